"""Per-process GPU use from NVML on a single server (gpulab's embedded mode).

NVML itself is :class:`spawner.local.nvml.NVML`, the one adapter: it turns NVML's
``NOT_FOUND`` from ``nvmlDeviceGetProcessUtilization`` -- what NVML answers
when no process used the GPU since the given timestamp -- into "no samples".
Any other NVML error stays an error, and the device gets no sample that
cycle (so a server on it can never be judged idle from a hole).

:class:`NVMLSource` maps GPU processes to hub servers by process ancestry
(every kernel is a descendant of its single-user server's ``pid``), records
each cycle, per server and device, the highest SM utilisation of that
server's processes (0 when NVML saw none of them busy), and names the kernels
that hold GPU memory so the culler can shut down just those.
"""

from __future__ import annotations

import os
import re
from collections import deque
from pathlib import Path

from traitlets import Any as AnyTrait
from traitlets import Unicode

from spawner.core.idle import DeviceSeries
from spawner.local.nvml import NVML

from .sources import SourceUnavailable, UtilisationSource
from .targets import DEVICE, ServerTarget, device_id

KERNEL_FILE_RE = re.compile(r"kernel-([0-9a-fA-F-]{8,64})\.json")


def read_process_table(proc_root: str = "/proc") -> dict[int, int]:
    """``pid -> ppid`` for every process (Linux ``/proc/<pid>/stat``)."""
    table: dict[int, int] = {}
    for entry in os.scandir(proc_root):
        if not entry.name.isdigit():
            continue
        try:
            stat = Path(entry.path, "stat").read_text()
        except OSError:
            continue
        # "pid (comm) state ppid ...": comm may hold spaces and parentheses.
        fields = stat.rsplit(")", 1)[-1].split()
        if len(fields) >= 2:
            table[int(entry.name)] = int(fields[1])
    return table


def process_started_at(pid: int, proc_root: str = "/proc") -> float | None:
    """When ``pid`` started (seconds since the epoch), from ``/proc/<pid>/stat`` and the boot time."""
    try:
        stat = Path(proc_root, str(pid), "stat").read_text()
        boot = next(
            float(line.split()[1])
            for line in Path(proc_root, "stat").read_text().splitlines()
            if line.startswith("btime ")
        )
    except (OSError, StopIteration, ValueError, IndexError):
        return None
    fields = stat.rsplit(")", 1)[-1].split()
    try:  # field 22 of stat: start time in clock ticks after boot (index 19 after "state")
        return boot + int(fields[19]) / os.sysconf("SC_CLK_TCK")
    except (IndexError, ValueError):
        return None


def owner_of(pid: int, parents: dict[int, int], roots: dict[int, str]) -> str | None:
    """The server key whose process tree contains ``pid``."""
    seen = 0
    while pid > 1 and seen < 256:
        if pid in roots:
            return roots[pid]
        pid = parents.get(pid, 0)
        seen += 1
    return None


def kernel_id_of(pid: int, parents: dict[int, int], proc_root: str = "/proc") -> str | None:
    """The Jupyter kernel id of ``pid`` or its nearest kernel ancestor (from ``kernel-<id>.json``)."""
    seen = 0
    while pid > 1 and seen < 64:
        try:
            cmdline = Path(proc_root, str(pid), "cmdline").read_bytes().decode(errors="replace")
        except OSError:
            return None
        m = KERNEL_FILE_RE.search(cmdline)
        if m:
            return m.group(1)
        pid = parents.get(pid, 0)
        seen += 1
    return None


class NVMLSource(UtilisationSource):
    """Per-process GPU use on this machine; servers found by process ancestry."""

    proc_root = Unicode("/proc", config=True, help="Where the process table is (for tests and containers).")
    nvml_module = AnyTrait(
        None,
        allow_none=True,
        config=True,
        help="The NVML module to use (default: `pynvml` from nvidia-ml-py). For tests and recordings.",
    )

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.nvml = NVML(self.nvml_module)
        self._last_seen: dict[int, int] = {}
        self._history: dict[tuple[str, str, str], deque] = {}
        self._holders: dict[str, list[dict]] = {}

    def _ensure_init(self) -> None:
        if not self.nvml.start():
            raise SourceUnavailable(self.nvml.reason)

    async def collect(self, targets, now, windows):
        window_seconds = max(windows.values(), default=0.0)
        targets = [t for t in targets if t.mapping == DEVICE and t.pid]
        self._ensure_init()
        self.queries += 1
        parents = read_process_table(self.proc_root)
        roots = {t.pid: t.key for t in targets if t.pid}
        by_key = {t.key: t for t in targets}
        devices = sorted({d for t in targets for d in t.devices})
        holders: dict[str, list[dict]] = {t.key: [] for t in targets}
        busiest: dict[tuple[str, int], int] = {}
        answered: set[int] = set()
        for index in devices:
            try:
                procs = self.nvml.compute_processes(index)
                samples = self.nvml.process_utilization(index, self._last_seen.get(index, 0))
            except Exception as e:  # any NVML error: no sample for this device this cycle
                self.log.error("NVML device %d: %s", index, e)
                continue
            answered.add(index)
            if samples:
                self._last_seen[index] = max(ts for _, ts, _ in samples)
            for pid, _ts, sm in samples:
                key = owner_of(pid, parents, roots)
                if key is not None:
                    busiest[(key, index)] = max(busiest.get((key, index), 0), sm)
            for pid, used in procs:
                key = owner_of(pid, parents, roots)
                if key is not None:
                    holders[key].append(
                        {
                            "pid": pid,
                            "device": index,
                            "used_memory_bytes": used,
                            "kernel_id": kernel_id_of(pid, parents, self.proc_root),
                            "started_at": process_started_at(pid, self.proc_root),
                        }
                    )
        if devices and not answered:
            raise SourceUnavailable("NVML answered for none of the devices")
        self._holders = holders
        horizon = now - window_seconds
        out: dict[str, list[DeviceSeries]] = {}
        for key, target in by_key.items():
            series = []
            for index in target.devices:
                # Keyed by session: a restarted server never inherits the samples of the one before.
                hist = self._history.setdefault((key, target.started, device_id(target.hostname, str(index))), deque())
                if index in answered:
                    hist.append((now, float(busiest.get((key, index), 0))))
                while hist and hist[0][0] < horizon:
                    hist.popleft()
                if hist:
                    series.append(
                        DeviceSeries(
                            device_id(target.hostname, str(index)),
                            tuple(hist),
                            metric="nvml:process_sm_util",
                            labels={"gpu_processes": str(sum(1 for h in holders[key] if h["device"] == index))},
                        )
                    )
            out[key] = series
        # Servers that went away: forget their history.
        for hk in [hk for hk in self._history if hk[0] not in by_key or hk[1] != by_key[hk[0]].started]:
            del self._history[hk]
        return out

    def kernel_holders(self, target: ServerTarget) -> list[dict]:
        return list(self._holders.get(target.key, ()))
