"""GPU sharing backends: from a profile's GPU fraction to what a pod must ask for.

One small, pure mapping per mechanism. Each takes the profile, its amount in
milli-GPUs, the team and the cluster's option dict for that backend, and
returns a :class:`PodGPUSpec`: extended-resource requests/limits,
annotations, labels, scheduler name and node selector, plus the *effective*
milli-GPUs the pod really takes once the mechanism has rounded the request
(time-slicing replicas, MIG slices, HAMi percentages). The ledger counts the
effective amount, and the spawn form shows it, so a user asking for 0.3 GPU
on a 4-replica time-sliced cluster sees and pays for 0.5.

- ``whole``: ``nvidia.com/gpu: N``; fractions are refused.
- ``timeslice``: NVIDIA device-plugin time-slicing; ``R`` replicas per GPU
  advertised as ``nvidia.com/gpu.shared`` on the nodes of the shared pool
  (``renameByDefault``), ``nvidia.com/gpu`` on the whole-GPU pool, so the
  resource name alone selects the pool. A fraction rounds up to ``1/R``:
  with ``failRequestsGreaterThanOne`` (the default, as NVIDIA recommends) only
  one replica per pod, since k replicas give neither k/R of the compute nor
  any memory isolation, and may even land on two different GPUs.
- ``mig``: MIG "mixed" strategy resources (``nvidia.com/mig-3g.40gb``); the
  smallest slice of the GPU model that covers the requested memory and compute.
- ``hami``: HAMi vGPU, ``nvidia.com/gpu: 1`` with ``nvidia.com/gpumem-percentage``
  and ``nvidia.com/gpucores``, scheduled by ``hami-scheduler``.
- ``kai``: NVIDIA KAI scheduler, ``schedulerName: kai-scheduler``, the
  ``gpu-fraction`` annotation and the team's ``kai.scheduler/queue`` label.

Whole-GPU requests (1, 2, 4 ... GPUs) map to ``nvidia.com/gpu: N`` under every
backend: sharing only concerns fractions. Pure code: no I/O, no Kubernetes client.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from .gpu_pools import pool_exclusions, pool_selector
from .model import Profile, Team
from .units import MILLI_PER_GPU, format_gpus

#: The sharing backends a catalog may name (``sharing.backend``, a profile's ``sharing``).
SHARING_BACKENDS = ("whole", "timeslice", "mig", "hami", "kai")


class SharingError(ValueError):
    """The profile cannot be expressed with this backend (message says why)."""


# --------------------------------------------------------------------------
# Tables

#: GPU Feature Discovery's ``nvidia.com/gpu.product`` values for the models
#: gpulab names (SXM parts; PCIe/NVL parts report other strings, so override
#: them per backend with ``node_selector``).
GPU_PRODUCT_LABEL = "nvidia.com/gpu.product"
DEFAULT_GPU_PRODUCTS: dict[str, str] = {
    "A100-40GB": "NVIDIA-A100-SXM4-40GB",
    "A100-80GB": "NVIDIA-A100-SXM4-80GB",
    "H100-80GB": "NVIDIA-H100-80GB-HBM3",
    "H200-141GB": "NVIDIA-H200",
}

#: MIG profiles per GPU model (NVIDIA MIG user guide), media-extension
#: variants left out. The name says compute slices and memory: ``3g.40gb``.
DEFAULT_MIG_PROFILES: dict[str, tuple[str, ...]] = {
    "A100-40GB": ("1g.5gb", "1g.10gb", "2g.10gb", "3g.20gb", "4g.20gb", "7g.40gb"),
    "A100-80GB": ("1g.10gb", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb"),
    "H100-80GB": ("1g.10gb", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb"),
    "H200-141GB": ("1g.18gb", "1g.35gb", "2g.35gb", "3g.71gb", "4g.71gb", "7g.141gb"),
}


#: A MIG profile name: compute slices and memory, ``3g.40gb``.
MIG_NAME_RE = re.compile(r"^([1-9])g\.([1-9][0-9]{0,3})gb$")
# --------------------------------------------------------------------------
# The result


@dataclass(frozen=True)
class PodGPUSpec:
    """Everything a pod needs for one profile's GPU share."""

    backend: str
    #: What the profile asked for.
    requested_milli: int
    #: What the pod really takes after the backend rounded it (the ledger counts this).
    effective_milli: int
    #: Container ``resources.requests`` / ``resources.limits`` entries (extended resources).
    requests: Mapping[str, str] = field(default_factory=dict)
    limits: Mapping[str, str] = field(default_factory=dict)
    annotations: Mapping[str, str] = field(default_factory=dict)
    labels: Mapping[str, str] = field(default_factory=dict)
    scheduler_name: str | None = None
    node_selector: Mapping[str, str] = field(default_factory=dict)
    #: One line for the spawn form and logs: "2 of 4 time-slices of one H100-80GB".
    summary: str = ""
    #: Tolerations for the taints GPU nodes carry (see :func:`gpu_tolerations`).
    tolerations: tuple[Mapping[str, str], ...] = ()
    #: Container environment the share needs (:data:`NO_GPU_ENV` for a pod without a GPU).
    env: Mapping[str, str] = field(default_factory=dict)
    #: Node selector requirements to AND into the pod's node affinity (:mod:`spawner.core.gpu_pools`).
    node_requirements: tuple[Mapping[str, Any], ...] = ()
    #: The MIG slice a fraction maps to (``1g.10gb``); ``""`` under every other backend.
    mig_slice: str = ""

    @property
    def rounded(self) -> bool:
        return self.effective_milli != self.requested_milli


