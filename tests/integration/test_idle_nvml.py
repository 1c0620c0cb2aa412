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
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pynvml
import pytest
import requests
from traitlets.config import Config

from idle_culler.app import GPUIdleCuller
from idle_culler.nvml_source import NVMLSource
from idle_culler.sources import SourceUnavailable
from idle_culler.targets import DEVICE, ServerTarget
from spawner.core.idle import BUSY, IDLE, judge_gpu_idle
from spawner.local.nvml import NVML
from tests.hub_harness import RunningHub


class ScriptedNVML:
    """pynvml's call surface, answering from ``self.devices`` (set by the test).

    ``devices[i] = {"procs": [(pid, bytes)], "util": [(pid, smUtil)] | "not-found" | "error"}``
    """

    NVMLError = pynvml.NVMLError
    NVMLError_NotFound = pynvml.NVMLError_NotFound

    def __init__(self, count: int = 2):
        self.devices = {i: {"procs": [], "util": "not-found"} for i in range(count)}
        self.calls: list[tuple] = []

    def nvmlInit(self):  # noqa: N802 (pynvml names)
        self.calls.append(("init",))

    def nvmlShutdown(self):  # noqa: N802
        pass

    def nvmlDeviceGetCount(self):  # noqa: N802
        return len(self.devices)

    def nvmlDeviceGetHandleByIndex(self, i):  # noqa: N802
        return ("handle", i)

    def nvmlDeviceGetComputeRunningProcesses(self, handle):  # noqa: N802
        procs = []
        for pid, used in self.devices[handle[1]]["procs"]:
            p = pynvml.c_nvmlProcessInfo_v3_t()
            p.pid, p.usedGpuMemory = pid, used
            procs.append(pynvml.nvmlStructToFriendlyObject(p))
        return procs

    def nvmlDeviceGetProcessUtilization(self, handle, timestamp):  # noqa: N802
        self.calls.append(("util", handle[1], timestamp))
        util = self.devices[handle[1]]["util"]
        if util == "not-found":
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_FOUND)
        if util == "error":
            raise pynvml.NVMLError(pynvml.NVML_ERROR_UNKNOWN)
        samples = (pynvml.c_nvmlProcessUtilizationSample_t * len(util))()
        now_us = int(time.time() * 1e6)
        for s, (pid, sm) in zip(samples, util, strict=False):
            s.pid, s.timeStamp, s.smUtil = pid, now_us, sm
        return samples[0 : len(util)]


def test_adapter_turns_not_found_into_no_samples_and_keeps_other_errors():
    nvml = ScriptedNVML(1)
    adapter = NVML(nvml)
    assert adapter.start()
    assert adapter.process_utilization(0, 0) == []
    nvml.devices[0]["util"] = [(123, 40)]
    [(pid, ts, sm)] = adapter.process_utilization(0, 0)
    assert (pid, sm) == (123, 40) and ts > 0
    nvml.devices[0]["util"] = "error"
    with pytest.raises(pynvml.NVMLError_Unknown):
        adapter.process_utilization(0, 0)
    nvml.devices[0]["procs"] = [(123, 2 << 30)]
    assert adapter.compute_processes(0) == [(123, 2 << 30)]


@pytest.fixture
def fake_server_tree(tmp_path):
    """A real process tree: a 'server' whose child runs like a kernel (``-f .../kernel-<id>.json``)."""
    kernel_id = str(uuid.uuid4())
    conn = tmp_path / f"kernel-{kernel_id}.json"
    conn.write_text("{}")
    code = (
        "import subprocess, sys, time; "
        f"p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)', '-f', {str(conn)!r}]); "
        "print(p.pid, flush=True); time.sleep(120)"
    )
    server = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    kernel_pid = int(server.stdout.readline())
    yield server.pid, kernel_pid, kernel_id
    os.kill(kernel_pid, 9)
    server.kill()
    server.wait()


async def test_source_attributes_processes_to_servers_and_kernels(fake_server_tree):
    server_pid, kernel_pid, kernel_id = fake_server_tree
    stranger = os.getpid()  # a process of nobody's server, on the same GPU
    nvml = ScriptedNVML(2)
    nvml.devices[0] = {"procs": [(kernel_pid, 3 << 30), (stranger, 1 << 30)], "util": [(stranger, 95)]}
    source = NVMLSource(nvml_module=nvml)
    target = ServerTarget(
        user="alice",
        server="",
        team="vision",
        profile="p",
        gpu_milli=1000,
        mapping=DEVICE,
        hostname="box",
        devices=(0,),
        pid=server_pid,
    )
    window, gap = 1.0, 0.5

    def verdict(data, now):
        return judge_gpu_idle(
            data[target.key],
            now=now,
            window_seconds=window,
            threshold_percent=1,
            max_gap_seconds=gap,
            expected_devices=target.expected_devices,
        )

    start = time.time()
    while time.time() - start < window + 0.3:
        now = time.time()
        data = await source.collect([target], now, {target.key: window})
        await asyncio.sleep(0.2)
    # The stranger's 95 % is not alice's: her kernel holds memory but computes nothing.
    assert verdict(data, now).status == IDLE
    holders = source.kernel_holders(target)
    assert [{k: h[k] for k in ("pid", "device", "used_memory_bytes", "kernel_id")} for h in holders] == [
        {"pid": kernel_pid, "device": 0, "used_memory_bytes": 3 << 30, "kernel_id": kernel_id}
    ]
    # Each holder's start time, so a kernel younger than the timeout is never reclaimed.
    assert start - 120 < holders[0]["started_at"] <= time.time()
    # The timestamp passed to NVML advances, so samples are never counted twice.
    stamps = [c[2] for c in nvml.calls if c[0] == "util"]
    assert stamps[0] == 0 and stamps[-1] > 0

    nvml.devices[0]["util"] = [(kernel_pid, 60)]
    now = time.time()
    assert verdict(await source.collect([target], now, {target.key: window}), now).status == BUSY

    # An NVML error: the source cannot answer (no culls), and the hole it leaves
    # keeps the server from being idle until a whole window is measured again.
    nvml.devices[0]["util"] = "error"
    for _ in range(4):
        await asyncio.sleep(0.2)
        with pytest.raises(SourceUnavailable):
            await source.collect([target], time.time(), {target.key: window})
    nvml.devices[0]["util"] = "not-found"
    now = time.time()
    data = await source.collect([target], now, {target.key: window})
    assert not verdict(data, now).idle


# -- end to end: a real hub, a real server, a real kernel --------------------

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
def hub(tmp_path_factory):
    h = RunningHub(tmp_path_factory.mktemp("nvml-hub"), CATALOG, extra_config=EXTRA)
    h.start()
    yield h
    h.close()


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


@pytest.mark.integration
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


@pytest.mark.integration
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


@pytest.mark.integration
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
