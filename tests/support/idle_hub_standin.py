"""A stand-in for the JupyterHub REST API the GPU idle culler talks to, around gpulab's real idle store.

The culler reads the hub's ready servers (``GET /hub/api/users?state=ready``, with each
server's spawner state, paginated), gpulab's idle state, records each cycle and stops the
servers the hub grants. A real hub with KubeSpawner servers for every sharing backend is
more than a test can run (HAMi and KAI pods need their own schedulers), so this serves
the hub's side as a thread:

- the server list is the test's (each server: its pod, namespace, profile and start time,
  in the shape JupyterHub 5's REST API writes user models, KubeSpawner's state included);
- ``/gpulab/idle/state``, ``/gpulab/idle/cycle`` and ``/gpulab/idle`` (one server's view)
  are answered by gpulab's own :class:`hub_config.domain.idle_store.IdleStore` over an
  SQLite file, so warnings, grants, refusals and the "reclaim is off" reason are the
  product's (a claim is re-checked with the session's maximum lifetime, as the hub's
  handler does, from the catalog and the server's start);
- ``DELETE /users/<u>/server`` calls the test's ``on_stop`` (which deletes the pod, as
  KubeSpawner's stop does) and drops the server from the list.
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tornado import httpserver, web
from traitlets.config import Config

from hub_config.domain.idle_store import IdleStore, UnattributedServers
from hub_config.storage.db import session_factory, utcnow
from idle_culler.app import GPUIdleCuller
from idle_culler.targets import parse_time
from spawner.core.catalog import Catalog
from spawner.core.grant import GrantedShare
from spawner.core.idle import KeepalivePolicy, Lifetime, session_lifetime
from spawner.core.idle_cycle import CycleRecords
from tests.support.ports import free_port

TOKEN = "idle-hub-standin-token"


@dataclass
class StandinServer:
    user: str
    pod: str
    namespace: str
    profile: str
    team: str
    milli: int
    started: str  # ISO 8601, as the hub's REST API writes it


class IdleHubStandin:
    """The hub API for the culler: ``url`` is its ``/hub/api``; ``stopped`` lists the servers stopped."""

    def __init__(self, workdir: Path, catalog: Catalog, on_stop: Callable[[StandinServer], None]):
        self.catalog = catalog
        self.on_stop = on_stop
        self.servers: dict[str, StandinServer] = {}
        self.stopped: list[str] = []
        self.cycles: list[dict[str, Any]] = []
        sessions = session_factory(url=f"sqlite:///{Path(workdir) / 'gpulab.sqlite'}")
        log = logging.getLogger("idle-hub-standin")
        self.store = IdleStore(sessions, KeepalivePolicy(2, 3600), log, UnattributedServers())
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}/hub/api"
        self._loop: asyncio.AbstractEventLoop | None = None
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)

    def add(self, server: StandinServer) -> None:
        self.servers[server.user] = server

    def view(self, user: str) -> dict[str, Any]:
        """``GET /hub/api/gpulab/idle?user=U``: what the user's sidebar and the admin page read."""
        s = self.servers.get(user)
        with self.store.sessions() as session:
            return self.store.view(session, user, "", s.started if s else "")

    def lifetime(self, user: str) -> Lifetime | None:
        """The running session's maximum lifetime from the catalog and its start (the hub's rule)."""
        s = self.servers.get(user)
        if s is None:
            return None
        profile, team = self.catalog.profiles.get(s.profile), self.catalog.teams.get(s.team)
        return session_lifetime(profile, team, s.milli, parse_time(s.started))

    # -- the REST API -----------------------------------------------------------------

    def _user_model(self, s: StandinServer) -> dict[str, Any]:
        grant = GrantedShare(team=s.team, profile=s.profile, milli=s.milli, over_quota=False)
        return {
            "name": s.user,
            "servers": {
                "": {
                    "name": "",
                    "ready": True,
                    "pending": None,
                    "url": f"/user/{s.user}/",
                    "started": s.started,
                    "last_activity": s.started,
                    "user_options": {"profile": s.profile, "team": s.team},
                    # KubeSpawner's get_state plus gpulab's grant.
                    "state": {"pod_name": s.pod, "namespace": s.namespace, "gpulab": grant.to_json()},
                }
            },
        }

    def _app(self) -> web.Application:
        hub = self

        class Base(web.RequestHandler):
            def prepare(self) -> None:
                if self.request.headers.get("Authorization") != f"token {TOKEN}":
                    raise web.HTTPError(403)

            def write_json(self, doc: Any) -> None:
                self.set_header("Content-Type", "application/json")
                self.finish(json.dumps(doc))

        class Users(Base):
            def get(self) -> None:
                items = [hub._user_model(s) for s in hub.servers.values()]
                self.write_json({"items": items, "_pagination": {"offset": 0, "limit": 200, "total": len(items)}})

        class Server(Base):
            def delete(self, user: str) -> None:
                s = hub.servers.pop(user, None)
                if s is None:
                    raise web.HTTPError(404)
                hub.stopped.append(user)
                hub.on_stop(s)
                self.set_status(204)
                self.finish()

        class State(Base):
            def get(self) -> None:
                self.write_json(hub.store.state(hub.catalog))

        class Cycle(Base):
            def post(self) -> None:
                body = json.loads(self.request.body)
                hub.cycles.append(body)
                records = CycleRecords.from_json(body)
                # As the hub's own handler does: each claimed session's lifetime from its catalog.
                lifetimes = {(c.user, c.server): hub.lifetime(c.user) for c in records.reclaims}
                self.write_json(hub.store.apply_cycle(records, utcnow(), lifetimes))

        return web.Application(
            [
                (r"/hub/api/users", Users),
                (r"/hub/api/users/([^/]+)/server", Server),
                (r"/hub/api/gpulab/idle/state", State),
                (r"/hub/api/gpulab/idle/cycle", Cycle),
            ]
        )

    def _serve(self) -> None:
        loop = asyncio.new_event_loop()
        self._loop = loop
        asyncio.set_event_loop(loop)
        server = httpserver.HTTPServer(self._app())
        server.listen(self.port, "127.0.0.1")
        loop.call_soon(self._ready.set)
        loop.run_forever()
        server.stop()
        loop.close()

    def start(self) -> IdleHubStandin:
        self._thread.start()
        self._ready.wait(10)
        return self

    def stop(self) -> None:
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(10)


def standin_culler(
    hub: IdleHubStandin,
    prometheus_url: str,
    *,
    timeout: float,
    unattributed_after: float,
    scrape_interval: float = 1,
    kai_reservation_namespace: str = "",
) -> GPUIdleCuller:
    """The real culler (in-process, no grace, no /metrics server) over ``hub`` and a Prometheus."""
    c = Config()
    if kai_reservation_namespace:
        c.PrometheusSource.kai_reservation_namespace = kai_reservation_namespace
    c.GPUIdleCuller.url = hub.url
    c.GPUIdleCuller.api_token = TOKEN
    c.GPUIdleCuller.source = "prometheus"
    c.GPUIdleCuller.default_timeout = timeout
    c.GPUIdleCuller.grace_seconds = 0
    c.GPUIdleCuller.unattributed_after = unattributed_after
    c.GPUIdleCuller.metrics_url = ""
    c.PrometheusSource.prometheus_url = prometheus_url
    c.PrometheusSource.scrape_interval = scrape_interval
    c.PrometheusSource.rule_interval = scrape_interval
    app = GPUIdleCuller(config=c)
    app.initialize([])
    return app
