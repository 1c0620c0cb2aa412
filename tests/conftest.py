"""Shared fixtures: a real Debian Chromium driven by Playwright (no browser download)."""

from __future__ import annotations

import os

import pytest

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Tiers: a test on the Kubernetes test bed is an integration test too, so the fast
    tier (``-m "not integration"``, scripts/test --fast) never starts a control plane."""
    for item in items:
        if item.get_closest_marker("kube") and not item.get_closest_marker("integration"):
            item.add_marker(pytest.mark.integration)


@pytest.fixture(scope="module")
def browser():
    """Headless Debian Chromium for the module's tests (fails, never skips, if missing)."""
    if not os.path.exists(CHROMIUM):
        pytest.fail(f"{CHROMIUM} is missing: scripts/bootstrap.sh --test installs Debian's chromium")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield b
        b.close()


# The real Kubernetes test bed (tests/kube): session-wide control plane, a
# per-test Cluster view, and the gpulab chart installed into it.
from tests.kube.chart import gpulab_release, release  # noqa: E402,F401
from tests.kube.cluster import kube, kube_testbed  # noqa: E402,F401
