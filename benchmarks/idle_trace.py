"""How much idle GPU-time the culler's decision reclaims on a per-GPU duty-cycle trace.

A synthetic trace with the statistics of a real per-GPU utilisation trace
(30 s scrapes over 24 h; about two thirds of the samples at zero; idle runs
with a long tail; one- and two-sample scrape holes common; a few holes of
hours) is replayed through the culler's own decision
(:func:`spawner.core.idle.judge_gpu_idle` on per-window summaries, as Prometheus
answers them, and :func:`spawner.core.idle.next_step`), with a cull cycle every
60 s, at idle timeouts of 15, 30, 60 and 120 minutes.

Figures, per timeout:

* **reclaimable idle GPU-time**: for every idle run (no busy sample, no hole
  longer than the tolerated missed scrapes), its length past timeout + grace;
* **reclaimed**: the part of that time during which the culler had freed the
  GPU (from its reclaim until the user came back);
* **busy reclaims**: reclaims with a busy sample between the start of the
  evidence window and the reclaim (must be 0).

After a reclaim the user comes back at the next busy sample and starts a new
server session there (only its own samples count).

Run::

    .venv/bin/python benchmarks/idle_trace.py              # 143 GPUs x 24 h
    .venv/bin/python benchmarks/idle_trace.py --smoke      # 12 GPUs x 12 h
"""

from __future__ import annotations

import argparse
import json
import math
import random
import sys
from bisect import bisect_left, bisect_right
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from itertools import pairwise

from _common import table, write_result  # noqa: E402

from spawner.core.idle import (  # noqa: E402
    DeviceSummary,
    IdleWarning,
    Step,
    judge_gpu_idle,
    max_gap_for,
    next_step,
)

INTERVAL = 30.0
CYCLE = 60.0
THRESHOLD = 1.0
TIMEOUTS_MIN = (15, 30, 60, 120)


# -- the trace ------------------------------------------------------------------


def synth_trace(seed: int, hours: float, *, long_holes: int = 1) -> list[tuple[float, float | None]]:
    """One GPU: ``(t, percent)`` every 30 s, ``None`` for a missed scrape."""
    rng = random.Random(seed)
    n = int(hours * 3600 / INTERVAL)
    values: list[float | None] = []
    busy = rng.random() < 0.4
    while len(values) < n:
        if busy:  # busy runs: minutes to a couple of hours, utilisation 5..100 %
            length = max(1, int(rng.lognormvariate(math.log(40), 1.0)))
            values.extend(rng.uniform(5, 100) for _ in range(length))
        else:  # idle runs: long-tailed (Pareto), from minutes to many hours
            length = max(1, int(20 * rng.paretovariate(0.9)))
            values.extend(0.0 for _ in range(length))
        busy = not busy
    values = values[:n]
    # Scrape holes: one- and two-sample holes are common, a few last hours.
    i = 0
    while i < n:
        r = rng.random()
        if r < 0.005:
            values[i] = None
        elif r < 0.007:
            values[i : i + 2] = [None] * len(values[i : i + 2])
            i += 1
        i += 1
    for _ in range(long_holes):
        if rng.random() < 0.25:
            start = rng.randrange(n)
            length = int(rng.uniform(1, 4) * 3600 / INTERVAL)
            values[start : start + length] = [None] * len(values[start : start + length])
    return [(k * INTERVAL, v) for k, v in enumerate(values)]


# -- a per-window summary, as Prometheus answers it ------------------------------


class SparseMax:
    """Range maximum in O(1) after O(n log n) preparation."""

    def __init__(self, xs: list[float]):
        self.levels = [list(xs)]
        k = 1
        while 2 * k <= len(xs):
            prev = self.levels[-1]
            self.levels.append([max(prev[i], prev[i + k]) for i in range(len(prev) - k)])
            k *= 2

    def max(self, lo: int, hi: int) -> float:
        """Maximum of xs[lo:hi] (hi > lo)."""
        level = (hi - lo).bit_length() - 1
        row = self.levels[level]
        return max(row[lo], row[hi - (1 << level)])


