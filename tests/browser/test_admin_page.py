"""The GPU admin page in a real browser (Debian Chromium + Playwright) against a real hub.

The admin reaches the page from the hub's navigation bar, is told why a bad
quota is refused, lowers team vision's burst limit, sees the change in the
audit log; alice's next spawn is then refused with the new limit, on the spawn
page and on the server. Screenshots: gpulab-test-output/admin/ under the temporary folder.
"""

from __future__ import annotations

import html

import pytest

from tests.support.browser import browser_login, screenshots_dir
from tests.support.catalogs import H100_PROFILES, NLP_TEAM, VISION_TEAM, h100_inventory
from tests.support.hub import RunningHub

SHOTS = screenshots_dir("admin")
CATALOG = (
    h100_inventory(2) + 'prices: {H100-80GB: 2.5, "*": 1.0}\n' + H100_PROFILES + "teams:\n" + VISION_TEAM + NLP_TEAM
)


@pytest.fixture(scope="module")
def hub(start_hub):
    return start_hub(CATALOG)


def login(browser, hub: RunningHub, user: str):
    return browser_login(browser, hub.url, user, width=1400)


def test_admin_edits_quota_on_the_page_and_the_next_spawn_is_refused(hub, browser):
    SHOTS.mkdir(parents=True, exist_ok=True)
    # bob holds half a GPU so the page has something to show.
    r = hub.api("POST", "/users/bob/server", json={"team": "vision", "profile": "h100-half"})
    assert r.status_code in (201, 202), r.text
    hub.wait_server("bob")

    admin_ctx, page = login(browser, hub, "admin")
    page.goto(hub.url + "/hub/home")
    page.click("#gpulab-admin-link")
    page.wait_for_url("**/hub/gpulab/admin")
    assert page.locator("h1").inner_text() == "GPU admin"
    form = page.locator("#team-form-vision")
    assert form.locator("input[name=burst]").input_value() == "1"
    assert "0.5 GPUs held in 1 workload(s)" in form.inner_text()
    assert page.locator("svg.gpulab-history").count() == 1

    # A burst limit below the guarantee: refused with the reason, nothing changes.
    form.locator("input[name=burst]").fill("0.25")
    form.locator("button[type=submit]").click()
    burst = form.locator("input[name=burst]")
    error = form.locator("#team-vision-burst-error")  # at the field, which points at it
    error.wait_for()
    assert "teams.vision.burst: burst limit (0.25 GPUs) is below the guarantee (0.5 GPUs)" in error.inner_text()
    assert burst.get_attribute("aria-invalid") == "true"
    assert burst.get_attribute("aria-describedby") == "team-vision-burst-error"
    page.screenshot(path=str(SHOTS / "admin-refused-edit.png"), full_page=True)
    assert hub.api("GET", "/gpulab/teams/vision").json()["burst_milli"] == 1000

    # Lower the burst limit to the guarantee: saved, live, audited.
    form.locator("input[name=burst]").fill("0.5")
    with page.expect_navigation():
        form.locator("button[type=submit]").click()
    form = page.locator("#team-form-vision")
    assert form.locator("input[name=burst]").input_value() == "0.5"
    assert form.locator(".gpulab-form-status").inner_text() == "Saved team vision."  # said where Save was pressed
    audit = page.locator("#gpulab-audit tbody tr").first
    assert "team.update" in audit.inner_text() and "admin" in audit.inner_text()
    assert 'burst: "1" → "0.5"' in audit.inner_text()
    page.screenshot(path=str(SHOTS / "admin-page.png"), full_page=True)
    # The CSV link works from the browser session (it carries the XSRF token GETs to the API need).
    csv = page.request.get(hub.url + page.locator("#gpulab-csv").get_attribute("href"))
    assert csv.status == 200 and csv.headers["content-type"].startswith("text/csv")
    assert ",vision,bob," in csv.text()

    # A new profile chooses its teams in the same form; one larger than the server is refused at the field.
    page.locator("#gpulab-profile-editor summary").click()
    pform = page.locator("#gpulab-profile-form")
    pform.locator("input[name=slug]").fill("h100-huge")
    pform.locator("input[name=gpus]").fill("100")
    pform.locator("input[name=teams][value=nlp]").uncheck()
    pform.locator("button[type=submit]").click()
    gpus_error = pform.locator("#gpulab-profile-gpus-error")
    gpus_error.wait_for()
    assert "100 GPUs is more than this server has (2 GPU in all)" in gpus_error.inner_text()
    assert hub.api("GET", "/gpulab/profiles/h100-huge").status_code == 404  # nothing saved
    pform.locator("input[name=gpus]").fill("0.75")
    with page.expect_navigation():
        pform.locator("button[type=submit]").click()
    assert page.locator("#gpulab-profiles-status").inner_text() == "Created profile h100-huge."
    created = hub.api("GET", "/gpulab/profiles/h100-huge").json()
    assert "vision" in created["used_by_teams"], created
    vision = hub.api("GET", "/gpulab/teams/vision").json()
    assert "h100-huge" in vision["allowed_profiles"], vision
    admin_ctx.close()

    # alice's spawn page shows the new limit, and the server refuses it too.
    alice_ctx, page = login(browser, hub, "alice")
    page.goto(hub.url + "/hub/spawn")
    quarter = page.locator('input[name=choice][value="vision:h100-quarter"]')
    assert quarter.is_disabled()
    reason = "team vision holds 0.5 of its 0.5 GPU burst limit; this request needs 0.25"
    assert reason in page.locator("label[for='gpulab-vision--h100-quarter']").inner_text()
    assert "GPU admin" not in page.locator("nav").inner_text()  # alice is no admin
    # A user who forces the form anyway (re-enables the radio button) is refused by the server.
    quarter.evaluate("el => { el.disabled = false; el.checked = true; }")
    with page.expect_navigation():
        page.click("form input[type=submit], form button[type=submit]")
    assert reason in html.unescape(page.content())
    page.screenshot(path=str(SHOTS / "spawn-refused.png"), full_page=True)
    alice_ctx.close()
    assert "" not in hub.api("GET", "/users/alice").json()["servers"]
