"""The what-if API and page against a real running hub, on recorded usage seeded into its database.

The history (usage intervals and utilisation samples, the rows the hub's
usage recorder writes) is written into the hub's own gpulab database, then
replayed through ``/hub/api/gpulab/whatif`` and the what-if page in Chromium.
Screenshot: docs/img/admin-whatif.png (scripts/screenshots).
"""

from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone

import pytest

from hub_config.domain.usage_records import UsageInterval, UtilisationSample
from hub_config.storage.db import session_factory
from tests.support.browser import screenshots_dir
from tests.support.catalogs import H100_PROFILES, NLP_TEAM, h100_inventory

pytestmark = pytest.mark.docs_screenshots

CATALOG = (
    h100_inventory(2)
    + H100_PROFILES
    + "teams:\n  - {name: vision, display_name: Computer vision, users: [alice, bob], guarantee: 0.5, burst: 1}\n"
    + NLP_TEAM
)
H = 3600


def seed_history(db_path) -> None:
    """Four recorded sessions (see the figures asserted below)."""
    sessions = session_factory(url=f"sqlite:///{db_path}")
    now = datetime.now(timezone.utc).replace(tzinfo=None, microsecond=0)
    day3, day2, day1 = now - timedelta(days=3), now - timedelta(days=2), now - timedelta(days=1)

    def interval(key, team, user, milli, start, hours, util):
        with sessions.begin() as s:
            s.add(
                UsageInterval(
                    key=key,
                    team=team,
                    user=user,
                    profile="p",
                    kind="notebook",
                    gpu_milli=milli,
                    gpu_model="H100-80GB",
                    over_quota=False,
                    started_at=start,
                    ended_at=start + timedelta(hours=hours),
                )
            )
            if util is not None:
                s.add_all(
                    UtilisationSample(at=start + timedelta(seconds=t), key=key, team=team, user=user, util_pct=util(t))
                    for t in range(0, int(hours * H) + 1, 60)
                )

    # alice: busy 30 min, then idle for 3.5 h; she starts another session 2 h in (regret for a 1 h timeout)
    interval("notebook:alice/", "vision", "alice", 1000, day3, 4, lambda t: 60.0 if t < 1800 else 0.0)
    interval("notebook:alice/b", "vision", "alice", 500, day3 + timedelta(hours=2), 1, lambda t: 90.0)
    # carol: idle all along, never comes back
    interval("notebook:carol/", "nlp", "carol", 1000, day2, 5, lambda t: 0.0)
    # bob: a 0.3 GPU session from an older catalog, no utilisation recorded
    interval("notebook:bob/", "vision", "bob", 300, day1, 2, None)


@pytest.fixture
def jp_asyncio_loop():
    """No Jupyter server event loop here (nor its cleanup below).

    ``tests/unit/lab_server/test_labextension_server.py`` registers pytest_jupyter's plugin,
    whose autouse ``jp_asyncio_loop`` and ``jp_server_cleanup`` then apply to
    the modules collected after it; at teardown they close the loop that
    Playwright's sync API keeps running. This module starts no Jupyter server.
    """
    yield None


@pytest.fixture
def jp_server_cleanup():
    yield


@pytest.fixture(scope="module")
def hub(start_hub):
    h = start_hub(CATALOG)
    seed_history(h.state_dir / "gpulab.sqlite")
    return h


@pytest.fixture(scope="module")
def alice_token(hub):
    r = hub.api("POST", "/users/alice/tokens", json={"note": "what-if tests"})
    assert r.status_code == 201, r.text
    return r.json()["token"]


def whatif(hub, method="GET", token=None, **kwargs):
    return hub.api(method, "/gpulab/whatif", token=token, **kwargs)


def test_todays_settings_and_the_advice(hub):
    r = whatif(hub)
    assert r.status_code == 200, r.text
    doc = r.json()
    assert doc["sessions"] == 4 and doc["current_sizes_milli"] == [250, 500, 1000]
    now = doc["current"]
    # alice's second session finds her first one still holding vision's 1-GPU burst
    assert now["refused"]["quota"] == 1 and now["refused_gpu_hours"]["quota"] == pytest.approx(0.5)
    # 4 h x 1 + 5 h x 1 + bob's 0.3 rounded up to 0.5 for 2 h
    assert now["served_gpu_hours"] == pytest.approx(10.0)
    assert now["reclaims"] == 0  # no team has an idle timeout today
    advice = doc["advice"]
    assert advice["error"] is None and 300 in advice["sizes_milli"]
    # measured on the two GPUs by packing the recorded requests: the same work as today's sizes here
    assert advice["chosen_by"] == "most work placed in a fill simulation"
    assert advice["predicted_gain"] == pytest.approx(0.0) and advice["efficiency"] == pytest.approx(1.0)


def test_a_proposal_with_an_idle_timeout(hub):
    teams_before = hub.api("GET", "/gpulab/teams").json()
    r = whatif(hub, "POST", json={"idle_timeout": "1h", "quotas": {"nlp": {"guarantee": 1, "burst": 1}}})
    assert r.status_code == 200, r.text
    p = r.json()["proposed"]
    # alice reclaimed 30 min + 1 h timeout + 15 min grace in (2.25 GPU-h back), carol 1 h 15 min in (3.75)
    assert p["reclaims"] == 2 and p["reclaimed_gpu_hours"] == pytest.approx(6.0)
    assert p["regret"] == 1  # alice came back 15 minutes after the reclaim
    assert p["refused"]["quota"] == 0  # her second session now fits
    assert p["served_gpu_hours"] == pytest.approx(1.75 + 0.5 + 1.25 + 1.0)
    one = whatif(hub, "POST", json={"team": "nlp", "sizes": [1], "idle_timeout": None}).json()
    assert one["sessions"] == 1 and one["proposed"]["served_gpu_hours"] == pytest.approx(5.0)
    assert hub.api("GET", "/gpulab/teams").json() == teams_before  # a what-if saves nothing


