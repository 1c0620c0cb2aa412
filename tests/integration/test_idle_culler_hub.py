"""The GPU idle culler end to end: a real JupyterHub with real single-user servers,
the culler as a hub-managed service (``python -m idle_culler``), a real Prometheus
scraping a fake dcgm-exporter (the only stand-in: there is no GPU here).

The single-server spawner saves each server's devices in its state; the culler
joins them to the exporter's ``gpu`` + ``Hostname`` labels (see docs/idle-culler.md).
Idle windows are seconds long; every wait polls the hub's state.
"""

from __future__ import annotations

import json
import re
import threading
import time

import pytest
import requests

from tests.support.culler_service import culler_service_config
from tests.support.dcgm_fake_exporter import FakeDCGMExporter, RunningPrometheus
from tests.support.hub import RunningHub, free_port

NODE = "gpulab-test-node"
TIMEOUT = 4  # the h100-1 profile's idle_timeout
GRACE = 3
DEVICES = 6

CATALOG = f"""
inventory:
  - {{model: H100-80GB, count: {DEVICES}, memory_mib: 81559}}
profiles:
  - {{slug: cpu, display_name: CPU only, gpus: 0}}
  - {{slug: h100-1, display_name: "1 × H100", gpus: 1, gpu_model: H100-80GB, idle_timeout: {TIMEOUT}s}}
teams:
  - {{name: vision, users: [alice, bob, carol], guarantee: {DEVICES}, burst: {DEVICES}, allowed_profiles: [cpu, h100-1]}}
"""


def extra_config(prometheus_url: str, metrics_port: int) -> str:
    return culler_service_config(
        prometheus_url,
        metrics_port,
        node=NODE,
        grace=GRACE,
        keepalive_max_uses=1,
        keepalive_extends_seconds=6,
        extra="c.JupyterHub.last_activity_interval = 1",
    )


@pytest.fixture(scope="module")
def exporter():
    e = FakeDCGMExporter(hostname=NODE, hostname_label="Hostname").start()
    for i in range(DEVICES):
        e.set_gpu(i, 100)  # busy until a test says otherwise
    yield e
    e.stop()


@pytest.fixture(scope="module")
def prometheus(exporter, tmp_path_factory):
    p = RunningPrometheus(tmp_path_factory.mktemp("prom"), [f"127.0.0.1:{exporter.port}"]).start()
    yield p
    p.stop()


@pytest.fixture(scope="module")
def metrics_port():
    return free_port()


@pytest.fixture(scope="module")
def hub(prometheus, metrics_port, tmp_path_factory):
    h = RunningHub(
        tmp_path_factory.mktemp("culler-hub"), CATALOG, extra_config=extra_config(prometheus.url, metrics_port)
    )
    h.start()
    yield h
    h.close()


def spawn(hub: RunningHub, user: str, name: str = "", profile: str = "h100-1") -> int | None:
    path = f"/users/{user}/servers/{name}" if name else f"/users/{user}/server"
    r = hub.api("POST", path, data=json.dumps({"team": "vision", "profile": profile}))
    assert r.status_code in (201, 202), r.text
    server = hub.wait_server(user, name)
    shares = server["state"].get("gpulab", {}).get("shares") or []
    return shares[0][0] if shares else None


def running(hub: RunningHub, user: str, name: str = "") -> bool:
    return name in (hub.api("GET", f"/users/{user}").json().get("servers") or {})


def idle_view(hub: RunningHub, user: str, name: str = "", token: str | None = None) -> dict:
    r = hub.api("GET", "/gpulab/idle", params={"user": user, "server": name}, token=token)
    assert r.status_code == 200, r.text
    return r.json()


def audit(hub: RunningHub, user: str | None = None) -> list[dict]:
    params = {"user": user} if user else {}
    r = hub.api("GET", "/gpulab/idle/audit", params=params)
    assert r.status_code == 200, r.text
    return r.json()["events"]


def reclaimed(hub: RunningHub, user: str, server: str) -> bool:
    return any(e["kind"] == "reclaim" and e["server"] == server for e in audit(hub, user))


def poll(what: str, check, timeout: float = 40, hub: RunningHub | None = None):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.3)
    raise TimeoutError(f"{what} not reached in {timeout}s" + (f"\n{hub.log_tail(80)}" if hub else ""))


