"""One GPU idle-culler cycle over thousands of GPU servers, beside jupyterhub-idle-culler 2.x.

Both cullers run against the same hub REST API in the same run, alternating:

* ``gpulab-idle-culler``: :meth:`idle_culler.app.GPUIdleCuller.cycle` (hub user
  list + gpulab idle state + ONE Prometheus query + the decision per server);
* ``jupyterhub-idle-culler``: :func:`jupyterhub_idle_culler.cull_idle`, one call.

**Stand-ins (labelled as such in the output):** a real hub with 5,000 running
servers is not feasible on a benchmark machine, so the hub REST API is a
stand-in process (tornado) serving JupyterHub's paginated
``GET /hub/api/users?state=ready`` (default and maximum page size 200, like
JupyterHub's) with KubeSpawner-like server state, plus gpulab's
``GET /hub/api/gpulab/idle/state``; and Prometheus is a stand-in serving
``/api/v1/query`` with one matrix of dcgm-exporter series (one per server,
samples every ``--interval`` s over the idle window). Every GPU is busy, so
neither culler stops anything: the benchmark times the scan and decision,
which is what a cycle costs when nothing is idle. The stand-in reports its
own time spent building the Prometheus answer, so it can be subtracted.

Run::

    .venv/bin/python benchmarks/culler_cycle.py            # 5,000 servers
    .venv/bin/python benchmarks/culler_cycle.py --smoke    # 50 servers, seconds
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import multiprocessing
import socket
import statistics
import sys
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import table, write_result  # noqa: E402

PAGE_MAX = 200  # JupyterHub's default api_page_default_limit / api_page_max_limit
TOKEN = "benchmark-token-0123456789"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# -- the stand-in hub + Prometheus (a separate process) -----------------------


def serve_standins(port: int, n_servers: int, window: int, interval: int, ready) -> None:
    from tornado import ioloop, web

    now_iso = datetime.now(timezone.utc).isoformat().replace("+00:00", "Z")
    users = []
    for i in range(n_servers):
        name = f"user{i:05d}"
        users.append({
            "kind": "user", "name": name, "admin": False, "groups": [], "roles": ["user"],
            "created": now_iso, "last_activity": now_iso, "pending": None,
            "servers": {"": {
                "name": "", "full_name": f"{name}/", "last_activity": now_iso, "started": now_iso,
                "pending": None, "ready": True, "stopped": False, "url": f"/user/{name}/",
                "user_options": {"team": "vision", "profile": "h100-1"},
                "progress_url": f"/hub/api/users/{name}/server/progress", "full_url": None,
                "state": {"pod_name": f"jupyter-{name}", "namespace": "jhub", "dns_name": "",
                          "gpulab": {"team": "vision", "profile": "h100-1", "milli": 1000}},
            }},
        })
    counts: dict[str, int] = {}
    standin_seconds = [0.0]

    def count(key: str) -> None:
        counts[key] = counts.get(key, 0) + 1

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
            page = users[offset:offset + limit]
            nxt = None
            if offset + limit < len(users):
                base = f"{self.request.protocol}://{self.request.host}/hub/api/users"
                nxt = {"offset": offset + limit, "limit": limit,
                       "url": f"{base}?state=ready&offset={offset + limit}&limit={limit}"}
            self.set_header("Content-Type", "application/json")
            if "pagination" in self.request.headers.get("Accept", ""):
                self.finish(json.dumps({"items": page, "_pagination": {
                    "offset": offset, "limit": limit, "total": len(users), "next": nxt}}))
            else:
                self.finish(json.dumps(page))

    class IdleState(web.RequestHandler):
        def get(self):
            count("GET /hub/api/gpulab/idle/state")
            self.finish({"now": time.time(), "warnings": [], "keepalives": [],
                         "profiles": {"h100-1": {"gpu_milli": 1000, "idle_timeout_seconds": window}},
                         "teams": {"vision": {"idle_timeout_seconds": None}}})

    class Query(web.RequestHandler):
        def post(self):
            self.get()

        def get(self):
            count("Prometheus /api/v1/query")
            t0 = time.perf_counter()
            at = float(self.get_argument("time", str(time.time())))
            stamps = [at - k * interval for k in range(window // interval, -1, -1)]
            values = json.dumps([[round(t, 3), "100"] for t in stamps])  # every GPU busy
            parts = []
            for u in users:
                name = u["name"]
                labels = json.dumps({"__name__": "DCGM_FI_DEV_GPU_UTIL", "gpu": "0", "UUID": f"GPU-{name}",
                                     "Hostname": "node-1", "modelName": "NVIDIA H100 80GB HBM3",
                                     "namespace": "jhub", "pod": f"jupyter-{name}", "container": "notebook"})
                parts.append('{"metric":' + labels + ',"values":' + values + "}")
            body = '{"status":"success","data":{"resultType":"matrix","result":[' + ",".join(parts) + "]}}"
            standin_seconds[0] += time.perf_counter() - t0
            self.set_header("Content-Type", "application/json")
            self.finish(body)

    class Stats(web.RequestHandler):
        def get(self):
            self.finish({"requests": counts, "prometheus_standin_seconds": standin_seconds[0]})

        def delete(self):
            counts.clear()
            standin_seconds[0] = 0.0
            self.set_status(204)

    app = web.Application([
        (r"/hub/api/?", Root), (r"/hub/api/users", Users), (r"/hub/api/gpulab/idle/state", IdleState),
        (r"/api/v1/query", Query), (r"/stats", Stats),
    ])
    app.listen(port, "127.0.0.1")
    ready.set()
    ioloop.IOLoop.current().start()


# -- the two cullers ------------------------------------------------------------


async def stats(base: str, reset: bool = False) -> dict[str, Any]:
    from tornado.httpclient import AsyncHTTPClient

    client = AsyncHTTPClient()
    if reset:
        await client.fetch(base + "/stats", method="DELETE")
        return {}
    return json.loads((await client.fetch(base + "/stats")).body)


async def run(args) -> dict[str, Any]:
    from jupyterhub_idle_culler import cull_idle
    from traitlets.config import Config

    from idle_culler.app import GPUIdleCuller

    port = free_port()
    base = f"http://127.0.0.1:{port}"
    ctx = multiprocessing.get_context("spawn")  # a fresh interpreter: not a fork of a running event loop
    ready = ctx.Event()
    proc = ctx.Process(target=serve_standins, args=(port, args.servers, args.window, args.interval, ready),
                                   daemon=True)
    proc.start()
    if not ready.wait(60):
        raise SystemExit("stand-in hub did not start")
    quiet = logging.getLogger("benchmark-culler")
    quiet.setLevel(logging.WARNING)
    try:
        config = Config()
        config.GPUIdleCuller.update(url=base + "/hub/api", api_token=TOKEN, source="prometheus",
                                    concurrency=args.concurrency, api_page_size=PAGE_MAX, config_file="",
                                    max_sample_gap=args.interval * 3, log_level=logging.WARNING)
        config.PrometheusSource.prometheus_url = base
        ours = GPUIdleCuller(config=config)
        ours.initialize([])
        ours.log.setLevel(logging.WARNING)

        rows, ours_times, theirs_times, ours_queries, verdict_counts = [], [], [], [], {}
        for rep in range(args.repeat):
            await stats(base, reset=True)
            t0 = time.perf_counter()
            summary = await ours.cycle()
            ours_s = time.perf_counter() - t0
            ours_stats = await stats(base)
            await stats(base, reset=True)
            t0 = time.perf_counter()
            await cull_idle(url=base + "/hub/api", api_token=TOKEN, inactive_limit=10 * 86400, logger=quiet,
                            concurrency=args.concurrency, api_page_size=PAGE_MAX)
            theirs_s = time.perf_counter() - t0
            theirs_stats = await stats(base)
            prom_requests = ours_stats["requests"].get("Prometheus /api/v1/query", 0)
            verdict_counts = {}
            for v in summary["verdicts"].values():
                verdict_counts[v] = verdict_counts.get(v, 0) + 1
            assert summary["gpu_servers"] == args.servers, summary["gpu_servers"]
            assert prom_requests == 1 and summary["queries"] == 1, (prom_requests, summary["queries"])
            assert not summary["warned"] and not summary["reclaimed"]
            ours_times.append(ours_s)
            theirs_times.append(theirs_s)
            ours_queries.append(prom_requests)
            rows.append({
                "repeat": rep + 1, "gpulab_cycle_s": ours_s, "idle_culler_cycle_s": theirs_s,
                "ratio": ours_s / theirs_s, "gpulab_metric_queries": prom_requests,
                "gpulab_hub_requests": sum(v for k, v in ours_stats["requests"].items() if "hub/api" in k),
                "idle_culler_hub_requests": sum(theirs_stats["requests"].values()),
                "prometheus_standin_s": ours_stats["prometheus_standin_seconds"],
            })
    finally:
        proc.terminate()
        proc.join(10)
    med_ours, med_theirs = statistics.median(ours_times), statistics.median(theirs_times)
    return {
        "rows": rows, "verdicts_last_cycle": verdict_counts,
        "gpulab_median_s": med_ours, "idle_culler_median_s": med_theirs,
        "ratio_median": med_ours / med_theirs, "metric_queries_per_cycle": sorted(set(ours_queries)),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--smoke", action="store_true", help="50 servers, one repeat (used by the tests)")
    ap.add_argument("--servers", type=int, help="GPU servers (default 5000)")
    ap.add_argument("--repeat", type=int, help="cycles timed per culler, alternating (default 5)")
    ap.add_argument("--window", type=int, default=600, help="idle window in seconds (default 600)")
    ap.add_argument("--interval", type=int, default=30, help="dcgm-exporter sample interval (default 30)")
    ap.add_argument("--concurrency", type=int, default=10, help="hub requests in flight, both cullers (default 10)")
    ap.add_argument("--out", help="directory for the JSON result (default benchmarks/results)")
    args = ap.parse_args(argv)
    args.servers = args.servers or (50 if args.smoke else 5000)
    args.repeat = args.repeat or (1 if args.smoke else 5)

    result = asyncio.run(run(args))
    print(table(
        ["repeat", "gpulab cycle (s)", "jupyterhub-idle-culler (s)", "ratio", "metric queries",
         "gpulab hub requests", "idle-culler hub requests", "Prometheus stand-in (s)"],
        [[r["repeat"], r["gpulab_cycle_s"], r["idle_culler_cycle_s"], r["ratio"], r["gpulab_metric_queries"],
          r["gpulab_hub_requests"], r["idle_culler_hub_requests"], r["prometheus_standin_s"]]
         for r in result["rows"]],
        title=f"One cull cycle over {args.servers:,} GPU servers (stand-in hub API and Prometheus)",
    ))
    print(f"\nmedian: gpulab {result['gpulab_median_s']:.3f}s, jupyterhub-idle-culler "
          f"{result['idle_culler_median_s']:.3f}s, ratio {result['ratio_median']:.2f}; "
          f"metric queries per cycle: {result['metric_queries_per_cycle']}")
    path = write_result("culler_cycle", {
        "smoke": args.smoke,
        "standins": "hub REST API and Prometheus are stand-in processes (see the script's docstring)",
        "parameters": {"servers": args.servers, "repeat": args.repeat, "window_s": args.window,
                       "interval_s": args.interval, "concurrency": args.concurrency, "page_size": PAGE_MAX},
        **result,
    }, args.out)
    print(json.dumps({"result": str(path), "ratio_median": result["ratio_median"],
                      "metric_queries_per_cycle": result["metric_queries_per_cycle"]}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
