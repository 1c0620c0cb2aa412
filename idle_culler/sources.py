"""GPU utilisation sources behind one interface, chosen by ``c.GPUIdleCuller.source``.

- ``PrometheusSource`` (:mod:`idle_culler.prometheus_source`): ONE PromQL query
  per cycle for every GPU server; Prometheus aggregates each idle window itself.
- ``DCGMExporterSource`` (:mod:`idle_culler.dcgm_exporter_source`): scrapes
  dcgm-exporter ``/metrics`` endpoints directly (no Prometheus) and keeps the
  samples it saw over the window.
- ``NVMLSource`` (:mod:`idle_culler.nvml_source`): per-process use on a single server.

``collect()`` returns, per server key, the :class:`~spawner.core.idle.DeviceSeries`
(raw samples) or :class:`~spawner.core.idle.DeviceSummary` (aggregates) of its GPUs; a source that cannot answer at all raises
:class:`SourceUnavailable`, and then nothing is culled that cycle.
"""

from __future__ import annotations

from abc import ABCMeta, abstractmethod
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import replace
from typing import Any

from traitlets import MetaHasTraits
from traitlets.config import LoggingConfigurable

from spawner.core.idle import DeviceSeries, DeviceSummary

from .targets import DEVICE, ServerTarget, device_id

GPU_UTIL = "DCGM_FI_DEV_GPU_UTIL"
GR_ENGINE_ACTIVE = "DCGM_FI_PROF_GR_ENGINE_ACTIVE"
#: HAMi's vGPU monitor, per container and vGPU: the container's own SM use, 0-100
#: (Project-HAMi/HAMi cmd/vGPUmonitor/metrics.go; labels namespace, pod, container,
#: vdevice_index, device_uuid). dcgm-exporter cannot name HAMi's pods (its device ids
#: ``GPU-<uuid>-<n>`` match no GPU), so this is a HAMi server's only evidence.
HAMI_CONTAINER_UTIL = "hami_container_device_utilization_ratio"
METRICS = (GPU_UTIL, GR_ENGINE_ACTIVE, HAMI_CONTAINER_UTIL)


def metrics_for(backends: Iterable[str] | None) -> tuple[str, ...]:
    """The metrics servers of these sharing backends can have evidence in: HAMi's own only when
    a HAMi server can exist (``None`` or an unknown backend "": every metric)."""
    if backends is None:
        return METRICS
    wanted = set(backends)
    return METRICS if wanted & {"hami", ""} else (GPU_UTIL, GR_ENGINE_ACTIVE)


#: Labels worth keeping in the audit evidence.
EVIDENCE_LABELS = ("UUID", "modelName", "GPU_I_PROFILE", "GPU_I_ID", "container", "device_uuid", "vdevice_index")


class SourceUnavailable(Exception):
    """The source could not answer; the culler culls nothing this cycle."""


class _ConfigurableABCMeta(MetaHasTraits, ABCMeta):
    """traitlets' metaclass and abc's together: a configurable class with abstract methods."""


class UtilisationSource(LoggingConfigurable, metaclass=_ConfigurableABCMeta):
    """Interface: GPU utilisation samples for a set of servers (a source that does not
    implement :meth:`collect` cannot be instantiated)."""

    #: Requests made to the metrics backend since start (the benchmark reads it).
    queries = 0
    #: The widest hole between samples the culler tolerates (its ``max_sample_gap``), set by the
    #: culler; a source that summarises holes itself needs it (None: the source's own default).
    max_gap_seconds: float | None = None

    def prefetch(
        self, now: float, windows: Iterable[float], threshold_percent: float, backends: Iterable[str] | None = None
    ) -> None:
        """Start reading ahead, while the culler still lists the hub's servers: the answer
        for every idle window the catalog allows (and its profiles' sharing ``backends``), used
        by the next :meth:`collect` at ``now``. Sources that read per server (an exporter
        scrape, NVML) have nothing to read ahead."""

    def cancel_prefetch(self) -> None:
        """Drop a read ahead the cycle will not use (the hub did not answer, no GPU server)."""

    @abstractmethod
    async def collect(
        self, targets: list[ServerTarget], now: float, windows: Mapping[str, float]
    ) -> dict[str, list[DeviceSeries | DeviceSummary]]:
        """Samples (or summaries) per server key; ``windows`` maps each key to its idle window."""

    def kernel_holders(self, target: ServerTarget) -> list[dict]:
        """Kernels of ``target`` holding GPU memory (only sources with per-process data)."""
        return []