BAD = [
    (b"not json", 400, "not valid JSON"),
    (b"[1, 2]", 400, "JSON object"),
    (json.dumps({"colour": "red"}).encode(), 400, "unknown field"),
    (json.dumps({"sizes": "0.5"}).encode(), 400, "sizes"),
    (json.dumps({"sizes": [0.0001]}).encode(), 400, "1/1000"),
    (json.dumps({"sizes": [-1]}).encode(), 400, "negative"),
    (json.dumps({"sizes": [1.5]}).encode(), 400, "not a size this hub can give"),
    (json.dumps({"team": "nope"}).encode(), 400, "no team named"),
    (json.dumps({"days": 0}).encode(), 400, "days"),
    (json.dumps({"days": True}).encode(), 400, "days"),
    (json.dumps({"quotas": {"vision": {"guarantee": 2, "burst": 1}}}).encode(), 400, "below the guarantee"),
    (json.dumps({"quotas": {"ghost": {"burst": 1}}}).encode(), 400, "no team named"),
    (json.dumps({"quotas": {"vision": {"limit": 1}}}).encode(), 400, "guarantee"),
    (json.dumps({"idle_timeout": "soon"}).encode(), 400, "idle_timeout"),
    (json.dumps({"idle_timeout": 5}).encode(), 400, "1 minute"),
    (json.dumps({"max_sizes": 0}).encode(), 400, "max_sizes"),
    (json.dumps({"sizes": [1] * 20000}).encode(), 413, "larger than"),
]


@pytest.mark.parametrize("body,status,message", BAD, ids=[f"{s}-{m}" for _, s, m in BAD])
def test_bad_input_is_refused_and_changes_nothing(hub, body, status, message):
    teams_before = hub.api("GET", "/gpulab/teams").json()
    r = whatif(hub, "POST", data=body, headers={"Content-Type": "application/json"})
    assert r.status_code == status, r.text
    assert message in r.json()["message"]
    assert hub.api("GET", "/gpulab/teams").json() == teams_before


def test_only_admins(hub, alice_token):
    assert whatif(hub, token=alice_token).status_code == 403
    assert whatif(hub, "POST", token=alice_token, json={}).status_code == 403
    import requests

    assert requests.get(hub.url + "/hub/api/gpulab/whatif", timeout=10).status_code == 403
    assert whatif(hub, params={"days": "nine"}).status_code == 400


def test_the_whatif_page_in_chromium(hub, browser):
    context = browser.new_context(viewport={"width": 1300, "height": 1100})
    page = context.new_page()
    page.set_default_timeout(60_000)
    page.goto(hub.url + "/hub/login")
    page.fill("input[name=username]", "admin")
    page.fill("input[name=password]", "gpulab-demo")
    page.click("input[type=submit], button[type=submit]")
    page.wait_for_load_state("networkidle")
    page.goto(hub.url + "/hub/gpulab/admin")
    page.click("#gpulab-whatif-link")
    page.wait_for_selector("#whatif-results:not(.d-none)")
    assert "4 " in page.inner_text("#whatif-sessions") + " "
    assert "0.3" in page.inner_text("#whatif-advice-text")
    # a size the hub cannot give: the API's message, shown on the page
    page.fill("#whatif-sizes", "0.25, 1.5")
    page.click("#whatif-run")
    page.wait_for_selector("#whatif-error:not(.d-none)")
    assert "1.5 GPU is not a size" in page.inner_text("#whatif-error")
    # the advisor's sizes, a one-hour idle timeout
    page.click("#whatif-use-advice")
    page.fill("#whatif-timeout", "1h")
    page.click("#whatif-run")
    page.wait_for_function(
        "document.querySelector('#whatif-table tbody tr:nth-child(6) td:nth-child(3)').textContent === '6.00'"
    )
    assert page.locator("#whatif-error").is_hidden()
    rows = page.locator("#whatif-table tbody tr")
    assert rows.nth(6).inner_text().split("\t")[-1].strip() == "1 of 2"
    shots = screenshots_dir("docs")
    page.screenshot(path=str(shots / "admin-whatif.png"), full_page=True)
    context.close()


def test_a_cross_site_post_from_an_admin_browser_session_is_refused(hub):
    admin = hub.login("admin")
    # cookies ride along, the XSRF token does not
    r = admin.post(hub.url + "/hub/api/gpulab/whatif", json={"idle_timeout": "1h"}, timeout=30)
    assert r.status_code == 403, r.text
    xsrf = admin.cookies.get("_xsrf", path="/hub/")
    r = admin.post(
        hub.url + "/hub/api/gpulab/whatif", json={"idle_timeout": "1h"}, timeout=60, headers={"X-XSRFToken": xsrf}
    )
    assert r.status_code == 200, r.text
    # a non-admin's browser session, with its token, is still refused
    alice = hub.login("alice")
    r = alice.post(
        hub.url + "/hub/api/gpulab/whatif",
        json={},
        timeout=30,
        headers={"X-XSRFToken": alice.cookies.get("_xsrf", path="/hub/")},
    )
    assert r.status_code == 403, r.text
    assert alice.get(hub.url + "/hub/gpulab/admin/whatif", timeout=30).status_code == 403
