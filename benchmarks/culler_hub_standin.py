"""The stand-in hub REST API the culler benchmark times both cullers against (a process).

It serves what a culler cycle reads and writes, in JupyterHub's documented shapes:
the paginated ``GET /hub/api/users?state=ready`` (``Accept:
application/jupyterhub-pagination+json``: ``items`` + ``_pagination``, page size at
most 200 like JupyterHub's default ``api_page_max_limit``) with KubeSpawner-like
server state, ``DELETE /hub/api/users/<name>/server`` (204), and gpulab's idle state
and cycle endpoints (it accepts every claim). ``/control`` resets the population and
reads the request counts. The real hub's own cost of that listing is measured apart,
on a real JupyterHub, by :mod:`hub_at_scale`.
"""

from __future__ import annotations

import json
import time
from datetime import datetime, timezone
from typing import Any

PAGE_MAX = 200  # JupyterHub's default api_page_default_limit / api_page_max_limit
TOKEN = "benchmark-token-0123456789"
KINDS = ("idle-closed", "idle-open", "busy-closed", "busy-open")


def kind_of(i: int) -> str:
    return KINDS[i % 4]


def iso(ts: float) -> str:
    return datetime.fromtimestamp(ts, timezone.utc).isoformat().replace("+00:00", "Z")


def serve_hub(port: int, n_servers: int, at: float, window: int, ready) -> None:
    from tornado import ioloop, web

    started = iso(at - 2 * window)  # every session is older than its idle timeout
    state = {"scenario": "warn", "stopped": set()}
    counts: dict[str, int] = {}

    def count(key: str, n: int = 1) -> None:
        counts[key] = counts.get(key, 0) + n

    def user_model(i: int) -> dict[str, Any]:
        name = f"user{i:05d}"
        # The tab decides what the hub sees: an open tab keeps last_activity fresh.
        seen = iso(time.time() - (30 if kind_of(i).endswith("open") else 2 * 86400))
        return {
            "kind": "user",
            "name": name,
            "admin": False,
            "groups": [],
            "roles": ["user"],
            "created": started,
            "last_activity": seen,
            "pending": None,
            "servers": {
                "": {
                    "name": "",
                    "full_name": f"{name}/",
                    "last_activity": seen,
                    "started": started,
                    "pending": None,
                    "ready": True,
                    "stopped": False,
                    "url": f"/user/{name}/",
                    "user_options": {"team": "vision", "profile": "h100-1"},
                    "progress_url": f"/hub/api/users/{name}/server/progress",
                    "full_url": None,
                    "state": {
                        "pod_name": f"jupyter-{name}",
                        "namespace": "jhub",
                        "dns_name": "",
                        "gpulab": {"team": "vision", "profile": "h100-1", "milli": 1000},
                    },
                }
            },
        }

    models = [user_model(i) for i in range(n_servers)]
    live_cache: list[list[dict[str, Any]]] = []

    def live() -> list[dict[str, Any]]:
        """The running servers' models, kept until a stop or a new population (pages index it)."""
        if not live_cache:
            live_cache.append([m for m in models if m["name"] not in state["stopped"]])
        return live_cache[0]

    class Root(web.RequestHandler):
        def get(self):
            count("GET /hub/api/")
            self.finish({"version": "6.1.1"})

    class Users(web.RequestHandler):
        def get(self):
            count("GET /hub/api/users")
            if self.request.headers.get("Authorization") != f"token {TOKEN}":
                raise web.HTTPError(403)
            offset = int(self.get_argument("offset", "0"))
            limit = min(int(self.get_argument("limit", str(PAGE_MAX))), PAGE_MAX)
            running = live()
            page = running[offset : offset + limit]
            nxt = None
            if offset + limit < len(running):
                base = f"{self.request.protocol}://{self.request.host}/hub/api/users"
                nxt = {
                    "offset": offset + limit,
                    "limit": limit,
                    "url": f"{base}?state=ready&offset={offset + limit}&limit={limit}",
                }
            self.set_header("Content-Type", "application/json")
            if "pagination" in self.request.headers.get("Accept", ""):
                self.finish(
                    json.dumps(
                        {
                            "items": page,
                            "_pagination": {"offset": offset, "limit": limit, "total": len(running), "next": nxt},
                        }
                    )
                )
            else:
                self.finish(json.dumps(page))

    class Server(web.RequestHandler):
        def delete(self, name):
            count("DELETE server")
            state["stopped"].add(name)
            live_cache.clear()
            self.set_status(204)
            self.finish()

    class IdleState(web.RequestHandler):
        def get(self):
            count("GET gpulab/idle/state")
            warnings = []
            if state["scenario"] in ("reclaim", "steady"):
                reclaim_at = at - 60 if state["scenario"] == "reclaim" else at + 600
                warnings = [
                    {
                        "user": f"user{i:05d}",
                        "server": "",
                        "warned_at": at - 900,
                        "reclaim_at": reclaim_at,
                        "session": started,
                        "held": False,
                    }
                    for i in range(n_servers)
                    if kind_of(i).startswith("idle")
                ]
            self.finish(
                {
                    "now": at,
                    "warnings": warnings,
                    "keepalives": [],
                    "profiles": {"h100-1": {"gpu_milli": 1000, "idle_timeout_seconds": window, "sharing": "whole"}},
                    "teams": {"vision": {"idle_timeout_seconds": None}},
                    # Every server has series: the hub holds the culler's (empty) unattributed list.
                    "unattributed": [],
                }
            )

    class Cycle(web.RequestHandler):
        def post(self):
            count("POST gpulab/idle/cycle")
            doc = json.loads(self.request.body)
            for key in ("warnings", "holds", "clears", "reclaims"):
                count(f"recorded {key}", len(doc.get(key, [])))
            self.finish(
                {
                    "warnings": len(doc.get("warnings", [])),
                    "holds": 0,
                    "clears": 0,
                    "reclaims": [
                        {"user": r["user"], "server": r["server"], "accepted": True, "message": "recorded"}
                        for r in doc.get("reclaims", [])
                    ],
                }
            )

    class Control(web.RequestHandler):
        def get(self):
            self.finish({"requests": counts, "stopped": sorted(state["stopped"])})

        def post(self):  # a fresh population for the next cycle
            state["scenario"] = self.get_argument("scenario")
            state["stopped"] = set()
            live_cache.clear()
            counts.clear()
            self.set_status(204)
            self.finish()

    app = web.Application(
        [
            (r"/hub/api/?", Root),
            (r"/hub/api/users", Users),
            (r"/hub/api/users/([^/]+)/server", Server),
            (r"/hub/api/gpulab/idle/state", IdleState),
            (r"/hub/api/gpulab/idle/cycle", Cycle),
            (r"/control", Control),
        ]
    )
    app.listen(port, "127.0.0.1")
    ready.set()
    ioloop.IOLoop.current().start()
