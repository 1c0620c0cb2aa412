"""GPU pools and departments through a real running hub (single server): admission refusals in
words, the spawn page's pool line, the quota tree API and admin page, and bad input on the
pool and department endpoints (a clear 4xx, nothing changed)."""

from __future__ import annotations

import html
import json

import pytest

from tests.support.catalogs import H100_HALF, H100_ONE, H100_QUARTER, h100_inventory
from tests.support.hub import ADMIN_AND_CULLER_SCOPES

CATALOG = (
    h100_inventory(2)
    + "pools:\n  - {name: h100, gpu_model: H100-80GB}\n"
    + "departments:\n  - {name: research, guarantee: 1, burst: 1.25}\n"
    + "profiles:\n"
    + H100_QUARTER
    + H100_HALF
    + H100_ONE
    + """teams:
  - {name: vision, users: [alice, bob], guarantee: 0.5, burst: 2, department: research, fair_share_weight: 2,
     pools: {h100: {guarantee: 0.25, burst: 0.75}}}
  - {name: nlp, users: [carol], guarantee: 0.5, burst: 1, department: research}
  - {name: ops, users: [otto], guarantee: 0.25, burst: 2}
"""
)


@pytest.fixture(scope="module")
def hub(start_hub):
    return start_hub(CATALOG, admin_scopes=ADMIN_AND_CULLER_SCOPES)


def snapshot(hub) -> tuple:
    return tuple(
        hub.api("GET", path).json()
        for path in ("/gpulab/teams", "/gpulab/departments", "/gpulab/pools", "/gpulab/tree")
    )


def test_pool_quota_and_department_bound_refuse_spawns_in_words(hub):
    r = hub.api("POST", "/users/alice/server", json={"team": "vision", "profile": "h100-half"})
    assert r.status_code in (201, 202), r.text
    hub.wait_server("alice")
    # vision's H100 pool allows 0.75: another 0.5 is refused in words, though its total (2) has room
    r = hub.api("POST", "/users/bob/servers/more", json={"team": "vision", "profile": "h100-half"})
    assert r.status_code == 403, r.text
    assert (
        "team vision holds 0.5 of its 0.75 GPU burst limit in pool h100; this request needs 0.5" in r.json()["message"]
    )
    # the spawn page says what is free in the pool
    bob = hub.login("bob")
    page = html.unescape(hub.spawn_page(bob, "x", "bob").text)
    assert "0.25 of 0.75 H100-80GB free for team vision (1.5 of 2 GPUs in all)" in page
    # carol's team nlp is in the same department (burst 1.25, vision holds 0.5): 1 GPU is refused
    r = hub.api("POST", "/users/carol/server", json={"team": "nlp", "profile": "h100-1"})
    assert r.status_code == 403, r.text
    assert "department research holds 0.5 of its 1.25 GPU burst limit; this request needs 1" in r.json()["message"]
    # the tree shows held / guaranteed / borrowed per node
    tree = hub.api("GET", "/gpulab/tree").json()
    (research,) = tree["departments"]
    assert (research["held_milli"], research["guarantee_milli"], research["burst_milli"]) == (500, 1000, 1250)
    vision = next(t for t in research["teams"] if t["name"] == "vision")
    assert vision["held_milli"] == 500 and vision["borrowed_milli"] == 0
    assert vision["pools"] == [
        {
            "pool": "h100",
            "guarantee_milli": 250,
            "burst_milli": 750,
            "held_milli": 500,
            "borrowed_milli": 250,
            "words": "holds 0.5 of 0.25 guaranteed (burst 0.75), borrows 0.25",
        }
    ]
    assert [t["name"] for t in tree["teams"]] == ["ops"]
    # the usage report says what each team holds per pool, and its GPU-hours per pool
    usage = hub.api("GET", "/gpulab/usage?period=24h").json()
    now = next(t for t in usage["now"] if t["team"] == "vision")
    assert now["held_by_pool_milli"] == {"h100": 500}
    assert now["pools"] == [{"pool": "h100", "guarantee_milli": 250, "burst_milli": 750, "held_milli": 500}]
    period = next(t for t in usage["teams"] if t["team"] == "vision")
    assert set(period["gpu_hours_by_pool"]) == {"h100"} and period["gpu_hours_by_pool"]["h100"] > 0
    admin = hub.login("admin")
    page = admin.get(hub.url + "/hub/gpulab/admin", timeout=30)
    assert page.status_code == 200
    assert 'id="gpulab-tree-table"' in page.text and "Department research" in page.text
    hub.api("DELETE", "/users/alice/server")