def metric(text: str, name: str, labels: str = "") -> float:
    m = re.search(rf"^{re.escape(name)}{re.escape(labels)} ([0-9.e+-]+)$", text, re.M)
    return float(m.group(1)) if m else 0.0


def user_token(hub: RunningHub, user: str) -> str:
    r = hub.api("POST", f"/users/{user}/tokens", data=json.dumps({"note": "idle test"}))
    assert r.status_code == 201, r.text
    return r.json()["token"]


class OpenTab(threading.Thread):
    """A browser tab left open: keeps requesting the server through the proxy."""

    def __init__(self, url: str, token: str):
        super().__init__(daemon=True)
        self.url, self.token, self.stop_event = url, token, threading.Event()
        self.requests = 0

    def run(self):
        while not self.stop_event.wait(0.5):
            try:
                requests.get(self.url, headers={"Authorization": f"token {self.token}"}, timeout=5)
                self.requests += 1
            except requests.RequestException:
                pass


def test_idle_gpu_is_culled_after_warning_and_busy_or_unmeasured_ones_are_kept(hub, exporter, metrics_port):
    devices = {
        "alice/": spawn(hub, "alice"),
        "alice/tab": spawn(hub, "alice", "tab"),
        "bob/": spawn(hub, "bob"),
        "carol/": spawn(hub, "carol"),
    }
    assert spawn(hub, "carol", "cpu", profile="cpu") is None
    assert len(set(devices.values())) == 4, devices
    token = user_token(hub, "alice")
    tab = OpenTab(f"{hub.url}/user/alice/tab/api/contents", token)
    tab.start()
    try:
        started = time.time()
        # bob's exporter uses the newer label spelling (the last test shows it is joined too).
        exporter.set_gpu(devices["bob/"], 100, host_label="hostname")
        exporter.set_gpu(devices["alice/"], 0)
        exporter.set_gpu(devices["alice/tab"], 0)
        exporter.remove(f"util/{NODE}/{devices['carol/']}")  # carol's metrics go missing

        warned = poll("alice warned", lambda: idle_view(hub, "alice")["warning"], hub=hub)
        assert "at or below" in warned["reason"]
        assert warned["evidence"]["devices"], warned
        # The user sees the warning before anything is stopped.
        assert running(hub, "alice")
        poll("alice's idle server stopped", lambda: not running(hub, "alice"), hub=hub)
        poll("alice/tab stopped", lambda: not running(hub, "alice", "tab"), hub=hub)
        # The culler records a reclaim once the hub has stopped the server.
        poll("reclaims recorded", lambda: reclaimed(hub, "alice", "") and reclaimed(hub, "alice", "tab"), hub=hub)
        assert time.time() - started >= TIMEOUT + GRACE - 1.5
    finally:
        tab.stop_event.set()
        tab.join(5)
    assert tab.requests > 5

    events = audit(hub, "alice")
    by_server = {}
    for e in events:
        by_server.setdefault(e["server"], []).append(e["kind"])
    assert by_server[""] == ["warning", "reclaim"] and by_server["tab"] == ["warning", "reclaim"], events
    reclaim = next(e for e in events if e["kind"] == "reclaim" and e["server"] == "tab")
    assert reclaim["team"] == "vision" and reclaim["profile"] == "h100-1" and reclaim["gpu_milli"] == 1000
    # Idle GPU-hours observed: 1 GPU x (timeout + grace) at least; freed: from the reclaim until now.
    assert reclaim["idle_gpu_hours_before_reclaim"] >= (TIMEOUT + GRACE - 1.5) / 3600
    assert reclaim["gpu_hours_freed"] > 0
    assert reclaim["evidence"]["action"] == "stop-server"
    assert reclaim["evidence"]["source"] == "prometheus"
    assert reclaim["evidence"]["idle_timeout_seconds"] == TIMEOUT
    assert reclaim["evidence"]["idle_timeout_from"] == "profile h100-1"
    # The open tab kept the server "active" for the hub (what jupyterhub-idle-culler sees)...
    # When the culler decided, the hub had seen activity less than an idle timeout ago.
    last_activity = reclaim["evidence"]["hub_last_activity"]
    decided_at = reclaim["evidence"]["decided_at"]
    assert decided_at - _ts(last_activity) < TIMEOUT, (last_activity, decided_at)
    # ...yet its GPU was idle, so it was reclaimed.

    # Busy GPU kept; missing metrics kept and counted; CPU-only server left alone.
    assert running(hub, "bob") and running(hub, "carol") and running(hub, "carol", "cpu")
    assert audit(hub, "bob") == [] and audit(hub, "carol") == []
    text = requests.get(f"http://127.0.0.1:{metrics_port}/metrics", timeout=5).text
    assert metric(text, "gpulab_culler_idle_gpu_hours_before_reclaim_total", '{team="vision"}') > 0
    assert metric(text, "gpulab_culler_cycles_total") >= TIMEOUT
    assert metric(text, "gpulab_culler_skipped_missing_data_total") >= 1
    assert metric(text, "gpulab_culler_reclaims_total", '{action="stop-server",team="vision"}') == 2
    # Ledger freed: the two reclaimed GPUs are no longer held.
    assert sum(w["gpu_milli"] for w in hub.holdings()) == 2000
    # The user is told, on the spawn page and in the idle API, never with a raw error.
    view = idle_view(hub, "alice", "tab")
    assert view["warning"] is None and "Your GPU was reclaimed at" in view["reclaimed"]["message"]
    assert view["reclaimed"]["idle_minutes"] is not None and view["reclaimed"]["peak_percent"] == 0
    page = hub.spawn_page(hub.login("alice")).text
    assert 'id="gpulab-reclaimed"' in page and "Your GPU was reclaimed at" in page and "start again" in page
    # Both figures on the hub's metrics, named for what they measure.
    admin = user_token(hub, "admin")  # an admin user's token carries read:metrics
    hub_metrics = requests.get(f"{hub.url}/hub/metrics", headers={"Authorization": f"token {admin}"}, timeout=10).text
    assert metric(hub_metrics, "gpulab_team_idle_gpu_hours_before_reclaim", '{team="vision"}') > 0
    assert metric(hub_metrics, "gpulab_team_gpu_hours_freed", '{team="vision"}') > 0


