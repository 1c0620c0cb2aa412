"""A GPU server's maximum lifetime end to end: a real JupyterHub with real single-user servers,
the culler as a hub-managed service (``python -m idle_culler``), a real Prometheus scraping a
fake dcgm-exporter (the only stand-in: there is no GPU here).

A busy server of a profile with ``max_lifetime`` is warned once its session is that old, and
stopped after the grace; "keep my GPU" pressed before reaches no further than the lifetime,
pressed after is refused (409, with the sentence), and the hub's re-check of the culler's
claim agrees. A busy server of a profile with a long lifetime is left alone.
"""

from __future__ import annotations

import json
import time

import pytest

from tests.support.culler_service import culler_service_config
from tests.support.dcgm_fake_exporter import FakeDCGMExporter, RunningPrometheus
from tests.support.hub import RunningHub, free_port

NODE = "gpulab-test-node"
LIFETIME = 20  # the h100-life profile's max_lifetime
GRACE = 3
DEVICES = 3

CATALOG = f"""
inventory:
  - {{model: H100-80GB, count: {DEVICES}, memory_mib: 81559}}
profiles:
  - {{slug: h100-life, display_name: "1 × H100, {LIFETIME}s", gpus: 1, gpu_model: H100-80GB,
      idle_timeout: 4s, max_lifetime: {LIFETIME}s}}
  - {{slug: h100-long, display_name: "1 × H100, 1h", gpus: 1, gpu_model: H100-80GB, idle_timeout: 4s, max_lifetime: 1h}}
teams:
  - {{name: vision, users: [alice, bob, carol], guarantee: {DEVICES}, burst: {DEVICES}}}
"""


@pytest.fixture(scope="module")
def exporter():
    e = FakeDCGMExporter(hostname=NODE, hostname_label="Hostname").start()
    for i in range(DEVICES):
        e.set_gpu(i, 100)  # every GPU busy throughout
    yield e
    e.stop()


@pytest.fixture(scope="module")
def hub(exporter, tmp_path_factory):
    prometheus = RunningPrometheus(tmp_path_factory.mktemp("prom"), [f"127.0.0.1:{exporter.port}"]).start()
    h = RunningHub(
        tmp_path_factory.mktemp("lifetime-hub"),
        CATALOG,
        extra_config=culler_service_config(
            prometheus.url,
            free_port(),
            node=NODE,
            grace=GRACE,
            keepalive_max_uses=3,
            keepalive_extends_seconds=3600,
        ),
    )
    try:
        h.start()
        yield h
    finally:
        h.close()
        prometheus.stop()


def spawn(hub: RunningHub, user: str, name: str, profile: str) -> dict:
    r = hub.api("POST", f"/users/{user}/servers/{name}", data=json.dumps({"team": "vision", "profile": profile}))
    assert r.status_code in (201, 202), r.text
    return hub.wait_server(user, name)


def running(hub: RunningHub, user: str, name: str) -> bool:
    return name in (hub.api("GET", f"/users/{user}").json().get("servers") or {})


def idle_view(hub: RunningHub, user: str, name: str, token: str) -> dict:
    r = hub.api("GET", "/gpulab/idle", params={"user": user, "server": name}, token=token)
    assert r.status_code == 200, r.text
    return r.json()


def events(hub: RunningHub, user: str, server: str) -> list[dict]:
    r = hub.api("GET", "/gpulab/idle/audit", params={"user": user})
    assert r.status_code == 200, r.text
    return [e for e in r.json()["events"] if e["server"] == server]


def keep(hub: RunningHub, user: str, server: str, token: str):
    return hub.api("POST", "/gpulab/idle/keepalive", token=token, data=json.dumps({"user": user, "server": server}))


def user_token(hub: RunningHub, user: str) -> str:
    r = hub.api("POST", f"/users/{user}/tokens", data=json.dumps({"note": "lifetime test"}))
    assert r.status_code == 201, r.text
    return r.json()["token"]


