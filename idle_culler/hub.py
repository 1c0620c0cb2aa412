"""The culler's only way into the hub: its REST API, with the service's token."""

from __future__ import annotations

import asyncio
import json
import ssl
from typing import Any
from urllib.parse import quote

import aiohttp
from tornado.httputil import url_concat

from spawner.core.idle_cycle import CycleRecords, CycleResult, Mark, ReclaimClaim, Unattributed, WarningRecord

from .targets import ServerTarget


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
    """Hub REST calls the culler makes, limited to ``concurrency`` at a time.

    Requests go over a pool of keep-alive connections (aiohttp): a cycle that
    stops thousands of servers makes thousands of requests, and a new TCP
    connection for each (tornado's simple client) costs the culler and the hub
    more than the request itself.
    """

    def __init__(
        self,
        url: str,
        token: str,
        *,
        concurrency: int = 10,
        page_size: int = 0,
        ssl_context: ssl.SSLContext | None = None,
        request_timeout: float = 60.0,
        public_url: str = "",
    ):
        self.url = url.rstrip("/")
        self.token = token
        self.page_size = page_size
        self.public_url = public_url.rstrip("/")
        self.ssl_context = ssl_context
        self.request_timeout = request_timeout
        self.concurrency = concurrency
        self._semaphore = asyncio.Semaphore(concurrency) if concurrency else None
        self._session: aiohttp.ClientSession | None = None
        self._session_loop: asyncio.AbstractEventLoop | None = None
        self.requests = 0

    def _client(self) -> aiohttp.ClientSession:
        """The connection pool of the running event loop (a pool belongs to one loop)."""
        loop = asyncio.get_running_loop()
        if self._session is None or self._session.closed or self._session_loop is not loop:
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=self.concurrency or 100),
                timeout=aiohttp.ClientTimeout(total=self.request_timeout),
            )
            self._session_loop = loop
        return self._session

    async def close(self) -> None:
        if self._session is not None and not self._session.closed:
            await self._session.close()

    async def request(
        self,
        method: str,
        path_or_url: str,
        body: Any = None,
        params: dict[str, str] | None = None,
        headers: dict[str, str] | None = None,
    ) -> tuple[int, Any]:
        url = path_or_url if "://" in path_or_url else self.url + path_or_url
        if params:
            url = url_concat(url, params)
        hdrs = {"Authorization": f"token {self.token}", **(headers or {})}
        data = None
        if body is not None:
            data = json.dumps(body)
            hdrs["Content-Type"] = "application/json"
        kwargs: dict[str, Any] = {"ssl": self.ssl_context} if self.ssl_context is not None else {}
        self.requests += 1
        client = self._client()
        try:
            if self._semaphore is not None:
                async with self._semaphore:
                    code, raw = await self._send(client, method, url, hdrs, data, kwargs)
            else:
                code, raw = await self._send(client, method, url, hdrs, data, kwargs)
        except asyncio.TimeoutError:
            raise HubAPIError(method, url, 599, f"no answer within {self.request_timeout:g}s") from None
        except aiohttp.ClientError as e:
            if isinstance(e, OSError):
                raise
            raise HubAPIError(method, url, 599, str(e) or type(e).__name__) from None
        if code >= 400:
            message = ""
            try:
                message = json.loads(raw).get("message", "")
            except (ValueError, AttributeError):
                message = raw[:300].decode(errors="replace")
            raise HubAPIError(method, url, code, message or f"HTTP {code}")
        if not raw:
            return code, None
        return code, json.loads(raw)

    @staticmethod
    async def _send(
        client: aiohttp.ClientSession,
        method: str,
        url: str,
        headers: dict[str, str],
        data: str | None,
        kwargs: dict[str, Any],
    ) -> tuple[int, bytes]:
        async with client.request(method, url, headers=headers, data=data, **kwargs) as resp:
            return resp.status, await resp.read()

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
        await self.request("DELETE", "/gpulab/idle/warnings", params={"user": user, "server": server, "reason": reason})

    async def record_cycle(self, records: CycleRecords) -> CycleResult:
        """One cycle's warnings, holds, clears and reclaim claims in one request."""
        _, doc = await self.request("POST", "/gpulab/idle/cycle", records.to_json())
        return CycleResult.from_json(doc or {})

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


class CycleBatch:
    """Everything one cycle records in the hub, sent as one request (:class:`CycleRecords`)."""

    def __init__(self) -> None:
        self.warnings: list[WarningRecord] = []
        self.holds: list[Mark] = []
        self.clears: list[Mark] = []
        #: Each claim with the server it is for and the server's base URL (kernel reclaims).
        self.claims: list[tuple[ReclaimClaim, ServerTarget, str | None]] = []
        #: The servers no series names, replacing the hub's list (``None``: the hub's is current).
        self.unattributed: tuple[Unattributed, ...] | None = None

    @property
    def empty(self) -> bool:
        return not (self.warnings or self.holds or self.clears or self.claims) and self.unattributed is None

    def warn(self, record: WarningRecord) -> None:
        self.warnings.append(record)

    def hold(self, user: str, server: str, session: str, reason: str) -> None:
        self.holds.append(Mark(user=user, server=server, session=session, reason=reason[:500]))

    def clear(self, user: str, server: str, reason: str) -> None:
        self.clears.append(Mark(user=user, server=server, reason=reason[:500]))

    def reclaim(self, claim: ReclaimClaim, target: ServerTarget, base: str | None) -> None:
        self.claims.append((claim, target, base))

    def records(self) -> CycleRecords:
        return CycleRecords(
            warnings=tuple(self.warnings),
            holds=tuple(self.holds),
            clears=tuple(self.clears),
            reclaims=tuple(c for c, _, _ in self.claims),
            unattributed=self.unattributed,
        )
