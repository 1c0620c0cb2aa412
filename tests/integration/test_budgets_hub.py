"""GPU-hour budgets through a real hub (single server): the admin API and its bad input, the
banners, the webhook POSTed to a real HTTP server (retried, each threshold once), and the
admin's choice at 100 %: new work only over quota (preemptible), or refused with a sentence.

Usage earlier in the period is written into gpulab's usage table in the recorder's own format
(one closed interval per workload), as the hub would have recorded it; the running servers'
usage is recorded by the hub itself.
"""

from __future__ import annotations

import html
import json
import sqlite3

import pytest

from tests.support import budgets
from tests.support.catalogs import CPU_PROFILE, H100_HALF, H100_ONE, h100_inventory
from tests.support.hub import RunningHub
from tests.support.webhook_receiver import WebhookReceiver

ZONE = "Europe/Berlin"
CATALOG = (
    h100_inventory(2)
    + "profiles:\n"
    + CPU_PROFILE
    + H100_HALF
    + H100_ONE
    + """teams:
  - {name: vision, users: [alice, bob], guarantee: 1, burst: 2}
  - {name: nlp, users: [carol], guarantee: 1, burst: 2}
"""
)
EXTRA = f"""
c.GPULabUsage.time_zone = "{ZONE}"
c.GPULabBudgets.check_interval = 3600  # the tests check through the API
c.GPULabBudgets.webhook_retry_seconds = 0
c.GPULabBudgets.webhook_attempts = 3
c.GPULab.admin_contact = "#gpu-help"
"""


@pytest.fixture(scope="module")
def receiver():
    with WebhookReceiver() as r:
        yield r


@pytest.fixture(scope="module")
def hub(start_hub):
    return start_hub(CATALOG, extra_config=EXTRA)


def db(hub: RunningHub) -> sqlite3.Connection:
    return sqlite3.connect(hub.state_dir / "gpulab.sqlite")


def add_history(hub: RunningHub, team: str, user: str, gpu_hours: float) -> None:
    budgets.add_history(hub, team, user, gpu_hours, ZONE)


def user_token(hub: RunningHub, user: str) -> str:
    r = hub.api("POST", f"/users/{user}/tokens", json={"note": "budget tests"})
    assert r.status_code == 201, r.text
    return r.json()["token"]


def snapshot(hub: RunningHub) -> tuple:
    listing = hub.api("GET", "/gpulab/budgets").json()
    with db(hub) as conn:
        rows = conn.execute("SELECT * FROM gpulab_budget ORDER BY key").fetchall()
        hook = conn.execute("SELECT webhook_url FROM gpulab_budget_settings").fetchall()
        audit = conn.execute("SELECT count(*) FROM gpulab_audit").fetchone()[0]
    return listing, rows, hook, audit


