"""The capacity simulation: allocation policies, and ledger + packer under a trace.

Used by ``benchmarks/capacity.py`` (which reads the files and prints the
tables). Every task goes through the project's own :class:`spawner.core.ledger.Ledger`
and :class:`spawner.core.packer.DevicePacker`; the rounding of the sharing policies
is :mod:`spawner.core.sharing`'s.
"""

from __future__ import annotations

import heapq
import time
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from _common import percentile
from trace_loader import TraceTask

from spawner.core.catalog.yaml_text import catalog_from_yaml
from spawner.core.fragmentation import TaskClass
from spawner.core.ledger import Ledger
from spawner.core.model import Team
from spawner.core.packer import FULL, DevicePacker, GPUDevice
from spawner.core.sharing import mig_table, pick_mig_slice, timeslice_effective_milli
from spawner.core.whatif import Proposal, RecordedSession
from spawner.core.whatif import replay as replay_sessions

#: The profile sizes the product brief offers (docs/benchmarks.md), in milli-GPUs.
DEFAULT_PROFILE_SIZES = (250, 500, 1000, 2000, 4000, 8000)
#: The GPU model whose MIG table (from spawner.core.sharing) the hypothetical MIG policy uses.
MIG_MODEL = "A100-40GB"
TEAM = "cluster"
OUTCOMES = ("placed", "not offered", "quota", "no device fits")


@dataclass(frozen=True)
class Policy:
    name: str
    #: request milli -> allocated milli, or ``None`` when no offered size can hold it.
    allocate: Callable[[int], int | None]
    note: str