def _ts(iso: str) -> float:
    from datetime import datetime

    return datetime.fromisoformat(iso.replace("Z", "+00:00")).timestamp()


def test_keepalive_is_honoured_and_capped(hub, exporter):
    device = spawn(hub, "bob", "keep")
    bob = user_token(hub, "bob")
    carol = user_token(hub, "carol")
    exporter.set_gpu(device, 0)
    poll("bob/keep warned", lambda: idle_view(hub, "bob", "keep", token=bob)["warning"], hub=hub)

    r = hub.api("POST", "/gpulab/idle/keepalive", token=carol, data=json.dumps({"user": "bob", "server": "keep"}))
    assert r.status_code == 403  # not carol's server
    r = hub.api("POST", "/gpulab/idle/keepalive", token=bob, data=json.dumps({"user": "bob", "server": "keep"}))
    assert r.status_code == 200, r.text
    view = r.json()
    assert view["warning"] is None
    assert view["keepalive"]["used"] == 1 and view["keepalive"]["max"] == 1 and view["keepalive"]["until"]
    until = _ts(view["keepalive"]["until"])

    # Honoured: no warning and no stop while it lasts, though the GPU stays idle.
    while time.time() < until - 0.5:
        assert idle_view(hub, "bob", "keep", token=bob)["warning"] is None
        assert running(hub, "bob", "keep")
        time.sleep(0.5)
    # Capped: warned again afterwards, a second press is refused, and the GPU is reclaimed.
    poll("bob/keep warned again", lambda: idle_view(hub, "bob", "keep", token=bob)["warning"], hub=hub)
    r = hub.api("POST", "/gpulab/idle/keepalive", token=bob, data=json.dumps({"user": "bob", "server": "keep"}))
    assert r.status_code == 409 and "1 of 1" in r.json()["message"]
    poll("bob/keep stopped", lambda: not running(hub, "bob", "keep"), hub=hub)
    poll("bob/keep reclaim recorded", lambda: reclaimed(hub, "bob", "keep"), hub=hub)
    kinds = [e["kind"] for e in audit(hub, "bob") if e["server"] == "keep"]
    assert kinds == ["warning", "keepalive", "warning", "reclaim"], kinds
    # The admin page lists them, with their evidence and both GPU-hour figures.
    page = hub.login("admin").get(f"{hub.url}/hub/gpulab/admin", timeout=30).text
    for kind in ("warning", "keepalive", "reclaim"):
        assert f'data-idle-event="{kind}"' in page, kind
    assert 'data-culler-status="on"' in page
    assert "Idle GPU-h before reclaim" in page and "GPU-h freed by reclaims" in page


