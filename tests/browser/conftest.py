"""The browser tier: real Chromium through Playwright against a real hub and lab."""

from __future__ import annotations

import pytest

from tests.support.browser import CHROMIUM, CHROMIUM_ARGS, chromium_missing


@pytest.fixture(scope="module", autouse=True)
def chromium_present() -> None:
    """Fail (never skip) before a module starts its hub when Chromium is missing."""
    missing = chromium_missing()
    if missing:
        pytest.fail(missing)


@pytest.fixture(scope="module")
def browser():
    """Headless Debian Chromium for the module's tests."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield b
        b.close()
