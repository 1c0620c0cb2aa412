"""A stand-in for pynvml where there is no GPU: the calls the adapter makes, answered with
pynvml's own structures and exceptions (``nvmlDeviceGetProcessUtilization`` raises
``NVMLError_NotFound`` on an idle GPU, as the real library does)."""

from __future__ import annotations

import time

import pynvml


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
