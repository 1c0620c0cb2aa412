"""The NVML source: per-process GPU use mapped to hub servers and to the kernel holding GPU memory.

There is no GPU here, so NVML itself is replaced by :class:`ScriptedNVML`, which
answers the pynvml calls the adapter makes with pynvml's own structures and
exceptions (``nvmlDeviceGetProcessUtilization`` raises ``NVMLError_NotFound``
on an idle GPU, as the real library does). Everything else is real: the
process tree in /proc, a real hub, a real single-user server, a real kernel.
"""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import pytest
import requests
from traitlets.config import Config

from idle_culler.app import GPUIdleCuller
from tests.support.nvml import ScriptedNVML

CULLER_TOKEN = "c" * 32
CATALOG = """
inventory:
  - {model: H100-80GB, count: 2, memory_mib: 81559}
profiles:
  - {slug: h100-1, display_name: "1 × H100", gpus: 1, gpu_model: H100-80GB, idle_timeout: 2s}
teams:
  - {name: vision, users: [alice, bob], guarantee: 2, burst: 2, allowed_profiles: [h100-1]}
"""
EXTRA = f"""
from hub_config.config.scopes import CULLER_SERVICE_SCOPES
c.JupyterHub.services = list(c.JupyterHub.services) + [{{"name": "culler", "api_token": "{CULLER_TOKEN}"}}]
c.JupyterHub.load_roles = list(c.JupyterHub.load_roles) + [
    {{"name": "culler", "scopes": CULLER_SERVICE_SCOPES, "services": ["culler"]}}]
"""


@pytest.fixture(scope="module")
def hub(start_hub):
    return start_hub(CATALOG, extra_config=EXTRA)


def descendants(pid: int) -> list[int]:
    children = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[-1].split()
            except OSError:
                continue
            if int(fields[1]) == pid:
                children.append(int(entry.name))
    return children + [d for c in children for d in descendants(c)]


async def test_idle_kernel_is_shut_down_then_the_idle_server_is_stopped(hub):
    r = hub.api("POST", "/users/alice/server", data=json.dumps({"team": "vision", "profile": "h100-1"}))
    assert r.status_code in (201, 202), r.text
    server = hub.wait_server("alice")
    device = server["state"]["gpulab"]["shares"][0][0]
    token = hub.api("POST", "/users/alice/tokens", data="{}").json()["token"]
    auth = {"Authorization": f"token {token}"}
    kernel = requests.post(f"{hub.url}/user/alice/api/kernels", headers=auth, json={}, timeout=60).json()
    kernel_pid = next(
        p
        for p in descendants(server["state"]["pid"])
        if kernel["id"] in Path(f"/proc/{p}/cmdline").read_bytes().decode(errors="replace")
    )

    nvml = ScriptedNVML(2)
    nvml.devices[device] = {"procs": [(kernel_pid, 5 << 30)], "util": "not-found"}
    config = Config()
    config.GPUIdleCuller.update(
        url=hub.url + "/hub/api",
        api_token=CULLER_TOKEN,
        public_url=hub.url,
        source="nvml",
        grace_seconds=1,
        max_sample_gap=1.5,
        config_file="",
    )
    config.NVMLSource.nvml_module = nvml
    culler = GPUIdleCuller(config=config)
    culler.initialize([])

    async def cycles_until(check, timeout=40):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            await culler.cycle()
            if check():
                return
            await asyncio.sleep(0.3)
        raise TimeoutError(hub.log_tail(60))

    def kernels():
        r = requests.get(f"{hub.url}/user/alice/api/kernels", headers=auth, timeout=10)
        return [k["id"] for k in r.json()] if r.status_code == 200 else None

    def audit():
        return hub.api("GET", "/gpulab/idle/audit", params={"user": "alice"}).json()["events"]

    # First the idle kernel that holds GPU memory is shut down; the server stays.
    await cycles_until(lambda: any(e["kind"] == "reclaim" for e in audit()))
    assert "" in hub.api("GET", "/users/alice").json()["servers"]
    assert kernels() == []
    reclaim = [e for e in audit() if e["kind"] == "reclaim"][0]
    assert reclaim["evidence"]["action"] == "shutdown-kernel"
    assert reclaim["evidence"]["kernel_ids"] == [kernel["id"]]
    # The server still holds its GPU allocation: nothing freed.
    assert reclaim["idle_gpu_hours_before_reclaim"] == 0 and reclaim["gpu_hours_freed"] == 0

    # NVML now sees no process of alice's: still idle, so after a new warning the server is stopped.
    nvml.devices[device] = {"procs": [], "util": "not-found"}
    await cycles_until(lambda: "" not in hub.api("GET", "/users/alice").json()["servers"])
    kinds = [(e["kind"], e["evidence"].get("action")) for e in audit()]
    assert kinds == [
        ("warning", None),
        ("reclaim", "shutdown-kernel"),
        ("warning", None),
        ("reclaim", "stop-server"),
    ], kinds
    assert [e for e in audit() if e["kind"] == "reclaim"][-1]["idle_gpu_hours_before_reclaim"] > 0


