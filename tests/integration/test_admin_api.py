"""Admin API against a real running hub: authorisation matrix, edits, bad input, usage, metrics."""

from __future__ import annotations

import html
import json
import sqlite3
import time

import pytest
import requests

from tests.support.catalogs import CPU_PROFILE, H100_HALF, H100_ONE, H100_QUARTER, h100_inventory
from tests.support.hub import ADMIN_AND_CULLER_SCOPES, RunningHub

CATALOG = (
    h100_inventory(2)
    + 'prices: {H100-80GB: 2.5, "*": 1.0}\n'
    + "profiles:\n"
    + CPU_PROFILE
    + H100_QUARTER
    + H100_HALF
    + H100_ONE
    + """teams:
  - {name: vision, users: [alice, bob], guarantee: 0.5, burst: 1, per_user_cap: 1,
     allowed_profiles: [cpu, h100-quarter, h100-half, h100-1]}
  - {name: nlp, users: [carol], guarantee: 1, burst: 2}
"""
)

OTHER_SERVICE_TOKEN = "other-service-token-0123456789abcdef"
EXTRA = f"""
c.JupyterHub.services = list(c.JupyterHub.services) + [{{"name": "other-svc", "api_token": "{OTHER_SERVICE_TOKEN}"}}]
c.JupyterHub.load_roles = list(c.JupyterHub.load_roles) + [
    {{"name": "other-svc", "scopes": ["read:users", "list:users"], "services": ["other-svc"]}}]
"""


@pytest.fixture(scope="module")
def hub(start_hub):
    return start_hub(CATALOG, extra_config=EXTRA, admin_scopes=ADMIN_AND_CULLER_SCOPES)


def user_token(hub: RunningHub, user: str, scopes: list[str] | None = None) -> str:
    body: dict = {"note": "admin tests"}
    if scopes is not None:
        body["scopes"] = scopes
    r = hub.api("POST", f"/users/{user}/tokens", json=body)
    assert r.status_code == 201, r.text
    return r.json()["token"]


@pytest.fixture(scope="module")
def tokens(hub):
    return {
        "admin-user": user_token(hub, "admin"),
        "ordinary-user": user_token(hub, "alice"),
        "token-without-scope": user_token(hub, "admin", ["read:users", "list:users"]),
        "service-without-scope": OTHER_SERVICE_TOKEN,
        "admin-service": hub.token,
    }


def db(hub: RunningHub) -> sqlite3.Connection:
    return sqlite3.connect(hub.state_dir / "gpulab.sqlite")


def snapshot(hub: RunningHub) -> tuple:
    """Everything an edit could change: the runtime (via the API) and the database."""
    teams = hub.api("GET", "/gpulab/teams").json()
    profiles = hub.api("GET", "/gpulab/profiles").json()
    prices = hub.api("GET", "/gpulab/prices").json()
    with db(hub) as conn:
        row = conn.execute("SELECT version, data FROM gpulab_catalog WHERE id = 1").fetchone()
        audit = conn.execute("SELECT count(*) FROM gpulab_audit").fetchone()[0]
    return teams, profiles, prices, row, audit


# Every admin endpoint, with a request that would succeed for an admin.
ENDPOINTS = [
    ("GET", "/gpulab/teams", None),
    ("POST", "/gpulab/teams", {"name": "matrix", "guarantee": 1, "burst": 1}),
    ("GET", "/gpulab/teams/vision", None),
    ("PATCH", "/gpulab/teams/vision", {"burst": "1"}),
    ("DELETE", "/gpulab/teams/matrix", None),
    ("GET", "/gpulab/profiles", None),
    ("POST", "/gpulab/profiles", {"slug": "matrix-p", "gpus": 0.25}),
    ("GET", "/gpulab/profiles/matrix-p", None),
    ("PATCH", "/gpulab/profiles/matrix-p", {"description": "edited"}),
    ("POST", "/gpulab/profiles/matrix-p/retire", None),
    ("POST", "/gpulab/profiles/matrix-p/restore", None),
    ("GET", "/gpulab/prices", None),
    ("PUT", "/gpulab/prices", {"prices": {"H100-80GB": 2.5, "*": 1.0}}),
    ("GET", "/gpulab/usage", None),
    ("GET", "/gpulab/usage.csv", None),
    ("GET", "/gpulab/audit", None),
]
ADMIN_STATUS = {"GET": 200, "POST": 201, "PATCH": 200, "DELETE": 204, "PUT": 200}


