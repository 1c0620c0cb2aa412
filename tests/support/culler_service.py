"""The GPU idle culler as a hub-managed service of a test hub (``python -m idle_culler``), reading
a real Prometheus: the hub configuration the culler's end-to-end tests run it with."""

from __future__ import annotations

import sys


def culler_service_config(
    prometheus_url: str,
    metrics_port: int,
    *,
    node: str,
    grace: int,
    keepalive_max_uses: int,
    keepalive_extends_seconds: int,
    extra: str = "",
) -> str:
    """Hub config lines that start the culler as the ``gpulab-idle-culler`` service with its role,
    cycling every second over Prometheus with a 1 s scrape interval and ``grace`` seconds of grace."""
    command = [
        sys.executable,
        "-m",
        "idle_culler",
        "--source=prometheus",
        f"--prometheus-url={prometheus_url}",
        "--cull-every=1",
        f"--grace={grace}",
        "--max-sample-gap=2.5",
        "--scrape-interval=1",
        f"--node-name={node}",
        "--timeout=3600",
        "--log-level=DEBUG",
    ]
    return f"""
from hub_config.config.scopes import CULLER_SERVICE_SCOPES
c.JupyterHub.services = list(c.JupyterHub.services) + [{{
    "name": "gpulab-idle-culler", "url": "http://127.0.0.1:{metrics_port}", "command": {command!r}}}]
c.JupyterHub.load_roles = list(c.JupyterHub.load_roles) + [{{
    "name": "gpulab-idle-culler", "scopes": CULLER_SERVICE_SCOPES, "services": ["gpulab-idle-culler"]}}]
c.GPULabIdle.keepalive_max_uses = {keepalive_max_uses}
c.GPULabIdle.keepalive_extends_seconds = {keepalive_extends_seconds}
{extra}
"""
