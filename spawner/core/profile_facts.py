"""What a profile gives, as the spawn pages of both spawners say it on its card.

"0.25 × H100-80GB · 19.9 GiB GPU memory", "2 CPUs guaranteed, up to 4 · memory 8 GiB,
up to 16 GiB", "Images: PyTorch, JAX". The GPU memory is the share of one device's
memory (a fraction of a GPU is a fraction of its memory: the single server hands it to
the workload as ``GPULAB_GPU_MEMORY_MIB``, HAMi as its memory percentage), a MIG slice's
own memory, or N whole devices'. The device's memory comes from what the hub knows of
the model: the single server's devices (detected by NVML or declared in the catalog's
``inventory``), else the catalog's ``inventory``, else the number in the model's name
("H100-80GB": 80 GB, as NVIDIA names it). Pure: no I/O.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

from .catalog.inventory import DeviceSpec
from .model import Profile
from .units import MILLI_PER_GPU, format_gpus

#: The memory a GPU model's name states: ``H100-80GB``, ``A100-SXM4-40GB``, ``H200-141GB``.
MODEL_MEMORY_RE = re.compile(r"(?:^|[-_ ])([1-9][0-9]{0,3})\s?GB$", re.IGNORECASE)


@dataclass(frozen=True)
class DeviceMemory:
    """One device's memory: exact MiB (detected or declared) or the GB its model's name states."""

    mib: int = 0
    named_gb: int = 0

    def share_words(self, milli: int) -> str:
        """ "19.9 GiB" for ``milli`` of one device (or N devices); ``""`` when unknown."""
        if self.mib:
            return gib_words(self.mib * milli // MILLI_PER_GPU)
        if self.named_gb:
            return f"{self.named_gb * milli / MILLI_PER_GPU:.1f}".removesuffix(".0") + " GB"
        return ""


def gib_words(mib: int) -> str:
    """MiB as the pages say it: "39.8 GiB" (one decimal, none when whole)."""
    return f"{mib / 1024:.1f}".removesuffix(".0") + " GiB"


def device_memory(
    model: str | None,
    devices: Iterable[tuple[str, int]] = (),
    inventory: Iterable[DeviceSpec] = (),
) -> DeviceMemory:
    """The memory of one ``model`` device (``None``: any model; the first known one).

    ``devices``: ``(model, memory MiB)`` of the machine's devices (single server);
    ``inventory``: the catalog's declared models.
    """
    for name, mib in devices:
        if mib and model in (None, name):
            return DeviceMemory(mib=mib)
    for spec in inventory:
        if spec.memory_mib and model in (None, spec.model):
            return DeviceMemory(mib=spec.memory_mib)
    m = MODEL_MEMORY_RE.search(model or "")
    return DeviceMemory(named_gb=int(m.group(1))) if m else DeviceMemory()


def _cores(value: float) -> str:
    return f"{value:g}"


def _memory(num_bytes: int) -> str:
    return gib_words(num_bytes >> 20) if num_bytes >= 1 << 30 else f"{num_bytes >> 20} MiB"


def _range(guarantee: str | None, limit: str | None, noun: str) -> str:
    """ "2 CPUs guaranteed, up to 4 CPUs", "up to 16 GiB memory", "CPU not limited"."""
    if guarantee and limit and guarantee != limit:
        return f"{guarantee} {noun} guaranteed, up to {limit}"
    if limit:
        return f"up to {limit} {noun}"
    if guarantee:
        return f"{guarantee} {noun} guaranteed"
    return f"{noun} not limited"


def gpu_words(profile: Profile, effective_milli: int, memory: DeviceMemory, mig_slice: str = "") -> str:
    """ "0.25 × H100-80GB · 19.9 GiB GPU memory", "MIG 1g.10gb of one H100-80GB · 10 GB GPU memory",
    "No GPU"."""
    if effective_milli <= 0:
        return "No GPU"
    model = profile.gpu_model or "GPU"
    if mig_slice:
        m = re.search(r"\.([0-9]+)gb$", mig_slice)
        share = f"{m.group(1)} GB" if m else ""
        what = f"MIG slice {mig_slice} of one {model}"
    else:
        share = memory.share_words(effective_milli)
        what = f"{format_gpus(effective_milli)} × {model}"
    return what + (f" · {share} GPU memory" if share else "")


def profile_facts(
    profile: Profile,
    effective_milli: int,
    memory: DeviceMemory,
    *,
    cpu_limit: float | None = None,
    mem_limit: int | None = None,
    cpu_guarantee: float | None = None,
    mem_guarantee: int | None = None,
    mig_slice: str = "",
) -> list[str]:
    """What ``profile`` gives, one short line per fact: GPU share and GPU memory, CPU and memory,
    the image choices. ``cpu_limit``/``mem_limit`` (and the guarantees): what the server really
    runs under, when the adapter knows better than the profile (the single server: the team's
    caps and the hub's defaults applied, :func:`spawner.core.limits.workload_limits`; Kubernetes:
    KubeSpawner's configured values where the profile sets none)."""
    facts = [gpu_words(profile, effective_milli, memory, mig_slice)]
    cpu_g_value = cpu_guarantee if cpu_guarantee is not None else profile.cpu_guarantee
    mem_g_value = mem_guarantee if mem_guarantee is not None else profile.mem_guarantee
    cpu_g = _cores(cpu_g_value) if cpu_g_value else None
    cpu_l = cpu_limit if cpu_limit is not None else profile.cpu_limit
    mem_g = _memory(mem_g_value) if mem_g_value else None
    mem_l = mem_limit if mem_limit is not None else profile.mem_limit
    cpu = _range(cpu_g, _cores(cpu_l) if cpu_l else None, "CPU")
    ram = _range(mem_g, _memory(mem_l) if mem_l else None, "RAM")
    facts.append(f"{cpu} · {ram}")
    if profile.images:
        names = ", ".join(i.display_name for i in profile.images)
        facts.append(("Images: " if len(profile.images) > 1 else "Image: ") + names)
    return facts
