"""The hub's own pages in a real browser (Debian Chromium + Playwright) against a real hub.

A user's spawn page shows each profile's idle timeout and the per-user cap,
says what to do about an unavailable profile (a smaller one that fits, when
quota frees, whom to ask), keeps a refused choice selected with a sentence
instead of "HTTP 403"; the progress page says what is being set up; the hub
home offers "Start again with ..." in one click and shows which GPU each
server holds. The admin lands on the admin page when in no team, chooses GPU
models from a list, and reads the page in dark mode. Screenshots: docs/img/ (scripts/screenshots).
"""

from __future__ import annotations

import pytest

from tests.support.browser import browser_login, screenshots_dir
from tests.support.catalogs import HUB_PAGES
from tests.support.hub import RunningHub

pytestmark = pytest.mark.docs_screenshots

SHOTS = screenshots_dir("docs")
CONTACT = "gpu-admins@example.org"
CATALOG = HUB_PAGES
EXTRA = f"""
c.GPULab.admin_contact = "{CONTACT}"
c.GPULabUsage.currency = "EUR"
c.GPULabUsage.time_zone = "Europe/Berlin"
# Servers take a few seconds to start, as on a loaded machine: the progress page stays up to be read.
c.Spawner.cmd = ["/bin/sh", "-c", 'sleep 6; exec "$0" "$@"'] + list(c.Spawner.cmd)
"""


@pytest.fixture(scope="module")
def hub(start_hub):
    return start_hub(CATALOG, extra_config=EXTRA)


def login(browser, hub: RunningHub, user: str, dark: bool = False):
    return browser_login(browser, hub.url, user, dark=dark)


def profile(page, value: str):
    return page.locator(f'label[data-choice="{value}"]')


