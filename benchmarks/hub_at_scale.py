"""A real JupyterHub holding tens of thousands of running servers, for the culler benchmark.

``benchmarks/culler_cycle.py`` times whole cull cycles against a stand-in hub API;
this module measures what that stand-in leaves out: the real hub's own
``GET /hub/api/users?state=ready`` listing, which both cullers read in full every
cycle, at the same size.

How the hub holds 50,000 running servers on a 2-core machine:

* **The database is filled directly.** Tables are created by JupyterHub's own
  :func:`jupyterhub.orm.new_session_factory` (schema and alembic stamp of the
  installed release); then one bulk ``INSERT`` per table writes the rows exactly
  as JupyterHub's ORM stores a running server -- a ``users`` row, a ``servers``
  row (ip, port, base_url) and a ``spawners`` row pointing at it with the
  spawner's state (JSON), ``started``, ``last_activity`` and ``user_options`` --
  and JupyterHub's default roles with each user holding ``user``.
  50,000 spawns through the REST API would take hours here and measure spawning,
  not listing.
* **The hub is the real ``jupyterhub`` (6.1.1 here) on that database.** At start it
  loads every user and instantiates a spawner for every running server, as after
  any hub restart (``init_spawners``), and serves the REST API from its ORM.
* **Two stand-ins, both outside what is measured:** the spawner class
  (:class:`RunningSpawner`) reports its servers running (``poll()`` returns
  ``None``) and returns the state it was loaded with, as KubeSpawner returns its
  pod name and namespace; the proxy class (:class:`InMemoryProxy`) keeps routes in
  a dict (JupyterHub's :class:`~jupyterhub.proxy.Proxy` API) instead of 50,000
  routes in configurable-http-proxy. Neither is on the listing's path. At start the
  hub also checks that each running server answers HTTP (``init_spawners``: "any
  non-5XX response code will do, even 404"): every server row points at one small
  tornado process (:func:`serve_servers`) answering as a single-user server does
  (its version header), with a listen backlog for the hub's thousands of concurrent
  checks. The hub is asked to finish those checks
  before it serves (``init_spawners_timeout = -1``), and keeps polling every spawner
  every 30 s afterwards, as a real hub does.

Run on its own::

    .venv/bin/python benchmarks/hub_at_scale.py --users 50000
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

from jupyterhub.proxy import Proxy
from jupyterhub.spawner import Spawner

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from tests.support.ports import free_port  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import write_result  # noqa: E402

BENCH_DIR = Path(__file__).resolve().parent
ROOT = BENCH_DIR.parent
SERVICE = "benchmark-culler"
#: What each culler's token needs: jupyterhub-idle-culler's documented scopes, and
#: ``admin:server_state`` for gpulab's (the server state names the pod).
SCOPES = ["list:users", "read:users:activity", "read:servers", "delete:servers", "admin:server_state"]


class RunningSpawner(Spawner):
    """Stand-in spawner for servers already running (never started by this hub): ``poll()``
    says running, and the state it was loaded with is the state it reports."""

    _loaded: dict[str, Any]

    def load_state(self, state: dict[str, Any]) -> None:
        super().load_state(state)
        self._loaded = dict(state)

    def get_state(self) -> dict[str, Any]:
        state = super().get_state()
        state.update(getattr(self, "_loaded", {}))
        return state

    async def start(self) -> tuple[str, int]:
        raise RuntimeError("the benchmark's servers are written into the database, never spawned")

    async def poll(self) -> int | None:
        return None

    async def stop(self, now: bool = False) -> None:
        return None


class InMemoryProxy(Proxy):
    """Stand-in proxy keeping its routes in memory (JupyterHub's documented Proxy API)."""

    should_start = False
    _routes: dict[str, dict[str, Any]]

    async def add_route(self, routespec: str, target: str, data: dict[str, Any]) -> None:
        self._routes_dict()[routespec] = {"routespec": routespec, "target": target, "data": data}

    async def delete_route(self, routespec: str) -> None:
        self._routes_dict().pop(routespec, None)

    async def get_all_routes(self) -> dict[str, dict[str, Any]]:
        return dict(self._routes_dict())

    def _routes_dict(self) -> dict[str, dict[str, Any]]:
        if not hasattr(self, "_routes"):
            self._routes = {}
        return self._routes


def serve_servers(port: int) -> None:
    """Answer the hub's "is it up?" checks for every server row (all on this one port)."""
    import jupyterhub
    from tornado import ioloop, netutil, web
    from tornado.httpserver import HTTPServer

    class Up(web.RequestHandler):
        def get(self, path: str) -> None:
            self.set_header("X-JupyterHub-Version", jupyterhub.__version__)
            self.finish("up")

    http = HTTPServer(web.Application([(r"/(.*)", Up)]))
    http.add_sockets(netutil.bind_sockets(port, "127.0.0.1", backlog=4096))
    ioloop.IOLoop.current().start()


def populate(db_url: str, users: list[dict[str, Any]], server_port: int) -> float:
    """Write ``users`` (name, created, last_activity, started, state, user_options) with one
    running default server each into a JupyterHub database; returns the seconds it took."""
    from jupyterhub import orm
    from jupyterhub.roles import get_default_roles
    from sqlalchemy import insert

    t0 = time.perf_counter()
    session = orm.new_session_factory(db_url)()  # JupyterHub's schema, stamped with its revision
    engine = session.get_bind()
    with engine.begin() as conn:
        conn.execute(
            insert(orm.User.__table__),
            [
                {
                    "id": i + 1,
                    "name": u["name"],
                    "admin": False,
                    "created": u["created"],
                    "last_activity": u["last_activity"],
                    "cookie_id": f"cookie-{i + 1}",
                    "state": {},
                }
                for i, u in enumerate(users)
            ],
        )
        conn.execute(
            insert(orm.Server.__table__),
            [
                {
                    "id": i + 1,
                    "proto": "http",
                    "ip": "127.0.0.1",
                    "port": server_port,
                    "base_url": f"/user/{u['name']}/",
                    "cookie_name": "jupyterhub-user",
                }
                for i, u in enumerate(users)
            ],
        )
        conn.execute(
            insert(orm.Spawner.__table__),
            [
                {
                    "id": i + 1,
                    "user_id": i + 1,
                    "server_id": i + 1,
                    "name": "",
                    "state": u["state"],
                    "started": u["started"],
                    "last_activity": u["last_activity"],
                    "user_options": u["user_options"],
                }
                for i, u in enumerate(users)
            ],
        )
        # JupyterHub's default roles, every user holding "user", as a hub that created these users
        # stores them (without, the hub's start takes them for an upgrade and grants the role
        # one user at a time).
        roles = get_default_roles()
        conn.execute(
            insert(orm.Role.__table__),
            [
                {"id": k + 1, "name": r["name"], "description": r.get("description", ""), "scopes": r["scopes"]}
                for k, r in enumerate(roles)
            ],
        )
        user_role = next(k + 1 for k, r in enumerate(roles) if r["name"] == "user")
        conn.execute(
            insert(orm.Base.metadata.tables["user_role_map"]),
            [{"user_id": i + 1, "role_id": user_role, "managed_by_auth": False} for i in range(len(users))],
        )
    session.close()
    return time.perf_counter() - t0


def hub_config(workdir: Path, db_url: str, port: int, token: str, page_max: int) -> Path:
    path = workdir / "jupyterhub_config.py"
    path.write_text(
        f"""
import sys
sys.path.insert(0, {str(BENCH_DIR)!r})
c.JupyterHub.db_url = {db_url!r}
c.JupyterHub.spawner_class = "hub_at_scale.RunningSpawner"
c.JupyterHub.proxy_class = "hub_at_scale.InMemoryProxy"
c.JupyterHub.authenticator_class = "null"
c.JupyterHub.hub_ip = "127.0.0.1"
c.JupyterHub.hub_port = {port}
c.JupyterHub.cleanup_servers = False
c.JupyterHub.init_spawners_timeout = -1
c.JupyterHub.cookie_secret_file = {str(workdir / "cookie_secret")!r}
c.JupyterHub.pid_file = {str(workdir / "jupyterhub.pid")!r}
c.JupyterHub.last_activity_interval = 3600
c.JupyterHub.api_page_max_limit = {page_max}
c.JupyterHub.services = [{{"name": {SERVICE!r}, "api_token": {token!r}}}]
c.JupyterHub.load_roles = [{{"name": {SERVICE!r}, "scopes": {SCOPES!r}, "services": [{SERVICE!r}]}}]
"""
    )
    return path


class RealHub:
    """``jupyterhub`` as a process on a database filled by :func:`populate`."""

    def __init__(self, workdir: Path, users: list[dict[str, Any]], port: int, token: str, page_max: int = 200):
        self.workdir = workdir
        self.port = port
        self.api_url = f"http://127.0.0.1:{port}/hub/api"
        db_url = f"sqlite:///{workdir / 'jupyterhub.sqlite'}"
        self.server_port = free_port()
        self.populate_s = populate(db_url, users, self.server_port)
        self.config = hub_config(workdir, db_url, port, token, page_max)
        self.proc: subprocess.Popen | None = None
        self.servers: subprocess.Popen | None = None
        self.start_s = 0.0

    def start(self, timeout: float = 3600) -> RealHub:
        jupyterhub = Path(sys.executable).with_name("jupyterhub")
        self.servers = subprocess.Popen(
            [sys.executable, __file__, "--serve-servers", str(self.server_port)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        t0 = time.perf_counter()
        self.log = open(self.workdir / "jupyterhub.log", "ab")
        self.proc = subprocess.Popen(
            [str(jupyterhub), "-f", str(self.config), "--log-level=WARN"],
            cwd=self.workdir,
            stdout=self.log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        import requests

        while time.perf_counter() - t0 < timeout:
            if self.proc.poll() is not None:
                raise RuntimeError(f"jupyterhub exited: {(self.workdir / 'jupyterhub.log').read_text()[-3000:]}")
            try:
                # A long timeout: at 50,000 servers the hub's event loop stalls for ~2 s at a
                # time (its 30 s poll of every spawner), so a 2 s probe never gets an answer.
                if requests.get(self.api_url + "/", timeout=60).ok:
                    self.start_s = time.perf_counter() - t0
                    return self
            except requests.RequestException:
                pass
            time.sleep(0.5)
        self.stop()
        raise RuntimeError(f"jupyterhub did not answer within {timeout:.0f}s")

    def stop(self) -> None:
        for proc in (self.proc, self.servers):
            if proc is not None and proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(30)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait(10)
        self.proc = self.servers = None


def process_cpu(pid: int) -> float:
    """CPU seconds (user + system) process ``pid`` has used so far (its children not included)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(") ", 1)[1].split()
    except (OSError, IndexError):
        return math.nan
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def rss_mib(pid: int) -> int:
    """Resident memory of process ``pid`` in MiB (0 when it is gone)."""
    try:
        lines = Path(f"/proc/{pid}/status").read_text().splitlines()
    except OSError:
        return 0
    return next((int(line.split()[1]) // 1024 for line in lines if line.startswith("VmRSS:")), 0)


async def list_ready(api_url: str, token: str, page_size: int, hub_pid: int, concurrency: int = 10) -> dict[str, Any]:
    """One full ``state=ready`` listing as gpulab's culler reads it (``HubClient.ready_users``,
    pagination header, ``limit``): wall, hub CPU, pages, bytes, and the slowest page."""
    from idle_culler.hub import HubClient

    client = HubClient(api_url, token, concurrency=concurrency, page_size=page_size, request_timeout=600)
    page_times: list[float] = []
    send = client._send

    async def timed_send(*args: Any, **kwargs: Any) -> tuple[int, bytes]:
        t = time.perf_counter()
        code, raw = await send(*args, **kwargs)
        page_times.append(time.perf_counter() - t)
        sizes.append(len(raw))
        return code, raw

    sizes: list[int] = []
    client._send = timed_send  # type: ignore[method-assign]
    cpu0, t0 = process_cpu(hub_pid), time.perf_counter()
    try:
        users = await client.ready_users()
    finally:
        await client.close()
    wall, hub_cpu = time.perf_counter() - t0, process_cpu(hub_pid) - cpu0
    return {
        "page_size": page_size,
        "users": len(users),
        "pages": client.requests,
        "wall_s": wall,
        "hub_cpu_s": hub_cpu,
        "answer_bytes": sum(sizes),
        "first_page_s": page_times[0] if page_times else 0.0,
        "last_page_s": page_times[-1] if page_times else 0.0,
    }


async def peer_listing(api_url: str, token: str, page_size: int, hub_pid: int, concurrency: int = 10) -> dict[str, Any]:
    """One jupyterhub-idle-culler ``cull_idle`` pass that stops nothing (limit longer than any
    server's age): its listing (plus its version check), wall and hub CPU."""
    import logging

    from jupyterhub_idle_culler import cull_idle

    quiet = logging.getLogger("benchmark-peer")
    quiet.setLevel(logging.WARNING)
    cpu0, t0 = process_cpu(hub_pid), time.perf_counter()
    await cull_idle(
        url=api_url,
        api_token=token,
        inactive_limit=10 * 365 * 86400,
        logger=quiet,
        concurrency=concurrency,
        api_page_size=page_size,
    )
    return {"page_size": page_size, "wall_s": time.perf_counter() - t0, "hub_cpu_s": process_cpu(hub_pid) - cpu0}


def measure(users: list[dict[str, Any]], page_sizes: list[int], token: str, port: int) -> dict[str, Any]:
    """Start a real hub holding ``users``, then time full listings at each page size."""
    with tempfile.TemporaryDirectory(prefix="hub-at-scale-") as tmp:
        hub = RealHub(Path(tmp), users, port, token, page_max=max(page_sizes))
        hub.start()
        assert hub.proc is not None
        rss = rss_mib(hub.proc.pid)
        try:
            listings = []
            for size in page_sizes:
                ours = asyncio.run(list_ready(hub.api_url, token, size, hub.proc.pid))
                assert ours["users"] == len(users), (ours["users"], len(users))
                peer = asyncio.run(peer_listing(hub.api_url, token, size, hub.proc.pid))
                listings.append({"gpulab": ours, "peer": peer})
        finally:
            hub.stop()
    return {
        "users": len(users),
        "jupyterhub": _jupyterhub_version(),
        "populate_s": hub.populate_s,
        "hub_start_s": hub.start_s,
        "hub_rss_mib": rss,
        "listings": listings,
    }


def _jupyterhub_version() -> str:
    import jupyterhub

    return jupyterhub.__version__


def sample_users(n: int, at: float, window: int) -> list[dict[str, Any]]:
    """``n`` users with one running GPU server each, in the culler benchmark's four kinds."""
    started = datetime.fromtimestamp(at - 2 * window, timezone.utc).replace(tzinfo=None)
    now = datetime.now(timezone.utc).replace(tzinfo=None)
    out = []
    for i in range(n):
        name = f"user{i:05d}"
        seen = now - (timedelta(seconds=30) if i % 2 else timedelta(days=2))  # open tab / closed tab
        out.append(
            {
                "name": name,
                "created": started,
                "last_activity": seen,
                "started": started,
                "user_options": {"team": "vision", "profile": "h100-1"},
                "state": {
                    "pod_name": f"jupyter-{name}",
                    "namespace": "jhub",
                    "dns_name": "",
                    "gpulab": {"team": "vision", "profile": "h100-1", "milli": 1000},
                },
            }
        )
    return out


def main(argv: list[str] | None = None) -> int:
    if argv is None and sys.argv[1:2] == ["--serve-servers"]:
        serve_servers(int(sys.argv[2]))
        return 0
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--users", type=int, default=50000)
    ap.add_argument("--page-size", type=int, action="append", help="listing page sizes (default 200)")
    ap.add_argument("--out", help="directory for the JSON result (default benchmarks/results)")
    args = ap.parse_args(argv)
    result = measure(
        sample_users(args.users, time.time() - 6 * 3600, 3600),
        args.page_size or [200],
        "benchmark-token-0123456789",
        free_port(),
    )
    print(json.dumps(result, indent=1))
    print(json.dumps({"result": str(write_result("hub_at_scale", result, args.out))}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