@pytest.mark.parametrize("caller", ["ordinary-user", "token-without-scope", "service-without-scope", "anonymous"])
@pytest.mark.parametrize("method, path, body", ENDPOINTS, ids=[f"{m} {p}" for m, p, _ in ENDPOINTS])
def test_non_admin_callers_are_refused_and_change_nothing(hub, tokens, caller, method, path, body):
    before = snapshot(hub)
    headers = {} if caller != "anonymous" else {"Authorization": ""}
    r = hub.api(method, path, token=tokens.get(caller), json=body, headers=headers)
    assert r.status_code == 403, (caller, r.status_code, r.text)
    assert r.headers["Content-Type"].startswith("application/json")
    assert "message" in r.json()
    assert snapshot(hub) == before


@pytest.mark.parametrize("caller", ["admin-user", "admin-service"])
def test_admins_may_call_every_endpoint(hub, tokens, caller):
    suffix = caller.split("-")[1]  # fresh names per caller: profiles are retired, never deleted
    for method, path, body in ENDPOINTS:
        path = path.replace("matrix", f"matrix{suffix}")
        if body and isinstance(body.get("name") or body.get("slug"), str):
            body = {
                k: (v.replace("matrix", f"matrix{suffix}") if k in ("name", "slug") else v) for k, v in body.items()
            }
        r = hub.api(method, path, token=tokens[caller], json=body)
        expected = 200 if path.endswith(("/retire", "/restore")) else ADMIN_STATUS[method]
        assert r.status_code == expected, (caller, method, path, r.status_code, r.text)
    assert hub.api("POST", f"/gpulab/profiles/matrix{suffix}-p/retire").status_code == 200
    r = hub.api("GET", "/gpulab/audit", params={"target": f"matrix{suffix}"})
    assert [e["action"] for e in r.json()["entries"]] == ["team.delete", "team.create"]
    actor = "admin" if caller == "admin-user" else "service:test-admin"
    assert {e["actor"] for e in r.json()["entries"]} == {actor}


def test_admin_page_needs_the_admin_scope(hub, tokens):
    # Pages take browser logins, not tokens (JupyterHub's rule for every page): any token gets
    # the login redirect, never the page.
    for caller, token in tokens.items():
        r = requests.get(
            hub.url + "/hub/gpulab/admin",
            headers={"Authorization": f"token {token}"},
            timeout=30,
            allow_redirects=False,
        )
        assert r.status_code == 302 and "/hub/login" in r.headers["Location"], caller
    alice = hub.login("alice")
    r = alice.get(hub.url + "/hub/gpulab/admin", timeout=30)
    assert r.status_code == 403
    assert "GPU admin" not in alice.get(hub.url + "/hub/home", timeout=30).text
    anonymous = requests.get(hub.url + "/hub/gpulab/admin", timeout=30, allow_redirects=False)
    assert anonymous.status_code == 302 and "/hub/login" in anonymous.headers["Location"]
    admin = hub.login("admin")
    home = admin.get(hub.url + "/hub/home", timeout=30).text
    assert 'id="gpulab-admin-link"' in home and "/hub/gpulab/admin" in home
    page = admin.get(hub.url + "/hub/gpulab/admin", timeout=30)
    assert page.status_code == 200
    assert 'id="team-form-vision"' in page.text and "<svg" in page.text
    assert "jupyterhub-logo" in page.text  # the hub's own page frame


