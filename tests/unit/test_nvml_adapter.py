"""The one NVML adapter (spawner/local/nvml.py), on stand-ins with pynvml's call surface.

The stand-ins answer as nvidia-ml-py documents: ``nvmlInit`` raises an ``NVMLError``
subclass without a driver, names and UUIDs may come as ``bytes`` from older releases.
"""

from __future__ import annotations

from types import SimpleNamespace

import pynvml

from spawner.local.nvml import NVML, detect_gpus, model_name


class NoDriver:
    """pynvml on a machine without the NVIDIA driver: ``nvmlInit`` fails, every time."""

    def __init__(self):
        self.inits = 0

    def nvmlInit(self):  # noqa: N802 (pynvml names)
        self.inits += 1
        raise pynvml.NVMLError(pynvml.NVML_ERROR_DRIVER_NOT_LOADED)


class OneH100:
    """pynvml with one H100 80GB, names as bytes (nvidia-ml-py before 11.5)."""

    def __init__(self):
        self.shutdowns = 0

    def nvmlInit(self):  # noqa: N802
        pass

    def nvmlShutdown(self):  # noqa: N802
        self.shutdowns += 1

    def nvmlDeviceGetCount(self):  # noqa: N802
        return 1

    def nvmlDeviceGetHandleByIndex(self, i):  # noqa: N802
        return ("h", i)

    def nvmlDeviceGetName(self, h):  # noqa: N802
        return b"NVIDIA H100 80GB HBM3"

    def nvmlDeviceGetUUID(self, h):  # noqa: N802
        return b"GPU-1234"

    def nvmlDeviceGetMemoryInfo(self, h):  # noqa: N802
        return SimpleNamespace(total=81559 * 1024 * 1024, used=1024 * 1024 * 1024)


def test_without_a_driver_there_is_a_reason_and_no_devices():
    module = NoDriver()
    nvml = NVML(module)
    assert not nvml.start() and nvml.reason.startswith("NVML is not available: ")
    assert detect_gpus(nvml=NVML(module)) is None
    assert not nvml.start() and module.inits == 3  # retried by default (the culler, each cycle)


def test_a_failed_start_is_final_when_asked():
    module = NoDriver()
    nvml = NVML(module, retry=False)
    assert not nvml.start() and not nvml.start()
    assert module.inits == 1


def test_detect_gpus_reads_names_as_catalog_models_and_shuts_down():
    module = OneH100()
    [dev] = detect_gpus("node-a", nvml=NVML(module))
    assert (dev.index, dev.model, dev.uuid, dev.node) == (0, "H100-80GB", "GPU-1234", "node-a")
    assert module.shutdowns == 1
    assert model_name("NVIDIA H200", 143771) == "H200-141GB"


def test_device_reads_by_index_string():
    nvml = NVML(OneH100())
    assert nvml.start()
    assert nvml.memory_mib("0") == (1024, 81559) and nvml.name("0") == "NVIDIA H100 80GB HBM3"
