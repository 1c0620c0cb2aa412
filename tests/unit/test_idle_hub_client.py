"""The culler's hub client: keep-alive connections, at most ``concurrency`` of them, and
errors that say what happened (a tornado app on a loopback port stands in for the hub API)."""

from __future__ import annotations

import asyncio

import pytest
from tornado import web
from tornado.httpserver import HTTPServer

from idle_culler.hub import HubAPIError, HubClient
from tests.support.hub import free_port


class Recorder:
    def __init__(self) -> None:
        self.peers: set[tuple] = set()
        self.requests = 0


@pytest.fixture
async def api():
    seen = Recorder()

    class Ok(web.RequestHandler):
        async def delete(self, name):
            seen.requests += 1
            seen.peers.add(self.request.connection.context.address)
            await asyncio.sleep(0.005)
            self.set_status(204)

    class Refused(web.RequestHandler):
        def post(self):
            self.set_status(409)
            self.finish({"status": 409, "message": "'keep my GPU' was pressed"})

    class Slow(web.RequestHandler):
        async def get(self):
            await asyncio.sleep(2)
            self.finish({})

    port = free_port()
    server = HTTPServer(
        web.Application(
            [(r"/hub/api/users/([^/]+)/server", Ok), (r"/hub/api/refused", Refused), (r"/hub/api/slow", Slow)]
        )
    )
    server.listen(port, "127.0.0.1")
    yield f"http://127.0.0.1:{port}/hub/api", seen
    server.stop()


async def test_stops_reuse_at_most_concurrency_connections(api):
    url, seen = api
    hub = HubClient(url, "token", concurrency=4)
    codes = await asyncio.gather(*(hub.stop_server(f"user{i}", "") for i in range(60)))
    await hub.close()
    assert codes == [204] * 60 and seen.requests == 60
    assert 1 <= len(seen.peers) <= 4, seen.peers  # not one connection per request


async def test_errors_name_the_request_and_the_hubs_message(api):
    url, _ = api
    hub = HubClient(url, "token", request_timeout=0.5)
    with pytest.raises(HubAPIError, match="POST .*/refused -> 409: 'keep my GPU' was pressed") as refused:
        await hub.request("POST", "/refused", {"x": 1})
    assert refused.value.code == 409
    with pytest.raises(HubAPIError, match="no answer within 0.5s") as slow:
        await hub.request("GET", "/slow")
    assert slow.value.code == 599
    await hub.close()
    down = HubClient(f"http://127.0.0.1:{free_port()}/hub/api", "token")
    with pytest.raises(OSError):  # what the culler catches as "cannot reach the hub"
        await down.request("GET", "/users")
    await down.close()