def test_team_lifecycle_is_applied_and_audited(hub):
    r = hub.api(
        "POST",
        "/gpulab/teams",
        json={
            "name": "audio",
            "display_name": "Audio",
            "users": ["bob"],
            "groups": ["researchers"],
            "guarantee": "0.25",
            "burst": 0.5,
            "per_user_cap": 0.5,
            "allowed_profiles": ["h100-quarter"],
            "namespace": "team-audio",
        },
    )
    assert r.status_code == 201, r.text
    team = r.json()
    assert (team["guarantee_milli"], team["burst_milli"], team["per_user_cap_milli"]) == (250, 500, 500)
    assert any(t["name"] == "audio" for t in hub.me("bob")["teams"])  # live, no restart

    r = hub.api("PATCH", "/gpulab/teams/audio", json={"name": "speech", "burst": "0.75"})
    assert r.status_code == 200, r.text
    assert r.json()["name"] == "speech" and r.json()["burst_milli"] == 750
    bob_teams = {t["name"]: t for t in hub.me("bob")["teams"]}
    assert "audio" not in bob_teams and bob_teams["speech"]["burst_milli"] == 750

    r = hub.api("PATCH", "/gpulab/teams/speech", json={"users": ["bob", "carol"], "per_user_cap": None})
    assert r.status_code == 200 and r.json()["per_user_cap_milli"] is None
    assert any(t["name"] == "speech" for t in hub.me("carol")["teams"])

    entries = hub.api("GET", "/gpulab/audit", params={"limit": 5}).json()["entries"]
    actions = [e["action"] for e in entries]
    assert actions[:3] == ["team.update", "team.rename", "team.create"]
    rename = entries[1]
    assert rename["actor"] == "service:test-admin" and rename["target"] == "audio -> speech"
    assert rename["old"]["name"] == "audio" and rename["new"]["name"] == "speech"
    assert rename["old"]["burst"] == "0.5" and rename["new"]["burst"] == "0.75"
    assert entries[0]["old"]["users"] == ["bob"] and entries[0]["new"]["users"] == ["bob", "carol"]

    assert hub.api("DELETE", "/gpulab/teams/speech").status_code == 204
    assert all(t["name"] != "speech" for t in hub.api("GET", "/gpulab/teams").json()["teams"])
    assert all(t["name"] != "speech" for t in hub.me("carol")["teams"])
    assert hub.api("GET", "/gpulab/audit", params={"limit": 1}).json()["entries"][0]["action"] == "team.delete"