# -- turning labelled series into per-server device series ----------------


def hostname_of(labels: Mapping[str, str]) -> str:
    """dcgm-exporter's host label: ``Hostname`` (old builds) or ``hostname`` (new)."""
    return labels.get("hostname") or labels.get("Hostname") or ""


def percent(metric: str, value: float) -> float:
    return value * 100.0 if metric == GR_ENGINE_ACTIVE else value


def pod_of(labels: Mapping[str, str]) -> tuple[str, str]:
    """``(namespace, pod)`` a series names. Scraped without ``honorLabels`` (the GPU operator's
    own ServiceMonitor, a plain scrape job), the exporter's ``namespace``/``pod`` are renamed
    ``exported_namespace``/``exported_pod`` and the target's own (the exporter's pod) take
    their place: the exported ones, when present, are the workload's."""
    if labels.get("exported_pod"):
        return labels.get("exported_namespace", ""), labels["exported_pod"]
    return labels.get("namespace", ""), labels.get("pod", "")


def index_series(raw: Iterable[tuple[Mapping[str, str], list[tuple[float, float]] | DeviceSummary]]):
    """Index ``(labels, samples or summary)`` by ``(namespace, pod)`` and by ``(host, gpu)``.

    A MIG instance is its own device (``GPU_I_ID``) and is measured by
    ``GR_ENGINE_ACTIVE``; on a whole GPU, ``GR_ENGINE_ACTIVE`` (when profiling
    metrics are on) duplicates ``GPU_UTIL`` and is dropped when both exist.
    """
    by_pod: dict[tuple[str, str], list[DeviceSeries | DeviceSummary]] = defaultdict(list)
    by_device: dict[tuple[str, str], list[DeviceSeries | DeviceSummary]] = defaultdict(list)
    entries = []
    has_util: set[tuple[str, str, str, str, str]] = set()
    for labels, samples in raw:
        metric = labels.get("__name__", "")
        if metric not in METRICS:
            continue
        host, gpu, mig = hostname_of(labels), labels.get("gpu", ""), labels.get("GPU_I_ID", "")
        if metric == HAMI_CONTAINER_UTIL:  # a vGPU: named by its GPU and its index in the container
            host, gpu, mig = "hami", labels.get("device_uuid", ""), labels.get("vdevice_index", "")
        ident = (*pod_of(labels), host, gpu, mig)
        if metric == GPU_UTIL:
            has_util.add(ident)
        entries.append((metric, labels, samples, ident))
    for metric, labels, samples, ident in entries:
        namespace, pod, host, gpu, mig = ident
        if metric == GR_ENGINE_ACTIVE and not mig and ident in has_util:
            continue
        common: dict[str, Any] = dict(
            device=f"hami/{gpu}/vgpu{mig}" if metric == HAMI_CONTAINER_UTIL else device_id(host, gpu, mig),
            metric=metric,
            labels={k: labels[k] for k in EVIDENCE_LABELS if labels.get(k)},
        )
        series: DeviceSeries | DeviceSummary
        if isinstance(samples, DeviceSummary):
            series = replace(samples, peak=percent(metric, samples.peak), mean=percent(metric, samples.mean), **common)
        else:
            series = DeviceSeries(samples=tuple((t, percent(metric, v)) for t, v in samples), **common)
        if pod:
            by_pod[(namespace, pod)].append(series)
        if metric != HAMI_CONTAINER_UTIL:
            by_device[(host, gpu)].append(series)
    return by_pod, by_device


def series_for_targets(targets: list[ServerTarget], by_pod, by_device) -> dict[str, list[DeviceSeries]]:
    out: dict[str, list[DeviceSeries]] = {}
    for t in targets:
        if t.mapping == DEVICE:
            found: list[DeviceSeries] = []
            for d in t.devices:
                # A local server holds whole device indices: MIG instances count under their GPU.
                parent = device_id(t.hostname, str(d))
                found.extend(replace(s, device=parent) for s in by_device.get((t.hostname, str(d)), ()))
            out[t.key] = found
        else:
            out[t.key] = list(by_pod.get((t.namespace, t.pod), ()))
    return out
