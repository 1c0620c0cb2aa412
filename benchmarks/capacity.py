"""GPU capacity on a real trace: whole GPUs vs fractional profiles, time-slicing and MIG.

Every GPU task of a pod list in the Alibaba ``cluster-trace-gpu-v2023`` format
is admitted through the project's own :class:`spawner.core.ledger.Ledger` and placed
by its :class:`spawner.core.packer.DevicePacker` on the GPUs of a node list, once
per allocation policy:

``whole``       every request rounded up to whole GPUs (no sharing);
``fractional``  rounded up to the nearest offered profile size (default
                0.25, 0.5, 1, 2, 4, 8 GPUs, or the sizes of ``--catalog``);
``timeslice-4`` time-slicing with 4 replicas: shares rounded up to k/4 GPU;
``mig-a100-40gb`` HYPOTHETICAL: no GPU model of the Alibaba trace supports
                MIG, so this pretends every GPU were an A100-40GB and uses
                the MIG table and slice choice of :mod:`spawner.core.sharing`.

The rounding itself is :mod:`spawner.core.sharing`'s (``timeslice_effective_milli``,
``mig_table``, ``pick_mig_slice``), not a copy.

Two measures (see docs/benchmarks.md for why):

* **inflation** -- as in the paper that published the trace: tasks arrive in
  trace order (cycling through the trace again when it runs out) and never
  leave, until the GPU demand offered reaches ``--load`` times the cluster;
* **time replay** -- the trace's own creation and deletion times, on the full
  cluster and on a cluster cut down (whole nodes, evenly spread) to
  ``--replay-fraction`` of the peak concurrent whole-GPU demand, so that it
  saturates. A task that does not fit when it arrives is refused (not queued).

Ledger set-up (documented, not tuned): one team, ``cluster``, whose guarantee
and burst are the cluster's GPUs; it records every admission, must agree with
the packer, and refuses only when every GPU is allocated.

    .venv/bin/python benchmarks/capacity.py            # full run on the Alibaba trace
    .venv/bin/python benchmarks/capacity.py --smoke    # first 600 GPU tasks, a few seconds
"""

from __future__ import annotations

import argparse
import math
import os
import random
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import table, write_result  # noqa: E402
from capacity_sim import (  # noqa: E402
    DEFAULT_PROFILE_SIZES,
    FULL,
    TEAM,
    cluster_summary,
    exact_policy,
    fill,
    fill_sim,
    find_cost,
    fractional_policy,
    inflate,
    mig_capable,
    mig_policy,
    peak_demand,
    replay,
    replay_queued,
    round_to_whole,
    sizes_from_catalog,
    timeslice_policy,
    whole_policy,
)
from trace_loader import PodTrace, default_trace_dir, load_nodes, load_pods, subset_nodes  # noqa: E402

from spawner.core.advisor import demand_from, fill_work, recommend  # noqa: E402
from spawner.core.packer import SCORINGS  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent


def repo_relative(path: str) -> str:
    """``path`` relative to the repository (results must not carry this machine's absolute paths)."""
    return os.path.relpath(Path(path).resolve(), ROOT)


def _ratio(a: float, b: float) -> float:
    return a / b if b else float("nan")


def ratios_vs_whole(rows: list[dict[str, Any]], keys: Sequence[str]) -> dict[str, dict[str, float]]:
    by = {r["policy"]: r for r in rows}
    base = by.get("whole")
    if not base:
        return {}
    return {name: {k: _ratio(r[k], base[k]) for k in keys} for name, r in by.items() if name != "whole"}