BAD_EDITS = [
    ("PATCH", "/gpulab/teams/vision", {"guarantee": -1}, 400, "cannot be negative"),
    ("PATCH", "/gpulab/teams/vision", {"burst": "1.0005"}, 400, "finer than 1/1000"),
    ("PATCH", "/gpulab/teams/vision", {"guarantee": 0.0001}, 400, "finer than 1/1000"),
    ("PATCH", "/gpulab/teams/vision", {"burst": "0.25"}, 400, "below the guarantee"),
    ("PATCH", "/gpulab/teams/vision", {"allowed_profiles": ["h100-1", "h100-9"]}, 400, "unknown profile 'h100-9'"),
    ("PATCH", "/gpulab/teams/vision", {"guarantee": True}, 400, "expected a number of GPUs"),
    ("PATCH", "/gpulab/teams/vision", {"quota": 3}, 400, "unknown key"),
    ("PATCH", "/gpulab/teams/vision", {"name": "nlp"}, 409, "already exists"),
    ("PATCH", "/gpulab/teams/vision", {"name": "Not A Slug"}, 400, "lowercase"),
    ("PATCH", "/gpulab/teams/vision", {"namespace": "Bad_NS"}, 400, "namespace"),
    ("PATCH", "/gpulab/teams/nobody", {"burst": 1}, 404, "no team"),
    ("POST", "/gpulab/teams", {"name": "nlp", "burst": 1}, 409, "already exists"),
    ("POST", "/gpulab/teams", {"burst": 1}, 400, "needs a 'name'"),
    ("POST", "/gpulab/teams", {"name": "x", "users": "alice"}, 400, "expected a list"),
    ("POST", "/gpulab/profiles", {"slug": "h100-1", "gpus": 1}, 409, "already exists"),
    ("POST", "/gpulab/profiles", {"slug": "odd", "gpus": 1.5}, 400, "whole number of GPUs"),
    ("POST", "/gpulab/profiles", {"slug": "neg", "gpus": -0.5}, 400, "cannot be negative"),
    ("POST", "/gpulab/profiles", {"slug": "pc", "gpus": 1, "priority_class": "vip"}, 400, "unknown priority class"),
    ("POST", "/gpulab/profiles", {"slug": "t", "gpus": 1, "teams": ["ghosts"]}, 400, "unknown team 'ghosts'"),
    ("PATCH", "/gpulab/profiles/h100-1", {"slug": "h100-one"}, 400, "slug cannot change"),
    ("PATCH", "/gpulab/profiles/h100-1", {"gpus": "0.0005"}, 400, "finer than 1/1000"),
    # Larger than this server's whole inventory (2 × H100-80GB): nobody could ever start it.
    ("POST", "/gpulab/profiles", {"slug": "huge", "gpus": 100}, 400, "100 GPUs is more than this server has (2 GPU"),
    (
        "POST",
        "/gpulab/profiles",
        {"slug": "h100-3", "gpus": 3, "gpu_model": "H100-80GB"},
        400,
        "3 GPUs is more than this server has (2 H100-80GB in all), so no user could ever start it; at most 2 here",
    ),
    ("PATCH", "/gpulab/profiles/h100-1", {"gpus": 4}, 400, "4 GPUs is more than this server has"),
    ("POST", "/gpulab/profiles", {"slug": "big", "gpus": 4, "teams": ["vision"]}, 400, "more than this server has"),
    ("PUT", "/gpulab/prices", {"prices": {"H100-80GB": -2}}, 400, "non-negative price"),
    ("PUT", "/gpulab/prices", {"H100-80GB": 2}, 400, "body must be"),
    # A maximum lifetime: a duration longer than zero, whatever the caller sends.
    ("PATCH", "/gpulab/profiles/h100-1", {"max_lifetime": "0s"}, 400, "longer than 0s"),
    ("PATCH", "/gpulab/profiles/h100-1", {"max_lifetime": ["8h"]}, 400, "expected a duration"),
    ("PATCH", "/gpulab/profiles/h100-1", {"max_lifetime": True}, 400, "expected a duration"),
    ("PATCH", "/gpulab/profiles/h100-1", {"max_lifetime": "8" * 5000}, 400, "a duration"),
    ("PATCH", "/gpulab/teams/vision", {"max_lifetime": -60}, 400, "cannot be negative"),
    ("PATCH", "/gpulab/teams/vision", {"max_lifetime": {"h": 8}}, 400, "expected a duration"),
    ("PATCH", "/gpulab/profiles/h100-1/retire", {"retired": True}, 405, ""),
    ("DELETE", "/gpulab/profiles/h100-1", None, 405, ""),
]


@pytest.mark.parametrize(
    "method, path, body, status, message",
    BAD_EDITS,
    ids=[f"{m} {p} {json.dumps(b)[:40]}" for m, p, b, _, _ in BAD_EDITS],
)
def test_bad_edits_get_a_clear_4xx_and_change_nothing(hub, method, path, body, status, message):
    before = snapshot(hub)
    r = hub.api(method, path, json=body)
    assert r.status_code == status, r.text
    assert message in (r.json()["message"] or ""), r.json()
    assert snapshot(hub) == before


@pytest.mark.parametrize(
    "data, status, message",
    [
        (b"x" * (65 * 1024), 413, "larger than"),
        (b"{not json", 400, "not valid JSON"),
        (b"[1, 2]", 400, "JSON object"),
        (b"", 400, "JSON object"),
    ],
)
def test_malformed_bodies_are_refused(hub, data, status, message):
    before = snapshot(hub)
    r = hub.api("PATCH", "/gpulab/teams/vision", data=data, headers={"Content-Type": "application/json"})
    assert r.status_code == status, r.text
    assert message in r.json()["message"]
    assert snapshot(hub) == before


