"""Admin edits and usage history survive hub restarts; the config file's role for GitOps."""

from __future__ import annotations

import sqlite3

import pytest

from tests.support.hub import RunningHub

CATALOG = """
inventory:
  - {model: H100-80GB, count: 1, memory_mib: 81559}
prices: {H100-80GB: 3.0}
profiles:
  - {slug: h100-quarter, gpus: 0.25, gpu_model: H100-80GB}
  - {slug: h100-half, gpus: 0.5, gpu_model: H100-80GB}
teams:
  - {name: vision, users: [alice, bob], guarantee: 0.5, burst: 1}
"""


@pytest.fixture(scope="module")
def hub(start_hub):
    return start_hub(CATALOG)


def intervals(hub: RunningHub, key: str) -> list[tuple]:
    with sqlite3.connect(hub.state_dir / "gpulab.sqlite") as conn:
        return conn.execute(
            "SELECT started_at, ended_at, gpu_milli FROM gpulab_usage WHERE key = ? ORDER BY id", (key,)
        ).fetchall()


def vision(hub: RunningHub) -> dict:
    return hub.api("GET", "/gpulab/teams/vision").json()


def test_edits_survive_a_restart(hub):
    r = hub.api("PATCH", "/gpulab/teams/vision", json={"burst": "0.75", "users": ["alice", "bob", "carol"]})
    assert r.status_code == 200, r.text
    r = hub.api("POST", "/gpulab/profiles/h100-half/retire")
    assert r.status_code == 200
    audit_before = hub.api("GET", "/gpulab/audit").json()
    hub.restart()
    assert vision(hub)["burst_milli"] == 750
    assert "carol" in vision(hub)["users"]
    assert hub.api("GET", "/gpulab/profiles/h100-half").json()["retired"] is True
    assert hub.api("GET", "/gpulab/audit").json() == audit_before
    # ... and are enforced after the restart.
    r = hub.api("POST", "/users/bob/servers/big", json={"team": "vision", "profile": "h100-half"})
    assert r.status_code == 403 and "retired" in r.json()["message"]
    assert hub.api("POST", "/gpulab/profiles/h100-half/restore").status_code == 200


def test_running_workload_is_counted_once_across_a_restart(hub):
    r = hub.api("POST", "/users/alice/server", json={"team": "vision", "profile": "h100-half"})
    assert r.status_code in (201, 202), r.text
    hub.wait_server("alice")
    first = intervals(hub, "notebook:alice/")
    assert len(first) == 1 and first[0][1] is None and first[0][2] == 500
    hub.restart()
    assert [w["key"] for w in hub.holdings()] == ["notebook:alice/"]  # re-adopted
    assert intervals(hub, "notebook:alice/") == first  # same open interval, not a second one
    usage = hub.api("GET", "/gpulab/usage", params={"period": "24h"}).json()
    v = next(t for t in usage["teams"] if t["team"] == "vision")
    assert 0 < v["gpu_hours"] < 0.5 * 300 / 3600
    assert v["cost"] == pytest.approx(v["gpu_hours"] * 3.0, rel=1e-3, abs=1e-4)
    assert hub.api("DELETE", "/users/alice/server").status_code in (202, 204)
    hub.wait_server("alice", ready=False)
    closed = intervals(hub, "notebook:alice/")
    assert len(closed) == 1 and closed[0][0] == first[0][0] and closed[0][1] is not None


def test_the_database_wins_over_a_changed_file_until_reseeded(hub):
    hub.catalog_path.write_text(CATALOG.replace("burst: 1}", "burst: 0.5}"))
    hub.restart()
    assert vision(hub)["burst_milli"] == 750  # the admin's edit, not the file's 0.5
    assert "the database wins" in hub.log_tail(400)

    original = hub.config_path.read_text()
    hub.config_path.write_text(original + "\nc.GPULabCatalogStore.reseed_from_file = True\n")
    try:
        hub.restart()
    finally:
        hub.config_path.write_text(original)
    assert vision(hub)["burst_milli"] == 500
    assert vision(hub)["users"] == ["alice", "bob"]
    latest = hub.api("GET", "/gpulab/audit", params={"limit": 1}).json()["entries"][0]
    assert latest["action"] == "catalog.reseed" and latest["actor"] == "config-file"

    # With reseed switched off again, a new edit persists as before.
    hub.restart()
    assert vision(hub)["burst_milli"] == 500
    assert hub.api("PATCH", "/gpulab/teams/vision", json={"burst": "1"}).status_code == 200


def test_file_mode_makes_the_file_the_only_source(hub):
    original = hub.config_path.read_text()
    hub.config_path.write_text(original + "\nc.GPULabCatalogStore.source = 'file'\n")
    try:
        hub.restart()
        assert vision(hub)["burst_milli"] == 500  # the file's value, the admin's 1 GPU is gone
        r = hub.api("PATCH", "/gpulab/teams/vision", json={"burst": "2"})
        assert r.status_code == 409 and "managed by the config file" in r.json()["message"]
        assert vision(hub)["burst_milli"] == 500
        assert hub.api("GET", "/gpulab/teams").json()["source"] == "file"
    finally:
        hub.config_path.write_text(original)