def main(argv: list[str] | None = None) -> int:
    trace_dir = default_trace_dir()
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pods", default=str(trace_dir / "openb_pod_list_gpushare40.csv"), help="pod list CSV")
    ap.add_argument("--nodes", default=str(trace_dir / "openb_node_list_gpu_node.csv"), help="node list CSV")
    ap.add_argument(
        "--catalog",
        help="take the fractional profile sizes from this catalog YAML (default: 0.25, 0.5, 1, 2, 4, 8 GPUs)",
    )
    ap.add_argument("--replicas", type=int, default=4, help="time-slicing replicas per GPU (default 4)")
    ap.add_argument(
        "--load",
        type=float,
        default=1.5,
        help="inflation: stop when this multiple of the cluster's GPUs was offered (default 1.5)",
    )
    ap.add_argument(
        "--replay-fraction",
        type=float,
        default=0.5,
        help="time replay: cut the cluster down to this fraction of the peak concurrent whole-GPU demand (default 0.5)",
    )
    ap.add_argument(
        "--method",
        choices=("both", "paper", "load"),
        default="both",
        help="paper: file order, no departures, until --max-failures placements in a row fail "
        "(the trace paper's measure); load: until --load x the cluster was offered, then the "
        "time replays (default both)",
    )
    ap.add_argument(
        "--max-failures",
        type=int,
        default=200,
        help="paper method: stop after this many failed placements in a row (default 200)",
    )
    ap.add_argument(
        "--advisor-sizes", type=int, default=6, help="most sizes the profile advisor may recommend (default 6)"
    )
    ap.add_argument(
        "--advisor-learn",
        type=float,
        default=1.0,
        help="the profile advisor learns from (and measures on) only a random sample of this "
        "fraction of the GPU tasks (seed 0, kept in file order), to see how its catalog does on "
        "tasks it never saw; the file is not a time order (its shared-GPU tasks come first), so "
        "a leading slice would not do (default 1: all)",
    )
    ap.add_argument("--limit", type=int, help="read only the first N GPU tasks of the pod list")
    ap.add_argument("--smoke", action="store_true", help="first 600 GPU tasks, a few seconds (used by the tests)")
    ap.add_argument("--out", help="directory for the JSON result (default benchmarks/results)")
    ap.add_argument("--name", default="capacity", help="result file name without .json (default capacity)")
    args = ap.parse_args(argv)
    limit = args.limit or (600 if args.smoke else None)

    started = time.perf_counter()
    trace: PodTrace = load_pods(args.pods, limit=limit)
    devices = load_nodes(args.nodes)
    tasks = trace.tasks
    if not tasks:
        ap.error(f"{args.pods}: no GPU tasks")
    sizes = sizes_from_catalog(args.catalog) if args.catalog else list(DEFAULT_PROFILE_SIZES)
    if args.smoke:
        # A smaller cluster so that the 600-row sample fills it too.
        devices = subset_nodes(devices, max(16, sum(t.request_milli for t in tasks) // FULL // 3))
    # The profile advisor learns from the trace's requests and picks, among its least-waste
    # alternatives, the one that places the most work in the paper's fill (best fit): an
    # in-sample choice, as an admin would make it from the last 30 days.
    if not 0 < args.advisor_learn <= 1:
        ap.error("--advisor-learn must be in (0, 1]")
    in_order = sorted(tasks, key=lambda t: t.row)
    learn = (
        in_order
        if args.advisor_learn == 1
        else sorted(
            random.Random(0).sample(in_order, max(1, round(args.advisor_learn * len(tasks)))), key=lambda t: t.row
        )
    )
    requests = [(t.request_milli, t.models) for t in learn]
    t_adv = time.perf_counter()
    advice = recommend(
        demand_from((t.request_milli, 1) for t in learn),
        "kai",
        max_sizes=args.advisor_sizes,
        current=sizes,
        evaluate=lambda s: fill_work(requests, devices, s, args.max_failures),
    )
    advisor_s = time.perf_counter() - t_adv
    policies = [
        whole_policy(),
        fractional_policy(sizes),
        fractional_policy(advice.sizes, "advisor"),
        exact_policy(),
        timeslice_policy(args.replicas),
        mig_policy(),
    ]

    demand = sum(t.request_milli for t in tasks)
    print(
        f"{trace.path}: {trace.rows:,} rows, {len(tasks):,} GPU tasks asking for {demand / 1000:,.1f} GPUs "
        f"in all; skipped {trace.skipped or 'none'}",
        file=sys.stderr,
    )
    print(f"{args.nodes}: {cluster_summary(devices)}", file=sys.stderr)

    result: dict[str, Any] = {
        "smoke": args.smoke,
        "method": args.method,
        "pods_file": repo_relative(trace.path),
        "nodes_file": repo_relative(args.nodes),
        "rows": trace.rows,
        "gpu_tasks": len(tasks),
        "skipped": trace.skipped,
        "demand_gpus": demand / 1000,
        "policies": {p.name: p.note for p in policies},
        "profile_sizes_milli": sizes,
        "mig_capable_models_in_cluster": mig_capable(d.model for d in devices),
        "ledger": f"one team {TEAM!r}, guarantee = burst = cluster GPUs",
        "advisor": {
            **advice.to_dict(),
            "backend": "kai (any share)",
            "seconds": advisor_s,
            "learned_from_tasks": len(learn),
        },
    }
    if args.method in ("both", "paper"):
        result["paper"] = paper_method(tasks, devices, policies, args.max_failures)
    if args.method in ("both", "load"):
        load_method(args, tasks, trace, devices, policies, result)
    result["elapsed_s"] = time.perf_counter() - started
    path = write_result(args.name, result, args.out)
    print(f"\nwrote {path} in {result['elapsed_s']:.1f} s")
    return 0


def paper_method(tasks, devices, policies, max_failures: int) -> dict[str, Any]:
    rows = [fill(tasks, devices, p, scoring, max_failures) for p in policies for scoring in SCORINGS]
    exact = {r["scoring"]: r for r in rows if r["policy"] == "exact"}
    for r in rows:
        r["work_vs_exact_bestfit"] = _ratio(r["requested_gpus"], exact["bestfit"]["requested_gpus"])
        r["work_vs_exact_same_scoring"] = _ratio(r["requested_gpus"], exact[r["scoring"]]["requested_gpus"])
    print(
        table(
            [
                "policy",
                "scoring",
                "submitted",
                "served",
                "work placed (GPUs)",
                "vs exact (best fit)",
                "vs exact (same scoring)",
                "allocated share",
                "placement µs/call",
                "checks",
            ],
            [
                [
                    r["policy"],
                    r["scoring"],
                    r["submitted"],
                    r["served_workloads"],
                    r["requested_gpus"],
                    r["work_vs_exact_bestfit"],
                    r["work_vs_exact_same_scoring"],
                    r["allocated_share"],
                    r["place_us_per_call"],
                    "ok" if all(r["checks"].values()) else "FAILED",
                ]
                for r in rows
            ],
            title=f"Paper method on {len(devices):,} GPUs: file order, no departures, until {max_failures} "
            f"placements in a row fail",
        )
    )
    print()
    # What one query costs on the full cluster, empty and as the exact-fraction fill leaves it.
    sizes = [250, 1000, 2000, 8000]
    cost = {}
    for scoring in SCORINGS:
        # max_failures=0: the trace's workload (for FGD), nothing placed
        empty = fill_sim(tasks, devices, exact_policy(), scoring, max_failures=0)
        full = fill_sim(tasks, devices, exact_policy(), scoring, max_failures)
        cost[scoring] = {"empty": find_cost(empty, sizes), "after_exact_fill": find_cost(full, sizes)}
    print(
        table(
            ["scoring", "cluster", *[f"find {m / 1000:g} GPU µs" for m in sizes]],
            [[sc, state, *[c[str(m)] for m in sizes]] for sc, by in cost.items() for state, c in by.items()],
            title=f"Placement query cost on {len(devices):,} GPUs ({cluster_summary(devices)['nodes']:,} nodes)",
        )
    )
    print()
    return {"cluster": cluster_summary(devices), "max_failures": max_failures, "rows": rows, "find_us": cost}


def load_method(args, tasks, trace, devices, policies, result: dict[str, Any]) -> None:
    checkpoints = [x for x in (0.5, 0.75, 1.0, 1.25, 1.5, 2.0) if x <= args.load]
    inflation = [inflate(tasks, devices, p, args.load, checkpoints, scoring) for scoring in SCORINGS for p in policies]
    bestfit = [r for r in inflation if r["scoring"] == "bestfit"]
    result["inflation"] = {
        "cluster": cluster_summary(devices),
        "load": args.load,
        "rows": inflation,
        "ratios_vs_whole": ratios_vs_whole(bestfit, ("served_workloads", "requested_share", "allocated_share")),
    }

    print(
        table(
            [
                "policy",
                "scoring",
                "submitted",
                "served",
                "refused",
                "not offered",
                "ledger full",
                "no device fits",
                "allocated share",
                "requested share",
                "first refusal at load",
                "checks",
            ],
            [
                [
                    r["policy"],
                    r["scoring"],
                    r["submitted"],
                    r["served_workloads"],
                    r["refused"],
                    r["outcomes"]["not offered"],
                    r["outcomes"]["quota"],
                    r["outcomes"]["no device fits"],
                    r["allocated_share"],
                    r["requested_share"],
                    r["first_refusal"]["offered_load"] if r["first_refusal"] else "none",
                    "ok" if all(r["checks"].values()) else "FAILED",
                ]
                for r in inflation
            ],
            title=f"Inflation on {len(devices):,} GPUs: trace order, no departures, until {args.load:g} x the "
            f"cluster was offered",
        )
    )
    if checkpoints:
        print()
        print(
            table(
                ["policy", *[f"served @ {c:g}x" for c in checkpoints], *[f"req. share @ {c:g}x" for c in checkpoints]],
                [
                    [
                        r["policy"],
                        *[s["served_workloads"] for s in r["checkpoints"]],
                        *[s["requested_share"] for s in r["checkpoints"]],
                    ]
                    for r in bestfit
                ],
                title="Inflation checkpoints: workloads served and GPU demand served (share of cluster) by offered load",
            )
        )

    if trace.has_times:
        peak_whole = peak_demand(tasks, round_to_whole)
        cut = subset_nodes(devices, max(1, math.ceil(args.replay_fraction * peak_whole / FULL)))
        replays = {}
        for label, devs in (("full", devices), ("cut", cut)):
            rows = [replay(tasks, devs, p) for p in policies]
            replays[label] = {
                "cluster": cluster_summary(devs),
                "rows": rows,
                "ratios_vs_whole": ratios_vs_whole(
                    rows,
                    (
                        "served_workloads",
                        "peak_concurrent_workloads",
                        "time_avg_requested_share",
                        "time_avg_allocated_share",
                    ),
                ),
            }
            print()
            print(
                table(
                    [
                        "policy",
                        "arrived",
                        "served",
                        "refused",
                        "peak concurrent",
                        "peak alloc. share",
                        "time-avg alloc. share",
                        "time-avg req. share",
                        "checks",
                    ],
                    [
                        [
                            r["policy"],
                            r["arrived"],
                            r["served_workloads"],
                            r["refused"],
                            r["peak_concurrent_workloads"],
                            r["peak_allocated_share"],
                            r["time_avg_allocated_share"],
                            r["time_avg_requested_share"],
                            "ok" if all(r["checks"].values()) else "FAILED",
                        ]
                        for r in rows
                    ],
                    title=f"Time replay (spawner.core.whatif engine) on the {label} cluster ({len(devs):,} GPUs on "
                    f"{cluster_summary(devs)['nodes']} nodes); refused = did not fit on arrival",
                )
            )
        queued_rows = [replay_queued(tasks, cut, p) for p in policies]
        replays["cut_queued"] = {
            "cluster": cluster_summary(cut),
            "rows": queued_rows,
            "ratios_vs_whole": ratios_vs_whole(
                queued_rows,
                ("served_workloads", "peak_concurrent_workloads", "waited", "mean_wait_s", "time_avg_requested_share"),
            ),
        }
        print()
        print(
            table(
                [
                    "policy",
                    "arrived",
                    "served",
                    "refused",
                    "waited",
                    "waited by size",
                    "max queue",
                    "wait p50 s (waited)",
                    "wait max s",
                    "mean wait s (all)",
                    "peak concurrent",
                    "time-avg alloc. share",
                    "time-avg req. share",
                    "checks",
                ],
                [
                    [
                        r["policy"],
                        r["arrived"],
                        r["served_workloads"],
                        r["refused"],
                        r["waited"],
                        " ".join(f"{k}: {v}" for k, v in r["waited_by_size_milli"].items()) or "-",
                        r["max_queue_length"],
                        r["waited_p50_s"],
                        r["waited_max_s"],
                        r["mean_wait_s"],
                        r["peak_concurrent_workloads"],
                        r["time_avg_allocated_share"],
                        r["time_avg_requested_share"],
                        "ok" if all(r["checks"].values()) else "FAILED",
                    ]
                    for r in queued_rows
                ],
                title=f"Time replay with a queue on the cut cluster ({len(cut):,} GPUs): tasks that do not fit "
                f"wait (best-effort FIFO) and keep their duration",
            )
        )
        result["replay"] = {
            "peak_concurrent_whole_gpu_demand": peak_whole / 1000,
            "peak_concurrent_requested_gpus": peak_demand(tasks, lambda m: m) / 1000,
            "replay_fraction": args.replay_fraction,
            **replays,
        }
    else:
        result["replay"] = None
        print(f"\n{trace.path} has no creation_time/deletion_time columns: time replay skipped", file=sys.stderr)

    print()
    rat_rows = []
    for name, r in result["inflation"]["ratios_vs_whole"].items():
        row = [name, r["served_workloads"], r["requested_share"]]
        if result["replay"]:
            c = result["replay"]["cut"]["ratios_vs_whole"][name]
            q = result["replay"]["cut_queued"]["ratios_vs_whole"][name]
            row += [c["served_workloads"], c["peak_concurrent_workloads"], q["waited"], q["mean_wait_s"]]
        else:
            row += ["n/a"] * 4
        rat_rows.append(row)
    print(
        table(
            [
                "policy",
                "inflation: served",
                "inflation: demand served",
                "replay (cut): served",
                "replay (cut): peak concurrent",
                "queued replay (cut): tasks that waited",
                "queued replay (cut): mean wait",
            ],
            rat_rows,
            title="Capacity ratio vs whole GPUs (policy / whole, best fit)",
        )
    )


if __name__ == "__main__":
    sys.exit(main())