#: The environment of a pod without a GPU. The NVIDIA container toolkit hands a
#: container the GPUs its NVIDIA_VISIBLE_DEVICES names, and CUDA images set it to
#: ``all`` (the docker-stacks CUDA images do): on a GPU node whose runtime is nvidia
#: (the GPU operator's default) a "CPU only" pod would see every GPU of the node,
#: outside quotas and the ledger. ``void`` makes the runtime behave as runc: no GPU,
#: no driver (NVIDIA container toolkit, "Environment variables"). The device plugin
#: sets the variable for pods that request GPUs; gpulab never sets it for those.
NO_GPU_ENV: Mapping[str, str] = {"NVIDIA_VISIBLE_DEVICES": "void"}

#: Where PyTorch's DataLoader workers (and NCCL between local ranks) pass tensors. A
#: container runtime gives /dev/shm 64 MiB, and DataLoader workers then die with "bus
#: error" or "No space left on device"; a memory-backed emptyDir there is the usual cure
#: (Kubernetes sizes it to the pod's memory limit and counts it against that limit).
SHM_PATH = "/dev/shm"
SHM_VOLUME_NAME = "gpulab-shm"


def shm_volume() -> tuple[dict[str, Any], dict[str, Any]]:
    """The memory-backed ``(volume, volumeMount)`` at :data:`SHM_PATH` of a GPU pod."""
    return (
        {"name": SHM_VOLUME_NAME, "emptyDir": {"medium": "Memory"}},
        {"name": SHM_VOLUME_NAME, "mountPath": SHM_PATH},
    )


def with_shm(volumes: Any, mounts: Any) -> tuple[Any, Any]:
    """``volumes`` and ``mounts`` (lists, or dicts keyed by name as KubeSpawner also takes)
    with :func:`shm_volume` added, unless something (an admin's own volume) is mounted at
    /dev/shm already."""
    listed = list(mounts.values()) if isinstance(mounts, Mapping) else list(mounts)
    if any(str(m.get("mountPath", "")).rstrip("/") == SHM_PATH for m in listed):
        return volumes, mounts
    volume, mount = shm_volume()
    if isinstance(volumes, Mapping):
        volumes = {**volumes, SHM_VOLUME_NAME: volume}
    else:
        volumes = [*volumes, volume]
    if isinstance(mounts, Mapping):
        mounts = {**mounts, SHM_VOLUME_NAME: mount}
    else:
        mounts = [*mounts, mount]
    return volumes, mounts