def round_to_whole(milli: int) -> int:
    return -(-milli // FULL) * FULL


def whole_policy() -> Policy:
    return Policy("whole", round_to_whole, "every request rounded up to whole GPUs")


def exact_policy() -> Policy:
    return Policy(
        "exact",
        lambda milli: milli,
        "exact fractions: every request gets exactly what it asked for (the upper bound; e.g. KAI's gpu-fraction)",
    )


def fractional_policy(sizes: Sequence[int], name: str = "fractional") -> Policy:
    sizes = tuple(sorted(set(sizes)))
    bad = [s for s in sizes if s <= 0 or (s > FULL and s % FULL)]
    if bad:
        raise ValueError(f"profile sizes must be 1..1000 milli-GPUs or whole GPUs, got {bad}")

    def allocate(milli: int) -> int | None:
        for s in sizes:
            if s >= milli:
                return s
        return None

    shown = ", ".join(f"{s / 1000:g}" for s in sizes)
    return Policy(name, allocate, f"rounded up to the nearest profile size ({shown} GPUs)")


def timeslice_policy(replicas: int) -> Policy:
    def allocate(milli: int) -> int | None:
        if milli >= FULL:
            return round_to_whole(milli)
        return timeslice_effective_milli(milli, replicas)[1]

    return Policy(
        f"timeslice-{replicas}",
        allocate,
        f"time-slicing, {replicas} replicas per GPU: shares rounded up to k/{replicas} GPU "
        f"(spawner.core.sharing.timeslice_effective_milli)",
    )


def mig_policy(model: str = MIG_MODEL) -> Policy:
    table = mig_table(model)
    if not table:
        raise ValueError(f"spawner.core.sharing knows no MIG profiles for {model!r}")

    def allocate(milli: int) -> int | None:
        if milli >= FULL:
            return round_to_whole(milli)
        return pick_mig_slice(table, milli)[1]

    names = ", ".join(s.name for s in table)
    return Policy(
        f"mig-{model.lower()}",
        allocate,
        f"HYPOTHETICAL: no GPU of the trace supports MIG; every GPU is treated as an {model} "
        f"with the MIG slices of spawner.core.sharing ({names}), each counted as the larger of its "
        f"compute and memory share (spawner.core.sharing.pick_mig_slice)",
    )


def mig_capable(models: Iterable[str]) -> list[str]:
    """The cluster's GPU models that spawner.core.sharing has a MIG table for."""
    return sorted(m for m in set(models) if mig_table(m))


def sizes_from_catalog(path: str) -> list[int]:
    """The distinct GPU sizes of a catalog file's offered (not retired) profiles."""
    catalog = catalog_from_yaml(Path(path).read_text(), path)
    return sorted({p.gpu_milli for p in catalog.profiles.values() if p.gpu_milli > 0 and not p.retired})


class ClusterSim:
    """One team's ledger plus the device packer, admitting trace tasks."""

    def __init__(
        self,
        devices: list[GPUDevice],
        policy: Policy,
        scoring: str = "bestfit",
        workload: dict[TaskClass, float] | None = None,
    ):
        self.policy = policy
        self.packer = DevicePacker(devices, scoring=scoring, workload=workload)
        #: Time spent in the packer's place() and how many calls.
        self.place_s = 0.0
        self.place_calls = 0
        self.total_milli = len(devices) * FULL
        self.ledger = Ledger([Team(name=TEAM, guarantee_milli=self.total_milli, burst_milli=self.total_milli)])
        self.outcomes = dict.fromkeys(OUTCOMES, 0)
        self.running = 0
        self.allocated = 0
        self.requested = 0
        self.peak_running = 0
        self.peak_allocated = 0
        self._held: dict[str, tuple[int, int]] = {}

    def attempt(self, key: str, task: TraceTask) -> str:
        """Admit (ledger) and place (packer) ``task`` now; the outcome, not counted."""
        request = task.request_milli
        alloc = self.policy.allocate(request)
        if alloc is None:
            return "not offered"
        if not self.ledger.reserve(key, TEAM, task.qos or "trace", alloc, kind="job").allowed:
            return "quota"
        t0 = time.perf_counter()
        placed = self.packer.place(key, alloc, task.models or None)
        self.place_s += time.perf_counter() - t0
        self.place_calls += 1
        if placed is None:
            self.ledger.release(key)
            return "no device fits"
        self.ledger.confirm(key)
        self._held[key] = (alloc, request)
        self.running += 1
        self.allocated += alloc
        self.requested += request
        self.peak_running = max(self.peak_running, self.running)
        self.peak_allocated = max(self.peak_allocated, self.allocated)
        return "placed"

    def submit(self, key: str, task: TraceTask) -> str:
        outcome = self.attempt(key, task)
        self.outcomes[outcome] += 1
        return outcome

    def finish(self, key: str) -> None:
        held = self._held.pop(key, None)
        if held is None:
            return
        self.packer.release(key)
        self.ledger.release(key)
        self.running -= 1
        self.allocated -= held[0]
        self.requested -= held[1]

    def checks(self) -> dict[str, bool]:
        """Invariants: the ledger and the packer agree, and nothing is over-allocated."""
        ledger_held = self.ledger.usage(TEAM).held_milli
        packer_used = self.total_milli - self.packer.free_milli()
        return {
            "ledger_equals_packer": ledger_held == packer_used == self.allocated,
            "within_burst": ledger_held <= self.total_milli,
            "devices_within_one_gpu": all(0 <= self.packer.used(i) <= FULL for i in self.packer.devices),
            "allocated_covers_request": self.allocated >= self.requested,
        }


def trace_order(tasks: list[TraceTask]) -> list[TraceTask]:
    """By creation time when the file has times, then by row (the file's order)."""
    return sorted(tasks, key=lambda t: (t.creation if t.creation is not None else 0, t.row))


def policy_workload(tasks: list[TraceTask], policy: Policy) -> dict[TaskClass, float]:
    """The trace's request classes as the packer sees them (after the policy's rounding)."""
    out: dict[TaskClass, float] = {}
    for t in tasks:
        alloc = policy.allocate(t.request_milli)
        if alloc:
            cls = TaskClass(alloc, t.models)
            out[cls] = out.get(cls, 0.0) + 1.0
    return out


def fill(
    tasks: list[TraceTask], devices: list[GPUDevice], policy: Policy, scoring: str = "bestfit", max_failures: int = 200
) -> dict[str, Any]:
    """The paper's measure: file order, no departures, until ``max_failures`` placements in a row fail.

    Tasks are submitted in the order of the file (cycling through it again
    if it runs out first); a task no offered size holds is skipped, not
    counted as a failed placement. FGD scores against the trace's own
    request classes, as the paper does.
    """
    sim = fill_sim(tasks, devices, policy, scoring, max_failures)
    return {
        "policy": policy.name,
        "scoring": scoring,
        "submitted": sum(sim.outcomes.values()),
        "served_workloads": sim.running,
        "outcomes": dict(sim.outcomes),
        "requested_gpus": sim.requested / FULL,
        "allocated_gpus": sim.allocated / FULL,
        "requested_share": sim.requested / sim.total_milli,
        "allocated_share": sim.allocated / sim.total_milli,
        "place_calls": sim.place_calls,
        "place_us_per_call": 1e6 * sim.place_s / sim.place_calls if sim.place_calls else 0.0,
        "checks": sim.checks(),
    }


def fill_sim(
    tasks: list[TraceTask], devices: list[GPUDevice], policy: Policy, scoring: str = "bestfit", max_failures: int = 200
) -> ClusterSim:
    """The cluster as :func:`fill` leaves it."""
    workload = policy_workload(tasks, policy) if scoring == "fgd" else None
    sim = ClusterSim(devices, policy, scoring, workload)
    order = sorted(tasks, key=lambda t: t.row)
    failures = submitted = 0
    while order and failures < max_failures and submitted < 50 * len(order):
        task = order[submitted % len(order)]
        outcome = sim.submit(f"{task.name}#{submitted // len(order)}", task)
        submitted += 1
        if outcome == "placed":
            failures = 0
        elif outcome != "not offered":
            failures += 1
    return sim


def find_cost(sim: ClusterSim, sizes: Sequence[int], repeat: int = 2000) -> dict[str, float]:
    """Microseconds per ``packer.find`` for each size, on the cluster as it is (nothing placed)."""
    out = {}
    for milli in sizes:
        t0 = time.perf_counter()
        for _ in range(repeat):
            sim.packer.find(milli)
        out[str(milli)] = 1e6 * (time.perf_counter() - t0) / repeat
    return out


def inflate(
    tasks: list[TraceTask],
    devices: list[GPUDevice],
    policy: Policy,
    load: float,
    checkpoints: Sequence[float],
    scoring: str = "bestfit",
) -> dict[str, Any]:
    """Submit tasks in trace order, no departures, until ``load`` x cluster GPUs were offered."""
    sim = ClusterSim(devices, policy, scoring, policy_workload(tasks, policy) if scoring == "fgd" else None)
    order = trace_order(tasks)
    target = load * sim.total_milli
    offered = 0
    first_refusal: dict[str, Any] | None = None
    marks = sorted(checkpoints)
    snapshots = []
    i = 0
    while offered < target and order:
        task = order[i % len(order)]
        outcome = sim.submit(f"{task.name}#{i // len(order)}", task)
        offered += task.request_milli
        i += 1
        if outcome != "placed" and first_refusal is None:
            first_refusal = {
                "offered_load": offered / sim.total_milli,
                "served_workloads": sim.running,
                "requested_share": sim.requested / sim.total_milli,
                "reason": outcome,
            }
        while marks and offered >= marks[0] * sim.total_milli:
            snapshots.append(
                {
                    "offered_load": marks.pop(0),
                    "served_workloads": sim.running,
                    "requested_share": sim.requested / sim.total_milli,
                    "allocated_share": sim.allocated / sim.total_milli,
                }
            )
    return {
        "policy": policy.name,
        "scoring": scoring,
        "submitted": i,
        "offered_load": offered / sim.total_milli,
        "served_workloads": sim.running,
        "refused": i - sim.outcomes["placed"],
        "outcomes": dict(sim.outcomes),
        "allocated_share": sim.allocated / sim.total_milli,
        "requested_share": sim.requested / sim.total_milli,
        "first_refusal": first_refusal,
        "checkpoints": snapshots,
        "place_us_per_call": 1e6 * sim.place_s / sim.place_calls if sim.place_calls else 0.0,
        "checks": sim.checks(),
    }


def task_intervals(tasks: list[TraceTask]) -> tuple[list[tuple[int, int, int]], int]:
    """``(index, start, stop)`` of every task with a positive duration, and how many had none.

    A task without a deletion time runs to the end of the trace.
    """
    end_of_trace = max((t.deletion or t.creation or 0) for t in tasks) if tasks else 0
    intervals: list[tuple[int, int, int]] = []
    zero_length = 0
    for n, t in enumerate(tasks):
        start = t.creation or 0
        stop = t.deletion if t.deletion is not None else end_of_trace
        if stop <= start:
            zero_length += 1
            continue
        intervals.append((n, start, stop))
    return intervals, zero_length


def policy_sizes(policy: Policy, largest_milli: int) -> tuple[int, ...] | None:
    """The catalog a policy amounts to (what it rounds up to), for the what-if engine; ``None``: exact."""
    if policy.name == "exact":
        return None
    asks = [*range(1, FULL + 1), *range(2 * FULL, max(largest_milli, FULL) + 1, FULL)]
    return tuple(sorted({a for a in map(policy.allocate, asks) if a is not None}))


def replay(tasks: list[TraceTask], devices: list[GPUDevice], policy: Policy) -> dict[str, Any]:
    """Replay creation/deletion times through the product's what-if engine (:mod:`spawner.core.whatif`).

    A task that does not fit on arrival is refused; one team, ``cluster``,
    whose guarantee and burst are the cluster's GPUs.
    """
    intervals, zero_length = task_intervals(tasks)
    sessions = [
        RecordedSession(
            key=f"{tasks[n].name}@{n}",
            team=TEAM,
            user=tasks[n].name,
            gpu_milli=tasks[n].request_milli,
            start=start,
            end=stop,
            models=tasks[n].models,
        )
        for n, start, stop in intervals
    ]
    total = len(devices) * FULL
    largest = max((t.request_milli for t in tasks), default=FULL)
    proposal = Proposal(
        sizes=policy_sizes(policy, largest), teams={TEAM: Team(name=TEAM, guarantee_milli=total, burst_milli=total)}
    )
    r = replay_sessions(sessions, proposal, devices)
    first = min((s.start for s in sessions), default=0)
    last = max((s.end for s in sessions), default=0)
    span_gpu_s = max(1, last - first) * total / FULL
    outcomes = {"placed": r.served, **r.refused}
    return {
        "policy": policy.name,
        "engine": "spawner.core.whatif.replay",
        "arrived": r.sessions,
        "zero_length_skipped": zero_length,
        "served_workloads": r.served,
        "refused": r.sessions - r.served,
        "outcomes": outcomes,
        "peak_concurrent_workloads": r.peak_sessions,
        "peak_allocated_share": r.peak_held_milli / total,
        "time_avg_allocated_share": r.served_gpu_hours * 3600 / span_gpu_s,
        "time_avg_requested_share": r.served_requested_gpu_hours * 3600 / span_gpu_s,
        "served_gpu_hours": r.served_gpu_hours,
        "refused_gpu_hours": sum(r.refused_gpu_hours.values()),
        "window_s": [first, last],
        "checks": dict(r.checks),
    }


def replay_queued(tasks: list[TraceTask], devices: list[GPUDevice], policy: Policy) -> dict[str, Any]:
    """Replay arrivals; a task that does not fit waits in a queue and keeps its duration.

    The queue is best-effort FIFO (as Kueue's ``BestEffortFIFO``): whenever
    GPUs are freed, queued tasks start in arrival order, and a task that does
    not fit lets later, different-sized ones pass. Tasks of the same size and
    model constraint stay in order (if the first does not fit, none does).
    A task that could not fit even on the empty cluster is refused.
    """
    sim = ClusterSim(devices, policy)
    empty = DevicePacker(devices)
    intervals, zero_length = task_intervals(tasks)
    heap: list[tuple[int, int, int]] = []
    duration: dict[int, int] = {}
    for n, start, stop in intervals:
        duration[n] = stop - start
        heap.append((start, 1, n))
    heapq.heapify(heap)
    queues: dict[tuple[int, frozenset[str]], deque[tuple[int, int]]] = {}
    ever_fits: dict[tuple[int, frozenset[str]], bool] = {}
    waits: list[int] = []
    waited_sizes: list[int] = []
    refused = queued = max_queue = in_queue = 0
    first = heap[0][0] if heap else 0
    now = first
    alloc_integral = req_integral = 0

    def start(n: int, at: int) -> bool:
        if sim.attempt(f"{tasks[n].name}@{n}", tasks[n]) != "placed":
            return False
        heapq.heappush(heap, (at + duration[n], 0, n))
        return True

    def drain(at: int) -> None:
        nonlocal in_queue
        blocked: set[tuple[int, frozenset[str]]] = set()
        while True:
            heads = [(q[0][0], cls) for cls, q in queues.items() if q and cls not in blocked]
            if not heads:
                return
            _, cls = min(heads)
            arrived_at, n = queues[cls][0]
            if start(n, at):
                queues[cls].popleft()
                in_queue -= 1
                waits.append(at - arrived_at)
                if at > arrived_at:
                    waited_sizes.append(tasks[n].request_milli)
            else:
                blocked.add(cls)

    while heap:
        at, kind, n = heapq.heappop(heap)
        alloc_integral += sim.allocated * (at - now)
        req_integral += sim.requested * (at - now)
        now = at
        if kind == 0:
            sim.finish(f"{tasks[n].name}@{n}")
            if in_queue:
                drain(at)
            continue
        task = tasks[n]
        alloc = policy.allocate(task.request_milli)
        if alloc is None:
            refused += 1
            continue
        cls = (alloc, task.models)
        if cls not in ever_fits:
            ever_fits[cls] = alloc <= sim.total_milli and empty.find(alloc, task.models or None) is not None
        if not ever_fits[cls]:
            refused += 1
            continue
        q = queues.setdefault(cls, deque())
        if not q and start(n, at):
            waits.append(0)
            continue
        q.append((at, n))
        queued += 1
        in_queue += 1
        max_queue = max(max_queue, in_queue)
    span = max(1, now - first)
    checks = sim.checks()
    checks["all_released_at_end"] = sim.running == 0 and sim.ledger.usage(TEAM).held_milli == 0
    checks["queue_drained"] = in_queue == 0
    waited = sorted(w for w in waits if w > 0)
    waits.sort()
    return {
        "policy": policy.name,
        "arrived": len(duration),
        "zero_length_skipped": zero_length,
        "served_workloads": len(waits),
        "refused": refused,
        "queued": queued,
        "max_queue_length": max_queue,
        "waited": len(waited),
        "waited_by_size_milli": _count_sizes(waited_sizes),
        "mean_wait_s": sum(waits) / len(waits) if waits else 0.0,
        "p99_wait_s": percentile(waits, 99) if waits else 0.0,
        "waited_p50_s": percentile(waited, 50) if waited else 0.0,
        "waited_max_s": waited[-1] if waited else 0,
        "peak_concurrent_workloads": sim.peak_running,
        "time_avg_allocated_share": alloc_integral / (span * sim.total_milli),
        "time_avg_requested_share": req_integral / (span * sim.total_milli),
        "window_s": [first, now],
        "checks": checks,
    }


def _count_sizes(sizes: Iterable[int]) -> dict[str, int]:
    """``{"<=1 GPU": n, "2 GPUs": n, ...}`` for a list of requests."""
    out: dict[str, int] = {}
    for m in sorted(sizes):
        key = "<=1 GPU" if m <= FULL else f"{m // FULL} GPUs"
        out[key] = out.get(key, 0) + 1
    return out


def peak_demand(tasks: list[TraceTask], allocate: Callable[[int], int | None]) -> int:
    """Peak concurrent demand (milli, after ``allocate``) with unlimited GPUs."""
    end = max((t.deletion or t.creation or 0) for t in tasks) if tasks else 0
    events = []
    for t in tasks:
        start, stop = t.creation or 0, t.deletion if t.deletion is not None else end
        if stop > start:
            m = allocate(t.request_milli) or 0
            events += [(start, 1, m), (stop, 0, -m)]
    events.sort()
    cur = peak = 0
    for _, _, m in events:
        cur += m
        peak = max(peak, cur)
    return peak


def cluster_summary(devices: list[GPUDevice]) -> dict[str, Any]:
    models: dict[str, int] = {}
    for d in devices:
        models[d.model] = models.get(d.model, 0) + 1
    return {"gpus": len(devices), "nodes": len({d.node for d in devices}), "models": models}
