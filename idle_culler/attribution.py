"""Why a GPU server on Kubernetes has no utilisation series, said once and loudly.

dcgm-exporter names a GPU's series with the pod that holds it only where the kubelet's
device ids let it (NVIDIA/dcgm-exporter ``internal/pkg/transformation/kubernetes.go``):
whole GPUs and MIG instances always, time-slicing replicas only when told, HAMi's vGPUs
and KAI's fractions never. Without a series naming its pod a server is never judged idle
(no evidence, no reclaim); these are the sentences that tell its user and the admins why,
by sharing backend. Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from spawner.core.idle_cycle import UNATTRIBUTED_CODES, Unattributed
from spawner.core.units import MILLI_PER_GPU

from .targets import POD, ServerTarget

#: What the user and the admins read after "idle GPU reclaim is off for this server: ".
REASONS: Mapping[str, str] = {
    "no-series": (
        "no dcgm-exporter series names this pod: check that dcgm-exporter runs on its node with "
        "Kubernetes mode on (the GPU operator's default) and that Prometheus scrapes it"
    ),
    "timeslice-not-attributed": (
        "dcgm-exporter labels a time-sliced pod only when NVIDIA_RESOURCE_NAMES lists the pool's "
        "resource (nvidia.com/gpu.shared), and one pod per GPU unless KUBERNETES_VIRTUAL_GPUS=true: "
        "set both on dcgm-exporter"
    ),
    "mig-no-profiling-metrics": (
        "a MIG instance's utilisation exists only as DCGM's profiling metric "
        "DCGM_FI_PROF_GR_ENGINE_ACTIVE, and none names this pod: the GPU or driver does not collect "
        "profiling metrics, dcgm-exporter's counters leave them out (dcp-metrics-included.csv has "
        "them), or someone is profiling the GPU with Nsight"
    ),
    "hami-no-vgpu-metrics": (
        "HAMi's vGPU ids match no GPU, so dcgm-exporter names no HAMi pod, and HAMi's vGPU monitor "
        "(hami_container_device_utilization_ratio) has no series for this pod: scrape HAMi's "
        "device plugin monitor into the culler's Prometheus"
    ),
    "kai-reservation-pod": (
        "KAI holds this GPU fraction's GPU with its gpu-reservation pod (namespace "
        "kai-resource-reservation), so dcgm-exporter attributes the GPU to that pod, not to this server: "
        "set c.PrometheusSource.kai_reservation_namespace and export KAI's runai-gpu-group pod label "
        "from kube-state-metrics to find it through KAI's GPU group"
    ),
}
assert tuple(REASONS) == UNATTRIBUTED_CODES, "one sentence per code the hub accepts"

#: Put before the reason wherever a user or an admin reads it.
REASON_PREFIX = "idle GPU reclaim is off for this server: "

#: Evidence note of servers whose series is a whole shared GPU's.
SHARED_GPU_NOTE = (
    "shared GPU (time-slice or KAI fraction): the series is the whole GPU's utilisation, so the "
    "server is idle only when every pod on that GPU is idle"
)


def unattributed_code(target: ServerTarget) -> str:
    """Why no series names ``target``'s pod, from its sharing backend and size."""
    fraction = target.gpu_milli < MILLI_PER_GPU
    if target.sharing == "hami":
        return "hami-no-vgpu-metrics"  # HAMi's device plugin serves whole GPUs as vGPU ids too
    if fraction and target.sharing == "kai":
        return "kai-reservation-pod"
    if fraction and target.sharing == "timeslice":
        return "timeslice-not-attributed"
    if fraction and target.sharing == "mig":
        return "mig-no-profiling-metrics"
    return "no-series"


def is_unattributed(target: ServerTarget, series: int, now: float, after_seconds: float) -> bool:
    """A pod server that has run ``after_seconds`` and still no series names it."""
    if target.mapping != POD or series:
        return False
    return target.started_at is not None and now - target.started_at >= after_seconds


def shares_whole_gpu(target: ServerTarget) -> bool:
    """Its series, when it has one, is the whole GPU's: time-slices and KAI fractions see their GPU's."""
    return target.sharing in ("timeslice", "kai") and target.gpu_milli < MILLI_PER_GPU


def unattributed_servers(
    targets: Sequence[ServerTarget], data: Mapping[str, Sequence[Any]], now: float, after_seconds: float
) -> list[tuple[ServerTarget, Unattributed]]:
    """Each server no series names after ``after_seconds``, with its reason for the hub."""
    found = []
    for t in targets:
        if is_unattributed(t, len(data.get(t.key) or ()), now, after_seconds):
            code = unattributed_code(t)
            found.append(
                (t, Unattributed(user=t.user, server=t.server, session=t.started, code=code, reason=REASONS[code]))
            )
    return found


def hub_has_these(found: Sequence[Unattributed], hub_list: Sequence[Mapping[str, Any]] | None) -> bool:
    """Whether the hub's list (``None``: a hub that does not say) is already ``found``."""
    if hub_list is None:
        return False
    mine = {(u.user, u.server, u.session, u.code, u.reason) for u in found}
    theirs = {(u.get("user"), u.get("server"), u.get("session"), u.get("code"), u.get("reason")) for u in hub_list}
    return mine == theirs