def test_warning_of_a_server_stopped_by_its_user_is_cleared(hub, exporter):
    device = spawn(hub, "carol", "gone")
    exporter.set_gpu(device, 0)
    poll("carol/gone warned", lambda: idle_view(hub, "carol", "gone")["warning"], hub=hub)
    assert hub.api("DELETE", "/users/carol/servers/gone").status_code in (202, 204)
    # The user's view drops it at once (no running session); the culler clears it next cycle.
    assert idle_view(hub, "carol", "gone")["warning"] is None
    poll(
        "warning cleared",
        lambda: [e for e in audit(hub, "carol") if e["server"] == "gone"][-1]["kind"] == "cleared",
        hub=hub,
    )
    events = [e for e in audit(hub, "carol") if e["server"] == "gone"]
    assert [(e["kind"], e["reason"]) for e in events][-1] == ("cleared", "server not running")
    assert "reclaim" not in [e["kind"] for e in events]


@pytest.mark.parametrize(
    "body, status",
    [
        ({"server": "x"}, 400),
        ({"user": 5, "server": ""}, 400),
        ({"user": "bob", "server": ["x"]}, 400),
        ({"user": "bob", "server": "never-started"}, 409),
        ({"user": "nobody", "server": ""}, 403),
    ],
)
def test_keepalive_bad_input(hub, body, status):
    bob = user_token(hub, "bob")
    r = hub.api("POST", "/gpulab/idle/keepalive", token=bob, data=json.dumps(body))
    assert r.status_code == status, r.text


def test_culler_only_endpoints_refuse_users(hub):
    bob = user_token(hub, "bob")
    before = audit(hub, "bob")
    for method, path, body in [
        ("POST", "/gpulab/idle/warnings", {"user": "bob", "server": "", "grace_seconds": 1}),
        ("POST", "/gpulab/idle/reclaims", {"user": "bob", "server": ""}),
        ("POST", "/gpulab/idle/cycle", {"reclaims": [{"user": "bob", "server": ""}]}),
        # A user cannot switch idle reclaim off for anyone by claiming "no series names it".
        (
            "POST",
            "/gpulab/idle/cycle",
            {"unattributed": [{"user": "bob", "server": "", "code": "no-series", "reason": "trust me"}]},
        ),
        ("GET", "/gpulab/idle/state", None),
        ("GET", "/gpulab/idle/audit", None),
    ]:
        r = hub.api(method, path, token=bob, data=json.dumps(body) if body else None)
        assert r.status_code == 403, (path, r.text)
    assert idle_view(hub, "bob", token=bob)["reclaim_off"] is None
    # Nothing recorded by the refused calls (freed GPU-hours grow with time: compare the events).
    assert [(e["at"], e["kind"], e["server"]) for e in audit(hub, "bob")] == [
        (e["at"], e["kind"], e["server"]) for e in before
    ]


def test_prometheus_down_means_no_culls(hub, exporter, prometheus, metrics_port):
    device = next(s for s in [hub.api("GET", "/users/bob").json()["servers"][""]])["state"]["gpulab"]["shares"][0][0]
    before = len(audit(hub))
    errors_before = metric(
        requests.get(f"http://127.0.0.1:{metrics_port}/metrics", timeout=5).text,
        "gpulab_culler_errors_total",
        '{stage="source"}',
    )
    prometheus.stop()
    exporter.set_gpu(device, 0, host_label="hostname")  # bob's GPU goes idle while nobody can see it
    # Long enough for a warning and a reclaim, had the culler guessed.
    deadline = time.monotonic() + TIMEOUT + GRACE + 3
    while time.monotonic() < deadline:
        assert idle_view(hub, "bob")["warning"] is None
        assert running(hub, "bob")
        time.sleep(0.5)
    assert len(audit(hub)) == before
    text = requests.get(f"http://127.0.0.1:{metrics_port}/metrics", timeout=5).text
    assert metric(text, "gpulab_culler_errors_total", '{stage="source"}') >= errors_before + TIMEOUT
    assert metric(text, "gpulab_culler_source_failures_total", '{reason="unavailable"}') >= TIMEOUT
    # Once Prometheus is back and a whole idle window is measured, bob is warned
    # (joined through the new `hostname` label).
    prometheus.start()
    warning = poll("bob warned after Prometheus is back", lambda: idle_view(hub, "bob")["warning"], hub=hub)
    assert list(warning["evidence"]["devices"]) == [f"{NODE}/gpu{device}"]


