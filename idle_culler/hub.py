"""The culler's only way into the hub: its REST API, with the service's token."""

from __future__ import annotations

import asyncio
import json
import ssl
from typing import Any
from urllib.parse import quote

from tornado.httpclient import AsyncHTTPClient, HTTPClientError, HTTPRequest
from tornado.httputil import url_concat


def make_ssl_context(keyfile: str, certfile: str, cafile: str | None = None) -> ssl.SSLContext:
    """Client context for a hub with internal SSL (as jupyterhub-idle-culler makes it)."""
    ctx = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=cafile)
    ctx.load_cert_chain(certfile, keyfile)
    return ctx


class HubAPIError(Exception):
    def __init__(self, method: str, url: str, code: int, message: str):
        self.code = code
        super().__init__(f"{method} {url} -> {code}: {message}")


class HubClient:
    """Hub REST calls the culler makes, limited to ``concurrency`` at a time."""

    def __init__(self, url: str, token: str, *, concurrency: int = 10, page_size: int = 0,
                 ssl_context: ssl.SSLContext | None = None, request_timeout: float = 60.0,
                 public_url: str = ""):
        self.url = url.rstrip("/")
        self.token = token
        self.page_size = page_size
        self.public_url = public_url.rstrip("/")
        self.ssl_context = ssl_context
        self.request_timeout = request_timeout
        self._semaphore = asyncio.Semaphore(concurrency) if concurrency else None
        self.client = AsyncHTTPClient()
        self.requests = 0

    async def request(self, method: str, path_or_url: str, body: Any = None,
                      params: dict[str, str] | None = None, headers: dict[str, str] | None = None) -> tuple[int, Any]:
        url = path_or_url if "://" in path_or_url else self.url + path_or_url
        if params:
            url = url_concat(url, params)
        hdrs = {"Authorization": f"token {self.token}", **(headers or {})}
        data = None
        if body is not None:
            data = json.dumps(body)
            hdrs["Content-Type"] = "application/json"
        req = HTTPRequest(url, method=method, headers=hdrs, body=data, allow_nonstandard_methods=True,
                          request_timeout=self.request_timeout, ssl_options=self.ssl_context)
        self.requests += 1
        try:
            if self._semaphore is not None:
                async with self._semaphore:
                    resp = await self.client.fetch(req)
            else:
                resp = await self.client.fetch(req)
        except HTTPClientError as e:
            message = ""
            if e.response is not None and e.response.body:
                try:
                    message = json.loads(e.response.body).get("message", "")
                except (ValueError, AttributeError):
                    message = e.response.body[:300].decode(errors="replace")
            raise HubAPIError(method, url, e.code, message or str(e)) from None
        if not resp.body:
            return resp.code, None
        return resp.code, json.loads(resp.body)

    async def ready_users(self) -> list[dict[str, Any]]:
        """Every user with a ready server, with server state (paginated like jupyterhub-idle-culler)."""
        params = {"state": "ready"}
        if self.page_size:
            params["limit"] = str(self.page_size)
        headers = {"Accept": "application/jupyterhub-pagination+json"}
        users: list[dict[str, Any]] = []
        next_url: str | None = url_concat(self.url + "/users", params)
        while next_url:
            _, page = await self.request("GET", next_url, headers=headers)
            if isinstance(page, list):  # a hub without pagination
                users.extend(page)
                break
            users.extend(page["items"])
            nxt = (page.get("_pagination") or {}).get("next")
            next_url = nxt["url"] if nxt else None
        return users

    async def idle_state(self) -> dict[str, Any]:
        _, doc = await self.request("GET", "/gpulab/idle/state")
        return doc

    async def warn(self, body: dict[str, Any]) -> dict[str, Any]:
        _, doc = await self.request("POST", "/gpulab/idle/warnings", body)
        return doc

    async def clear(self, user: str, server: str, reason: str) -> None:
        await self.request("DELETE", "/gpulab/idle/warnings", params={"user": user, "server": server,
                                                                       "reason": reason})

    async def record_cycle(self, body: dict[str, Any]) -> dict[str, Any]:
        """One cycle's warnings, holds, clears and reclaim claims in one request."""
        _, doc = await self.request("POST", "/gpulab/idle/cycle", body)
        return doc or {}

    async def stop_server(self, user: str, server: str) -> int:
        """Stop a server (named or default); 202 = stopping, 204 = stopped."""
        if server:
            path = f"/users/{quote(user, safe='')}/servers/{quote(server, safe='')}"
        else:
            path = f"/users/{quote(user, safe='')}/server"
        code, _ = await self.request("DELETE", path)
        return code

    def server_base(self, server_model_url: str, full_url: str | None) -> str | None:
        if full_url:
            return full_url.rstrip("/")
        if self.public_url and server_model_url:
            return self.public_url + "/" + server_model_url.strip("/")
        return None

    async def shutdown_kernel(self, server_base: str, kernel_id: str) -> int:
        """Shut down one kernel through the proxy (the token needs ``access:servers``)."""
        code, _ = await self.request("DELETE", f"{server_base}/api/kernels/{quote(kernel_id, safe='')}")
        return code