def test_spawn_page_refusal_progress_and_start_again(hub, browser):
    SHOTS.mkdir(parents=True, exist_ok=True)
    # bob holds half a GPU: team vision (burst 1) has 0.5 left, so 1 × H100 does not fit.
    r = hub.api("POST", "/users/bob/server", json={"team": "vision", "profile": "h100-half"})
    assert r.status_code in (201, 202), r.text
    hub.wait_server("bob")

    ctx, page = login(browser, hub, "alice")
    assert "/hub/spawn" in page.url  # a user without a server lands on the spawn page
    half = profile(page, "vision:h100-half")
    # The idle rule once for the page (no NVIDIA driver here, so the embedded hub runs no culler),
    # each card's own timeout, and what the profile gives.
    rule = page.locator("#gpulab-idle-rule").inner_text()
    assert (
        rule
        == "Idle timeouts are not enforced: the GPU idle culler is off on this hub, so a server keeps its GPU until it is stopped."
    ), rule
    assert "Idle timeout 2h" in half.inner_text()
    assert "0.5 × H100-80GB · 39.8 GiB GPU memory" in half.inner_text()
    assert "at most 1 GPUs per user, you hold 0" in page.locator('fieldset[data-team="vision"] h3').inner_text()
    split = page.locator('fieldset[data-team="vision"] .gpulab-quota-split').inner_text()
    assert split == "in quota 0.5 of 0.5 · borrowable 0.5 above the guarantee (preemptible) · 0.5 free in all", split
    one = profile(page, "vision:h100-1")
    assert page.locator("#gpulab-vision--h100-1").is_disabled()
    todo = one.locator(".gpulab-todo").inner_text()
    # The what-to-do line ends with the offer to wait in line ("Queue me", a button).
    assert todo == (
        "Start 0.5 × H100, which fits now, try again when quota frees (when someone in team vision "
        f"stops a server), or ask {CONTACT} about team vision's quota. Queue me"
    )
    assert one.locator(".gpulab-todo button").inner_text() == "Queue me"
    page.screenshot(path=str(SHOTS / "spawn-page.png"), full_page=True)

    # Forcing the disabled profile: refused in a sentence, the choice stays selected.
    page.locator("#gpulab-vision--h100-1").evaluate("el => { el.disabled = false; el.checked = true; }")
    with page.expect_navigation():
        page.click("#spawn_form button[type=submit]")
    refused = page.locator("#gpulab-spawn-refused").inner_text()
    assert refused.startswith(
        "1 × H100 was not started: team vision holds 0.5 of its 1 GPU burst limit; "
        "this request needs 1. Start 0.5 × H100, which fits now"
    ), refused
    assert "HTTP" not in refused and "Forbidden" not in refused and not refused.startswith("Error")
    assert page.locator("#gpulab-vision--h100-1").is_checked()
    assert "gpulab-kept" in (one.get_attribute("class") or "")
    page.screenshot(path=str(SHOTS / "spawn-refused.png"), full_page=True)

    # Half a GPU fits: the progress page says what is being set up.
    page.locator("#gpulab-vision--h100-half").check()
    page.click("#spawn_form button[type=submit]")
    page.wait_for_url("**/hub/spawn-pending/alice**")
    page.locator("#progress-details").evaluate("el => { el.open = true; }")
    page.wait_for_function(
        "() => document.getElementById('progress-log').innerText.includes('Starting JupyterLab')", timeout=30_000
    )
    text = page.locator("#progress-log").inner_text()
    assert (
        "Reserved 0.5 GPU for 0.5 × H100 in team vision, above team vision's 0.5-GPU guarantee: preemptible"
    ) in text
    assert (
        "Devices: GPU 1 (H100-80GB, declared): 0.5 of it, 39.8 GiB of its 79.6 GiB memory" in text
        or "Devices: GPU 0 (H100-80GB, declared): 0.5 of it, 39.8 GiB of its 79.6 GiB memory" in text
    )
    assert "Idle timeout 2h, not enforced: the GPU idle culler is off on this hub" in text  # the same sentence
    # The account the server really runs as (the account spawner's, not the mixin's default words).
    account = hub.account("alice")
    runs_as = f"as system account {account.name}" if account is not None else "as the hub's own account"
    assert f"Starting JupyterLab {runs_as}" in text, text
    page.screenshot(path=str(SHOTS / "spawn-progress.png"), full_page=True)
    page.wait_for_url("**/user/alice/lab**", timeout=90_000)
    page.wait_for_selector(".jp-LabShell", timeout=90_000)

    # Stopped, alice comes back: the home page offers her last choice in one click.
    r = hub.api("DELETE", "/users/alice/server")
    assert r.status_code in (202, 204), r.text
    hub.wait_server("alice", ready=False)
    page.goto(hub.url + "/hub/home")
    again = page.locator("#gpulab-start-again")
    assert again.inner_text().strip() == "Start again with 0.5 × H100 (team vision)"
    assert "opt-choice=vision%3Ah100-half" in again.get_attribute("href")
    page.screenshot(path=str(SHOTS / "home-start-again.png"), full_page=True)
    again.click()
    page.wait_for_url("**/user/alice/lab**", timeout=90_000)
    page.wait_for_selector(".jp-LabShell", timeout=90_000)
    held = [w for w in hub.holdings() if w["key"] == "notebook:alice/"]
    assert held and held[0]["profile"] == "h100-half" and held[0]["team"] == "vision"

    # The spawn page of a new named server preselects the last choice and offers it as a button too.
    page.goto(hub.url + "/hub/spawn/alice/exp")
    assert page.locator("#gpulab-vision--h100-half").is_checked() is False  # vision is full now
    # A named server in the other team: the home page says which GPU each server holds.
    r = hub.api("POST", "/users/alice/servers/exp", json={"team": "nlp", "profile": "h100-quarter"})
    assert r.status_code in (201, 202), r.text
    hub.wait_server("alice", "exp")
    page.goto(hub.url + "/hub/home")
    row = page.locator('tr.home-server-row[data-server-name="exp"] .gpulab-server-gpu')
    row.wait_for()
    assert row.inner_text().startswith("0.25 × H100 on GPU ") and "team nlp · in quota" in row.inner_text()
    default = page.locator('#gpulab-home-gpus li[data-server-name=""]').inner_text()
    assert "0.5 × H100 on GPU" in default and "team vision · preemptible (over quota)" in default
    page.screenshot(path=str(SHOTS / "home-gpus.png"), full_page=True)
    ctx.close()
    for name in ("", "exp"):
        hub.api("DELETE", f"/users/alice/servers/{name}" if name else "/users/alice/server")
    hub.api("DELETE", "/users/bob/server")


def test_refused_query_spawn_keeps_choice_and_reads_as_sentence(hub, browser):
    hub.wait_server("bob", ready=False)
    hub.wait_server("alice", ready=False)
    r = hub.api("POST", "/users/bob/server", json={"team": "vision", "profile": "h100-1"})
    assert r.status_code in (201, 202), r.text
    hub.wait_server("bob")
    ctx, page = login(browser, hub, "alice")
    # The one-click URL of a choice that does not fit now: the form comes back with the sentence.
    page.goto(hub.url + "/hub/spawn/alice?opt-choice=vision%3Ah100-half")
    refused = page.locator("#gpulab-spawn-refused").inner_text()
    assert refused.startswith("0.5 × H100 was not started: team vision holds 1 of its 1 GPU burst limit"), refused
    assert refused.endswith(f"or ask {CONTACT} about team vision's quota."), refused
    assert page.locator("#gpulab-vision--h100-half").is_checked()
    assert not hub.api("GET", "/users/alice").json()["servers"]
    ctx.close()
    hub.api("DELETE", "/users/bob/server")
    hub.wait_server("bob", ready=False)


