"""GPU utilisation sources behind one interface, chosen by ``c.GPUIdleCuller.source``.

- :class:`PrometheusSource`: ONE PromQL query per cycle for every GPU server,
  over dcgm-exporter's ``DCGM_FI_DEV_GPU_UTIL`` (percent) and
  ``DCGM_FI_PROF_GR_ENGINE_ACTIVE`` (0..1, the only utilisation MIG instances
  have). It asks for a *range vector* (``metric[600s]`` at ``/api/v1/query``),
  which returns the raw samples with their scrape timestamps. (``query_range``
  would re-sample onto a step grid and fill holes from the 5-minute lookback,
  hiding exactly the stale or missing data the decision must see.)
- :class:`DCGMExporterSource`: scrapes dcgm-exporter ``/metrics`` endpoints
  directly (no Prometheus) and keeps the samples it saw over the window.
- ``NVMLSource`` (:mod:`idle_culler.nvml_source`): per-process use on a single server.

``collect()`` returns, per server key, the :class:`~spawner.idle.DeviceSeries`
of its GPUs; a source that cannot answer at all raises
:class:`SourceUnavailable`, and then nothing is culled that cycle.
"""

from __future__ import annotations

import asyncio
import json
import math
import time
from collections import defaultdict, deque
from collections.abc import Iterable, Mapping
from dataclasses import replace
from urllib.parse import urlencode

from tornado.httpclient import AsyncHTTPClient, HTTPClientError, HTTPRequest
from traitlets import Dict, Float, Integer, List, Unicode
from traitlets.config import LoggingConfigurable

from spawner.idle import DeviceSeries

from .targets import DEVICE, ServerTarget, device_id

GPU_UTIL = "DCGM_FI_DEV_GPU_UTIL"
GR_ENGINE_ACTIVE = "DCGM_FI_PROF_GR_ENGINE_ACTIVE"
METRICS = (GPU_UTIL, GR_ENGINE_ACTIVE)
#: Labels worth keeping in the audit evidence.
EVIDENCE_LABELS = ("UUID", "modelName", "GPU_I_PROFILE", "GPU_I_ID", "container")


class SourceUnavailable(Exception):
    """The source could not answer; the culler culls nothing this cycle."""


class UtilisationSource(LoggingConfigurable):
    """Interface: GPU utilisation samples for a set of servers."""

    #: Requests made to the metrics backend since start (the benchmark reads it).
    queries = 0

    async def collect(self, targets: list[ServerTarget], now: float,
                      window_seconds: float) -> dict[str, list[DeviceSeries]]:
        raise NotImplementedError

    def kernel_holders(self, target: ServerTarget) -> list[dict]:
        """Kernels of ``target`` holding GPU memory (only sources with per-process data)."""
        return []


# -- turning labelled series into per-server device series ----------------


def hostname_of(labels: Mapping[str, str]) -> str:
    """dcgm-exporter's host label: ``Hostname`` (old builds) or ``hostname`` (new)."""
    return labels.get("hostname") or labels.get("Hostname") or ""


def percent(metric: str, value: float) -> float:
    return value * 100.0 if metric == GR_ENGINE_ACTIVE else value


def index_series(raw: Iterable[tuple[Mapping[str, str], list[tuple[float, float]]]]):
    """Index raw ``(labels, samples)`` by ``(namespace, pod)`` and by ``(host, gpu)``.

    A MIG instance is its own device (``GPU_I_ID``) and is measured by
    ``GR_ENGINE_ACTIVE``; on a whole GPU, ``GR_ENGINE_ACTIVE`` (when profiling
    metrics are on) duplicates ``GPU_UTIL`` and is dropped when both exist.
    """
    by_pod: dict[tuple[str, str], list[DeviceSeries]] = defaultdict(list)
    by_device: dict[tuple[str, str], list[DeviceSeries]] = defaultdict(list)
    entries = []
    has_util: set[tuple[str, str, str, str, str]] = set()
    for labels, samples in raw:
        metric = labels.get("__name__", "")
        if metric not in METRICS:
            continue
        host, gpu, mig = hostname_of(labels), labels.get("gpu", ""), labels.get("GPU_I_ID", "")
        ident = (labels.get("namespace", ""), labels.get("pod", ""), host, gpu, mig)
        if metric == GPU_UTIL:
            has_util.add(ident)
        entries.append((metric, labels, samples, ident))
    for metric, labels, samples, ident in entries:
        namespace, pod, host, gpu, mig = ident
        if metric == GR_ENGINE_ACTIVE and not mig and ident in has_util:
            continue
        series = DeviceSeries(
            device=device_id(host, gpu, mig),
            samples=tuple((t, percent(metric, v)) for t, v in samples),
            metric=metric,
            labels={k: labels[k] for k in EVIDENCE_LABELS if labels.get(k)},
        )
        if pod:
            by_pod[(namespace, pod)].append(series)
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


# -- Prometheus -------------------------------------------------------------


