"""The one adapter over NVML (nvidia-ml-py), for every process that asks a GPU.

The hub asks which GPUs this machine has (:func:`detect_gpus`), the culler which
processes use them (``idle_culler/nvml_source.py``), the lab server how busy they are
(``labextension/utilisation.py``); all three go through :class:`NVML`, which loads and
initialises the library once, keeps the reason when it cannot, and turns NVML's
answers into plain Python values. There is never a guess: no driver means ``None``
or "no data, and why", so the caller falls back to the declared inventory or says so.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from spawner.core.packer import GPUDevice

log = logging.getLogger("gpulab.nvml")


def _text(value: Any) -> str:
    """NVML's strings (``bytes`` from older nvidia-ml-py releases) as ``str``."""
    return value.decode() if isinstance(value, bytes) else str(value)


class NVML:
    """nvidia-ml-py, initialised on first use, or the reason it is not there.

    ``module`` is the ``pynvml`` module (imported on first use when not given) or a
    stand-in with its call surface (the tests' scripted NVML, a recording). With
    ``retry=False`` a failed start is final: a process polled every few seconds (the lab
    server) does not ask a missing driver again.
    """

    def __init__(self, module: Any = None, *, retry: bool = True):
        self._module = module
        self._retry = retry
        self._lock = threading.Lock()
        self._started = False
        self._failed = False
        self._handles: dict[int | str, Any] = {}
        #: Why NVML is not available, once :meth:`start` failed ("" otherwise).
        self.reason = ""

    def start(self) -> bool:
        """Initialise NVML (once; again after :meth:`stop` or a failure): ``True`` when it answers."""
        with self._lock:
            if self._started:
                return True
            if self._failed and not self._retry:
                return False
            try:
                if self._module is None:
                    import pynvml  # only where NVML is used: most processes run without it

                    self._module = pynvml
                self._module.nvmlInit()
            except ImportError:
                self._failed, self.reason = True, "nvidia-ml-py is not installed"
                return False
            except Exception as e:  # NVMLError_LibraryNotFound, DriverNotLoaded, ...
                self._failed, self.reason = True, f"NVML is not available: {e}"
                return False
            self._started, self.reason = True, ""
            return True

    def stop(self) -> None:
        """Shut NVML down (device handles are dropped; a later :meth:`start` opens it again)."""
        with self._lock:
            if self._started:
                self._started = False
                self._handles.clear()
                try:
                    self._module.nvmlShutdown()
                except Exception as e:
                    log.debug("nvmlShutdown failed: %s", e)

    @property
    def module(self) -> Any:
        """The started ``pynvml`` module (for its error classes)."""
        if not self._started:
            raise RuntimeError("NVML is not started: call start() first")
        return self._module

    def handle(self, device: int | str) -> Any:
        """The handle of a device by index (``0``, ``"0"``) or UUID (``"GPU-…"``), cached."""
        if device not in self._handles:
            nvml = self.module
            if isinstance(device, int) or device.isdigit():
                self._handles[device] = nvml.nvmlDeviceGetHandleByIndex(int(device))
            else:
                self._handles[device] = nvml.nvmlDeviceGetHandleByUUID(device)
        return self._handles[device]

    def device_count(self) -> int:
        return int(self.module.nvmlDeviceGetCount())

    def name(self, device: int | str) -> str:
        return _text(self.module.nvmlDeviceGetName(self.handle(device)))

    def uuid(self, device: int | str) -> str:
        return _text(self.module.nvmlDeviceGetUUID(self.handle(device)))

    def memory_mib(self, device: int | str) -> tuple[int, int]:
        """``(used, total)`` device memory in MiB."""
        mem = self.module.nvmlDeviceGetMemoryInfo(self.handle(device))
        return int(mem.used // (1024 * 1024)), int(mem.total // (1024 * 1024))

    def gpu_percent(self, device: int | str) -> int:
        """The whole device's utilisation over NVML's last sample period (every process on it)."""
        return int(self.module.nvmlDeviceGetUtilizationRates(self.handle(device)).gpu)

    def minor(self, device: int | str) -> int | None:
        """The minor number of the device's node ``/dev/nvidia<minor>`` (``None``: NVML cannot say)."""
        try:
            return int(self.module.nvmlDeviceGetMinorNumber(self.handle(device)))
        except Exception:
            return None

    def compute_processes(self, index: int) -> list[tuple[int, int | None]]:
        """``(pid, used GPU memory bytes or None)`` of compute processes on device ``index``."""
        procs = self.module.nvmlDeviceGetComputeRunningProcesses(self.handle(index))
        return [(int(p.pid), None if p.usedGpuMemory is None else int(p.usedGpuMemory)) for p in procs]

    def process_utilization(self, index: int, since_us: int) -> list[tuple[int, int, int]]:
        """``(pid, timestamp µs, SM %)`` samples newer than ``since_us``; ``[]`` when NVML has none."""
        nvml = self.module
        try:
            samples = nvml.nvmlDeviceGetProcessUtilization(self.handle(index), int(since_us))
        except nvml.NVMLError_NotFound:
            return []  # no process used the GPU since since_us: an idle GPU, not an error
        return [(int(s.pid), int(s.timeStamp), int(s.smUtil)) for s in samples]


def model_name(raw: str, memory_mib: int) -> str:
    """``"NVIDIA H100 80GB HBM3"`` -> ``"H100-80GB"`` (the catalog's model names)."""
    name = raw.replace("NVIDIA", "").replace("Tesla", "").strip()
    family = name.split()[0] if name else "GPU"
    gib = round(memory_mib / 1024)
    # Marketed sizes: 80 GB parts report ~79.6 GiB, 141 GB ones ~139.8 GiB.
    for size in (10, 16, 20, 24, 32, 40, 48, 80, 94, 96, 141, 192):
        if abs(gib - size * 1000 / 1024) <= 3 or abs(gib - size) <= 1:
            return f"{family}-{size}GB"
    return f"{family}-{gib}GB"


def detect_gpus(node: str = "local", nvml: NVML | None = None) -> list[GPUDevice] | None:
    """The GPUs NVML sees, or ``None`` when NVML or the driver is absent."""
    nvml = nvml or NVML()
    if not nvml.start():
        log.info("%s; using the declared GPU inventory", nvml.reason)
        return None
    try:
        devices = []
        for i in range(nvml.device_count()):
            total = nvml.memory_mib(i)[1]
            # minor: /dev/nvidia<minor>, the node the devices cgroup opens to this device only
            devices.append(
                GPUDevice(i, model_name(nvml.name(i), total), total, nvml.uuid(i), node, "nvml", nvml.minor(i))
            )
        return devices
    finally:
        nvml.stop()
