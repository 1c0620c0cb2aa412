"""Utilisation from dcgm-exporter ``/metrics`` endpoints scraped directly, without Prometheus.

One request per exporter per cycle; the culler remembers the samples it saw
over the longest idle window itself (``c.DCGMExporterSource.max_series`` bounds
the memory). Chosen with ``c.GPUIdleCuller.source = "dcgm-exporter"``.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque

from tornado.httpclient import AsyncHTTPClient, HTTPRequest
from traitlets import Dict, Float, Integer, List, Unicode

from .sources import METRICS, SourceUnavailable, UtilisationSource, index_series, series_for_targets


class DCGMExporterSource(UtilisationSource):
    """Scrape dcgm-exporter ``/metrics`` (one request per exporter per cycle) and remember the window."""

    exporter_urls = List(
        Unicode(),
        config=True,
        help='dcgm-exporter metrics URLs, e.g. `["http://10.0.0.5:9400/metrics"]` (one per GPU node).',
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
        resp = await AsyncHTTPClient().fetch(
            HTTPRequest(url, headers=dict(self.extra_headers), request_timeout=self.request_timeout)
        )
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

    async def collect(self, targets, now, windows):
        window_seconds = max(windows.values(), default=0.0)
        if not self.exporter_urls:
            raise SourceUnavailable("no dcgm-exporter URLs configured (c.DCGMExporterSource.exporter_urls)")
        results = await asyncio.gather(*(self._scrape(u) for u in self.exporter_urls), return_exceptions=True)
        ok = 0
        for url, result in zip(self.exporter_urls, results, strict=True):
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
