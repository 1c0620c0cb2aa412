"""The culler's own Prometheus metrics (a private registry, served at /metrics)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from tornado import web


class CullerMetrics:
    def __init__(self) -> None:
        self.registry = r = CollectorRegistry()
        self.cycles = Counter("gpulab_culler_cycles", "Cull cycles run.", registry=r)
        self.errors = Counter("gpulab_culler_errors", "Errors, by stage (source, hub, stop, record).",
                              ["stage"], registry=r)
        self.skipped = Counter(
            "gpulab_culler_skipped_missing_data",
            "GPU servers left alone in a cycle because their utilisation data was missing, stale or partial.",
            registry=r)
        self.warnings = Counter("gpulab_culler_warnings", "Idle warnings recorded.", ["team"], registry=r)
        self.reclaims = Counter("gpulab_culler_reclaims", "Reclaims, by action (stop-server, shutdown-kernel).",
                                ["team", "action"], registry=r)
        self.reclaimed_gpu_hours = Counter(
            "gpulab_culler_reclaimed_gpu_hours",
            "GPU-hours given back by stopping idle servers (GPUs held x verified idle time).",
            ["team"], registry=r)
        self.gpu_servers = Gauge("gpulab_culler_gpu_servers", "GPU servers seen in the last cycle, by verdict.",
                                 ["verdict"], registry=r)
        self.cycle_seconds = Gauge("gpulab_culler_last_cycle_seconds", "Wall time of the last cycle.",
                                   registry=r)
        self.queries = Gauge("gpulab_culler_last_cycle_metric_queries",
                             "Requests made to the metrics source in the last cycle.", registry=r)

    def render(self) -> bytes:
        return generate_latest(self.registry)


class MetricsHandler(web.RequestHandler):
    def initialize(self, metrics: CullerMetrics) -> None:
        self.metrics = metrics

    def get(self) -> None:
        self.set_header("Content-Type", CONTENT_TYPE_LATEST)
        self.finish(self.metrics.render())