def test_csrf_less_form_post_from_a_browser_session_is_refused(hub):
    admin = hub.login("admin")
    before = snapshot(hub)
    # A cross-site form: cookies ride along, the XSRF token does not.
    r = admin.post(hub.url + "/hub/api/gpulab/teams", data={"name": "evil", "burst": "8"}, timeout=30)
    assert r.status_code == 403, r.text
    r = admin.patch(hub.url + "/hub/api/gpulab/teams/vision", json={"burst": "8"}, timeout=30)
    assert r.status_code == 403, r.text
    assert snapshot(hub) == before
    # The page's way: the same session with the XSRF token in a header works.
    xsrf = admin.cookies.get("_xsrf", path="/hub/")
    r = admin.patch(
        hub.url + "/hub/api/gpulab/teams/vision", json={"burst": "1"}, timeout=30, headers={"X-XSRFToken": xsrf}
    )
    assert r.status_code == 200, r.text


def test_quota_edit_applies_to_the_next_spawn(hub):
    assert hub.api("PATCH", "/gpulab/teams/vision", json={"burst": "0.75", "guarantee": "0.5"}).status_code == 200
    r = hub.api("POST", "/users/bob/servers/big", json={"team": "vision", "profile": "h100-1"})
    assert r.status_code == 403, r.text
    assert "team vision holds 0 of its 0.75 GPU burst limit; this request needs 1" in r.json()["message"]
    bob = hub.login("bob")
    page = html.unescape(hub.spawn_page(bob, "x", "bob").text)
    assert "0.75 of 0.75 GPUs free for team vision" in page
    assert hub.api("PATCH", "/gpulab/teams/vision", json={"burst": "1"}).status_code == 200
    assert "big" not in hub.api("GET", "/users/bob").json()["servers"]


def test_delete_and_rename_are_refused_while_the_team_holds_gpus(hub):
    r = hub.api("POST", "/users/alice/server", json={"team": "vision", "profile": "h100-half"})
    assert r.status_code in (201, 202), r.text
    hub.wait_server("alice")
    before = snapshot(hub)
    r = hub.api("DELETE", "/gpulab/teams/vision")
    assert r.status_code == 409
    assert "cannot delete team vision: it holds 0.5 GPUs in 1 workload(s) (notebook:alice/)" in r.json()["message"]
    r = hub.api("PATCH", "/gpulab/teams/vision", json={"name": "vision2"})
    assert r.status_code == 409 and "cannot rename team vision" in r.json()["message"]
    assert snapshot(hub) == before


def test_retired_profile_keeps_running_but_is_not_offered(hub):
    assert hub.wait_server("alice")  # from the previous test, on h100-half
    r = hub.api("POST", "/gpulab/profiles/h100-half/retire")
    assert r.status_code == 200 and r.json()["retired"] is True
    assert hub.wait_server("alice")["ready"]
    assert [w["profile"] for w in hub.holdings() if w["key"] == "notebook:alice/"] == ["h100-half"]
    bob = hub.login("bob")
    page = hub.spawn_page(bob, "x", "bob").text
    assert 'value="vision:h100-half"' not in page and 'value="vision:h100-quarter"' in page
    r = hub.api("POST", "/users/bob/servers/x", json={"team": "vision", "profile": "h100-half"})
    assert r.status_code == 403 and "retired" in r.json()["message"]
    assert hub.api("POST", "/gpulab/profiles/h100-half/restore").json()["retired"] is False
    assert 'value="vision:h100-half"' in hub.spawn_page(bob, "x", "bob").text
    entries = hub.api("GET", "/gpulab/audit", params={"target": "h100-half"}).json()["entries"]
    assert [e["action"] for e in entries[:2]] == ["profile.restore", "profile.retire"]
    assert entries[1]["old"].get("retired") is None and entries[1]["new"]["retired"] is True


