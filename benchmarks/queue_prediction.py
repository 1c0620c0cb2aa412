"""How often the queue's predicted start was right, on the recorded sessions of a real GPU cluster.

The Alibaba 2023 trace (``openb_pod_list_gpushare40.csv``: each GPU task's creation and
deletion time, so its session length, and its GPU request) is replayed in arrival order
on a pool cut down until it saturates (``--gpus``; the trace never holds more than ~70 of
its 6,212 GPUs at once, so the full cluster queues nobody). A task that does not fit, or
arrives while others wait, joins the queue (first come, first served, no overtaking:
:func:`spawner.core.queue.next_to_start`) and starts when enough GPU share frees.

At the moment a task joins, the hub's own prediction is made with the hub's own
functions: each running task's expected end from :func:`spawner.core.queue.expected_end`
over the *recorded* session lengths of tasks of the same request size that had ended by
then (the newest 200, as the hub reads them; the trace has no idle warnings or time
limits, so those bounds do not apply here), then :func:`spawner.core.queue.predict_start`.
It is compared with the start the replay then gives the task. Reported: how many queued
tasks got a prediction, the median absolute error and the share within ±15 minutes;
and the same with the true remaining lengths (an oracle) to separate the error of the
queue model (fragmentation is not modelled, nor is it in the replay: one pool of milli-GPUs)
from the error of the session-length estimate.

Run::

    .venv/bin/python benchmarks/queue_prediction.py            # the whole trace, on 48 GPUs
    .venv/bin/python benchmarks/queue_prediction.py --smoke    # the first 1,500 tasks, on 24 GPUs
"""

from __future__ import annotations

import argparse
import heapq
import sys
from collections import defaultdict, deque
from pathlib import Path
from statistics import median
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from _common import table, write_result  # noqa: E402
from trace_loader import default_trace_dir, load_pods  # noqa: E402

from spawner.core.queue import Holder, QueueEntry, expected_end, predict_start  # noqa: E402

HISTORY = 200
WITHIN = 15 * 60


def typical_length(past: deque[float]) -> float | None:
    """A queued task's expected length: the median of its size's recorded lengths (3 at least)."""
    return median(past) if len(past) >= 3 else None


def replay(tasks: list[Any], capacity: int, oracle: bool) -> list[tuple[float, float | None]]:
    """``(actual wait end, predicted start)`` per queued task, in seconds of the trace."""
    running: list[tuple[float, int, int]] = []  # (end, task index, milli) heap
    started_at: dict[int, float] = {}
    queue: deque[int] = deque()
    free = capacity
    lengths: dict[int, deque[float]] = defaultdict(lambda: deque(maxlen=HISTORY))
    ended_log: list[tuple[float, int, float]] = []  # (end time, request, length) in end order, for history
    predictions: dict[int, float | None] = {}
    enq_at: dict[int, float] = {}
    out: list[tuple[float, float | None]] = []
    hist_i = 0

    def start(i: int, now: float) -> None:
        nonlocal free
        t = tasks[i]
        free -= t.request_milli
        started_at[i] = now
        heapq.heappush(running, (now + (t.deletion - t.creation), i, t.request_milli))
        if i in predictions:
            out.append((now, predictions[i]))

    def release_until(now: float) -> None:
        nonlocal free
        while running and running[0][0] <= now:
            end, i, milli = heapq.heappop(running)
            free += milli
            ended_log.append((end, tasks[i].request_milli, end - started_at[i]))
            drain(end)

    def drain(now: float) -> None:
        while queue and tasks[queue[0]].request_milli <= free:
            start(queue.popleft(), now)

    for i, t in enumerate(tasks):
        now = float(t.creation)
        release_until(now)
        while hist_i < len(ended_log) and ended_log[hist_i][0] <= now:
            lengths[ended_log[hist_i][1]].append(ended_log[hist_i][2])
            hist_i += 1
        if not queue and t.request_milli <= free:
            start(i, now)
            continue
        holders = []
        for end, j, milli in running:
            if oracle:
                ends, basis = end, "oracle"
            else:
                ends, basis = expected_end(started_at[j], now, list(lengths[tasks[j].request_milli]))
            holders.append(Holder(f"t{j}", "pool", milli, None, ends, basis))
        me = QueueEntry(i, "u", "", "pool", "p", t.request_milli, 1, now)
        ahead = [QueueEntry(j, "u", "", "pool", "p", tasks[j].request_milli, 1, enq_at[j]) for j in queue]
        if oracle:
            length = lambda q: float(tasks[q.id].deletion - tasks[q.id].creation)  # noqa: E731
        else:
            length = lambda q: typical_length(lengths[q.milli])  # noqa: E731
        predictions[i] = predict_start(me, ahead, holders, now, team_free_milli=free, length=length).at
        enq_at[i] = now
        queue.append(i)
    release_until(float("inf"))
    return out


def figures(pairs: list[tuple[float, float | None]]) -> dict[str, Any]:
    errors = [abs(actual - predicted) for actual, predicted in pairs if predicted is not None]
    return {
        "queued": len(pairs),
        "predicted": len(errors),
        "predicted_share": round(len(errors) / len(pairs), 3) if pairs else None,
        "median_abs_error_min": round(median(errors) / 60, 1) if errors else None,
        "within_15_min_share": round(sum(e <= WITHIN for e in errors) / len(errors), 3) if errors else None,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trace-dir", type=Path, default=None)
    ap.add_argument("--gpus", type=int, default=None, help="GPUs of the pool the trace is replayed on (48; smoke 24)")
    ap.add_argument("--smoke", action="store_true")
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    directory = args.trace_dir or default_trace_dir()
    trace = load_pods(directory / "openb_pod_list_gpushare40.csv")
    tasks = [
        t
        for t in trace.tasks
        if t.request_milli > 0 and t.creation is not None and t.deletion is not None and t.deletion > t.creation
    ]
    tasks.sort(key=lambda t: (t.creation, t.row))
    if args.smoke:
        tasks = tasks[:1500]
    args.gpus = args.gpus or (24 if args.smoke else 48)
    capacity = args.gpus * 1000
    tasks = [t for t in tasks if t.request_milli <= capacity]
    result = {"gpus": args.gpus, "tasks": len(tasks), "smoke": args.smoke}
    result["history"] = figures(replay(tasks, capacity, oracle=False))
    result["oracle"] = figures(replay(tasks, capacity, oracle=True))
    rows = [
        [name, f["queued"], f["predicted"], f["median_abs_error_min"], f["within_15_min_share"]]
        for name, f in (("recorded sessions", result["history"]), ("true lengths (oracle)", result["oracle"]))
    ]
    print(table(["prediction from", "queued", "with a prediction", "median |error| min", "within ±15 min"], rows))
    path = write_result("queue_prediction", result, args.out)
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