def test_admin_in_no_team_lands_on_admin_page_in_dark_mode(hub, browser):
    ctx, page = login(browser, hub, "admin", dark=True)
    assert "/hub/gpulab/admin" in page.url, page.url
    banner = page.locator("#gpulab-admin-no-team")
    assert "You (admin) are in no GPU team" in banner.inner_text()
    assert page.evaluate("document.documentElement.getAttribute('data-bs-theme')") == "dark"
    # The usage table's team rows follow the theme: no white bands.
    row = page.locator('#gpulab-usage-table tr.gpulab-team-row[data-team="vision"] th')
    rgb = row.evaluate("el => getComputedStyle(el).backgroundColor")
    r, g, b = (int(x) for x in rgb[rgb.index("(") + 1 : rgb.index(")")].split(",")[:3])
    assert (r + g + b) / 3 < 90, rgb
    fg = row.evaluate("el => getComputedStyle(el).color")
    assert sum(int(x) for x in fg[fg.index("(") + 1 : fg.index(")")].split(",")[:3]) / 3 > 160, fg
    assert "Cost (EUR)" in page.locator("#gpulab-usage").inner_text()
    assert "(calendar days, Europe/Berlin)" in page.locator("#gpulab-buckets-note").inner_text()
    assert "2.50 EUR" in page.locator("#gpulab-prices").inner_text()
    page.screenshot(path=str(SHOTS / "admin-dark.png"), full_page=True)
    ctx.close()


def test_admin_chooses_gpu_model_and_a_typo_is_refused(hub, browser):
    ctx, page = login(browser, hub, "admin")
    page.goto(hub.url + "/hub/gpulab/admin")
    # The idle timeouts as the users' pages say them, per team, and that nothing enforces them here.
    idle = page.locator('tr[data-profile="h100-quarter"] .gpulab-profile-idle').inner_text()
    assert idle == "vision: 4h; nlp: 4h (not enforced: the GPU idle culler is off on this hub)", idle
    page.goto(hub.url + "/hub/gpulab/admin/whatif")
    today = page.locator('#whatif-quotas tr[data-team="vision"]').inner_text()
    assert "0.25 × H100: 4h; 0.5 × H100: 2h; 1 × H100: 1h" in today, today
    assert "not enforced: the GPU idle culler is off on this hub" in page.locator("#whatif-culler-off").inner_text()
    page.goto(hub.url + "/hub/gpulab/admin")
    page.locator("#gpulab-profile-editor summary").click()
    select = page.locator("#gpulab-gpu-model")
    options = select.locator("option").all_inner_texts()
    assert options == ["any", "H100-80GB (declared)"], options
    form = page.locator("#gpulab-profile-form")
    form.locator("input[name=slug]").fill("h100-3q")
    form.locator("input[name=display_name]").fill("0.75 × H100")
    form.locator("input[name=gpus]").fill("0.75")
    select.select_option("H100-80GB")
    page.locator("#gpulab-profile-editor").screenshot(path=str(SHOTS / "admin-model-chooser.png"))
    with page.expect_navigation():
        form.locator("button[type=submit]").click()
    assert page.locator('tr[data-profile="h100-3q"]').inner_text().count("H100-80GB") == 1
    ctx.close()
    # The API refuses a model this server does not have, naming the known ones; nothing changes.
    before = hub.api("GET", "/gpulab/profiles").json()
    r = hub.api("POST", "/gpulab/profiles", json={"slug": "typo", "gpus": 1, "gpu_model": "H100-80G"})
    assert r.status_code == 400
    assert r.json()["message"] == (
        "gpu_model: GPU model 'H100-80G' is not known here (did you mean 'H100-80GB'?); known: H100-80GB"
    )
    r = hub.api("PATCH", "/gpulab/profiles/h100-3q", json={"gpu_model": "A100-40GB"})
    assert r.status_code == 400 and "known: H100-80GB" in r.json()["message"]
    assert hub.api("GET", "/gpulab/profiles").json() == before