def test_a_restarted_server_gets_its_full_timeout_and_grace(hub, exporter):
    """The old session's warning is void, and the GPU's idle past does not count for the new one."""
    # Every free GPU idle from now on, whichever one each session gets.
    held = {
        d
        for u in hub.api("GET", "/users").json()
        for srv in (u.get("servers") or {}).values()
        for d, _ in ((srv.get("state") or {}).get("gpulab") or {}).get("shares") or []
    }
    for d in set(range(DEVICES)) - held:
        exporter.set_gpu(d, 0)
    spawn(hub, "alice", "again")
    first = poll("alice/again warned", lambda: idle_view(hub, "alice", "again")["warning"], hub=hub)
    hub.api("DELETE", "/users/alice/servers/again")  # the user stops it (or the culler got there first)
    poll("stopped", lambda: not running(hub, "alice", "again"), hub=hub)
    assert spawn(hub, "alice", "again") not in held  # a GPU that has been idle for a while
    started = _ts(hub.api("GET", "/users/alice").json()["servers"]["again"]["started"])
    # Nothing inherited by the new session: no warning yet (on a loaded machine, the new
    # session's own may already stand, and the assertions below hold it to its own timeout).
    inherited = idle_view(hub, "alice", "again")["warning"]
    assert inherited is None or inherited["warned_at"] != first["warned_at"]
    warned = poll("new session warned", lambda: idle_view(hub, "alice", "again")["warning"], hub=hub)
    # Not before a whole idle timeout of the new session's own samples.
    assert _ts(warned["warned_at"]) - started >= TIMEOUT
    assert warned["evidence"]["session_started_at"] == pytest.approx(started, abs=0.01)
    assert _ts(warned["warned_at"]) > _ts(first["warned_at"])
    poll("reclaimed after its own grace", lambda: not running(hub, "alice", "again"), hub=hub)
    kinds = [(e["kind"], e["session"]) for e in audit(hub, "alice") if e["server"] == "again"]
    sessions = [s for k, s in kinds if k == "warning"]
    assert len(sessions) == 2 and sessions[0] != sessions[1], kinds
    assert [k for k, _ in kinds][-1] == "reclaim"


def test_a_warning_held_through_missing_data_is_announced_again_with_a_fresh_grace(hub, exporter):
    device = spawn(hub, "carol", "hole")
    exporter.set_gpu(device, 0)
    first = poll("carol/hole warned", lambda: idle_view(hub, "carol", "hole")["warning"], hub=hub)
    exporter.remove(f"util/{NODE}/{device}")  # its metrics go missing during the grace
    held = poll("warning held", lambda: (w := idle_view(hub, "carol", "hole")["warning"]) and w["held"] and w, hub=hub)
    time.sleep(GRACE)  # the old grace ends while the data is missing: no reclaim
    assert running(hub, "carol", "hole")
    exporter.set_gpu(device, 0)
    back = time.time()
    renewed = poll(
        "re-announced",
        lambda: (
            (w := idle_view(hub, "carol", "hole")["warning"])
            and not w["held"]
            and w["warned_at"] != first["warned_at"]
            and w
        ),
        hub=hub,
    )
    assert _ts(renewed["reclaim_at"]) - _ts(renewed["warned_at"]) == pytest.approx(GRACE, abs=0.01)
    assert _ts(renewed["warned_at"]) >= back  # only after data returned (and covered a timeout)
    assert held["reclaim_at"] == first["reclaim_at"]
    poll("reclaimed", lambda: not running(hub, "carol", "hole"), hub=hub)
    events = [e for e in audit(hub, "carol") if e["server"] == "hole"]
    assert [e["kind"] for e in events] == ["warning", "held", "warning", "reclaim"], events
    assert "fresh grace" in events[2]["reason"]
    assert _ts(events[3]["at"]) >= _ts(renewed["reclaim_at"])