def test_bad_budget_and_webhook_input_is_refused_and_changes_nothing(hub):
    assert hub.api("PUT", "/gpulab/budgets/teams/nlp", json={"gpu_hours": 50}).status_code == 200
    alice = user_token(hub, "alice")
    before = snapshot(hub)
    cases = [
        # who may: an ordinary user may not edit budgets, not even their own team's
        (
            "PUT",
            "/gpulab/budgets/teams/vision",
            {"json": {"gpu_hours": 1e6}},
            alice,
            403,
            "requires custom:gpulab:admin",
        ),
        ("PUT", "/gpulab/budgets/webhook", {"json": {"url": "http://evil.example/"}}, alice, 403, "requires"),
        ("DELETE", "/gpulab/budgets/teams/nlp", {}, alice, 403, "requires"),
        # other teams and users: ones that do not exist
        ("PUT", "/gpulab/budgets/teams/ghost", {"json": {"gpu_hours": 1}}, None, 404, "there is no team 'ghost'"),
        ("PUT", "/gpulab/budgets/teams/vision/users/mallory", {"json": {"gpu_hours": 1}}, None, 404, "no user"),
        ("DELETE", "/gpulab/budgets/teams/vision", {}, None, 404, "there is no budget team:vision"),
        # tampered: the body names another team or user than the path
        ("PUT", "/gpulab/budgets/teams/vision", {"json": {"gpu_hours": 1, "team": "nlp"}}, None, 400, "differs"),
        ("PUT", "/gpulab/budgets/teams/nlp", {"json": {"gpu_hours": 1, "user": "carol"}}, None, 400, "differs"),
        ("PUT", "/gpulab/budgets/teams/nlp", {"json": {"gpu_hours": 1, "guarantee": 9}}, None, 400, "unknown budget"),
        # malformed and out of range
        ("PUT", "/gpulab/budgets/teams/nlp", {"data": b"{not json"}, None, 400, "not valid JSON"),
        ("PUT", "/gpulab/budgets/teams/nlp", {"data": b'{"gpu_hours": NaN}'}, None, 400, "NaN"),
        ("PUT", "/gpulab/budgets/teams/nlp", {"data": b"[1, 2]"}, None, 400, "JSON object"),
        ("PUT", "/gpulab/budgets/teams/nlp", {"json": {"gpu_hours": -5}}, None, 400, "above 0"),
        ("PUT", "/gpulab/budgets/teams/nlp", {"json": {"gpu_hours": "lots"}}, None, 400, "number of GPU-hours"),
        ("PUT", "/gpulab/budgets/teams/nlp", {"json": {"gpu_hours": 1, "period": "year"}}, None, 400, "'period'"),
        ("PUT", "/gpulab/budgets/teams/nlp", {"json": {"gpu_hours": 1, "at_limit": "stop"}}, None, 400, "'at_limit'"),
        (
            "PUT",
            "/gpulab/budgets/teams/nlp",
            {"data": b'{"gpu_hours": 1, "x": "' + b"a" * 5000 + b'"}'},
            None,
            413,
            "larger",
        ),
        # the webhook: only http(s) URLs with a host, of a sane length
        (
            "PUT",
            "/gpulab/budgets/webhook",
            {"json": {"url": "ftp://files.example.org/x"}},
            None,
            400,
            "http:// or https://",
        ),
        ("PUT", "/gpulab/budgets/webhook", {"json": {"url": "javascript:alert(1)"}}, None, 400, "http:// or https://"),
        ("PUT", "/gpulab/budgets/webhook", {"json": {"url": "file:///etc/passwd"}}, None, 400, "http:// or https://"),
        ("PUT", "/gpulab/budgets/webhook", {"json": {"url": "http:///nohost"}}, None, 400, "must name a host"),
        ("PUT", "/gpulab/budgets/webhook", {"json": {"url": "http://a b.example/"}}, None, 400, "without spaces"),
        ("PUT", "/gpulab/budgets/webhook", {"json": {"url": "http://x.example:99999/"}}, None, 400, "not a URL"),
        ("PUT", "/gpulab/budgets/webhook", {"json": {"url": "https://x.example/" + "a" * 2100}}, None, 400, "longer"),
        ("PUT", "/gpulab/budgets/webhook", {"json": {"url": 7}}, None, 400, "must be a string"),
        (
            "PUT",
            "/gpulab/budgets/webhook",
            {"json": {"url": "https://x.example/", "secret": "s"}},
            None,
            400,
            "unknown",
        ),
        ("PUT", "/gpulab/budgets/webhook", {"json": {}}, None, 400, "give 'url'"),
    ]
    for method, path, kwargs, token, status, words in cases:
        r = hub.api(method, path, token=token, **kwargs)
        assert r.status_code == status, (method, path, kwargs, r.status_code, r.text)
        assert words in r.json()["message"], (path, r.text)
    assert snapshot(hub) == before
    # and a user reads only their own teams' budgets
    r = hub.api("GET", "/gpulab/me/budgets", params={"user": "carol"}, token=alice)
    assert r.status_code == 403
    assert hub.api("GET", "/gpulab/budgets", token=alice).status_code == 403


