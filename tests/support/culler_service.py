"""The GPU idle culler as a hub-managed service of a test hub (``python -m idle_culler``), reading
a real Prometheus: the hub configuration the culler's end-to-end tests run it with."""

from __future__ import annotations

import json
import sys

import requests

from tests.support.hub import RunningHub


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


def culler_token_config(token: str) -> str:
    """Hub config lines that register the ``gpulab-idle-culler`` service with ``token`` and its
    role, and run nothing: a test plays the culler's part through the hub API with that token."""
    return f"""
from hub_config.config.scopes import CULLER_SERVICE_SCOPES
c.JupyterHub.services = list(c.JupyterHub.services) + [
    {{"name": "gpulab-idle-culler", "api_token": "{token}"}}]
c.JupyterHub.load_roles = list(c.JupyterHub.load_roles) + [
    {{"name": "gpulab-idle-culler", "scopes": CULLER_SERVICE_SCOPES, "services": ["gpulab-idle-culler"]}}]
"""


def as_culler(hub: RunningHub, token: str, method: str, path: str, body: dict | None = None) -> requests.Response:
    """A hub API request with the culler's token, as ``gpulab-idle-culler`` makes it."""
    return hub.api(method, path, token=token, data=json.dumps(body) if body is not None else None)
