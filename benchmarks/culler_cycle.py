"""GPU idle-culler cycles over thousands of GPU servers, beside jupyterhub-idle-culler 2.x.

Both cullers run against the same hub REST API in the same run, on the same
population of servers in four equal kinds -- idle GPU with the browser tab
closed, idle GPU with the tab open, busy GPU with the tab closed, busy GPU with
the tab open -- and each pair of cycles starts from the same fresh population:

* ``gpulab-idle-culler``: :meth:`idle_culler.app.GPUIdleCuller.cycle` (hub user
  list + gpulab idle state + ONE Prometheus query, asked while the list is read,
  reading the culler's recording rule for holes + the decision per server +
  ONE request recording the cycle + one stop per reclaimed server), timed in
  three kinds of cycle: **warn** (no warnings yet: the idle half is warned),
  **reclaim** (their grace is over: the idle half is claimed and stopped) and
  **steady** (warned, grace running: nothing to do);
* ``jupyterhub-idle-culler``: :func:`jupyterhub_idle_culler.cull_idle`, one call
  (it stops every server whose hub activity is older than the limit: the
  closed tabs, busy or not).

Both limit themselves to ``--concurrency`` hub requests in flight. gpulab's go
over a pool of keep-alive connections; the peer's over tornado's simple client,
a new connection per request (``cull_idle`` configures that client itself).

**Real and stand-in parts (named in the output):** Prometheus is the real
Debian ``prometheus`` binary, its TSDB filled with one window of 30 s
dcgm-exporter history per server by ``promtool tsdb create-blocks-from
openmetrics``, and the culler's recording rules evaluated over that history by
Prometheus' engine (``promtool tsdb create-blocks-from rules``; ``--holes
subquery`` leaves them out and measures holes with the subquery instead); the
culler's clock is set to the end of that history. The hub
REST API is a stand-in process (tornado) serving JupyterHub's paginated
``GET /hub/api/users?state=ready`` (page size 200, like JupyterHub's) with
KubeSpawner-like server state, ``DELETE .../server`` (204), and gpulab's idle
state and cycle endpoints (it accepts every claim): a real hub with 5,000
running servers is not feasible on a benchmark machine.

Wall time is the cycle's; CPU time is this process's (both cullers run here).
Prometheus answers gpulab's query only, so its CPU during gpulab's cycle is
reported and added on gpulab's side (``cpu_ratio_with_prometheus``); the
stand-in hub's CPU while serving each culler (mostly the user listing) is
reported for both, apart.

Run::

    .venv/bin/python benchmarks/culler_cycle.py            # 5,000 servers
    .venv/bin/python benchmarks/culler_cycle.py --smoke    # 40 servers, seconds
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import math
import multiprocessing
import os
import shutil
import statistics
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import table, write_result  # noqa: E402

PAGE_MAX = 200  # JupyterHub's default api_page_default_limit / api_page_max_limit
TOKEN = "benchmark-token-0123456789"
KINDS = ("idle-closed", "idle-open", "busy-closed", "busy-open")
CYCLES = ("warn", "reclaim", "steady")


def kind_of(i: int) -> str:
    return KINDS[i % 4]


def iso(ts: float) -> str:
    return datetime.fromtimestamp(ts, timezone.utc).isoformat().replace("+00:00", "Z")


# -- the stand-in hub API (a separate process) ------------------------------------


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
            live = [m for m in models if m["name"] not in state["stopped"]]
            page = live[offset : offset + limit]
            nxt = None
            if offset + limit < len(live):
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
                            "_pagination": {"offset": offset, "limit": limit, "total": len(live), "next": nxt},
                        }
                    )
                )
            else:
                self.finish(json.dumps(page))

    class Server(web.RequestHandler):
        def delete(self, name):
            count("DELETE server")
            state["stopped"].add(name)
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


# -- the real Prometheus, with one window of history per server --------------------


def start_prometheus(workdir: Path, n_servers: int, at: float, window: int, interval: int, rules: bool = True):
    from tests.support.dcgm_fake_exporter import RunningPrometheus

    prom = RunningPrometheus(workdir, [], rules=rules, rule_interval=f"{interval}s")
    stamps = [at - k * interval for k in range(window // interval + 2, -1, -1)]
    series = []
    for i in range(n_servers):
        name = f"user{i:05d}"
        value = 0.0 if kind_of(i).startswith("idle") else 97.0
        series.append(
            (
                "DCGM_FI_DEV_GPU_UTIL",
                {
                    "gpu": "0",
                    "UUID": f"GPU-{name}",
                    "Hostname": "node-1",
                    "modelName": "NVIDIA H100 80GB HBM3",
                    "namespace": "jhub",
                    "pod": f"jupyter-{name}",
                    "container": "notebook",
                },
                [(t, value) for t in stamps],
            )
        )
    t0 = time.perf_counter()
    prom.backfill(series)
    prom.start(timeout=120)
    if rules:  # a rule group's evaluations, 7 s after the scrapes (its own offset)
        prom.backfill_rules(stamps[0] + 7, at + 1)
    return prom, time.perf_counter() - t0


# -- the two cullers ---------------------------------------------------------------


async def control(base: str, scenario: str | None = None) -> dict[str, Any]:
    from tornado.httpclient import AsyncHTTPClient

    client = AsyncHTTPClient()
    if scenario:
        await client.fetch(f"{base}/control?scenario={scenario}", method="POST", body=b"")
        return {}
    return json.loads((await client.fetch(base + "/control")).body)


async def timed(coro_factory) -> tuple[Any, float, float]:
    c0, t0 = time.process_time(), time.perf_counter()
    result = await coro_factory()
    return result, time.perf_counter() - t0, time.process_time() - c0


def process_cpu(pid: int) -> float:
    """CPU seconds (user + system) process ``pid`` has used so far (its children not included)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(") ", 1)[1].split()
    except (OSError, IndexError):
        return math.nan
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def run(args, prom_url: str, at: float, prom_pid: int) -> dict[str, Any]:
    from jupyterhub_idle_culler import cull_idle
    from traitlets.config import Config

    from idle_culler.app import GPUIdleCuller
    from tests.support.hub import free_port

    port = free_port()
    base = f"http://127.0.0.1:{port}"
    ctx = multiprocessing.get_context("spawn")  # a fresh interpreter: not a fork of a running event loop
    ready = ctx.Event()
    proc = ctx.Process(target=serve_hub, args=(port, args.servers, at, args.window, ready), daemon=True)
    proc.start()
    if not ready.wait(60):
        raise SystemExit("stand-in hub did not start")
    quiet = logging.getLogger("benchmark-culler")
    quiet.setLevel(logging.WARNING)
    config = Config()
    config.GPUIdleCuller.update(
        url=base + "/hub/api",
        api_token=TOKEN,
        source="prometheus",
        concurrency=args.concurrency,
        api_page_size=PAGE_MAX,
        config_file="",
        grace_seconds=900,
        log_level=logging.ERROR,
    )
    config.PrometheusSource.update(prometheus_url=prom_url, scrape_interval=float(args.interval))
    if args.holes == "subquery":
        config.PrometheusSource.sample_age_rule = ""
    ours = GPUIdleCuller(config=config)
    ours.initialize([])
    ours.clock = lambda: at
    ours.log.setLevel(logging.ERROR)  # like the peer at WARNING: no line per server in either
    half = args.servers // 2
    rows: list[dict[str, Any]] = []
    try:
        for rep in range(args.repeat):
            for kind in CYCLES:
                await control(base, kind)
                prom0, hub0 = process_cpu(prom_pid), process_cpu(proc.pid)
                summary, ours_wall, ours_cpu = await timed(ours.cycle)
                prom_cpu, ours_hub_cpu = process_cpu(prom_pid) - prom0, process_cpu(proc.pid) - hub0
                ours_req = (await control(base))["requests"]
                await control(base, kind)
                hub0 = process_cpu(proc.pid)
                _, peer_wall, peer_cpu = await timed(
                    lambda: cull_idle(
                        url=base + "/hub/api",
                        api_token=TOKEN,
                        inactive_limit=args.window,
                        logger=quiet,
                        concurrency=args.concurrency,
                        api_page_size=PAGE_MAX,
                    )
                )
                peer_hub_cpu = process_cpu(proc.pid) - hub0
                peer = await control(base)
                peer_stopped = peer["stopped"]
                # What each culler did, checked every time (a benchmark of wrong work means nothing).
                expected = {"warn": (half, 0), "reclaim": (0, half), "steady": (0, 0)}[kind]
                assert (len(summary.warned), len(summary.reclaimed)) == expected, (kind, summary.warned[:3])
                # One query per cycle: the recording rule covers every series' holes (a second
                # query is the subquery for series it does not cover; the backfill waits for it).
                subquery = ours.utilisation.last_subquery_series
                assert summary.queries == 1 and summary.gpu_servers == args.servers, (summary.queries, subquery)
                assert subquery == 0, subquery
                assert ours_req.get("POST gpulab/idle/cycle", 0) == (1 if kind != "steady" else 0)
                idx = {int(n[4:]) for n in peer_stopped}
                rows.append(
                    {
                        "repeat": rep + 1,
                        "cycle": kind,
                        "load_avg_1m": os.getloadavg()[0],
                        "gpulab_wall_s": ours_wall,
                        "gpulab_cpu_s": ours_cpu,
                        "peer_wall_s": peer_wall,
                        "peer_cpu_s": peer_cpu,
                        "wall_ratio": ours_wall / peer_wall,
                        "cpu_ratio": ours_cpu / peer_cpu,
                        # Prometheus answers gpulab's query only: its CPU counts on gpulab's side.
                        "prometheus_cpu_s": prom_cpu,
                        "cpu_ratio_with_prometheus": (ours_cpu + prom_cpu) / peer_cpu,
                        # The (stand-in) hub's CPU serving each culler's requests: the user listing.
                        "gpulab_hub_cpu_s": ours_hub_cpu,
                        "peer_hub_cpu_s": peer_hub_cpu,
                        "gpulab_hub_requests": sum(ours_req.values())
                        - sum(v for k, v in ours_req.items() if k.startswith("recorded")),
                        "peer_hub_requests": sum(peer["requests"].values()),
                        "gpulab_answer_bytes": ours.utilisation.last_answer_bytes,
                        # Waiting for Prometheus once the hub's list was read (it was asked at the start).
                        "gpulab_prometheus_wait_s": summary.source_wait_seconds or 0.0,
                        "gpulab_warned": len(summary.warned),
                        "gpulab_reclaimed": len(summary.reclaimed),
                        "peer_stopped": len(idx),
                        "peer_wrong_stops": sum(1 for i in idx if kind_of(i).startswith("busy")),
                        "peer_missed_idle": sum(
                            1 for i in range(args.servers) if kind_of(i).startswith("idle") and i not in idx
                        ),
                    }
                )
    finally:
        if ours.hub is not None:
            await ours.hub.close()
        proc.terminate()
        proc.join(10)
    out: dict[str, Any] = {"rows": rows, "cycles": {}}
    for kind in CYCLES:
        rs = [r for r in rows if r["cycle"] == kind]
        med = {
            k: statistics.median(r[k] for r in rs)
            for k in (
                "gpulab_wall_s",
                "gpulab_cpu_s",
                "peer_wall_s",
                "peer_cpu_s",
                "prometheus_cpu_s",
                "gpulab_hub_cpu_s",
                "peer_hub_cpu_s",
                "gpulab_answer_bytes",
                "gpulab_hub_requests",
                "peer_hub_requests",
            )
        }
        out["cycles"][kind] = {
            **med,
            "wall_ratio": med["gpulab_wall_s"] / med["peer_wall_s"],
            "cpu_ratio": med["gpulab_cpu_s"] / med["peer_cpu_s"],
            "cpu_ratio_with_prometheus": (med["gpulab_cpu_s"] + med["prometheus_cpu_s"]) / med["peer_cpu_s"],
        }
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--smoke", action="store_true", help="40 servers, one repeat (used by the tests)")
    ap.add_argument("--servers", type=int, help="GPU servers, a multiple of 4 (default 5000)")
    ap.add_argument("--repeat", type=int, help="rounds of the three cycle kinds, each beside the peer (default 3)")
    ap.add_argument("--window", type=int, default=3600, help="idle timeout in seconds (default 3600)")
    ap.add_argument("--interval", type=int, default=30, help="dcgm-exporter scrape interval (default 30)")
    ap.add_argument("--concurrency", type=int, default=10, help="hub requests in flight, both cullers (default 10)")
    ap.add_argument(
        "--holes",
        choices=("rule", "subquery"),
        default="rule",
        help="how gpulab measures holes: the recording rule (default) or, without it, the subquery",
    )
    ap.add_argument("--out", help="directory for the JSON result (default benchmarks/results)")
    args = ap.parse_args(argv)
    args.servers = args.servers or (40 if args.smoke else 5000)
    args.repeat = args.repeat or (1 if args.smoke else 3)
    if args.servers % 4:
        ap.error("--servers must be a multiple of 4 (four kinds of session)")
    if not shutil.which("prometheus") or not shutil.which("promtool"):
        raise SystemExit("needs the prometheus and promtool binaries (Debian package `prometheus`)")

    at = math.floor((time.time() - 6 * 3600) / args.interval) * args.interval  # history ends 6 h ago
    with tempfile.TemporaryDirectory(prefix="culler-bench-") as tmp:
        prom, backfill_s = start_prometheus(
            Path(tmp), args.servers, at, args.window, args.interval, rules=args.holes == "rule"
        )
        try:
            result = asyncio.run(run(args, prom.url, at, prom.proc.pid))
        finally:
            prom.stop()
    print(
        table(
            [
                "cycle",
                "repeat",
                "gpulab wall (s)",
                "peer wall (s)",
                "wall ratio",
                "gpulab CPU (s)",
                "peer CPU (s)",
                "CPU ratio",
                "gpulab hub req",
                "peer hub req",
                "answer bytes",
                "Prometheus wait (s)",
            ],
            [
                [
                    r["cycle"],
                    r["repeat"],
                    r["gpulab_wall_s"],
                    r["peer_wall_s"],
                    r["wall_ratio"],
                    r["gpulab_cpu_s"],
                    r["peer_cpu_s"],
                    r["cpu_ratio"],
                    r["gpulab_hub_requests"],
                    r["peer_hub_requests"],
                    r["gpulab_answer_bytes"],
                    r["gpulab_prometheus_wait_s"],
                ]
                for r in result["rows"]
            ],
            title=(
                f"Cull cycles over {args.servers:,} GPU servers in four kinds (real Prometheus, "
                f"stand-in hub API), window {args.window}s, scrape {args.interval}s"
            ),
        )
    )
    for kind, c in result["cycles"].items():
        print(
            f"median {kind:8s} cycle: wall ratio {c['wall_ratio']:.2f}, CPU ratio {c['cpu_ratio']:.2f} "
            f"(gpulab {c['gpulab_wall_s']:.3f}s / {c['gpulab_cpu_s']:.3f}s CPU; "
            f"jupyterhub-idle-culler {c['peer_wall_s']:.3f}s / {c['peer_cpu_s']:.3f}s CPU); "
            f"with Prometheus' {c['prometheus_cpu_s']:.3f}s CPU on gpulab's side: CPU ratio "
            f"{c['cpu_ratio_with_prometheus']:.2f}; hub CPU serving gpulab {c['gpulab_hub_cpu_s']:.3f}s, "
            f"the peer {c['peer_hub_cpu_s']:.3f}s"
        )
    last = result["rows"][-1]
    print(
        f"jupyterhub-idle-culler per cycle: {last['peer_stopped']} stopped, {last['peer_wrong_stops']} of them "
        f"busy; {last['peer_missed_idle']} idle GPUs left running. Prometheus backfill took {backfill_s:.1f}s."
    )
    path = write_result(
        "culler_cycle",
        {
            "smoke": args.smoke,
            "parts": "real Prometheus (backfilled with promtool); stand-in hub REST API process (see the docstring)",
            "parameters": {
                "servers": args.servers,
                "repeat": args.repeat,
                "window_s": args.window,
                "holes": args.holes,
                "interval_s": args.interval,
                "concurrency": args.concurrency,
                "page_size": PAGE_MAX,
            },
            "prometheus_backfill_s": backfill_s,
            **result,
        },
        args.out,
    )
    print(
        json.dumps(
            {
                "result": str(path),
                **{
                    k: {"wall_ratio": round(c["wall_ratio"], 3), "cpu_ratio": round(c["cpu_ratio"], 3)}
                    for k, c in result["cycles"].items()
                },
            }
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