@dataclass
class ObservedGPU:
    times: list[float]
    values: list[float]
    peaks: SparseMax
    gaps: SparseMax  # gaps[i] = times[i] - times[i-1] (gaps[0] = 0)

    @classmethod
    def of(cls, trace: list[tuple[float, float | None]]) -> ObservedGPU:
        obs = [(t, v) for t, v in trace if v is not None]
        times = [t for t, _ in obs]
        values = [v for _, v in obs]
        gaps = [0.0] + [b - a for a, b in pairwise(times)]
        return cls(times, values, SparseMax(values), SparseMax(gaps))

    def summary(self, start: float, now: float) -> DeviceSummary:
        lo, hi = bisect_left(self.times, start), bisect_right(self.times, now)
        if hi <= lo:
            return DeviceSummary("gpu", 0, 0.0, 0.0, math.inf, math.inf, math.inf)
        gap = self.gaps.max(lo + 1, hi) if hi - lo > 1 else 0.0
        return DeviceSummary(
            "gpu", hi - lo, self.peaks.max(lo, hi), math.nan, self.times[lo] - start, now - self.times[hi - 1], gap
        )


# -- replay ------------------------------------------------------------------------


def replay(trace: list[tuple[float, float | None]], timeout: float, grace: float, max_gap: float) -> dict[str, Any]:
    gpu = ObservedGPU.of(trace)
    end = trace[-1][0]
    busy_times = [t for t, v in zip(gpu.times, gpu.values, strict=True) if v > THRESHOLD]
    session_start = -timeout  # the first server started before the trace
    warning: IdleWarning | None = None
    reclaims: list[tuple[float, float]] = []  # (evidence start, reclaim time)
    free: list[tuple[float, float]] = []  # GPU freed: from a reclaim until the user is back
    c = CYCLE
    while c <= end:
        if session_start is None:  # reclaimed: the user returns at the next busy sample
            i = bisect_right(busy_times, c - CYCLE)
            back = busy_times[i] if i < len(busy_times) else end
            free.append((reclaims[-1][1], back))
            if i == len(busy_times):
                break
            session_start = back
            c = math.ceil(session_start / CYCLE) * CYCLE
            continue
        verdict = judge_gpu_idle(
            [gpu.summary(c - timeout, c)],
            now=c,
            window_seconds=timeout,
            threshold_percent=THRESHOLD,
            max_gap_seconds=max_gap,
            expected_devices=1,
            started_at=session_start,
        )
        session = str(session_start)
        step = next_step(verdict, warning, None, c, session)
        if step in (Step.WARN, Step.REWARN):
            warning = IdleWarning(c, c + grace, session)
        elif step is Step.HOLD:
            warning = IdleWarning(warning.warned_at, warning.reclaim_at, session, held=True)
        elif step in (Step.CLEAR, Step.VOID):
            warning = None
        elif step is Step.RECLAIM:
            reclaims.append((warning.warned_at - timeout, c))
            warning, session_start = None, None
        c += CYCLE
    if session_start is None and (not free or free[-1][0] != reclaims[-1][1]):
        free.append((reclaims[-1][1], end))
    return {"reclaims": reclaims, "busy_times": busy_times, "free": free}


def idle_runs(trace: list[tuple[float, float | None]], max_gap: float) -> list[tuple[float, float]]:
    """Maximal runs of idle samples not broken by a busy sample or a hole wider than ``max_gap``."""
    runs, start, last = [], None, None
    for t, v in trace:
        if v is None:
            continue
        if v > THRESHOLD or (last is not None and t - last > max_gap):
            if start is not None:
                runs.append((start, last + INTERVAL))
            start = None
        if v <= THRESHOLD and start is None:
            start = t
        last = t
    if start is not None:
        runs.append((start, last + INTERVAL))
    return runs


def evaluate(
    traces: list[list[tuple[float, float | None]]],
    timeout_min: int,
    grace: float,
    missed: int,
    truth_missed: int | None = None,
) -> dict[str, Any]:
    """Replay every trace; idle runs are cut at holes wider than ``truth_missed`` scrapes
    (default: ``missed``), the culler tolerates ``missed``."""
    timeout = timeout_min * 60.0
    max_gap = max_gap_for(INTERVAL, missed)
    truth_gap = max_gap_for(INTERVAL, missed if truth_missed is None else truth_missed)
    reclaimable = reclaimed = 0.0
    n_reclaims = busy_reclaims = 0
    for trace in traces:
        result = replay(trace, timeout, grace, max_gap)
        runs = idle_runs(trace, truth_gap)
        reclaimable += sum(max(0.0, (e - s) - timeout - grace) for s, e in runs)
        # Of each run's idle time past timeout + grace, the part during which the GPU was freed.
        for s, e in runs:
            for a, b in result["free"]:
                reclaimed += max(0.0, min(e, b) - max(s + timeout + grace, a))
        for evidence_start, at in result["reclaims"]:
            n_reclaims += 1
            busy = result["busy_times"]
            if bisect_right(busy, at) > bisect_left(busy, evidence_start):
                busy_reclaims += 1
    return {
        "timeout_min": timeout_min,
        "reclaimable_gpu_hours": reclaimable / 3600,
        "reclaimed_gpu_hours": reclaimed / 3600,
        "share": reclaimed / reclaimable if reclaimable else 1.0,
        "reclaims": n_reclaims,
        "busy_reclaims": busy_reclaims,
    }


