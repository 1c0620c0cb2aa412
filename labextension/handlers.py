"""Tornado handlers of the gpulab server extension (inside the single-user server).

Both handlers are ordinary Jupyter server API handlers: they need the same
login as the rest of the server's API (a JupyterHub cookie or token), and a
cookie-authenticated POST must carry the ``_xsrf`` token, which JupyterLab's
``ServerConnection`` sends for us.
"""

from __future__ import annotations

import datetime
import json
import os
import re
from typing import Any
from urllib.parse import quote, urlencode

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
        info["utilisation"] = (
            utilisation.sample(info["devices"])
            if info["gpu"]
            else {"available": False, "reason": "this server has no GPU assigned"}
        )
        self.set_header("Content-Type", "application/json")
        self.finish(json.dumps(info))


#: What the panel says when the hub has no gpulab API.
NO_GPULAB = "This hub does not run gpulab; the GPU panel has nothing to show."


def gpulab_answered(body: bytes) -> bool:
    """Did a gpulab handler write this 404, rather than the hub's catch-all?

    gpulab's 404s always say what was not found ("no such user", "job 7 not
    found"); JupyterHub's ``API404`` for a route it does not have says only
    "Not Found", and a hub behind another proxy may answer HTML.
    """
    try:
        data = json.loads(body)
    except ValueError:
        return False
    message = data.get("message") if isinstance(data, dict) else None
    return isinstance(message, str) and message.strip().lower() not in ("", "not found")


class HubProxyHandler(APIHandler):
    """``/gpulab/api/hub/<path>`` -> the hub's ``/hub/api/gpulab/<path>``, as this server's owner.

    The hub decides what the request may do: the server token only carries
    ``custom:gpulab:jobs!user`` (see ``hub_config/config/scopes.py``), so asking for
    another user's data is refused there, with the hub's own message.
    """

    @property
    def hub_api_url(self) -> str:
        return os.environ.get("JUPYTERHUB_API_URL", "")

    @property
    def hub_token(self) -> str:
        return os.environ.get("JUPYTERHUB_API_TOKEN", "")

    def _error(self, status: int, message: str, absent: str | None = None) -> None:
        body: dict[str, Any] = {"status": status, "message": message}
        if absent:
            body["absent"] = absent
        self.set_status(status)
        self.set_header("Content-Type", "application/json")
        self.finish(json.dumps(body))

    async def _forward(self, method: str, path: str) -> None:
        if not _SAFE_PATH.match(path) or ".." in path:
            return self._error(400, f"not a gpulab API path: {path!r}")
        if not self.hub_api_url or not self.hub_token:
            return self._error(
                503, "this server does not run under JupyterHub (no JUPYTERHUB_API_URL/TOKEN)", absent="no-hub"
            )
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
            url,
            method=method,
            body=body,
            request_timeout=30,
            follow_redirects=False,
            headers={
                "Authorization": f"token {self.hub_token}",
                "Content-Type": "application/json",
                "Accept": "application/json",
            },
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
        if response.code == 404 and not gpulab_answered(response.body or b""):
            return self._error(404, NO_GPULAB, absent="no-gpulab")
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


class StopHandler(APIHandler):
    """``/gpulab/api/stop``: "Stop server and release GPU".

    ``POST`` (an empty JSON object) asks the hub to stop this very server --
    ``DELETE /hub/api/users/<user>/server`` or ``.../servers/<name>``, with
    the server's own token, which carries ``delete:servers!server`` -- and the
    spawner then frees the GPU share. The answer (202) goes out *before* the
    request to the hub, because the hub's stop ends this process. ``GET``
    returns the last request's state: ``requested``, or ``failed`` with the
    hub's reason when the hub refused.
    """

    STATE_KEY = "gpulab_stop_state"

    @property
    def state(self) -> dict[str, Any] | None:
        return self.settings.get(self.STATE_KEY)

    def _answer(self, status: int, body: Any) -> Any:
        self.set_status(status)
        self.set_header("Content-Type", "application/json")
        return self.finish(json.dumps(body))

    @web.authenticated
    async def get(self) -> None:
        await self._answer(200, self.state)

    @web.authenticated
    async def post(self) -> None:
        body = self.request.body or b""
        if len(body) > 1024:
            return await self._answer(413, {"status": 413, "message": "the stop request takes no body"})
        try:
            data = json.loads(body or b"{}")
        except ValueError:
            data = None
        if data != {}:
            return await self._answer(
                400, {"status": 400, "message": "the stop request's body must be {} (it takes no options)"}
            )
        api_url = os.environ.get("JUPYTERHUB_API_URL", "")
        token = os.environ.get("JUPYTERHUB_API_TOKEN", "")
        user = os.environ.get("JUPYTERHUB_USER", "")
        if not (api_url and token and user):
            return await self._answer(
                503,
                {
                    "status": 503,
                    "absent": "no-hub",
                    "message": "this server does not run under JupyterHub: nothing to stop",
                },
            )
        name = os.environ.get("JUPYTERHUB_SERVER_NAME", "")
        path = f"users/{quote(user, safe='')}/" + (f"servers/{quote(name, safe='')}" if name else "server")
        state = {
            "state": "requested",
            "at": datetime.datetime.now(datetime.timezone.utc).isoformat(),
            "message": "The hub is stopping this server; its GPU is released as soon as it has stopped.",
        }
        self.settings[self.STATE_KEY] = state
        self.log.info("gpulab: %s asked to stop this server (%s) and release its GPU", user, path)
        # Answer first: the hub's stop ends this process, and with it any request still open.
        await self._answer(202, state)
        request = HTTPRequest(
            url_path_join(api_url, path),
            method="DELETE",
            request_timeout=60,
            headers={"Authorization": f"token {token}"},
        )
        try:
            response = await AsyncHTTPClient().fetch(request, raise_error=False)
        except (OSError, HTTPClientError) as e:
            response = None
            reason = f"the hub is not reachable: {e}"
        else:
            reason = response.body.decode(errors="replace") if response is not None and response.body else ""
        if response is not None and response.code in (202, 204):
            return
        status = response.code if response is not None else 502
        try:
            reason = json.loads(reason).get("message") or reason
        except (ValueError, AttributeError):
            pass
        self.log.warning("gpulab: the hub did not stop this server: %s %s", status, reason)
        self.settings[self.STATE_KEY] = {
            **state,
            "state": "failed",
            "status": status,
            "message": f"The hub did not stop this server: {reason or status}",
        }


def setup_handlers(web_app: Any, log: Any = None) -> None:
    base = web_app.settings["base_url"]
    web_app.add_handlers(
        ".*$",
        [
            (url_path_join(base, "gpulab/api/session"), SessionHandler),
            (url_path_join(base, "gpulab/api/stop"), StopHandler),
            (url_path_join(base, "gpulab/api/hub/(.*)"), HubProxyHandler),
        ],
    )
