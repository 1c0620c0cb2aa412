"""Live utilisation of this server's GPUs through NVML (nvidia-ml-py).

No driver, no NVML, or a device NVML cannot find: the answer says so and
carries no numbers. Nothing here ever invents a utilisation figure.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from spawner.local.nvml import NVML

log = logging.getLogger("gpulab.labextension.nvml")

#: One NVML for the lab server's life: initialised on the first sample, never shut down;
#: tried once (the panel polls every few seconds).
_nvml = NVML(retry=False)
_logged_unavailable = False


def sample(visible_devices: list[str]) -> dict[str, Any]:
    """One utilisation sample of the devices in ``CUDA_VISIBLE_DEVICES``.

    Returns ``{"available": True, "at": epoch_seconds, "devices": [{id, uuid,
    name, gpu_percent, memory_used_mib, memory_total_mib}]}`` or
    ``{"available": False, "reason": "..."}``. The percentages are the whole
    physical device's (NVML cannot split a time-sliced GPU between the
    processes that share it), which the panel says.
    """
    if not visible_devices:
        return {"available": False, "reason": "this server has no GPU assigned"}
    global _logged_unavailable
    if not _nvml.start():
        if not _logged_unavailable:
            log.info("gpulab: %s; the GPU panel will show no utilisation data", _nvml.reason)
            _logged_unavailable = True
        return {"available": False, "reason": _nvml.reason}
    out = []
    try:
        for dev in visible_devices:
            used, total = _nvml.memory_mib(dev)
            out.append(
                {
                    "id": dev,
                    "uuid": _nvml.uuid(dev),
                    "name": _nvml.name(dev),
                    "gpu_percent": _nvml.gpu_percent(dev),
                    "memory_used_mib": used,
                    "memory_total_mib": total,
                }
            )
    except Exception as e:  # a device NVML does not know (declared inventory on a GPU box)
        return {"available": False, "reason": f"NVML could not read device {dev!r}: {e}"}
    return {"available": True, "at": time.time(), "devices": out}