def stable(events: list[dict]) -> list[dict]:
    """Audit events without the GPU-hours freed, which grow until the user holds a GPU again."""
    return [{k: v for k, v in e.items() if k != "gpu_hours_freed"} for e in events]


@pytest.mark.parametrize(
    "method, path, body, status",
    [
        ("POST", "/gpulab/idle/warnings", {"user": "bob", "server": "", "grace_seconds": -1}, 400),
        ("POST", "/gpulab/idle/warnings", {"user": "bob", "server": "", "grace_seconds": "60"}, 400),
        ("POST", "/gpulab/idle/warnings", {"user": "bob", "server": "", "grace_seconds": 10**9}, 400),
        ("POST", "/gpulab/idle/warnings", {"server": "", "grace_seconds": 60}, 400),
        ("POST", "/gpulab/idle/warnings", {"user": "bob", "grace_seconds": 60, "evidence": []}, 400),
        ("POST", "/gpulab/idle/warnings", {"user": "bob", "grace_seconds": 60, "reason": "x" * 5000}, 400),
        ("POST", "/gpulab/idle/warnings", {"user": "nobody", "grace_seconds": 60}, 404),
        ("POST", "/gpulab/idle/reclaims", {"user": "bob", "idle_gpu_hours": -1}, 400),
        ("POST", "/gpulab/idle/reclaims", {"user": "bob", "action": "delete-everything"}, 400),
        ("POST", "/gpulab/idle/reclaims", {"user": "bob", "gpu_milli": 1.5}, 400),
        ("POST", "/gpulab/idle/reclaims", {"user": "bob", "action": "shutdown-kernel", "kernel_ids": "k"}, 400),
        ("POST", "/gpulab/idle/reclaims", {"user": "bob", "server": ""}, 409),  # no warning: nothing to reclaim
        ("GET", "/gpulab/idle/audit?limit=0", None, 400),
        ("GET", "/gpulab/idle/audit?kind=bogus", None, 400),
    ],
)
def test_culler_endpoints_refuse_bad_input_and_record_nothing(hub, method, path, body, status):
    before = hub.api("GET", "/gpulab/idle/audit").json()["events"]
    data = json.dumps(body) if body is not None else None
    r = hub.api(method, path, token=CULLER_TOKEN, data=data)
    assert r.status_code == status, r.text
    assert r.json()["message"]
    assert stable(hub.api("GET", "/gpulab/idle/audit").json()["events"]) == stable(before)
    assert hub.api("GET", "/gpulab/idle", params={"user": "bob"}).json()["warning"] is None


def test_culler_records_a_warning_once_and_clears_it(hub):
    body = {
        "user": "bob",
        "server": "",
        "grace_seconds": 600,
        "reason": "idle",
        "evidence": {"x": 1},
        "team": "vision",
        "profile": "h100-1",
        "gpu_milli": 1000,
    }
    r = hub.api("POST", "/gpulab/idle/warnings", token=CULLER_TOKEN, data=json.dumps(body))
    assert r.status_code == 201, r.text
    first = r.json()["warning"]
    r = hub.api("POST", "/gpulab/idle/warnings", token=CULLER_TOKEN, data=json.dumps(body))
    assert r.status_code == 200 and r.json()["warning"] == first  # the clock never restarts
    # A reclaim before the grace period ends is refused and recorded nowhere.
    r = hub.api(
        "POST",
        "/gpulab/idle/reclaims",
        token=CULLER_TOKEN,
        data=json.dumps({"user": "bob", "server": "", "reason": "idle", "idle_gpu_hours": 1}),
    )
    assert r.status_code == 409 and "grace period" in r.json()["message"]
    state = hub.api("GET", "/gpulab/idle/state", token=CULLER_TOKEN).json()
    assert [(w["user"], w["server"]) for w in state["warnings"]] == [("bob", "")]
    r = hub.api("DELETE", "/gpulab/idle/warnings", token=CULLER_TOKEN, params={"user": "bob", "server": ""})
    assert r.status_code == 200 and r.json()["warning"] is None
    kinds = [e["kind"] for e in hub.api("GET", "/gpulab/idle/audit", params={"user": "bob"}).json()["events"]]
    assert kinds == ["warning", "cleared"]