def test_profile_create_and_edit(hub):
    r = hub.api(
        "POST",
        "/gpulab/profiles",
        json={
            "slug": "h100-3q",
            "display_name": "0.75 × H100",
            "gpus": "0.75",
            "gpu_model": "H100-80GB",
            "priority_class": "batch",
            "idle_timeout": "20m",
        },
    )
    assert r.status_code == 201, r.text
    assert r.json()["gpu_milli"] == 750 and r.json()["used_by_teams"] == ["nlp"]  # vision lists its profiles
    r = hub.api(
        "PATCH",
        "/gpulab/teams/vision",
        json={"allowed_profiles": ["cpu", "h100-quarter", "h100-half", "h100-1", "h100-3q"]},
    )
    assert r.status_code == 200
    r = hub.api("PATCH", "/gpulab/profiles/h100-3q", json={"gpus": "0.5", "description": "now half"})
    assert r.status_code == 200 and r.json()["gpu_milli"] == 500
    page = hub.spawn_page(hub.login("bob"), "y", "bob").text
    assert 'value="vision:h100-3q"' in page
    assert "maximum lifetime" not in page
    r = hub.api("PATCH", "/gpulab/profiles/h100-3q", json={"max_lifetime": "8h"})
    assert r.status_code == 200, r.text
    page = hub.spawn_page(hub.login("bob"), "y", "bob").text
    card = page[page.index('data-choice="vision:h100-3q"') :]
    # This hub runs no GPU idle culler: the card names the lifetime, and that nothing enforces it.
    assert "maximum lifetime 8h, not enforced</span>" in card[: card.index("</label>")]
    r = hub.api("PATCH", "/gpulab/profiles/h100-3q", json={"max_lifetime": None})  # back to no limit
    assert r.status_code == 200, r.text
    assert "maximum lifetime 8h" not in hub.spawn_page(hub.login("bob"), "y", "bob").text


def test_a_new_profile_naming_its_teams_is_offered_to_them_only(hub):
    """vision lists its allowed profiles, nlp allows all: naming vision adds the profile to vision's
    list (else nobody in vision could start it) and keeps it from nlp."""
    r = hub.api("POST", "/gpulab/profiles", json={"slug": "h100-for-vision", "gpus": "0.25", "teams": ["vision"]})
    assert r.status_code == 201, r.text
    assert r.json()["used_by_teams"] == ["vision"]
    assert "h100-for-vision" in hub.api("GET", "/gpulab/teams/vision").json()["allowed_profiles"]
    entries = hub.api("GET", "/gpulab/audit", params={"target": "h100-for-vision"}).json()["entries"]
    assert [e["action"] for e in entries] == ["profile.create"], entries