def test_at_80_percent_members_and_admins_are_told_and_the_webhook_once(hub, receiver):
    assert hub.api("PUT", "/gpulab/budgets/webhook", json={"url": receiver.url}).status_code == 200
    r = hub.api("PUT", "/gpulab/budgets/teams/vision", json={"gpu_hours": 10, "period": "month"})
    assert r.status_code == 200 and r.json()["at_limit"] == "over-quota" and r.json()["level"] == "ok"
    add_history(hub, "vision", "bob", 8.2)
    mine = hub.api("GET", "/gpulab/me/budgets", token=user_token(hub, "alice")).json()
    [vision] = [b for b in mine["budgets"] if b["team"] == "vision"]
    assert vision["level"] == "warning" and 82 <= vision["percent"] < 83 and mine["time_zone"] == ZONE
    assert "Team vision has used 8.2 of its 10 GPU-hours for" in vision["banner"]
    # another team's members see nothing of it
    carol = hub.api("GET", "/gpulab/me/budgets", token=user_token(hub, "carol")).json()
    assert [b["team"] for b in carol["budgets"]] == ["nlp"]
    # the spawn page's banner, and the admin page's
    page = html.unescape(hub.spawn_page(hub.login("alice")).text)
    assert 'id="gpulab-budget-banners"' in page and "GPU-hour budget at 82 %" in page
    assert "GPU-hour budget" not in html.unescape(hub.spawn_page(hub.login("carol")).text)
    admin = html.unescape(hub.login("admin").get(hub.url + "/hub/gpulab/admin", timeout=30).text)
    assert "GPU-hour budget at 82 %" in admin and "Team vision has used 8.2" in admin
    # the webhook: the receiver fails the first POST; the next check retries and delivers it
    receiver.answers.append(503)
    assert hub.api("POST", "/gpulab/budgets/check").json() == {"recorded": 1, "delivered": 0}
    [notice] = hub.api("GET", "/gpulab/budgets").json()["notices"]
    assert notice["webhook"] == "pending" and notice["attempts"] == 1 and "HTTP 503" in notice["last_error"]
    assert hub.api("POST", "/gpulab/budgets/check").json() == {"recorded": 0, "delivered": 1}
    assert hub.api("POST", "/gpulab/budgets/check").json() == {"recorded": 0, "delivered": 0}  # once per period
    [body] = receiver.delivered()
    assert [r["content_type"] for r in receiver.received] == ["application/json"] * 2
    assert body["schema"] == "gpulab.budget-threshold/v1" and body["threshold_percent"] == 80
    assert body["budget"] == {
        "key": "team:vision",
        "team": "vision",
        "gpu_hours": 10.0,
        "period": "month",
        "at_limit": "over-quota",
    }
    assert body["members"] == ["alice", "bob"] and body["period"]["time_zone"] == ZONE
    assert 82 <= body["percent"] < 83 and "8.2 of its 10 GPU-hours" in body["message"]


def test_at_100_percent_over_quota_new_work_starts_only_preemptible(hub, receiver):
    add_history(hub, "vision", "bob", 2.0)
    assert hub.api("POST", "/gpulab/budgets/check").json() == {"recorded": 1, "delivered": 1}
    body = receiver.delivered()[-1]
    assert body["threshold_percent"] == 100 and "new GPU work starts only over quota" in body["message"]
    # vision holds nothing of its 1 GPU guarantee, yet past its budget alice's server is preemptible
    r = hub.api("POST", "/users/alice/server", json={"team": "vision", "profile": "h100-half"})
    assert r.status_code in (201, 202), r.text
    hub.wait_server("alice")
    [held] = [w for w in hub.holdings() if w["key"] == "notebook:alice/"]
    assert held["over_quota"] is True, held
    # carol's team has its own budget, far from used: her work is in quota as usual
    r = hub.api("POST", "/users/carol/server", json={"team": "nlp", "profile": "h100-half"})
    assert r.status_code in (201, 202), r.text
    hub.wait_server("carol")
    assert [w["over_quota"] for w in hub.holdings() if w["key"] == "notebook:carol/"] == [False]
    for user in ("alice", "carol"):
        hub.api("DELETE", f"/users/{user}/server")
        hub.wait_server(user, ready=False)


def test_at_100_percent_refuse_says_why_and_starts_nothing(hub):
    r = hub.api("PUT", "/gpulab/budgets/teams/vision", json={"gpu_hours": 10, "at_limit": "refuse"})
    assert r.status_code == 200 and r.json()["level"] == "exhausted"
    r = hub.api("POST", "/users/bob/server", json={"team": "vision", "profile": "h100-half"})
    assert r.status_code == 403, r.text
    message = r.json()["message"]
    assert "Team vision has used" in message and "new GPU work is refused until the budget resets on" in message
    assert ZONE in message and "#gpu-help" in message
    assert "" not in hub.api("GET", "/users/bob").json()["servers"]
    assert not [w for w in hub.holdings() if w["user"] == "bob"]
    # the spawn form says the same sentence, and the banner says why beforehand
    bob = hub.login("bob")
    assert "new GPU work is refused" in html.unescape(hub.spawn_page(bob).text)
    page = html.unescape(hub.post_spawn(bob, "bob", {"choice": "vision:h100-half"}).text)
    assert "new GPU work is refused until the budget resets on" in page
    assert "" not in hub.api("GET", "/users/bob").json()["servers"]
    # CPU-only work uses no GPU-hours: still allowed
    r = hub.api("POST", "/users/bob/server", json={"team": "vision", "profile": "cpu"})
    assert r.status_code in (201, 202), r.text
    hub.wait_server("bob")
    hub.api("DELETE", "/users/bob/server")
    hub.wait_server("bob", ready=False)


