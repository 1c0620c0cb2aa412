"""Debian's Chromium driven by Playwright (``playwright install`` cannot download here)."""

from __future__ import annotations

import os

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
MISSING = f"{CHROMIUM} is missing: scripts/bootstrap.sh --test installs Debian's chromium"


def chromium_missing() -> str | None:
    """Why the browser tests cannot run (``None`` when Chromium is there)."""
    return None if os.path.exists(CHROMIUM) else MISSING
