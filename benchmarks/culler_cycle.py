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
openmetrics`` (the benchmark is its exporter: it writes every series' samples,
6 million for 50,000 GPUs, into the OpenMetrics file promtool reads), and the
culler's recording rules evaluated over that history by Prometheus' engine
(``promtool tsdb create-blocks-from rules``). gpulab's cycle is timed twice per
kind, with the rules and without them (``--holes subquery``: holes measured by
the subquery; ``--holes both``, the default, does both on the same TSDB); the
culler's clock is set to the end of that history.

The cycles' hub REST API is a stand-in process (``culler_hub_standin.py``)
serving JupyterHub's paginated ``GET /hub/api/users?state=ready`` (page size
200, like JupyterHub's) with KubeSpawner-like server state, ``DELETE
.../server`` (204), and gpulab's idle state and cycle endpoints (it accepts
every claim): each cycle stops half the servers, and a real hub cannot be given
its 25,000 stopped servers back between cycles. What the stand-in leaves out --
the real hub's own cost of the listing both cullers read every cycle -- is then
measured on a real JupyterHub holding the same servers (``hub_at_scale.py``:
its database filled directly, the way JupyterHub's ORM stores running servers,
rather than by 50,000 spawns through the API), for both cullers' listings, at
page size 200 and any ``--hub-page-size``.

Wall time is the cycle's; CPU time is this process's (both cullers run here).
Prometheus answers gpulab's query only, so its CPU during gpulab's cycle is
reported and added on gpulab's side (``cpu_ratio_with_prometheus``); the
stand-in hub's CPU while serving each culler (mostly the user listing) is
reported for both, apart.

Run::

    .venv/bin/python benchmarks/culler_cycle.py                 # 5,000 servers
    .venv/bin/python benchmarks/culler_cycle.py --users 50000 --repeat 1 --hub-page-size 5000
    .venv/bin/python benchmarks/culler_cycle.py --smoke         # 40 servers, seconds
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
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import table, write_result  # noqa: E402
from culler_hub_standin import PAGE_MAX, TOKEN, kind_of, serve_hub  # noqa: E402
from hub_at_scale import process_cpu, rss_mib  # noqa: E402

CYCLES = ("warn", "reclaim", "steady")


# -- the real Prometheus, with one window of history per server --------------------


def history(n_servers: int, stamps: list[float]):
    """One dcgm-exporter series per server (generated: 50,000 of them are 6 million samples)."""
    for i in range(n_servers):
        name = f"user{i:05d}"
        value = 0.0 if kind_of(i).startswith("idle") else 97.0
        labels = {
            "gpu": "0",
            "UUID": f"GPU-{name}",
            "Hostname": "node-1",
            "modelName": "NVIDIA H100 80GB HBM3",
            "namespace": "jhub",
            "pod": f"jupyter-{name}",
            "container": "notebook",
        }
        yield "DCGM_FI_DEV_GPU_UTIL", labels, [(t, value) for t in stamps]