def test_usage_gpu_hours_cost_reclaims_csv(hub):
    held_since = time.time()
    assert hub.wait_server("alice")
    time.sleep(2)
    r = hub.api("GET", "/gpulab/usage", params={"period": "24h"})
    assert r.status_code == 200, r.text
    report = r.json()
    vision = next(t for t in report["teams"] if t["team"] == "vision")
    # alice has held 0.5 GPU since the delete test; bounded by this test module's lifetime.
    assert 0 < vision["gpu_hours"] < 0.5 * 600 / 3600
    assert vision["in_quota_gpu_hours"] == vision["gpu_hours"] and vision["burst_gpu_hours"] == 0
    assert vision["cost"] == pytest.approx(vision["gpu_hours"] * 2.5, rel=1e-3, abs=1e-4)
    assert [u["user"] for u in vision["users"]] == ["alice"]
    # Clock-hour buckets: the hour the period starts in, up to the one it ends in.
    assert report["bucket_seconds"] == 3600 and len(report["buckets"]) in (24, 25)
    assert all(b[14:19] == "00:00" for b in report["buckets"]) and report["time_zone"] == "UTC"
    assert sum(vision["series"]) == pytest.approx(vision["gpu_hours"], rel=1e-3, abs=1e-6)
    now = {t["team"]: t for t in report["now"]}
    assert now["vision"]["held_milli"] == 500 and now["vision"]["users"][0]["user"] == "alice"
    assert vision["utilisation_pct"] is None  # no NVML here: no number rather than a guess
    assert report["sources"]["reclaims"] == "gpulab_idle_events"
    assert vision["idle_gpu_hours_before_reclaim"] == 0 and vision["gpu_hours_freed"] == 0
    assert vision["jobs"] == {}

    # The culler reports a reclaim through its own API (hub_config/api/idle.py), as it does in
    # production: a warning first (zero grace here), then the reclaim; the usage report reads
    # its records from gpulab's database.
    r = hub.api(
        "POST",
        "/gpulab/idle/warnings",
        json={"user": "bob", "server": "gone", "grace_seconds": 0, "gpu_milli": 1000, "reason": "GPU idle for 1h"},
    )
    assert r.status_code == 201, r.text
    r = hub.api(
        "POST",
        "/gpulab/idle/reclaims",
        json={
            "user": "bob",
            "server": "gone",
            "team": "vision",
            "profile": "h100-1",
            "gpu_milli": 1000,
            "idle_gpu_hours": 1.25,
            "reason": "GPU idle for 1h",
        },
    )
    assert r.status_code == 201, r.text
    report = hub.api("GET", "/gpulab/usage", params={"period": "24h"}).json()
    vision = next(t for t in report["teams"] if t["team"] == "vision")
    assert vision["idle_gpu_hours_before_reclaim"] == 1.25
    assert next(u for u in vision["users"] if u["user"] == "bob")["idle_gpu_hours_before_reclaim"] == 1.25
    assert report["total"]["idle_gpu_hours_before_reclaim"] == 1.25
    # Freed: 1 GPU from the reclaim until now (bob holds no GPU since): more than 0, less than a minute.
    assert 0 < report["total"]["gpu_hours_freed"] < 1 / 60

    r = hub.api("GET", "/gpulab/usage.csv", params={"period": "7d"})
    assert r.status_code == 200 and r.headers["Content-Type"].startswith("text/csv")
    rows = [line.split(",") for line in r.text.strip().splitlines()]
    assert rows[0][:5] == ["start", "end", "team", "user", "gpu_hours"]
    alice_row = next(row for row in rows if row[2] == "vision" and row[3] == "alice")
    assert float(alice_row[4]) > 0 and alice_row[rows[0].index("held_milli_now")] == "500"
    assert time.time() - held_since < 600


@pytest.mark.parametrize(
    "params",
    [
        {"period": "-1h"},
        {"period": "soon"},
        {"period": "0s"},
        {"period": "400d"},
        {"start": "yesterday"},
        {"start": "2026-01-02", "end": "2026-01-01"},
        {"start": "2026-01-01", "period": "1d"},
    ],
)
def test_bad_usage_periods_are_refused(hub, params):
    r = hub.api("GET", "/gpulab/usage", params=params)
    assert r.status_code == 400, r.text


def test_prometheus_gauges_on_the_hub_metrics_endpoint(hub, tokens):
    r = requests.get(hub.url + "/hub/metrics", headers={"Authorization": f"token {tokens['admin-user']}"}, timeout=30)
    assert r.status_code == 200, r.text
    text = r.text
    assert 'gpulab_team_gpu_milli{state="in-quota",team="vision"} 500.0' in text
    assert 'gpulab_team_gpu_milli{state="over-quota",team="vision"} 0.0' in text
    assert 'gpulab_team_gpu_milli{state="reserved",team="vision"} 0.0' in text
    assert 'gpulab_team_guarantee_milli{team="vision"} 500.0' in text
    assert 'gpulab_team_burst_milli{team="nlp"} 2000.0' in text
    assert 'gpulab_user_gpu_milli{team="vision",user="alice"} 500.0' in text
    assert 'gpulab_profile_retired{profile="h100-half"} 0.0' in text
    assert 'gpulab_team_gpu_hours{quota="in-quota",team="vision"}' in text
    assert "jupyterhub_" in text  # the hub's own metrics are still there
