"""The GPU-hour budget banner in Chromium: the spawn page at 80 %, the admin page and the
JupyterLab sidebar at 100 % (new work only over quota). Screenshots go to docs/img/budget-*.png."""

from __future__ import annotations

import pytest

from tests.support import budgets
from tests.support.browser import browser_login
from tests.support.catalogs import H100_HALF, h100_inventory
from tests.support.hub import RunningHub
from tests.support.lab import login_and_spawn, shot_docs

pytestmark = pytest.mark.docs_screenshots

ZONE = "Europe/Berlin"
CATALOG = (
    h100_inventory(1)
    + "profiles:\n"
    + H100_HALF
    + """teams:
  - {name: vision, display_name: Computer vision, users: [alice, bob], guarantee: 1, burst: 1}
"""
)
EXTRA = f'c.GPULabUsage.time_zone = "{ZONE}"\nc.GPULabBudgets.check_interval = 3600\n'


@pytest.fixture(scope="module")
def hub(start_hub):
    hub = start_hub(CATALOG, extra_config=EXTRA)
    assert hub.api("PUT", "/gpulab/budgets/teams/vision", json={"gpu_hours": 10}).status_code == 200
    budgets.add_history(hub, "vision", "bob", 8.2, ZONE)
    return hub


def test_the_spawn_page_warns_at_80_percent(hub: RunningHub, browser):
    context, page = browser_login(browser, hub.url, "alice")
    try:
        page.goto(hub.url + "/hub/spawn")
        banner = page.locator('#gpulab-budget-banners .gpulab-budget-banner[data-level="warning"]')
        banner.wait_for()
        text = banner.inner_text()
        assert text.startswith("GPU-hour budget at 82 %:"), text
        assert "Team vision has used 8.2 of its 10 GPU-hours for" in text
        assert banner.get_attribute("role") == "status"
        shot_docs(page, "budget-banner-spawn", page.locator("#spawn_form").locator(".."))
    finally:
        context.close()


def test_at_100_percent_the_admin_page_and_the_lab_sidebar_say_so(hub: RunningHub, browser):
    budgets.add_history(hub, "vision", "bob", 2.0, ZONE)
    context, page = browser_login(browser, hub.url, "admin")
    try:
        page.goto(hub.url + "/hub/gpulab/admin")
        banner = page.locator('#gpulab-budget-banners .gpulab-budget-banner[data-level="exhausted"]')
        banner.wait_for()
        assert "new GPU work starts only over quota, preemptible by other teams' work" in banner.inner_text()
        # the what-if page replays a proposed budget: today's is in the form, the proposal is sent
        page.goto(hub.url + "/hub/gpulab/admin/whatif")
        row = page.locator('#whatif-quotas tr[data-team="vision"]')
        assert row.locator("[name=budget]").input_value() == "10.0"
        row.locator("[name=budget]").fill("0.01")
        row.locator("[name=at_limit]").select_option("refuse")
        with page.expect_request(lambda r: r.method == "POST" and "api/gpulab/whatif" in r.url) as sent:
            page.click("#whatif-run")
        assert sent.value.post_data_json["budgets"] == [
            {"team": "vision", "gpu_hours": "0.01", "period": "month", "at_limit": "refuse"}
        ]
        page.locator("#whatif-table td", has_text="Refused past a GPU-hour budget").wait_for()
        assert page.locator("#whatif-error").is_hidden()
    finally:
        context.close()
    page = browser.new_page(viewport={"width": 1400, "height": 900})
    page.set_default_timeout(60_000)
    try:
        login_and_spawn(page, hub.url, "alice", "vision:h100-half")
        page.wait_for_selector(".jp-LabShell", timeout=90_000)
        page.click('.jp-SideBar [data-id="gpulab-panel"]')
        panel = page.locator("#gpulab-panel")
        section = panel.locator(".gpulab-budgets .gpulab-budget-exhausted")
        section.wait_for(timeout=90_000)
        assert section.get_attribute("role") == "alert"
        assert section.inner_text().startswith("GPU-hour budget used up:")
        # past its budget the server runs over quota: the session says so too
        panel.locator(".gpulab-share").wait_for()
        assert "burst (preemptible)" in panel.inner_text()
        toast = page.locator(".Toastify__toast", has_text="GPU-hour budget used up")
        toast.first.wait_for()
        shot_docs(page, "budget-lab-sidebar", panel.locator(".gpulab-panel"))
    finally:
        page.close()
        hub.api("DELETE", "/users/alice/server")
