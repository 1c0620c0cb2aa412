"""Live utilisation of this server's GPUs through NVML (nvidia-ml-py).

No driver, no NVML, or a device NVML cannot find: the answer says so and
carries no numbers. Nothing here ever invents a utilisation figure.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

log = logging.getLogger("gpulab.labextension.nvml")

_lock = threading.Lock()
_initialised: bool | None = None  # None: not tried yet; False: tried and failed
_init_error = ""


def _nvml():
    """The initialised ``pynvml`` module, or ``None`` (the reason in ``_init_error``)."""
    global _initialised, _init_error
    with _lock:
        if _initialised is None:
            try:
                import pynvml

                pynvml.nvmlInit()
                _initialised = True
            except ImportError:
                _initialised, _init_error = False, "nvidia-ml-py is not installed"
            except Exception as e:  # NVMLError_LibraryNotFound, DriverNotLoaded, ...
                _initialised, _init_error = False, f"NVML is not available: {e}"
                log.info("gpulab: %s; the GPU panel will show no utilisation data", _init_error)
        if not _initialised:
            return None
        import pynvml

        return pynvml


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


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
    pynvml = _nvml()
    if pynvml is None:
        return {"available": False, "reason": _init_error}
    out = []
    try:
        for dev in visible_devices:
            if dev.isdigit():
                handle = pynvml.nvmlDeviceGetHandleByIndex(int(dev))
            else:
                handle = pynvml.nvmlDeviceGetHandleByUUID(dev)
            rates = pynvml.nvmlDeviceGetUtilizationRates(handle)
            mem = pynvml.nvmlDeviceGetMemoryInfo(handle)
            out.append(
                {
                    "id": dev,
                    "uuid": _text(pynvml.nvmlDeviceGetUUID(handle)),
                    "name": _text(pynvml.nvmlDeviceGetName(handle)),
                    "gpu_percent": int(rates.gpu),
                    "memory_used_mib": int(mem.used // (1024 * 1024)),
                    "memory_total_mib": int(mem.total // (1024 * 1024)),
                }
            )
    except Exception as e:  # a device NVML does not know (declared inventory on a GPU box)
        return {"available": False, "reason": f"NVML could not read device {dev!r}: {e}"}
    return {"available": True, "at": time.time(), "devices": out}
