"""Gang admission: a 64-GPU multi-node job beside a single reservation, in the quota ledger.

A multi-node training job (8 nodes × 8 GPUs) is admitted by one
:meth:`spawner.core.ledger.Ledger.reserve` with ``members=8``: all 64 GPUs at
once or nothing. This fills a real ledger with live workloads in many teams and
measures, interleaved in the same loop so the machine's noise hits both alike:

* ``single``: reserve + release of one 1-GPU notebook;
* ``gang``: reserve + release of the 64-GPU gang (admitted, over the guarantee for
  batch, within it for training);
* ``gang refused``: the same gang where the team has only 60 GPUs free (the refusal
  builds its sentence: "needs 64 GPUs in one go; ...").

The goal is that admitting a 64-GPU gang costs at most twice a single
reservation: the result is the ratio of medians, not a time. Run::

    .venv/bin/python benchmarks/gang_admission.py            # full run
    .venv/bin/python benchmarks/gang_admission.py --smoke    # a second
"""

from __future__ import annotations

import argparse
import gc
import random
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import percentile, table, write_result  # noqa: E402

from spawner.core.ledger import RUNNING, Ledger, Workload  # noqa: E402
from spawner.core.model import Team  # noqa: E402

GANG_MEMBERS = 8
GPUS_PER_MEMBER = 8
GANG_MILLI = GANG_MEMBERS * GPUS_PER_MEMBER * 1000
#: The goal: a gang costs at most this many single reservations.
GOAL_RATIO = 2.0


def build_ledger(n_workloads: int, n_teams: int, seed: int) -> tuple[Ledger, list[Team]]:
    """Teams each with room for the gang above what they hold, and ``n_workloads`` running workloads."""
    rng = random.Random(seed)
    held = [0] * n_teams
    live = []
    for i in range(n_workloads):
        t = i % n_teams
        milli = rng.choice((250, 500, 1000, 2000, 4000))
        held[t] += milli
        live.append((t, milli, i))
    teams = [
        Team(
            name=f"team-{t:04d}",
            users=frozenset(),
            guarantee_milli=held[t] + GANG_MILLI,
            burst_milli=held[t] + GANG_MILLI + 8000,
        )
        for t in range(n_teams)
    ]
    ledger = Ledger(teams)
    for t, milli, i in live:
        ledger.adopt(Workload(f"notebook:u{i}/", teams[t].name, f"user-{i % 7}", milli, state=RUNNING))
    return ledger, teams


def measure(n_workloads: int, n_teams: int, ops: int, seed: int) -> dict[str, Any]:
    ledger, teams = build_ledger(n_workloads, n_teams, seed)
    # A team with only 60 GPUs free: the gang is refused there, whole.
    tight = teams[-1]
    filler = tight.burst_milli - ledger.usage(tight.name).held_milli - 60_000
    ledger.adopt(Workload("notebook:filler/", tight.name, "filler", filler, state=RUNNING))
    rng = random.Random(seed + 1)
    picks = [rng.choice(teams[:-1]).name for _ in range(ops)]
    perf = time.perf_counter_ns
    reserve, release = ledger.reserve, ledger.release
    single_ns, gang_ns, refused_ns = [], [], []
    gang_allowed = gang_whole = refused_whole = single_allowed = 0
    for i in range(min(ops, 1000)):  # warm-up, not recorded
        reserve("w", picks[i], "alice", 1000)
        release("w")
    gc.disable()
    try:
        for i, team in enumerate(picks):
            may_burst = bool(i % 2)  # batch and training alternate
            a = perf()
            d1 = reserve("notebook:bench/", team, "alice", 1000)
            release("notebook:bench/")
            b = perf()
            d2 = reserve("job:bench", team, "alice", GANG_MILLI, kind="job", may_burst=may_burst, members=GANG_MEMBERS)
            w = ledger.get("job:bench")
            release("job:bench")
            c = perf()
            d3 = reserve("job:refused", tight.name, "alice", GANG_MILLI, kind="job", members=GANG_MEMBERS)
            e = perf()
            single_ns.append(b - a)
            gang_ns.append(c - b)
            refused_ns.append(e - c)
            single_allowed += d1.allowed
            gang_allowed += d2.allowed
            gang_whole += w is not None and w.milli == GANG_MILLI and w.members == GANG_MEMBERS
            refused_whole += not d3.allowed and ledger.get("job:refused") is None and "in one go" in d3.reason
    finally:
        gc.enable()
    for xs in (single_ns, gang_ns, refused_ns):
        xs.sort()

    def us(xs: list[int], q: float) -> float:
        return round(percentile(xs, q) / 1000, 3)

    single_p50 = percentile(single_ns, 50)
    return {
        "workloads": n_workloads,
        "teams": n_teams,
        "ops": ops,
        "single_allowed": single_allowed,
        "gang_allowed": gang_allowed,
        "gang_held_whole": gang_whole,
        "gang_refused_whole": refused_whole,
        "live_after": len(ledger.workloads()),
        "single_p50_us": us(single_ns, 50),
        "single_p99_us": us(single_ns, 99),
        "gang_p50_us": us(gang_ns, 50),
        "gang_p99_us": us(gang_ns, 99),
        "gang_refused_p50_us": us(refused_ns, 50),
        "gang_to_single_ratio": round(percentile(gang_ns, 50) / single_p50, 3),
        "refused_to_single_ratio": round(percentile(refused_ns, 50) / single_p50, 3),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--smoke", action="store_true", help="a few hundred operations on small ledgers")
    parser.add_argument("--ops", type=int, default=None)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--out", default=None, help="folder for the JSON result (default benchmarks/results/)")
    args = parser.parse_args(argv)
    sizes = [(100, 10)] if args.smoke else [(100, 10), (10_000, 100), (10_000, 1000)]
    ops = args.ops or (300 if args.smoke else 20_000)
    rows = [measure(n, t, ops, args.seed) for n, t in sizes]
    print(
        table(
            ["workloads", "teams", "single p50 µs", "gang p50 µs", "refused p50 µs", "gang / single"],
            [
                [
                    r["workloads"],
                    r["teams"],
                    r["single_p50_us"],
                    r["gang_p50_us"],
                    r["gang_refused_p50_us"],
                    r["gang_to_single_ratio"],
                ]
                for r in rows
            ],
            title=f"A {GANG_MEMBERS} × {GPUS_PER_MEMBER} GPU gang beside one 1-GPU reservation (goal ≤ {GOAL_RATIO}×)",
        )
    )
    worst = max(r["gang_to_single_ratio"] for r in rows)
    path = write_result(
        "gang_admission",
        {
            "smoke": args.smoke,
            "parameters": {
                "sizes": sizes,
                "ops": ops,
                "gang_members": GANG_MEMBERS,
                "gpus_per_member": GPUS_PER_MEMBER,
            },
            "goal_ratio": GOAL_RATIO,
            "worst_ratio": worst,
            "meets_goal": worst <= GOAL_RATIO,
            "rows": rows,
        },
        args.out,
    )
    print(f"worst gang / single ratio {worst} (goal ≤ {GOAL_RATIO}); written to {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