def test_the_what_if_replay_follows_pool_and_department_proposals(hub):
    """Alice's session of the first test (0.5 H100, profile h100-half) replayed under proposals."""
    teams_before = hub.api("GET", "/gpulab/teams").json()
    today = hub.api("GET", "/gpulab/whatif?days=1").json()
    assert today["sessions"] >= 1 and today["current"]["refused"]["quota"] == 0
    tight_pool = {"quotas": {"vision": {"pools": {"h100": {"guarantee": 0.25, "burst": 0.25}}}}}
    r = hub.api("POST", "/gpulab/whatif", json={"days": 1, **tight_pool})
    assert r.status_code == 200, r.text
    doc = r.json()
    assert doc["proposed"]["refused"]["quota"] == 1
    assert doc["proposal"]["quotas"]["vision"]["pools"] == {"h100": {"guarantee_milli": 250, "burst_milli": 250}}
    tight_dept = {"departments": {"research": {"guarantee": 0.25, "burst": 0.25}}}
    r = hub.api("POST", "/gpulab/whatif", json={"days": 1, **tight_dept})
    assert r.status_code == 200, r.text
    assert r.json()["proposed"]["refused"]["quota"] == 1
    for body, words in (
        ({"quotas": {"vision": {"pools": {"h200": {"burst": 1}}}}}, "quotas.vision.pools.h200: unknown pool 'h200'"),
        ({"quotas": {"vision": {"pools": {"h100": {"burst": "x"}}}}}, "quotas.vision.pools.h100.burst"),
        ({"departments": {"ghost": {"burst": 1}}}, "no department named 'ghost'"),
        ({"departments": {"research": {"guarantee": 2, "burst": 1}}}, "below the guarantee"),
        ({"departments": ["research"]}, "departments: expected"),
    ):
        r = hub.api("POST", "/gpulab/whatif", json=body)
        assert r.status_code == 400 and words in r.json()["message"], r.text
    assert hub.api("GET", "/gpulab/teams").json() == teams_before  # a what-if saves nothing


