"""Thin adapter over NVML (nvidia-ml-py): which GPUs this machine has.

Returns ``None`` -- never an empty guess -- when there is no driver, so the
caller falls back to the declared inventory and says so on the spawn page.
"""

from __future__ import annotations

import logging

from .packer import GPUDevice

log = logging.getLogger("gpulab.nvml")


def _model_name(raw: str, memory_mib: int) -> str:
    """``"NVIDIA H100 80GB HBM3"`` -> ``"H100-80GB"`` (the catalog's model names)."""
    name = raw.replace("NVIDIA", "").replace("Tesla", "").strip()
    family = name.split()[0] if name else "GPU"
    gib = round(memory_mib / 1024)
    # Marketed sizes: 80 GB parts report ~79.6 GiB, 141 GB ones ~139.8 GiB.
    for size in (10, 16, 20, 24, 32, 40, 48, 80, 94, 96, 141, 192):
        if abs(gib - size * 1000 / 1024) <= 3 or abs(gib - size) <= 1:
            return f"{family}-{size}GB"
    return f"{family}-{gib}GB"


def detect_gpus(node: str = "local") -> list[GPUDevice] | None:
    """The GPUs NVML sees, or ``None`` when NVML or the driver is absent."""
    try:
        import pynvml
    except ImportError:  # nvidia-ml-py not installed
        return None
    try:
        pynvml.nvmlInit()
    except Exception as e:  # NVMLError_LibraryNotFound, DriverNotLoaded, ...
        log.info("NVML not available (%s); using the declared GPU inventory", e)
        return None
    try:
        devices = []
        for i in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(i)
            name = pynvml.nvmlDeviceGetName(handle)
            if isinstance(name, bytes):
                name = name.decode()
            uuid = pynvml.nvmlDeviceGetUUID(handle)
            if isinstance(uuid, bytes):
                uuid = uuid.decode()
            mem_mib = pynvml.nvmlDeviceGetMemoryInfo(handle).total // (1024 * 1024)
            try:  # /dev/nvidia<minor>: the node the devices cgroup opens to this device only
                minor: int | None = int(pynvml.nvmlDeviceGetMinorNumber(handle))
            except Exception:
                minor = None
            devices.append(GPUDevice(i, _model_name(name, mem_mib), mem_mib, uuid, node, "nvml", minor))
        return devices
    finally:
        try:
            pynvml.nvmlShutdown()
        except Exception:
            pass
