"""GPU pools, departments and fair-share weights: the shape of quota above one number.

A team's ``guarantee`` and ``burst`` count GPUs of *any* pool. A **pool** is a set of
GPUs an admin gives a quota of its own: one GPU model under one sharing backend
(``gpu_model: H100-80GB, sharing: whole``), or an admin-named node pool that profiles
join by name (``pool: inference``). A team may add a quota per pool; a workload in
that pool then counts against both the pool's quota and the team's total, and a
workload in a pool the team lists nothing for counts against the total only (so a
catalog without pools means what it meant before).

A **department** is an optional level above teams with its own guarantee and burst
(again optionally per pool): everything its teams hold together stays within its
burst, and it guarantees at least the sum of its teams' guarantees (checked when the
catalog is read), so a team's in-quota work is only ever held back by its own
department's teams borrowing -- preemptible work that reclaim takes back.

Between teams that borrow (hold more than their guarantee), idle capacity is shared
by ``fair_share_weight``: a team's **weighted share** is what it borrows divided by its
weight, and reclaim takes back from the team furthest over its weighted share first
(Kueue's fair sharing, kueue.sigs.k8s.io/docs/concepts/fair_sharing: "preempt
workloads from the ClusterQueues with the highest share value"; KAI's
``overQuotaWeight`` divides over-quota resources between queues the same way).

Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

#: No pool: the work counts against totals only (a profile no pool claims, or none named).
ANY_POOL = ""


@dataclass(frozen=True)
class PoolQuota:
    """A guarantee and burst limit in one pool, in milli-GPUs."""

    pool: str
    guarantee_milli: int
    burst_milli: int


@dataclass(frozen=True)
class GpuPool:
    """GPUs with a quota of their own: one model under one backend, or an admin-named node pool."""

    name: str
    display_name: str = ""
    #: The GPU model of the pool (``H100-80GB``); ``None``: an admin-named node pool
    #: that profiles join by naming it (a profile's ``pool``).
    gpu_model: str | None = None
    #: The sharing backend of the pool; ``None``: any backend of the model.
    sharing: str | None = None
    #: Node labels of the pool's nodes (Kubernetes: the pool's Kueue ResourceFlavor
    #: puts them on the pods it admits).
    node_labels: tuple[tuple[str, str], ...] = ()

    @property
    def label(self) -> str:
        return self.display_name or self.gpu_model or self.name

    def matches(self, gpu_model: str | None, backend: str) -> bool:
        """Does a profile of ``gpu_model`` under ``backend`` belong here by model?"""
        return (
            self.gpu_model is not None
            and gpu_model == self.gpu_model
            and (self.sharing is None or self.sharing == backend)
        )


@dataclass(frozen=True)
class Department:
    """A level above teams: a guarantee and a burst over what all its teams hold."""

    name: str
    display_name: str = ""
    guarantee_milli: int = 0
    burst_milli: int = 0
    pools: tuple[PoolQuota, ...] = ()

    @property
    def label(self) -> str:
        return self.display_name or self.name


def pool_quota(pools: Iterable[PoolQuota], pool: str) -> PoolQuota | None:
    """The quota ``pools`` give ``pool`` (``None``: only the total applies)."""
    if pool != ANY_POOL:
        for q in pools:  # a handful at most: a loop is cheaper than an index per team
            if q.pool == pool:
                return q
    return None


def pool_of(pools: Mapping[str, GpuPool], explicit: str | None, gpu_model: str | None, backend: str) -> str:
    """The pool a profile's GPUs come from: the one it names, else the first that matches its
    model and backend, else :data:`ANY_POOL` (counted against totals only)."""
    if explicit:
        return explicit
    return next((p.name for p in pools.values() if p.matches(gpu_model, backend)), ANY_POOL)


def borrowed(held_milli: int, guarantee_milli: int) -> int:
    """What a holder holds above its guarantee."""
    return max(0, held_milli - guarantee_milli)


def weighted_share(borrowed_milli: int, weight: float) -> float:
    """Borrowed milli-GPUs per unit of weight; a weight of 0 borrows only what nobody else wants."""
    if weight <= 0:
        return float("inf") if borrowed_milli > 0 else 0.0
    return borrowed_milli / weight


def fair_shares(borrowable_milli: int, demands: Mapping[str, int], weights: Mapping[str, float]) -> dict[str, int]:
    """Idle capacity split between borrowers by weight (water-filling, whole milli-GPUs).

    Each borrower gets at most what it asks for (``demands``); what one does not take goes
    to the others in proportion to their weights. Sums to ``min(borrowable, Σ demands)``.
    """
    left = max(0, borrowable_milli)
    out = {name: 0 for name in demands}
    open_ = {n for n, d in demands.items() if d > 0 and weights.get(n, 1.0) > 0}
    while left > 0 and open_:
        total_weight = sum(weights.get(n, 1.0) for n in open_)
        round_out = 0
        for name in sorted(open_):
            want = demands[name] - out[name]
            give = min(want, int(left * weights.get(name, 1.0) / total_weight))
            out[name] += give
            round_out += give
        if round_out == 0:  # remainders smaller than one milli-GPU per borrower: by weight, then name
            for name in sorted(open_, key=lambda n: (-weights.get(n, 1.0), n)):
                if left - round_out <= 0:
                    break
                if out[name] < demands[name]:
                    out[name] += 1
                    round_out += 1
        left -= round_out
        open_ = {n for n in open_ if out[n] < demands[n]}
    return out


@dataclass(frozen=True)
class NodeUsage:
    """One node of the quota tree (a department, a team, or either's share of one pool) now."""

    name: str
    guarantee_milli: int
    burst_milli: int
    held_milli: int

    @property
    def borrowed_milli(self) -> int:
        """Held above the guarantee (preemptible)."""
        return borrowed(self.held_milli, self.guarantee_milli)

    @property
    def free_milli(self) -> int:
        return max(0, self.burst_milli - self.held_milli)


@dataclass(frozen=True)
class Borrower:
    """A team as reclaim sees it: what it borrows and its weight."""

    team: str
    borrowed_milli: int
    weight: float


@dataclass(frozen=True)
class Reclaimable:
    """Preemptible work reclaim may take back: its key, team and size."""

    key: str
    team: str
    milli: int


def reclaim_choice(
    need_milli: int,
    borrowers: Sequence[Borrower],
    candidates: Iterable[Reclaimable],
    *,
    requester: str = "",
    requester_share_after: float | None = None,
) -> tuple[str, ...]:
    """Which preemptible work to take back to free ``need_milli``, or ``()`` when it cannot.

    One workload at a time from the team whose weighted share is then the highest (its
    largest workload first), until enough is free. ``requester_share_after`` (a borrowing
    request: the requester's weighted share once admitted) protects teams at or below it,
    as Kueue's fair-sharing preemption does ("LessThanOrEqualToFinalShare"); an in-quota
    request (``None``) may take back any borrowed work. Never takes the requester's own work.
    """
    if need_milli <= 0:
        return ()
    state = {b.team: [b.borrowed_milli, b.weight] for b in borrowers if b.team != requester}
    pool: dict[str, list[Reclaimable]] = {}
    for c in candidates:
        if c.team in state and c.milli > 0:
            pool.setdefault(c.team, []).append(c)
    for items in pool.values():
        items.sort(key=lambda c: (-c.milli, c.key))
    chosen: list[str] = []
    freed = 0

    def share(team: str) -> float:
        return weighted_share(int(state[team][0]), state[team][1])

    while freed < need_milli:
        eligible = [t for t in pool if pool[t] and state[t][0] > 0]
        if requester_share_after is not None:
            eligible = [t for t in eligible if share(t) > requester_share_after]
        if not eligible:
            return ()
        team = max(eligible, key=lambda t: (share(t), t))
        w = pool[team].pop(0)
        state[team][0] -= w.milli
        chosen.append(w.key)
        freed += w.milli
    return tuple(chosen)


__all__ = [
    "ANY_POOL",
    "Borrower",
    "Department",
    "GpuPool",
    "NodeUsage",
    "PoolQuota",
    "Reclaimable",
    "borrowed",
    "fair_shares",
    "pool_of",
    "pool_quota",
    "reclaim_choice",
    "weighted_share",
]