BAD = [
    (
        "PATCH",
        "/gpulab/teams/vision",
        {"pools": {"h200": {"guarantee": 1}}},
        400,
        "teams.vision.pools.h200: unknown pool 'h200'",
    ),
    (
        "PATCH",
        "/gpulab/teams/vision",
        {"pools": {"h100": {"guarantee": "lots"}}},
        400,
        "teams.vision.pools.h100.guarantee",
    ),
    ("PATCH", "/gpulab/teams/vision", {"pools": "h100"}, 400, "expected a mapping of pool name"),
    ("PATCH", "/gpulab/teams/vision", {"department": "reserch"}, 400, "did you mean 'research'"),
    ("PATCH", "/gpulab/teams/vision", {"fair_share_weight": 1e9}, 400, "fair_share_weight"),
    ("PATCH", "/gpulab/teams/vision", {"fair_share_weight": "2"}, 400, "fair_share_weight"),
    ("PATCH", "/gpulab/departments/research", {"guarantee": 0.25}, 400, "less than its teams' guarantees"),
    ("PATCH", "/gpulab/departments/research", {"burst": 0.5}, 400, "below the guarantee"),
    ("PATCH", "/gpulab/departments/research", {"name": "other"}, 400, "cannot be renamed"),
    ("PATCH", "/gpulab/departments/research", {"teams": ["ops"]}, 400, "unknown key"),
    ("PATCH", "/gpulab/departments/nope", {"burst": 2}, 404, "no department 'nope'"),
    ("DELETE", "/gpulab/departments/research", None, 409, "team vision, team nlp use it"),
    ("POST", "/gpulab/departments", {"name": "research"}, 409, "already exists"),
    ("POST", "/gpulab/departments", {"name": "Bad Name"}, 400, "department name"),
    ("POST", "/gpulab/departments", {"guarantee": 1}, 400, "needs a 'name'"),
    ("POST", "/gpulab/departments", {"name": "x", "pools": {"tpu": {"guarantee": 1}}}, 400, "unknown pool 'tpu'"),
    ("POST", "/gpulab/pools", {"name": "empty"}, 400, "names a gpu_model"),
    ("POST", "/gpulab/pools", {"name": "a", "gpu_model": "T4", "sharing": "magic"}, 400, "unknown sharing backend"),
    ("POST", "/gpulab/pools", {"name": "a", "node_labels": ["x"]}, 400, "node_labels"),
    ("POST", "/gpulab/pools", {"name": "x" * 70, "gpu_model": "T4"}, 400, "pool name"),
    ("DELETE", "/gpulab/pools/h100", None, 409, "team vision use it"),
    ("PATCH", "/gpulab/pools/h100", {"gpu_model": None, "node_labels": None}, 400, "names a gpu_model"),
]


@pytest.mark.parametrize(
    "method, path, body, status, message", BAD, ids=[f"{m} {p} {json.dumps(b)[:40]}" for m, p, b, _, _ in BAD]
)
def test_bad_pool_and_department_edits_get_a_clear_4xx_and_change_nothing(hub, method, path, body, status, message):
    before = snapshot(hub)
    r = hub.api(method, path, json=body)
    assert r.status_code == status, r.text
    assert message in (r.json()["message"] or ""), r.json()
    assert snapshot(hub) == before


def test_oversized_and_malformed_bodies_are_refused(hub):
    before = snapshot(hub)
    for data, status in ((b"x" * (65 * 1024), 413), (b"{not json", 400), (b"[1]", 400)):
        r = hub.api("PATCH", "/gpulab/departments/research", data=data, headers={"Content-Type": "application/json"})
        assert r.status_code == status, r.text
    assert snapshot(hub) == before


def test_a_department_and_a_pool_can_be_created_edited_and_deleted(hub):
    r = hub.api("POST", "/gpulab/pools", json={"name": "serve", "node_labels": {"pool": "serve"}})
    assert r.status_code == 201, r.text
    r = hub.api("POST", "/gpulab/departments", json={"name": "infra", "guarantee": 1, "burst": 2})
    assert r.status_code == 201, r.text
    r = hub.api("PATCH", "/gpulab/teams/ops", json={"department": "infra", "pools": {"serve": {"burst": 1}}})
    assert r.status_code == 200, r.text
    tree = hub.api("GET", "/gpulab/tree").json()
    infra = next(d for d in tree["departments"] if d["name"] == "infra")
    assert [t["name"] for t in infra["teams"]] == ["ops"]
    assert hub.api("DELETE", "/gpulab/departments/infra").status_code == 409
    assert hub.api("PATCH", "/gpulab/teams/ops", json={"department": None, "pools": None}).status_code == 200
    assert hub.api("DELETE", "/gpulab/departments/infra").status_code == 204
    assert hub.api("DELETE", "/gpulab/pools/serve").status_code == 204
    audit = hub.api("GET", "/gpulab/audit").json()["entries"]
    assert {"department.create", "department.delete", "pool.create", "pool.delete"} <= {e["action"] for e in audit}
