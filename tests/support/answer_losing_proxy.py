"""An HTTP proxy in front of the real API server that loses chosen answers.

Every request goes to the real kube-apiserver and is carried out there (a create
stores the pod); for the requests a rule picks, the client does not get the real
answer: ``hold`` keeps it past the client's own timeout (a slow or lost response, as an
overloaded API server's is), ``504`` answers what the API server answers when its own
deadline passes before the handler returns: the ``Timeout`` Status, code 504, whose
message is ``apierrors.NewTimeoutError``'s ("Timeout: request did not complete within
requested timeout - context deadline exceeded"; k8s.io/apiserver/pkg/endpoints/
handlers/finisher/finisher.go and k8s.io/apimachinery/pkg/api/errors/errors.go), while
the store goes on. The real answer of each request is kept in :attr:`seen`.

The client talks plain HTTP to the proxy (it sends the hub's token, which is forwarded);
the proxy talks TLS to the API server with the bed's CA.
"""

from __future__ import annotations

import asyncio
import json
import re
import ssl
from dataclasses import dataclass, field
from typing import Any

import aiohttp
from aiohttp import web

from tests.support.ports import free_port

#: The API server's answer when its request deadline passes (see the module's docstring).
TIMEOUT_STATUS = {
    "kind": "Status",
    "apiVersion": "v1",
    "metadata": {},
    "status": "Failure",
    "message": "Timeout: request did not complete within requested timeout - context deadline exceeded",
    "reason": "Timeout",
    "details": {},
    "code": 504,
}
#: Headers that belong to one hop, not forwarded.
_HOP = {"host", "content-length", "transfer-encoding", "connection", "accept-encoding"}


@dataclass
class Rule:
    method: str
    path: str  # a regular expression matched against the whole path
    action: str  # "hold" or "504"
    times: int = 1


@dataclass
class Seen:
    method: str
    path: str
    status: int  # the real API server's answer
    body: dict[str, Any]
    lost: str = ""  # the rule's action, when the client did not get it


@dataclass
class AnswerLosingProxy:
    upstream: str
    ca_file: str
    hold_seconds: float = 8.0
    rules: list[Rule] = field(default_factory=list)
    seen: list[Seen] = field(default_factory=list)

    async def start(self) -> str:
        self._ssl = ssl.create_default_context(cafile=self.ca_file)
        self._session = aiohttp.ClientSession()
        app = web.Application(client_max_size=16 * 1024**2)
        app.router.add_route("*", "/{tail:.*}", self._handle)
        self._runner = web.AppRunner(app, handler_cancellation=False)
        await self._runner.setup()
        port = free_port()
        await web.TCPSite(self._runner, "127.0.0.1", port).start()
        return f"http://127.0.0.1:{port}"

    async def close(self) -> None:
        await self._runner.cleanup()
        await self._session.close()

    def lose(self, method: str, path: str, action: str, times: int = 1) -> None:
        self.rules.append(Rule(method, path, action, times))

    def _take(self, method: str, path: str) -> str:
        for rule in self.rules:
            if rule.times > 0 and rule.method == method and re.fullmatch(rule.path, path):
                rule.times -= 1
                return rule.action
        return ""

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        body = await request.read()
        headers = {k: v for k, v in request.headers.items() if k.lower() not in _HOP}
        async with self._session.request(
            request.method, self.upstream + request.path_qs, headers=headers, data=body, ssl=self._ssl
        ) as r:
            data = await r.read()
            status, content_type = r.status, r.headers.get("Content-Type", "application/json")
        action = self._take(request.method, request.path)
        try:
            parsed = json.loads(data) if data else {}
        except ValueError:
            parsed = {}
        self.seen.append(Seen(request.method, request.path, status, parsed, action))
        if action == "hold":
            await asyncio.sleep(self.hold_seconds)  # the client has given up by now
        elif action == "504":
            return web.json_response(TIMEOUT_STATUS, status=504)
        return web.Response(status=status, body=data, headers={"Content-Type": content_type})
