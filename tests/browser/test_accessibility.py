"""axe-core on every page a user or an admin of gpulab sees, in light and dark, in Chromium.

The hub's login, spawn, progress, home, admin and what-if pages, and JupyterLab's GPU
panel and "Run as GPU job" dialog, are checked with axe-core (WCAG 2.x A/AA and Deque's
best practices, colour contrast included): none may have a serious or critical violation.
Every page is checked before the module fails, and the counts are printed (``-s``), so one
run shows the whole picture.
"""

from __future__ import annotations

import json

import pytest

from tests.support.axe import axe_violations, blocking, describe
from tests.support.browser import browser_login
from tests.support.catalogs import HUB_PAGES
from tests.support.hub import RunningHub
from tests.support.lab import give_notebook

CATALOG = HUB_PAGES
# Servers take a while to start, so the progress page stays up to be checked.
EXTRA = """
c.Spawner.cmd = ["/bin/sh", "-c", 'sleep 12; exec "$0" "$@"'] + list(c.Spawner.cmd)
"""
THEMES = ("light", "dark")
#: page -> theme -> blocking violations; filled by the tests, checked by the last one.
FOUND: dict[str, dict[str, list[dict]]] = {}


@pytest.fixture(scope="module")
def hub(start_hub):
    return start_hub(CATALOG, extra_config=EXTRA, prepare=lambda h: give_notebook(h, "alice", "greet.ipynb"))


def check(page, name: str, theme: str, include: str | None = None) -> None:
    found = blocking(axe_violations(page, include))
    FOUND.setdefault(name, {})[theme] = found
    print(f"axe {name} ({theme}): {sum(len(v['nodes']) for v in found)} serious/critical nodes, {len(found)} rules")


def test_login_page(hub: RunningHub, browser):
    for theme in THEMES:
        ctx = browser.new_context(color_scheme=theme)
        page = ctx.new_page()
        page.goto(hub.url + "/hub/login")
        check(page, "login", theme)
        ctx.close()


def test_spawn_progress_and_home_pages(hub: RunningHub, browser):
    # bob holds half a GPU: team vision (burst 1) has 0.5 left, so 1 × H100 is unavailable (its reason shown).
    r = hub.api("POST", "/users/bob/server", json={"team": "vision", "profile": "h100-half"})
    assert r.status_code in (201, 202), r.text
    hub.wait_server("bob")
    pages = {theme: browser_login(browser, hub.url, "alice", dark=theme == "dark") for theme in THEMES}
    for theme, (_, page) in pages.items():
        assert "/hub/spawn" in page.url, page.url
        check(page, "spawn", theme)
    light = pages["light"][1]
    light.check('input[name=choice][value="vision:h100-quarter"]')
    light.click("#spawn_form button[type=submit]")
    light.wait_for_url("**/hub/spawn-pending/alice**")
    for theme, (_, page) in pages.items():
        if theme != "light":
            page.goto(hub.url + "/hub/spawn-pending/alice")
        page.locator("#progress-message").wait_for()
        check(page, "progress", theme)
    hub.wait_server("alice")
    for theme, (_, page) in pages.items():
        # The progress page goes to the server by itself once it is ready (JupyterHub's
        # spawn_pending.html): let it, or that navigation interrupts the next one.
        page.wait_for_url("**/user/alice/**", timeout=90_000)
        page.goto(hub.url + "/hub/home")
        check(page, "home", theme)
    for ctx, _ in pages.values():
        ctx.close()


def test_admin_and_whatif_pages(hub: RunningHub, browser):
    for theme in THEMES:
        ctx, page = browser_login(browser, hub.url, "admin", dark=theme == "dark")
        page.goto(hub.url + "/hub/gpulab/admin")
        page.locator("#gpulab-profile-editor summary").click()  # the new-profile form, open
        check(page, "admin", theme)
        page.goto(hub.url + "/hub/gpulab/admin/whatif")
        page.wait_for_selector("#whatif-results:not(.d-none), #whatif-error:not(.d-none)")
        check(page, "what-if", theme)
        page.goto(hub.url + "/hub/gpulab/admin/budgets")
        page.wait_for_selector("#budget-form")
        check(page, "budgets", theme)
        ctx.close()


def set_lab_theme(page, hub: RunningHub, theme: str) -> None:
    """JupyterLab's theme setting, written through its settings API as the Settings menu does."""
    name = "JupyterLab Dark" if theme == "dark" else "JupyterLab Light"
    status = page.evaluate(
        """async ([url, raw]) => {
            const xsrf = (document.cookie.match(/(?:^|; )_xsrf=([^;]*)/) || [])[1] || '';
            const r = await fetch(url, { method: 'PUT', headers: { 'X-XSRFToken': decodeURIComponent(xsrf),
                                      'Content-Type': 'application/json' }, body: JSON.stringify({ raw }) });
            return r.status;
        }""",
        [
            hub.url + "/user/alice/lab/api/settings/@jupyterlab/apputils-extension:themes",
            json.dumps({"theme": name}),
        ],
    )
    assert status == 204, status


def test_lab_panel_and_job_dialog(hub: RunningHub, browser):
    ctx, page = browser_login(browser, hub.url, "alice")
    try:
        for theme in THEMES:
            page.goto(hub.url + "/user/alice/lab/tree/greet.ipynb")
            page.wait_for_selector(".jp-NotebookPanel .jp-Cell", timeout=90_000)
            if theme == "dark":
                set_lab_theme(page, hub, "dark")
                page.reload()
                page.wait_for_selector(".jp-NotebookPanel .jp-Cell", timeout=90_000)
                page.wait_for_function("document.body.dataset.jpThemeLight === 'false'")
            page.click('.jp-SideBar [data-id="gpulab-panel"]')
            panel = page.locator("#gpulab-panel")
            panel.locator(".gpulab-profile", has_text="0.25 × H100").wait_for()
            panel.locator(".gpulab-quota-bar").wait_for()
            check(page, "lab panel", theme, "#gpulab-panel")
            panel.get_by_role("button", name="Run as GPU job…").click()
            page.locator(".jp-Dialog .gpulab-job-form").wait_for()
            check(page, "job dialog", theme, ".jp-Dialog")
            page.keyboard.press("Escape")
            page.locator(".jp-Dialog").wait_for(state="detached")
    finally:
        set_lab_theme(page, hub, "light")
        ctx.close()


def test_no_serious_or_critical_violations():
    assert set(FOUND) == {
        "login",
        "spawn",
        "progress",
        "home",
        "admin",
        "what-if",
        "budgets",
        "lab panel",
        "job dialog",
    }, FOUND
    bad = {f"{name} ({theme})": v for name, themes in FOUND.items() for theme, v in themes.items() if v}
    assert not bad, "\n\n".join(f"{where}:\n{describe(v)}" for where, v in bad.items())
