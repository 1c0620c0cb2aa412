"""Admission cost with GPU pools and departments, side by side with a flat catalog, in one run.

The same worlds as :mod:`admission` (live workloads, teams, 20 profiles over 4 GPU
models), measured twice, interleaved: *flat* (a team's guarantee and burst for any
pool, no departments: the catalogs gpulab had before pools) and *tree* (a pool per GPU
model, every team with a quota in two pools, teams in departments of ten, weights
1-3, and one team per department with a GPU waiting in the spawn queue), so every
admission also checks its pool's quota and its department's bound. Both worlds'
teams already borrow (each is guaranteed half of what it holds), so every admission
is a borrowing one and, in the tree, runs weighted borrowing's fair-share check.
The claim: admission with pools and departments costs within 1.5x the flat catalog's
at 10,000 live workloads and 1,000 teams. Run::

    .venv/bin/python benchmarks/admission_tree.py            # 10,000 workloads x 1,000 teams
    .venv/bin/python benchmarks/admission_tree.py --smoke    # a few seconds
"""

from __future__ import annotations

import argparse
import gc
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import table, write_result  # noqa: E402
from admission import TIMED_KEYS, measure  # noqa: E402

#: The ratios the claim is about (tree / flat; lower is better).
COMPARED = ("reserve_release_p50_us", "admit_p50_us", "admit_refused_p50_us", "page_render_p50_ms")
LIMIT = 1.5


def best(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The best repeat per timing (least disturbed on a shared machine), counts from the first."""
    out = dict(runs[0])
    for key in TIMED_KEYS:
        values = [r[key] for r in runs]
        out[key] = max(values) if key.endswith("_per_s") else min(values)
    out["repeats"] = {key: [r[key] for r in runs] for key in TIMED_KEYS}
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--smoke", action="store_true", help="tiny sizes, a few seconds (used by the tests)")
    ap.add_argument("--workloads", type=int, default=10_000)
    ap.add_argument("--teams", type=int, default=1000)
    ap.add_argument("--ops", type=int, default=50_000, help="admissions timed per measurement")
    ap.add_argument("--renders", type=int, default=300)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--seed", type=int, default=20231)
    ap.add_argument("--out", help="directory for the JSON result (default benchmarks/results)")
    args = ap.parse_args(argv)
    if args.smoke:
        args.workloads, args.teams, args.ops, args.renders, args.repeat = 100, 20, 300, 5, 1

    started = time.perf_counter()
    runs: dict[str, list[dict[str, Any]]] = {"flat": [], "tree": []}
    for rep in range(args.repeat):
        for variant in ("flat", "tree"):
            gc.collect()
            r = measure(
                args.workloads, args.teams, args.ops, args.renders, args.seed, tree=variant == "tree", borrowing=True
            )
            runs[variant].append(r)
            print(
                f"  [{rep + 1}/{args.repeat}] {variant}: reserve+release p50 {r['reserve_release_p50_us']:.2f} µs, "
                f"admit p50 {r['admit_p50_us']:.2f} µs",
                file=sys.stderr,
            )
    flat, tree = best(runs["flat"]), best(runs["tree"])
    ratio = {key: tree[key] / flat[key] for key in COMPARED}
    checks = {
        "same_admissions": flat["allowed"] == tree["allowed"],
        "held_within_burst": flat["held_within_burst"] and tree["held_within_burst"],
        "filled_to_burst_exactly": flat["filled_to_burst_exactly"] and tree["filled_to_burst_exactly"],
        "nothing_leaked": flat["live_after"] == tree["live_after"] == args.workloads,
    }
    within = all(v <= LIMIT for v in ratio.values())
    print(
        table(
            ["measure", "flat", "pools + departments", "ratio"],
            [[key, flat[key], tree[key], ratio[key]] for key in COMPARED],
            title=f"Admission at {args.workloads:,} workloads, {args.teams:,} teams "
            f"({args.ops:,} timed operations, best of {args.repeat})",
        )
    )
    print(f"\nwithin {LIMIT}x: {within}; checks: {checks}")
    path = write_result(
        "admission_tree",
        {
            "smoke": args.smoke,
            "workloads": args.workloads,
            "teams": args.teams,
            "ops": args.ops,
            "repeat": args.repeat,
            "limit": LIMIT,
            "ratio": ratio,
            "within_limit": within,
            "checks": checks,
            "flat": flat,
            "tree": tree,
            "elapsed_s": time.perf_counter() - started,
        },
        args.out,
    )
    print(f"wrote {path}", file=sys.stderr)
    return 0 if all(checks.values()) else 1


if __name__ == "__main__":
    raise SystemExit(main())