def test_budgets_are_in_the_what_if_replay(hub):
    add_history(hub, "vision", "bob", 0.4)  # an hour of 0.4 GPUs, which the two H100 can replay
    proposal = {"budgets": [{"team": "vision", "gpu_hours": 0.01, "at_limit": "refuse"}], "days": 1}
    r = hub.api("POST", "/gpulab/whatif", json=proposal)
    assert r.status_code == 200, r.text
    out = r.json()
    assert out["proposal"]["budgets"] == [
        {"key": "team:vision", "team": "vision", "gpu_hours": 0.01, "period": "month", "at_limit": "refuse"}
    ]
    # the budget counts what the replay served: the 0.4 GPU session fits the two GPUs (the 8.2
    # and 2 GPU ones do not), and alice's server started after it finds 0.01 GPU-hours spent
    assert out["proposed"]["refused"]["budget"] >= 1 and out["proposed"]["by_team"]["nlp"]["refused_gpu_hours"] == 0
    over = hub.api(
        "POST", "/gpulab/whatif", json={**proposal, "budgets": [{**proposal["budgets"][0], "at_limit": "over-quota"}]}
    )
    assert over.json()["proposed"]["refused"]["budget"] == 0 and over.json()["proposed"]["budget_over_quota"] >= 1
    for bad, words in (
        ([{"team": "ghost", "gpu_hours": 1}], "budgets[0]: there is no team 'ghost'"),
        ([{"team": "vision", "gpu_hours": 1}, {"team": "vision", "gpu_hours": 2}], "given twice"),
        ({"team": "vision"}, "expected a list"),
    ):
        r = hub.api("POST", "/gpulab/whatif", json={"budgets": bad})
        assert r.status_code == 400 and words in r.json()["message"], r.text


def test_removing_the_budget_lets_work_start_in_quota_and_is_audited(hub):
    assert hub.api("DELETE", "/gpulab/budgets/teams/vision").status_code == 204
    r = hub.api("POST", "/users/bob/server", json={"team": "vision", "profile": "h100-half"})
    assert r.status_code in (201, 202), r.text
    hub.wait_server("bob")
    assert [w["over_quota"] for w in hub.holdings() if w["key"] == "notebook:bob/"] == [False]
    hub.api("DELETE", "/users/bob/server")
    hub.wait_server("bob", ready=False)
    actions = [e["action"] for e in hub.api("GET", "/gpulab/audit", params={"target": "team:vision"}).json()["entries"]]
    assert actions[:3] == ["budget.delete", "budget.set", "budget.set"]
    with db(hub) as conn:
        assert (
            json.loads(conn.execute("SELECT body FROM gpulab_budget_notice ORDER BY id").fetchone()[0])[
                "threshold_percent"
            ]
            == 80
        )


def test_a_user_budget_binds_that_user_in_that_team(hub):
    r = hub.api("PUT", "/gpulab/budgets/teams/nlp/users/carol", json={"gpu_hours": 0.001, "at_limit": "refuse"})
    assert r.status_code == 200 and r.json()["key"] == "user:nlp/carol", r.text
    add_history(hub, "nlp", "carol", 0.01)
    r = hub.api("POST", "/users/carol/server", json={"team": "nlp", "profile": "h100-half"})
    assert r.status_code == 403 and "In team nlp, carol has used" in r.json()["message"], r.text
    mine = hub.api("GET", "/gpulab/me/budgets", token=user_token(hub, "carol")).json()["budgets"]
    assert {b["key"]: b["level"] for b in mine} == {"team:nlp": "ok", "user:nlp/carol": "exhausted"}
    assert hub.api("DELETE", "/gpulab/budgets/teams/nlp/users/carol").status_code == 204
    r = hub.api("POST", "/users/carol/server", json={"team": "nlp", "profile": "h100-half"})
    assert r.status_code in (201, 202), r.text
    hub.wait_server("carol")
    hub.api("DELETE", "/users/carol/server")
    hub.wait_server("carol", ready=False)