class PrometheusSource(UtilisationSource):
    """dcgm-exporter metrics through Prometheus: one query per cycle."""

    prometheus_url = Unicode(
        "http://prometheus-server", config=True,
        help="Base URL of the Prometheus HTTP API (without /api/v1).",
    )
    series_selector = Unicode(
        "", config=True,
        help="""Extra PromQL label matchers added to the query, e.g.
        `namespace=~"jhub|team-.*"`, to limit it to the hub's pods.""",
    )
    bearer_token_file = Unicode(
        "", config=True, help="File with a bearer token for Prometheus (empty: no Authorization header).",
    )
    request_timeout = Float(30.0, config=True, help="Seconds to wait for Prometheus.")

    def query(self, window_seconds: float) -> str:
        matchers = [f'__name__=~"{GPU_UTIL}|{GR_ENGINE_ACTIVE}"']
        if self.series_selector.strip():
            matchers.append(self.series_selector.strip())
        return "{" + ",".join(matchers) + "}" + f"[{int(math.ceil(window_seconds))}s]"

    async def collect(self, targets, now, window_seconds):
        if not targets:
            return {}
        params = urlencode({"query": self.query(window_seconds), "time": f"{now:.3f}"})
        headers = {"Content-Type": "application/x-www-form-urlencoded"}
        if self.bearer_token_file:
            with open(self.bearer_token_file) as f:
                headers["Authorization"] = "Bearer " + f.read().strip()
        url = self.prometheus_url.rstrip("/") + "/api/v1/query"
        self.queries += 1
        try:
            resp = await AsyncHTTPClient().fetch(HTTPRequest(
                url, method="POST", body=params, headers=headers, request_timeout=self.request_timeout))
            doc = json.loads(resp.body)
        except (HTTPClientError, OSError, ValueError, asyncio.TimeoutError) as e:
            raise SourceUnavailable(f"Prometheus at {url}: {e}") from None
        if doc.get("status") != "success" or (doc.get("data") or {}).get("resultType") != "matrix":
            raise SourceUnavailable(f"Prometheus at {url} answered {str(doc)[:300]}")
        raw = []
        for item in doc["data"]["result"]:
            samples = []
            for t, v in item.get("values", ()):
                try:
                    samples.append((float(t), float(v)))
                except (TypeError, ValueError):
                    samples.append((float(t), float("nan")))
            raw.append((item.get("metric", {}), samples))
        by_pod, by_device = index_series(raw)
        self.log.debug("Prometheus: %d series for %d servers", len(raw), len(targets))
        return series_for_targets(targets, by_pod, by_device)


# -- dcgm-exporter, scraped directly --------------------------------------


class DCGMExporterSource(UtilisationSource):
    """Scrape dcgm-exporter ``/metrics`` (one request per exporter per cycle) and remember the window."""

    exporter_urls = List(
        Unicode(), config=True,
        help="dcgm-exporter metrics URLs, e.g. `[\"http://10.0.0.5:9400/metrics\"]` (one per GPU node).",
    )
    request_timeout = Float(10.0, config=True, help="Seconds to wait for one exporter.")
    max_series = Integer(200_000, config=True, help="Most series remembered (protects memory).")
    extra_headers = Dict(config=True, help="Extra HTTP headers sent to the exporters.")

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self._history: dict[tuple, tuple[dict, deque]] = {}

    async def _scrape(self, url: str):
        from prometheus_client.parser import text_string_to_metric_families

        self.queries += 1
        resp = await AsyncHTTPClient().fetch(HTTPRequest(url, headers=dict(self.extra_headers),
                                                         request_timeout=self.request_timeout))
        scraped_at = time.time()
        out = []
        for family in text_string_to_metric_families(resp.body.decode("utf-8", "replace")):
            if family.name not in METRICS:
                continue
            for s in family.samples:
                if s.name != family.name:
                    continue
                labels = dict(s.labels, __name__=s.name)
                out.append((labels, s.timestamp if s.timestamp is not None else scraped_at, float(s.value)))
        return out

    async def collect(self, targets, now, window_seconds):
        if not self.exporter_urls:
            raise SourceUnavailable("no dcgm-exporter URLs configured (c.DCGMExporterSource.exporter_urls)")
        results = await asyncio.gather(*(self._scrape(u) for u in self.exporter_urls), return_exceptions=True)
        ok = 0
        for url, result in zip(self.exporter_urls, results):
            if isinstance(result, BaseException):
                self.log.error("dcgm-exporter %s: %s", url, result)
                continue
            ok += 1
            for labels, ts, value in result:
                key = tuple(sorted(labels.items()))
                entry = self._history.get(key)
                if entry is None:
                    if len(self._history) >= self.max_series:
                        continue
                    entry = self._history[key] = (labels, deque())
                entry[1].append((float(ts), value))
        # Forget what is older than the window; drop series that went silent.
        horizon = now - window_seconds
        for key in list(self._history):
            samples = self._history[key][1]
            while samples and samples[0][0] < horizon:
                samples.popleft()
            if not samples:
                del self._history[key]
        if ok == 0:
            raise SourceUnavailable("no dcgm-exporter answered")
        by_pod, by_device = index_series((labels, list(samples)) for labels, samples in self._history.values())
        return series_for_targets(targets, by_pod, by_device)
