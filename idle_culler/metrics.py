"""The culler's own Prometheus metrics (a private registry, served at /metrics)."""

from __future__ import annotations

import logging
import os
from urllib.parse import urlparse

from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from tornado import web
from tornado.httpserver import HTTPServer


class CullerMetrics:
    def __init__(self) -> None:
        self.registry = r = CollectorRegistry()
        self.cycles = Counter("gpulab_culler_cycles", "Cull cycles run.", registry=r)
        self.errors = Counter(
            "gpulab_culler_errors", "Errors, by stage (source, hub, stop, record).", ["stage"], registry=r
        )
        self.skipped = Counter(
            "gpulab_culler_skipped_missing_data",
            "GPU servers left alone in a cycle because their utilisation data was missing, stale or partial.",
            registry=r,
        )
        self.warnings = Counter("gpulab_culler_warnings", "Idle warnings recorded.", ["team"], registry=r)
        self.reclaims = Counter(
            "gpulab_culler_reclaims",
            "Reclaims, by action (stop-server, shutdown-kernel).",
            ["team", "action"],
            registry=r,
        )
        self.idle_gpu_hours = Counter(
            "gpulab_culler_idle_gpu_hours_before_reclaim",
            "Idle GPU-hours observed before reclaims (GPUs held x proven idle time up to the reclaim). "
            "The GPU-hours freed after reclaims are on the hub's /hub/metrics "
            "(gpulab_idle_gpu_hours_freed).",
            ["team"],
            registry=r,
        )
        self.reclaimed_gpus = Counter(
            "gpulab_culler_reclaimed_gpus",
            "GPUs taken back from idle servers (sum of their GPU amounts).",
            ["team"],
            registry=r,
        )
        self.source_failures = Counter(
            "gpulab_culler_source_failures",
            "Cycles that culled nothing because the utilisation source failed, by reason "
            "(unavailable, too-large, no-series: see the log line for what to change).",
            ["reason"],
            registry=r,
        )
        self.answer_bytes = Gauge(
            "gpulab_culler_last_answer_bytes", "Size of the utilisation source's last answer, in bytes.", registry=r
        )
        self.gpu_servers = Gauge(
            "gpulab_culler_gpu_servers", "GPU servers seen in the last cycle, by verdict.", ["verdict"], registry=r
        )
        self.unattributed = Gauge(
            "gpulab_culler_unattributed_servers",
            "Running GPU servers no utilisation series names, by reason (never reclaimed as idle).",
            ["reason"],
            registry=r,
        )
        self.cycle_seconds = Gauge("gpulab_culler_last_cycle_seconds", "Wall time of the last cycle.", registry=r)
        self.queries = Gauge(
            "gpulab_culler_last_cycle_metric_queries",
            "Requests made to the metrics source in the last cycle.",
            registry=r,
        )

    def render(self) -> bytes:
        return generate_latest(self.registry)


class MetricsHandler(web.RequestHandler):
    def initialize(self, metrics: CullerMetrics) -> None:
        self.metrics = metrics

    def get(self) -> None:
        self.set_header("Content-Type", CONTENT_TYPE_LATEST)
        self.finish(self.metrics.render())


def serve_metrics(metrics: CullerMetrics, url: str, log: logging.Logger) -> HTTPServer:
    """Serve ``metrics`` at ``<url>/metrics`` (and under the service prefix when run by the hub)."""
    parsed = urlparse(url)
    prefix = os.environ.get("JUPYTERHUB_SERVICE_PREFIX", "/").rstrip("/")
    routes = [(r"/metrics", MetricsHandler, {"metrics": metrics})]
    if prefix:
        routes.append((prefix + r"/metrics", MetricsHandler, {"metrics": metrics}))
    server = HTTPServer(web.Application(routes))
    server.listen(parsed.port or 80, parsed.hostname or "127.0.0.1")
    log.info("Serving metrics at %s/metrics", url.rstrip("/"))
    return server
