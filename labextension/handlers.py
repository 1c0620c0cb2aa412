"""Tornado handlers of the gpulab server extension (inside the single-user server).

Both handlers are ordinary Jupyter server API handlers: they need the same
login as the rest of the server's API (a JupyterHub cookie or token), and a
cookie-authenticated POST must carry the ``_xsrf`` token, which JupyterLab's
``ServerConnection`` sends for us.
"""

from __future__ import annotations

import json
import os
import re
from typing import Any
from urllib.parse import urlencode

from jupyter_server.base.handlers import APIHandler
from jupyter_server.utils import url_path_join
from tornado import web
from tornado.httpclient import AsyncHTTPClient, HTTPClientError, HTTPRequest

from . import utilisation

#: Largest request body forwarded to the hub (the hub API's own limit is 256 KiB).
MAX_BODY_BYTES = 256 * 1024

#: What a forwarded path may look like: ``me``, ``jobs``, ``jobs/42/logs``, ``idle/keepalive``.
_SAFE_PATH = re.compile(r"^[A-Za-z0-9_\-]+(/[A-Za-z0-9_.\-]+)*$")


def session_info(env: dict[str, str] | None = None) -> dict[str, Any]:
    """This server's GPU share from the ``GPULAB_*`` variables the spawner set.

    ``gpu`` is false when the server was started without a GPU profile.
    """
    env = dict(os.environ if env is None else env)
    devices = [d for d in env.get("CUDA_VISIBLE_DEVICES", "").split(",") if d.strip()]
    info: dict[str, Any] = {
        "user": env.get("JUPYTERHUB_USER", ""),
        "server_name": env.get("JUPYTERHUB_SERVER_NAME", ""),
        "gpu": bool(env.get("GPULAB_PROFILE")),
        "team": env.get("GPULAB_TEAM") or None,
        "profile": env.get("GPULAB_PROFILE") or None,
        "gpu_milli": int(env["GPULAB_GPU_MILLI"]) if env.get("GPULAB_GPU_MILLI", "").isdigit() else None,
        "gpu_fraction": env.get("GPULAB_GPU_FRACTION") or None,
        "gpu_model": env.get("GPULAB_GPU_MODEL") or None,
        "gpu_source": env.get("GPULAB_GPU_SOURCE") or None,
        "memory_mib": int(env["GPULAB_GPU_MEMORY_MIB"]) if env.get("GPULAB_GPU_MEMORY_MIB", "").isdigit() else None,
        "quota": env.get("GPULAB_QUOTA") or None,
        "preemptible": env.get("GPULAB_PREEMPTIBLE") == "1",
        "devices": devices,
        "hub": bool(env.get("JUPYTERHUB_API_URL") and env.get("JUPYTERHUB_API_TOKEN")),
    }
    if info["gpu"] and info["gpu_fraction"]:
        info["share"] = f"{info['gpu_fraction']} × {info['gpu_model'] or 'GPU'}"
    else:
        info["share"] = None
    return info


class SessionHandler(APIHandler):
    """``GET /gpulab/api/session``: this server's GPU, and one NVML sample when available."""

    @web.authenticated
    async def get(self) -> None:
        info = session_info()
        info["utilisation"] = utilisation.sample(info["devices"]) if info["gpu"] else {
            "available": False, "reason": "this server has no GPU assigned"}
        self.set_header("Content-Type", "application/json")
        self.finish(json.dumps(info))


class HubProxyHandler(APIHandler):
    """``/gpulab/api/hub/<path>`` -> the hub's ``/hub/api/gpulab/<path>``, as this server's owner.

    The hub decides what the request may do: the server token only carries
    ``custom:gpulab:jobs!user`` (see ``hub_config/scopes.py``), so asking for
    another user's data is refused there, with the hub's own message.
    """

    @property
    def hub_api_url(self) -> str:
        return os.environ.get("JUPYTERHUB_API_URL", "")

    @property
    def hub_token(self) -> str:
        return os.environ.get("JUPYTERHUB_API_TOKEN", "")

    def _error(self, status: int, message: str) -> None:
        self.set_status(status)
        self.set_header("Content-Type", "application/json")
        self.finish(json.dumps({"status": status, "message": message}))

    async def _forward(self, method: str, path: str) -> None:
        if not _SAFE_PATH.match(path) or ".." in path:
            return self._error(400, f"not a gpulab API path: {path!r}")
        if not self.hub_api_url or not self.hub_token:
            return self._error(503, "this server does not run under JupyterHub (no JUPYTERHUB_API_URL/TOKEN)")
        body = None
        if method == "POST":
            body = self.request.body or b""
            if len(body) > MAX_BODY_BYTES:
                return self._error(413, f"request body is larger than {MAX_BODY_BYTES} bytes")
        query = [(k, v.decode()) for k, vs in self.request.query_arguments.items() for v in vs]
        url = url_path_join(self.hub_api_url, "gpulab", path)
        if query:
            url += "?" + urlencode(query)
        request = HTTPRequest(
            url, method=method, body=body, request_timeout=30, follow_redirects=False,
            headers={"Authorization": f"token {self.hub_token}", "Content-Type": "application/json",
                     "Accept": "application/json"},
            allow_nonstandard_methods=True,
        )
        try:
            response = await AsyncHTTPClient().fetch(request, raise_error=False)
        except (OSError, HTTPClientError) as e:
            self.log.warning("gpulab: hub not reachable at %s: %s", self.hub_api_url, e)
            return self._error(502, f"the hub is not reachable: {e}")
        if response.code == 599:  # tornado's "no HTTP response" (refused, timeout)
            self.log.warning("gpulab: hub not reachable at %s: %s", self.hub_api_url, response.error)
            return self._error(502, f"the hub is not reachable: {response.error}")
        self.log.debug("gpulab: %s %s -> %s", method, path, response.code)
        self.set_status(response.code)
        self.set_header("Content-Type", response.headers.get("Content-Type", "application/json"))
        self.finish(response.body or b"")

    @web.authenticated
    async def get(self, path: str) -> None:
        await self._forward("GET", path)

    @web.authenticated
    async def post(self, path: str) -> None:
        await self._forward("POST", path)

    @web.authenticated
    async def delete(self, path: str) -> None:
        await self._forward("DELETE", path)


def setup_handlers(web_app: Any, log: Any = None) -> None:
    base = web_app.settings["base_url"]
    web_app.add_handlers(".*$", [
        (url_path_join(base, "gpulab/api/session"), SessionHandler),
        (url_path_join(base, "gpulab/api/hub/(.*)"), HubProxyHandler),
    ])