def trace_stats(traces: list[list[tuple[float, float | None]]]) -> dict[str, float]:
    values = [v for tr in traces for _, v in tr]
    seen = [v for v in values if v is not None]
    holes: dict[str, int] = {"1": 0, "2": 0, "3-10": 0, ">=1h": 0}
    for tr in traces:
        run = 0
        for _, v in tr + [(0, 0.0)]:
            if v is None:
                run += 1
                continue
            if run:
                key = "1" if run == 1 else "2" if run == 2 else ">=1h" if run * INTERVAL >= 3600 else "3-10"
                holes[key] = holes.get(key, 0) + 1
            run = 0
    return {
        "samples": len(values),
        "zero_share": sum(1 for v in seen if v == 0) / len(seen),
        "missing_share": 1 - len(seen) / len(values),
        "holes": holes,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--smoke", action="store_true", help="12 GPUs x 12 h")
    ap.add_argument("--gpus", type=int, help="GPUs in the trace (default 143)")
    ap.add_argument("--hours", type=float, help="trace length (default 24)")
    ap.add_argument("--grace", type=float, default=900.0, help="grace seconds (default 900)")
    ap.add_argument("--missed", type=int, default=2, help="missed scrapes tolerated in a row (default 2)")
    ap.add_argument("--seed", type=int, default=2026)
    ap.add_argument("--out", help="directory for the JSON result (default benchmarks/results)")
    args = ap.parse_args(argv)
    gpus = args.gpus or (12 if args.smoke else 143)
    hours = args.hours or (12.0 if args.smoke else 24.0)
    traces = [synth_trace(args.seed * 1000 + g, hours) for g in range(gpus)]
    stats = trace_stats(traces)
    rows = [evaluate(traces, m, args.grace, args.missed) for m in TIMEOUTS_MIN]
    # The same runs judged by a culler for which every missed scrape restarts the idle clock.
    strict = {m: evaluate(traces, m, args.grace, 0, truth_missed=args.missed) for m in TIMEOUTS_MIN}
    for r in rows:
        r["share_if_every_missed_scrape_restarts_the_clock"] = strict[r["timeout_min"]]["share"]
    print(
        table(
            [
                "timeout (min)",
                "reclaimable idle GPU-h",
                "reclaimed GPU-h",
                "share",
                "reclaims",
                "reclaims with a busy sample",
                "share, 0 missed tolerated",
            ],
            [
                [
                    r["timeout_min"],
                    r["reclaimable_gpu_hours"],
                    r["reclaimed_gpu_hours"],
                    r["share"],
                    r["reclaims"],
                    r["busy_reclaims"],
                    r["share_if_every_missed_scrape_restarts_the_clock"],
                ]
                for r in rows
            ],
            title=f"Synthetic duty-cycle trace: {gpus} GPUs x {hours:g} h, 30 s scrapes, cycle 60 s, "
            f"grace {args.grace:g} s, {args.missed} missed scrapes tolerated",
        )
    )
    print(
        f"trace: {stats['zero_share']:.1%} of seen samples at zero, {stats['missing_share']:.2%} missing; "
        f"holes {stats['holes']}"
    )
    path = write_result(
        "idle_trace",
        {
            "smoke": args.smoke,
            "synthetic": True,
            "parameters": {
                "gpus": gpus,
                "hours": hours,
                "grace_s": args.grace,
                "missed_scrapes": args.missed,
                "seed": args.seed,
            },
            "trace": stats,
            "rows": rows,
        },
        args.out,
    )
    print(json.dumps({"result": str(path), "shares": {r["timeout_min"]: round(r["share"], 4) for r in rows}}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
