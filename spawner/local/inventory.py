"""This machine's GPUs: detected by NVML or declared in the catalog, and the one device
packer over them that the spawners, the job runner and the admin pages share."""

from __future__ import annotations

import logging

from spawner.core.packer import DevicePacker, devices_from_inventory
from spawner.runtime import GPULabRuntime

from .nvml import detect_gpus


def ensure_packer(runtime: GPULabRuntime, log=None) -> DevicePacker:
    """The runtime's device packer, created on first use (spawners and the job runner share it),
    from the devices ``c.GPULab.gpu_inventory_source`` says to use."""
    with runtime.lock:
        if runtime.packer is not None:
            return runtime.packer
        inventory_source = runtime.gpu_inventory_source
        devices = None
        if inventory_source in ("auto", "nvml"):
            devices = detect_gpus()
            if devices is None and inventory_source == "nvml":
                raise RuntimeError("gpu_inventory_source is 'nvml' but NVML found no NVIDIA driver")
        if devices:
            source = "nvml"
        else:
            devices = devices_from_inventory(runtime.catalog.inventory)
            source = "declared"
        runtime.packer = DevicePacker(devices)
        runtime.inventory_source = source
        (log or logging.getLogger("gpulab")).info(
            "gpulab: %d GPU(s) from %s: %s",
            len(devices),
            source,
            ", ".join(sorted({d.model for d in devices})) or "none",
        )
        return runtime.packer
