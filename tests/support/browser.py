"""Debian's Chromium driven by Playwright (``playwright install`` cannot download here)."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from tests.support import REPO

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


#: Test artefacts (failure screenshots, logs kept for a reader) go under the system's
#: temporary folder, never into the work tree: a test run changes no tracked file.
TEST_OUTPUT = Path(os.environ.get("GPULAB_TEST_OUTPUT") or Path(tempfile.gettempdir()) / "gpulab-test-output")


def screenshots_dir(name: str) -> Path:
    """Where the browser tests write the screenshots called ``name`` ("docs" for the docs' images).

    The docs' images land in ``docs/img`` only when the screenshot command asks for them
    (``scripts/screenshots`` sets ``GPULAB_DOCS_SCREENSHOTS=1``); in a plain test run they go
    under :data:`TEST_OUTPUT` like every other artefact.
    """
    if name == "docs" and os.environ.get("GPULAB_DOCS_SCREENSHOTS") == "1":
        folder = REPO / "docs" / "img"
    else:
        folder = TEST_OUTPUT / name
    folder.mkdir(parents=True, exist_ok=True)
    return folder