# --------------------------------------------------------------------------
# Helpers


def _opts(config: Mapping[str, Any], backend: str) -> Mapping[str, Any]:
    opts = config.get(backend) or {}
    return opts if isinstance(opts, Mapping) else {}


def _node_selector(profile: Profile, opts: Mapping[str, Any]) -> dict[str, str]:
    """Node labels that pin the pod to the profile's GPU model (none if any model)."""
    model = profile.gpu_model
    if not model or not profile.is_gpu:
        return {}
    configured = opts.get("node_selector") or {}
    if model in configured:
        return {str(k): str(v) for k, v in configured[model].items()}
    if model in DEFAULT_GPU_PRODUCTS:
        return {GPU_PRODUCT_LABEL: DEFAULT_GPU_PRODUCTS[model]}
    raise SharingError(
        f"no node selector is known for GPU model {model!r}; set sharing.<backend>.node_selector."
        f"{model} to the node labels of those GPUs (known models: {', '.join(DEFAULT_GPU_PRODUCTS)})"
    )


def _whole(
    profile: Profile,
    milli: int,
    opts: Mapping[str, Any],
    backend: str,
    resource_key: str = "whole_resource",
    **extra: Any,
) -> PodGPUSpec:
    gpus = milli // MILLI_PER_GPU
    resource = str(opts.get(resource_key) or "nvidia.com/gpu")
    model = profile.gpu_model or "GPU"
    return PodGPUSpec(
        backend=backend,
        requested_milli=milli,
        effective_milli=milli,
        requests={resource: str(gpus)},
        limits={resource: str(gpus)},
        node_selector=_node_selector(profile, opts),
        summary=f"{gpus} whole {model}{'s' if gpus != 1 else ''}",
        **extra,
    )


def _check_whole_number(profile: Profile, milli: int, backend: str) -> None:
    if milli > MILLI_PER_GPU and milli % MILLI_PER_GPU:
        raise SharingError(
            f"profile {profile.slug!r} asks for {format_gpus(milli)} GPUs: above one GPU the "
            f"{backend!r} backend only gives whole GPUs"
        )


# --------------------------------------------------------------------------
# The mappings


def map_whole(profile: Profile, milli: int, team: Team | None, config: Mapping[str, Any]) -> PodGPUSpec:
    """``nvidia.com/gpu: N``. Refuses fractions: whole GPUs cannot be shared."""
    opts = _opts(config, "whole")
    if milli % MILLI_PER_GPU:
        raise SharingError(
            f"profile {profile.slug!r} asks for {format_gpus(milli)} GPU, but this cluster gives "
            f"whole GPUs only (sharing backend 'whole'); use a whole number of GPUs or set the "
            f"profile's sharing to timeslice, mig, hami or kai"
        )
    return _whole(profile, milli, opts, "whole", resource_key="resource")