def poll(what: str, check, hub: RunningHub, timeout: float = 60):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.3)
    raise TimeoutError(f"{what} not reached in {timeout}s\n{hub.log_tail(80)}")


def _ts(iso: str) -> float:
    from idle_culler.targets import parse_time

    value = parse_time(iso)
    assert value is not None, iso
    return value


def test_a_busy_server_past_its_lifetime_is_warned_then_reclaimed_and_keepalive_does_not_save_it(hub):
    alice, bob, carol = (user_token(hub, u) for u in ("alice", "bob", "carol"))
    # bob's first: alice's lifetime runs from her start, and the press below must come within it
    # even when a server takes seconds to start on a loaded machine.
    spawn(hub, "bob", "long", "h100-long")
    old = spawn(hub, "alice", "life", "h100-life")
    ends = _ts(old["started"]) + LIFETIME
    # What the lab's sidebar reads: the lifetime, in seconds and in the idle sentence.
    offered = {p["slug"]: p for t in hub.me("alice")["teams"] for p in t["profiles"]}
    assert offered["h100-life"]["max_lifetime_seconds"] == LIFETIME
    assert f"stopped after {LIFETIME}s, whatever it does" in offered["h100-life"]["idle_policy"]
    assert offered["h100-long"]["max_lifetime_seconds"] == 3600

    # Pressed within the lifetime: granted, but it reaches no further than the lifetime.
    r = keep(hub, "alice", "life", alice)
    assert r.status_code == 200, r.text
    assert _ts(r.json()["keepalive"]["until"]) <= ends + 0.001
    assert keep(hub, "bob", "long", bob).status_code == 200  # an hour, well within bob's lifetime

    warning = poll("alice/life warned", lambda: idle_view(hub, "alice", "life", alice)["warning"], hub)
    assert time.time() >= ends - 0.5  # never before the lifetime (the GPU is busy all along)
    assert warning["reason"] == f"maximum lifetime {LIFETIME}s of profile h100-life reached"
    assert warning["evidence"]["max_lifetime_seconds"] == LIFETIME
    assert warning["evidence"]["max_lifetime_from"] == "profile h100-life"
    assert abs(warning["evidence"]["session_started_at"] - _ts(old["started"])) < 0.001
    assert running(hub, "alice", "life")  # the warning comes first

    # Pressed after the lifetime: refused with the sentence, and nothing changes.
    r = keep(hub, "alice", "life", alice)
    assert r.status_code == 409, r.text
    assert "maximum lifetime" in r.json()["message"] and "cannot extend" in r.json()["message"]
    assert keep(hub, "alice", "life", carol).status_code == 403  # not carol's server
    view = idle_view(hub, "alice", "life", alice)
    assert view["warning"] == warning and view["keepalive"]["used"] == 1

    poll("alice/life stopped", lambda: not running(hub, "alice", "life"), hub)
    poll("alice/life reclaim recorded", lambda: events(hub, "alice", "life")[-1]["kind"] == "reclaim", hub)
    recorded = events(hub, "alice", "life")
    assert [e["kind"] for e in recorded] == ["keepalive", "warning", "reclaim"], recorded
    reclaim = recorded[-1]
    assert reclaim["action"] == "stop-server" and reclaim["reason"] == warning["reason"]
    assert _ts(reclaim["at"]) >= _ts(recorded[1]["at"]) + GRACE - 0.1  # after the full grace
    told = idle_view(hub, "alice", "life", alice)["reclaimed"]
    assert "maximum lifetime" in told["message"] and told["idle_minutes"] is None, told

    # Within its lifetime, busy and kept alive: untouched.
    assert running(hub, "bob", "long")
    assert [e["kind"] for e in events(hub, "bob", "long")] == ["keepalive"]
    assert idle_view(hub, "bob", "long", bob)["warning"] is None