def start_prometheus(workdir: Path, n_servers: int, at: float, window: int, interval: int, rules: bool = True):
    from tests.support.dcgm_fake_exporter import RunningPrometheus

    prom = RunningPrometheus(workdir, [], rules=rules, rule_interval=f"{interval}s")
    stamps = [at - k * interval for k in range(window // interval + 2, -1, -1)]
    timeout = max(300.0, n_servers / 50)  # 50,000 series: 1,000 s at most for each promtool step
    t0 = time.perf_counter()
    prom.backfill(history(n_servers, stamps), timeout=timeout)
    prom.start(timeout=timeout)
    if rules:  # a rule group's evaluations, 7 s after the scrapes (its own offset)
        prom.backfill_rules(stamps[0] + 7, at + 1, timeout=timeout)
    return prom, time.perf_counter() - t0


# -- the two cullers ---------------------------------------------------------------


async def control(base: str, scenario: str | None = None) -> dict[str, Any]:
    from tornado.httpclient import AsyncHTTPClient

    client = AsyncHTTPClient()
    if scenario:
        await client.fetch(f"{base}/control?scenario={scenario}", method="POST", body=b"")
        return {}
    return json.loads((await client.fetch(base + "/control", request_timeout=120)).body)


async def timed(coro_factory) -> tuple[Any, float, float]:
    c0, t0 = time.process_time(), time.perf_counter()
    result = await coro_factory()
    return result, time.perf_counter() - t0, time.process_time() - c0


def gpulab_culler(args, base: str, prom_url: str, at: float, holes: str):
    from traitlets.config import Config

    from idle_culler.app import GPUIdleCuller

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
    # 50,000 series without the rules: the subquery alone takes Prometheus tens of seconds here.
    config.PrometheusSource.update(prometheus_url=prom_url, scrape_interval=float(args.interval), request_timeout=600)
    if holes == "subquery":
        config.PrometheusSource.sample_age_rule = ""
    ours = GPUIdleCuller(config=config)
    ours.initialize([])
    ours.clock = lambda: at
    ours.log.setLevel(logging.ERROR)  # like the peer at WARNING: no line per server in either
    return ours


def counted(requests: dict[str, int]) -> int:
    """Hub requests in a stand-in hub's counts (the ``recorded ...`` entries count records)."""
    return sum(v for k, v in requests.items() if not k.startswith("recorded"))


async def run(args, prom_url: str, at: float, prom_pid: int) -> dict[str, Any]:
    from jupyterhub_idle_culler import cull_idle

    from tests.support.hub import free_port

    port = free_port()
    base = f"http://127.0.0.1:{port}"
    ctx = multiprocessing.get_context("spawn")  # a fresh interpreter: not a fork of a running event loop
    ready = ctx.Event()
    proc = ctx.Process(target=serve_hub, args=(port, args.servers, at, args.window, ready), daemon=True)
    proc.start()
    if not ready.wait(120):
        raise SystemExit("stand-in hub did not start")
    quiet = logging.getLogger("benchmark-culler")
    quiet.setLevel(logging.WARNING)
    holes_modes = ("rule", "subquery") if args.holes == "both" else (args.holes,)
    ours = {holes: gpulab_culler(args, base, prom_url, at, holes) for holes in holes_modes}
    half = args.servers // 2
    rows: list[dict[str, Any]] = []
    try:
        for rep in range(args.repeat):
            for kind in CYCLES:
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
                idx = {int(n[4:]) for n in peer["stopped"]}
                for holes, culler in ours.items():
                    await control(base, kind)
                    prom0, hub0 = process_cpu(prom_pid), process_cpu(proc.pid)
                    summary, ours_wall, ours_cpu = await timed(culler.cycle)
                    prom_cpu, ours_hub_cpu = process_cpu(prom_pid) - prom0, process_cpu(proc.pid) - hub0
                    ours_req = (await control(base))["requests"]
                    # What each culler did, checked every time (a benchmark of wrong work means nothing).
                    expected = {"warn": (half, 0), "reclaim": (0, half), "steady": (0, 0)}[kind]
                    assert (len(summary.warned), len(summary.reclaimed)) == expected, (kind, summary.source_error)
                    # One query per cycle: with the rules, they cover every series' holes (a second
                    # query is the subquery for series they do not cover; the backfill waits for it).
                    subquery = culler.utilisation.last_subquery_series
                    assert summary.queries == 1 and summary.gpu_servers == args.servers, (summary.queries, subquery)
                    assert subquery == 0, subquery
                    assert ours_req.get("POST gpulab/idle/cycle", 0) == (1 if kind != "steady" else 0)
                    rows.append(
                        {
                            "repeat": rep + 1,
                            "cycle": kind,
                            "holes": holes,
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
                            "gpulab_hub_requests": counted(ours_req),
                            "peer_hub_requests": counted(peer["requests"]),
                            "gpulab_answer_bytes": culler.utilisation.last_answer_bytes,
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
        for culler in ours.values():
            if culler.hub is not None:
                await culler.hub.close()
        proc.terminate()
        proc.join(10)
    out: dict[str, Any] = {"rows": rows}
    for holes in holes_modes:
        out["cycles" if holes == holes_modes[0] else f"cycles_{holes}"] = medians(
            [r for r in rows if r["holes"] == holes]
        )
    return out


MEDIAN_FIELDS = (
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
    "gpulab_prometheus_wait_s",
)


def medians(rows: list[dict[str, Any]]) -> dict[str, dict[str, float]]:
    out = {}
    for kind in CYCLES:
        rs = [r for r in rows if r["cycle"] == kind]
        med = {k: statistics.median(r[k] for r in rs) for k in MEDIAN_FIELDS}
        out[kind] = {
            **med,
            "wall_ratio": med["gpulab_wall_s"] / med["peer_wall_s"],
            "cpu_ratio": med["gpulab_cpu_s"] / med["peer_cpu_s"],
            "cpu_ratio_with_prometheus": (med["gpulab_cpu_s"] + med["prometheus_cpu_s"]) / med["peer_cpu_s"],
        }
    return out


def real_hub_listing(args, at: float) -> dict[str, Any]:
    """The real JupyterHub's own cost of the listing both cullers read each cycle, at this size."""
    from hub_at_scale import measure, sample_users

    from tests.support.hub import free_port

    sizes = sorted({PAGE_MAX, *args.hub_page_size})
    return measure(sample_users(args.servers, at, args.window), sizes, TOKEN, free_port())


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--smoke", action="store_true", help="40 servers, one repeat (used by the tests)")
    ap.add_argument(
        "--users",
        "--servers",
        dest="users",
        type=int,
        help="users, each with one running GPU server, a multiple of 4 (default 5000; the issue's size is 50000)",
    )
    ap.add_argument("--repeat", type=int, help="rounds of the three cycle kinds, each beside the peer (default 3)")
    ap.add_argument("--window", type=int, default=3600, help="idle timeout in seconds (default 3600)")
    ap.add_argument("--interval", type=int, default=30, help="dcgm-exporter scrape interval (default 30)")
    ap.add_argument("--concurrency", type=int, default=10, help="hub requests in flight, both cullers (default 10)")
    ap.add_argument(
        "--holes",
        choices=("both", "rule", "subquery"),
        default="both",
        help="how gpulab measures holes: with the recording rules, without them (the subquery), or both "
        "(default: each cycle kind three times, gpulab with and without the rules beside the peer)",
    )
    ap.add_argument(
        "--hub-page-size",
        type=int,
        action="append",
        default=[],
        help="besides 200, a page size the real hub's listing is also timed at (the hub's "
        "api_page_max_limit raised to match); repeatable",
    )
    ap.add_argument("--no-real-hub", action="store_true", help="skip timing the real JupyterHub's listing")
    ap.add_argument("--out", help="directory for the JSON result (default benchmarks/results)")
    args = ap.parse_args(argv)
    args.servers = args.users = args.users or (40 if args.smoke else 5000)
    args.repeat = args.repeat or (1 if args.smoke else 3)
    if args.servers % 4:
        ap.error("--users must be a multiple of 4 (four kinds of session)")
    if not shutil.which("prometheus") or not shutil.which("promtool"):
        raise SystemExit("needs the prometheus and promtool binaries (Debian package `prometheus`)")

    at = math.floor((time.time() - 6 * 3600) / args.interval) * args.interval  # history ends 6 h ago
    with tempfile.TemporaryDirectory(prefix="culler-bench-") as tmp:
        prom, backfill_s = start_prometheus(
            Path(tmp), args.servers, at, args.window, args.interval, rules=args.holes != "subquery"
        )
        prom_rss_mib = rss_mib(prom.proc.pid)
        try:
            result = asyncio.run(run(args, prom.url, at, prom.proc.pid))
        finally:
            prom.stop()
    listing = None if args.no_real_hub else real_hub_listing(args, at)
    report(args, result, backfill_s, listing)
    path = write_result(
        "culler_cycle",
        {
            "smoke": args.smoke,
            "parts": "real Prometheus (backfilled with promtool); stand-in hub REST API process for the cycles; "
            "a real JupyterHub (database filled directly) for the hub's own listing (see the docstring)",
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
            "prometheus_rss_mib": prom_rss_mib,
            "real_hub_listing": listing,
            **result,
        },
        args.out,
    )
    summary = {
        name: {
            k: {"wall_ratio": round(c["wall_ratio"], 3), "cpu_ratio": round(c["cpu_ratio"], 3)} for k, c in cs.items()
        }
        for name, cs in result.items()
        if name.startswith("cycles")
    }
    print(json.dumps({"result": str(path), **summary}))
    return 0


def report(args, result: dict[str, Any], backfill_s: float, listing: dict[str, Any] | None) -> None:
    print(
        table(
            [
                "cycle",
                "holes",
                "repeat",
                "gpulab wall (s)",
                "peer wall (s)",
                "wall ratio",
                "gpulab CPU (s)",
                "Prometheus CPU (s)",
                "peer CPU (s)",
                "CPU ratio (with Prometheus)",
                "gpulab hub req",
                "peer hub req",
                "answer bytes",
                "Prometheus wait (s)",
            ],
            [
                [
                    r["cycle"],
                    r["holes"],
                    r["repeat"],
                    r["gpulab_wall_s"],
                    r["peer_wall_s"],
                    r["wall_ratio"],
                    r["gpulab_cpu_s"],
                    r["prometheus_cpu_s"],
                    r["peer_cpu_s"],
                    r["cpu_ratio_with_prometheus"],
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
    for name, cycles in result.items():
        if not name.startswith("cycles"):
            continue
        for kind, c in cycles.items():
            print(
                f"median {kind:8s} cycle ({name}): wall ratio {c['wall_ratio']:.2f}, CPU ratio {c['cpu_ratio']:.2f}, "
                f"with Prometheus' {c['prometheus_cpu_s']:.3f}s CPU on gpulab's side {c['cpu_ratio_with_prometheus']:.2f} "
                f"(gpulab {c['gpulab_wall_s']:.3f}s / {c['gpulab_cpu_s']:.3f}s CPU; "
                f"jupyterhub-idle-culler {c['peer_wall_s']:.3f}s / {c['peer_cpu_s']:.3f}s CPU); "
                f"stand-in hub CPU serving gpulab {c['gpulab_hub_cpu_s']:.3f}s, the peer {c['peer_hub_cpu_s']:.3f}s"
            )
    last = result["rows"][-1]
    print(
        f"jupyterhub-idle-culler per cycle: {last['peer_stopped']} stopped, {last['peer_wrong_stops']} of them "
        f"busy; {last['peer_missed_idle']} idle GPUs left running. Prometheus backfill took {backfill_s:.1f}s."
    )
    if listing:
        print(
            f"Real JupyterHub {listing['jupyterhub']} with {listing['users']:,} running servers "
            f"(database filled in {listing['populate_s']:.1f}s, hub start {listing['hub_start_s']:.1f}s, "
            f"{listing['hub_rss_mib']} MiB):"
        )
        for row in listing["listings"]:
            g, p = row["gpulab"], row["peer"]
            print(
                f"  page size {g['page_size']}: gpulab's listing {g['wall_s']:.2f}s, hub CPU {g['hub_cpu_s']:.2f}s, "
                f"{g['pages']} pages, {g['answer_bytes']:,} bytes (first page {g['first_page_s']:.3f}s, last "
                f"{g['last_page_s']:.3f}s); jupyterhub-idle-culler's pass {p['wall_s']:.2f}s, hub CPU {p['hub_cpu_s']:.2f}s"
            )


if __name__ == "__main__":
    sys.exit(main())
