"""The NVML source: per-process GPU use mapped to hub servers and to the kernel holding GPU memory.

NVML is :class:`tests.support.nvml.ScriptedNVML` (there is no GPU here); the process
tree in /proc is real. The culler against a real hub: tests/integration/test_idle_nvml.py.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
import uuid

import pynvml
import pytest

from idle_culler.nvml_source import NVMLSource
from idle_culler.sources import SourceUnavailable
from idle_culler.targets import DEVICE, ServerTarget
from spawner.core.idle import BUSY, IDLE, judge_gpu_idle
from spawner.local.nvml import NVML
from tests.support.nvml import ScriptedNVML


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