def timeslice_effective_milli(milli: int, replicas: int) -> tuple[int, int]:
    """``(k, effective_milli)``: the fewest of ``replicas`` time-slices covering ``milli``.

    ``effective_milli`` is rounded up to a whole milli-GPU (1/3 -> 334).
    """
    k = -(-milli * replicas // MILLI_PER_GPU)  # ceil without floats
    return k, -(-k * MILLI_PER_GPU // replicas)


def _shared_product(selector: dict[str, str], resource: str, opts: Mapping[str, Any]) -> dict[str, str]:
    """Time-slices advertised under the whole-GPU name (``renameByDefault: false``): GPU
    feature discovery then labels the node's product ``<product>-SHARED`` (k8s-device-plugin,
    internal/lm/resource.go), and that label is all that tells the two pools apart."""
    if resource != str(opts.get("whole_resource") or "nvidia.com/gpu") or GPU_PRODUCT_LABEL not in selector:
        return selector
    return {**selector, GPU_PRODUCT_LABEL: selector[GPU_PRODUCT_LABEL] + "-SHARED"}


def map_timeslice(profile: Profile, milli: int, team: Team | None, config: Mapping[str, Any]) -> PodGPUSpec:
    """``nvidia.com/gpu.shared: k`` with ``k/R`` >= the requested fraction."""
    opts = _opts(config, "timeslice")
    _check_whole_number(profile, milli, "timeslice")
    if milli >= MILLI_PER_GPU:
        return _whole(profile, milli, opts, "timeslice")
    replicas = int(opts.get("replicas", 4))
    resource = str(opts.get("resource") or "nvidia.com/gpu.shared")
    k, effective = timeslice_effective_milli(milli, replicas)
    # NVIDIA's time-slicing docs: asking for k > 1 replicas "does not guarantee
    # proportional compute" and gives no memory isolation; the replicas may
    # even come from different GPUs. failRequestsGreaterThanOne: true makes
    # the device plugin refuse such pods, and it is our default too.
    if k > 1 and opts.get("fail_requests_greater_than_one", True):
        raise SharingError(
            f"profile {profile.slug!r} needs {k} of {replicas} time-slices, but a time-sliced pod "
            f"gets one replica (failRequestsGreaterThanOne): {k} replicas would give neither "
            f"{format_gpus(effective)} of the compute nor of the memory; offer "
            f"{format_gpus(timeslice_effective_milli(1, replicas)[1])} GPU, or whole GPUs"
        )
    model = profile.gpu_model or "GPU"
    return PodGPUSpec(
        backend="timeslice",
        requested_milli=milli,
        effective_milli=effective,
        requests={resource: str(k)},
        limits={resource: str(k)},
        node_selector=_shared_product(_node_selector(profile, opts), resource, opts),
        summary=f"{k} of {replicas} time-slices of one {model} ({format_gpus(effective)} GPU)",
    )


@dataclass(frozen=True, order=True)
class MigSlice:
    compute: int
    memory_gb: int
    name: str

    @property
    def resource(self) -> str:
        return f"nvidia.com/mig-{self.name}"


def mig_table(model: str, opts: Mapping[str, Any] | None = None) -> tuple[MigSlice, ...]:
    """The MIG slices of ``model`` (configured ones replace the built-in list)."""
    configured = (opts or {}).get("profiles") or {}
    names = configured.get(model) or DEFAULT_MIG_PROFILES.get(model) or ()
    out = []
    for name in names:
        m = MIG_NAME_RE.match(name)
        if m:
            out.append(MigSlice(int(m.group(1)), int(m.group(2)), name))
    return tuple(sorted(out))


def _mig_shares(table: tuple[MigSlice, ...]) -> Callable[[MigSlice], tuple[int, int, int]]:
    """``share(slice) -> (compute_units, total_compute, memory_eighths)``.

    A GPU has 7 compute slices (4 on an A30) and 8 memory slices; the names
    round memory down (H200 ``2g.35gb`` is 2/8 of 141 GB), so memory is
    counted in eighths of the whole GPU's, not in the named gigabytes.
    """
    total_c = max(s.compute for s in table)
    total_m = max(s.memory_gb for s in table)
    return lambda s: (s.compute, total_c, round(8 * s.memory_gb / total_m))


def pick_mig_slice(table: tuple[MigSlice, ...], milli: int) -> tuple[MigSlice, int]:
    """The smallest slice covering ``milli`` of the GPU's memory *and* compute.

    The whole GPU is the largest slice (``7g.80gb``): its compute and memory
    are the totals. Returns ``(slice, effective_milli)`` where the effective
    share is the larger of the slice's compute and memory shares, rounded up.
    """
    units = _mig_shares(table)

    def covers(s: MigSlice) -> bool:
        c, total_c, m8 = units(s)
        return c * MILLI_PER_GPU >= milli * total_c and m8 * MILLI_PER_GPU >= milli * 8

    def share(s: MigSlice) -> int:
        c, total_c, m8 = units(s)
        return max(-(-c * MILLI_PER_GPU // total_c), -(-m8 * MILLI_PER_GPU // 8))

    best = min((s for s in table if covers(s)), key=lambda s: (share(s), s.compute, s.memory_gb))
    return best, share(best)


def map_mig(profile: Profile, milli: int, team: Team | None, config: Mapping[str, Any]) -> PodGPUSpec:
    """``nvidia.com/mig-<g>g.<mem>gb: 1``: the smallest slice that covers the request."""
    opts = _opts(config, "mig")
    _check_whole_number(profile, milli, "mig")
    if milli >= MILLI_PER_GPU:
        return _whole(profile, milli, opts, "mig")
    model = profile.gpu_model
    if not model:
        raise SharingError(f"profile {profile.slug!r} needs a gpu_model for MIG: slice sizes differ per GPU model")
    table = mig_table(model, opts)
    if not table:
        known = sorted({*DEFAULT_MIG_PROFILES, *(opts.get("profiles") or {})})
        raise SharingError(
            f"no MIG profiles are known for GPU model {model!r} (known: {', '.join(known)}); "
            f"add them under sharing.mig.profiles"
        )
    chosen, effective = pick_mig_slice(table, milli)
    total_c = max(s.compute for s in table)
    return PodGPUSpec(
        backend="mig",
        requested_milli=milli,
        effective_milli=effective,
        requests={chosen.resource: "1"},
        limits={chosen.resource: "1"},
        node_selector=_node_selector(profile, opts),
        mig_slice=chosen.name,
        summary=(
            f"MIG slice {chosen.name} of one {model} ({chosen.compute}/{total_c} compute, "
            f"{chosen.memory_gb} GB; counted as {format_gpus(effective)} GPU)"
        ),
    )


def hami_percent(milli: int) -> int:
    """Whole percent covering ``milli`` (0.333 -> 34)."""
    return -(-milli // 10)


def map_hami(profile: Profile, milli: int, team: Team | None, config: Mapping[str, Any]) -> PodGPUSpec:
    """One vGPU with a memory percentage and a core percentage of the device."""
    opts = _opts(config, "hami")
    _check_whole_number(profile, milli, "hami")
    # HAMi's mutating webhook leaves a pod alone when it already names a
    # scheduler other than the default one (pkg/scheduler/webhook.go), and
    # z2jh's user-scheduler sets one: name HAMi's scheduler ourselves.
    scheduler = str(opts.get("scheduler_name") or "hami-scheduler")
    if milli >= MILLI_PER_GPU:
        return _whole(profile, milli, opts, "hami", resource_key="resource", scheduler_name=scheduler)
    resource = str(opts.get("resource") or "nvidia.com/gpu")
    mem_res = str(opts.get("memory_percentage_resource") or "nvidia.com/gpumem-percentage")
    cores_res = str(opts.get("cores_resource") or "nvidia.com/gpucores")
    pct = hami_percent(milli)
    res = {resource: "1", mem_res: str(pct), cores_res: str(pct)}
    model = profile.gpu_model or "GPU"
    return PodGPUSpec(
        backend="hami",
        requested_milli=milli,
        effective_milli=pct * 10,
        requests=dict(res),
        limits=dict(res),
        scheduler_name=scheduler,
        node_selector=_node_selector(profile, opts),
        summary=f"HAMi vGPU: {pct}% of the memory and {pct}% of the cores of one {model}",
    )


def kai_queue(team: Team, opts: Mapping[str, Any]) -> str:
    return str(opts.get("queue") or "{team}").format(team=team.name)


def map_kai(profile: Profile, milli: int, team: Team | None, config: Mapping[str, Any]) -> PodGPUSpec:
    """KAI scheduler: ``gpu-fraction`` annotation, the team's queue label, ``kai-scheduler``."""
    opts = _opts(config, "kai")
    _check_whole_number(profile, milli, "kai")
    scheduler = str(opts.get("scheduler_name") or "kai-scheduler")
    queue_label = str(opts.get("queue_label") or "kai.scheduler/queue")
    # Without a team (the spawn form's size preview) there is no queue yet.
    labels = {queue_label: kai_queue(team, opts)} if team is not None else {}
    if milli >= MILLI_PER_GPU:
        return _whole(profile, milli, opts, "kai", scheduler_name=scheduler, labels=labels)
    annotation = str(opts.get("fraction_annotation") or "gpu-fraction")
    model = profile.gpu_model or "GPU"
    return PodGPUSpec(
        backend="kai",
        requested_milli=milli,
        effective_milli=milli,
        annotations={annotation: format_gpus(milli)},
        labels=labels,
        scheduler_name=scheduler,
        node_selector=_node_selector(profile, opts),
        summary=f"KAI GPU fraction {format_gpus(milli)} of one {model}"
        + (f" in queue {labels[queue_label]}" if labels else ""),
    )


Mapper = Callable[[Profile, int, "Team | None", Mapping[str, Any]], PodGPUSpec]
MAPPERS: dict[str, Mapper] = {
    "whole": map_whole,
    "timeslice": map_timeslice,
    "mig": map_mig,
    "hami": map_hami,
    "kai": map_kai,
}
assert tuple(MAPPERS) == SHARING_BACKENDS, "one mapping per backend the catalog accepts"


#: The taint key GPU node pools carry (GKE taints GPU nodes nvidia.com/gpu=present:NoSchedule).
GPU_TAINT_KEY = "nvidia.com/gpu"


def gpu_tolerations(spec: PodGPUSpec) -> tuple[dict[str, str], ...]:
    """Tolerations a GPU pod needs on tainted GPU nodes.

    What Kubernetes' ExtendedResourceToleration admission plugin adds when it
    is on (a NoSchedule toleration, operator Exists, keyed by each extended
    resource the pod requests), plus the common ``nvidia.com/gpu`` key, which
    is also the taint of nodes whose shared units are named
    ``nvidia.com/gpu.shared`` and of KAI fractions, which request no resource.
    """
    if spec.effective_milli <= 0:
        return ()
    keys = [GPU_TAINT_KEY] + sorted(k for k in spec.limits if "/" in k and k != GPU_TAINT_KEY)
    return tuple({"key": k, "operator": "Exists", "effect": "NoSchedule"} for k in keys)


def backend_for(profile: Profile, config: Mapping[str, Any]) -> str:
    """The profile's override, else the cluster default, else ``whole``."""
    return profile.sharing or str(config.get("backend") or "whole")


def pod_gpu_spec(
    profile: Profile, config: Mapping[str, Any], team: Team | None = None, milli: int | None = None
) -> PodGPUSpec:
    """Map ``profile`` (``milli`` defaults to its size) with its backend.

    CPU-only profiles get an empty spec. Raises :class:`SharingError`.
    """
    milli = profile.gpu_milli if milli is None else milli
    backend = backend_for(profile, config)
    if backend not in MAPPERS:
        raise SharingError(f"unknown sharing backend {backend!r}; expected one of {', '.join(MAPPERS)}")
    if milli <= 0:
        return PodGPUSpec(backend=backend, requested_milli=0, effective_milli=0, summary="no GPU", env=NO_GPU_ENV)
    spec = MAPPERS[backend](profile, milli, team, config)
    return replace(
        spec,
        tolerations=gpu_tolerations(spec),
        node_selector={**spec.node_selector, **pool_selector(backend)},
        node_requirements=pool_exclusions(backend, spec.limits),
    )


def effective_milli(profile: Profile, config: Mapping[str, Any]) -> int:
    """What the ledger should count for ``profile`` (its size if it cannot be mapped)."""
    try:
        return pod_gpu_spec(profile, config).effective_milli
    except SharingError:
        return profile.gpu_milli


__all__ = [
    "MIG_NAME_RE",
    "DEFAULT_GPU_PRODUCTS",
    "DEFAULT_MIG_PROFILES",
    "GPU_PRODUCT_LABEL",
    "GPU_TAINT_KEY",
    "MAPPERS",
    "NO_GPU_ENV",
    "gpu_tolerations",
    "MigSlice",
    "PodGPUSpec",
    "SharingError",
    "backend_for",
    "effective_milli",
    "mig_table",
    "pick_mig_slice",
    "pod_gpu_spec",
    "timeslice_effective_milli",
]
