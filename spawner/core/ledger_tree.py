"""The ledger's checks above one team: a department's bounds, weighted borrowing, reclaim.

:class:`~spawner.core.ledger.Ledger` keeps the totals (per team, per department) and
asks this module, under its lock, whether a request fits the tree above its team:

* **Department bounds** (:func:`department_full`): what a department's teams hold
  together stays within its burst, in all and in each pool it lists.
* **Weighted borrowing** (:func:`fair_share_refusal`): when teams of one department
  compete for its idle capacity, a team may borrow up to its weighted fair share while
  another team with *demand* is below its own. Definitions, precisely:

  - a team **borrows** what it holds above its guarantee;
  - the department's **borrowable capacity** is its burst less what its teams hold
    within their guarantees (a team's unused guarantee is lent, and reclaim takes it
    back);
  - a team's **demand** is what it would borrow if everything it asked for ran: what it
    holds, plus its *waiting* work (the spawn queue's waiting entries, milli-GPUs per
    team, :meth:`Ledger.set_waiting`), plus the request itself for the team asking,
    above its guarantee and within its burst;
  - a team's **fair share** is the water-filling split of the borrowable capacity by
    ``fair_share_weight`` over the demands (:func:`~spawner.core.quota_tree.fair_shares`);
  - a borrowing request is refused when it would take its team past its fair share
    while another team of the department *waits* with a request that would fit the
    department's idle capacity now and that comes first: the order is Kueue's for fair
    sharing, the lowest weighted share after admission first
    (kueue.sigs.k8s.io/docs/concepts/fair_sharing), ties by team name, so exactly one
    of the competing teams is admitted and no idle capacity is held for nobody. A team
    within its fair share is never refused for weights, and with nobody waiting idle
    capacity goes first-come as before.

* **Reclaim** (:func:`reclaim_for`): the borrowed, preemptible work that taking back
  would make room for a refused request, from the team furthest over its weighted
  share first (:func:`~spawner.core.quota_tree.reclaim_choice`).

Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

from .model import Team
from .quota_tree import (
    ANY_POOL,
    Borrower,
    Department,
    Reclaimable,
    borrowed,
    fair_shares,
    pool_quota,
    reclaim_choice,
    weighted_share,
)
from .units import format_gpus


class DepartmentTotals:
    """What a department's teams hold together, in all and (when it has pool quotas) per pool."""

    __slots__ = ("held", "per_pool", "by_pool", "burst", "teams", "waiting", "waiting_milli")

    def __init__(self, burst: int, by_pool: bool) -> None:
        self.held = 0
        self.per_pool: dict[str, int] = {}
        #: The department's burst limit and whether it has pool quotas (read by every admission).
        self.burst = burst
        self.by_pool = by_pool
        #: Its teams' names, and those of them with waiting work (weighted borrowing).
        self.teams: list[str] = []
        self.waiting: list[str] = []
        #: What those teams have waiting, in all.
        self.waiting_milli = 0

    def add(self, milli: int, pool: str, sign: int) -> None:
        self.held += sign * milli
        if self.by_pool and pool:
            in_pool = self.per_pool.get(pool, 0) + sign * milli
            if in_pool:
                self.per_pool[pool] = in_pool
            else:
                self.per_pool.pop(pool, None)


def covers(dt: DepartmentTotals, team: Team, milli: int) -> bool:
    """Does the department's idle capacity cover ``milli`` (a request within ``team``'s burst,
    as the ledger checks first) and all its teams' waiting work (``team`` of a weight above
    0)? Then every demand fits what the department can lend, the
    fair share of each team of a weight above 0 is its whole demand, and weighted borrowing
    refuses ``team`` nothing (:func:`fair_share_refusal` need not run: O(1))."""
    return team.fair_share_weight > 0 and dt.burst - dt.held >= milli + dt.waiting_milli


def department_full(
    dept: Department, dt: DepartmentTotals | None, pool: str, milli: int
) -> tuple[str, int, int] | None:
    """``(where, held, burst)`` when ``milli`` more would take ``dept`` past a burst limit."""
    held = dt.held if dt is not None else 0
    if held + milli > dept.burst_milli:
        return "", held, dept.burst_milli
    dq = pool_quota(dept.pools, pool) if dept.pools else None
    if dq is not None:
        in_pool = dt.per_pool.get(pool, 0) if dt is not None else 0
        if in_pool + milli > dq.burst_milli:
            return f" in pool {pool}", in_pool, dq.burst_milli
    return None


def department_refusal(dept: str, where: str, held: int, burst: int, asks: str, reclaim: Sequence[str]) -> str:
    """ "department research holds 8 of its 8 GPU burst limit; this request needs 1 (reclaim would ...)"."""
    said = f"department {dept} holds {format_gpus(held)} of its {format_gpus(burst)} GPU burst limit{where}; {asks}"
    if reclaim:
        said += (
            f" (reclaim would take back {len(reclaim)} borrowed, preemptible workload"
            f"{'s' if len(reclaim) > 1 else ''} of the team furthest over its weighted share first)"
        )
    return said


@dataclass(frozen=True)
class TeamState:
    """One team of a department as weighted borrowing sees it, in milli-GPUs."""

    name: str
    held: int
    guarantee: int
    burst: int
    weight: float
    #: Waiting work (the spawn queue's waiting entries), in all.
    waiting: int = 0
    #: Its first waiting request in queue order (``0``: none).
    next: int = 0

    @classmethod
    def of(cls, team: Team, held: int, waiting: Mapping[str, int], first: Mapping[str, int]) -> TeamState:
        """``team`` holding ``held``, with its waiting work from the ledger's totals and first requests."""
        name = team.name
        return cls(
            name,
            held,
            team.guarantee_milli,
            team.burst_milli,
            team.fair_share_weight,
            waiting.get(name, 0),
            first.get(name, 0),
        )

    @property
    def borrowed(self) -> int:
        return borrowed(self.held, self.guarantee)

    def demand(self, extra: int = 0) -> int:
        """What it would borrow if its waiting work (and ``extra``) ran, within its burst."""
        return min(borrowed(self.held + self.waiting + extra, self.guarantee), max(0, self.burst - self.guarantee))


def department_fair_shares(
    members: Sequence[TeamState], burst_milli: int, requester: str = "", milli: int = 0
) -> dict[str, int]:
    """Each team's fair share of its department's borrowable capacity (module docstring),
    with ``requester``'s demand including a request of ``milli``."""
    borrowable = max(0, burst_milli - sum(min(m.held, m.guarantee) for m in members))
    demands = {}
    for m in members:
        # The request may be one of its own waiting entries (the queue asking whether it fits).
        extra = max(0, milli - m.waiting) if m.name == requester else 0
        demands[m.name] = m.demand(extra)
    return fair_shares(borrowable, demands, {m.name: m.weight for m in members})


def _share_after(m: TeamState, milli: int) -> tuple[float, str]:
    """Kueue's fair-sharing order: the weighted share once ``milli`` more runs, then the name."""
    return weighted_share(borrowed(m.held + milli, m.guarantee), m.weight), m.name


def fair_share_refusal(
    dept_name: str,
    burst_milli: int,
    held_milli: int,
    me: TeamState,
    waiting: Sequence[TeamState],
    members: Callable[[], Sequence[TeamState]],
    milli: int,
) -> str:
    """Why a borrowing request of ``milli`` by ``me`` waits for another team, in words; ``""``
    when it may borrow (the module docstring has the rule). ``held_milli``: what the
    department's teams hold together now; ``waiting``: the other teams with waiting work;
    ``members()``: every team of the department (asked only when one of ``waiting`` comes first)."""
    idle = burst_milli - held_milli
    mine = _share_after(me, milli)
    ahead = [
        m
        for m in waiting
        if m.name != me.name and 0 < m.next <= idle and m.held + m.next <= m.burst and _share_after(m, m.next) < mine
    ]
    if not ahead:
        return ""
    everyone = members()
    requester = me.name
    shares = department_fair_shares(everyone, burst_milli, requester, milli)
    after = borrowed(me.held + milli, me.guarantee)
    if after <= shares.get(requester, 0):
        return ""
    other = min(ahead, key=lambda m: _share_after(m, m.next))
    total_weight = sum(m.weight for m in everyone if m.name == requester or m.demand() > 0)
    return (
        f"team {requester} would borrow {format_gpus(after)} GPUs, past its fair share of "
        f"{format_gpus(shares.get(requester, 0))} GPUs of department {dept_name}'s idle capacity "
        f"(weight {me.weight:g} of {total_weight:g}), while team {other.name} waits with "
        f"{format_gpus(other.borrowed)} of its fair share of {format_gpus(shares.get(other.name, 0))} GPUs"
    )


def reclaim_for(
    team: Team,
    dept: Department,
    pool: str,
    need: int,
    over: bool,
    milli: int,
    teams: Iterable[Team],
    held: Mapping[str, int],
    preemptible: Iterable[tuple[str, str, int, str]],
) -> tuple[str, ...]:
    """The preemption choice that would make room in ``dept`` (and ``pool``, if named) for a
    request of ``milli`` by ``team``. ``held``: what each team holds; ``preemptible``:
    ``(key, team, milli, pool)`` of every over-quota workload."""
    members = {t.name: t for t in teams if t.department == dept.name}
    borrowers = [
        Borrower(t.name, borrowed(held.get(t.name, 0), t.guarantee_milli), t.fair_share_weight)
        for t in members.values()
    ]
    candidates = [
        Reclaimable(key, owner, m)
        for key, owner, m, in_pool in preemptible
        if owner != team.name and owner in members and (pool == ANY_POOL or in_pool == pool)
    ]
    share_after = None
    if over:  # a borrowing request: only teams further over their share than it would be give way
        share_after = weighted_share(
            borrowed(held.get(team.name, 0) + milli, team.guarantee_milli), team.fair_share_weight
        )
    return reclaim_choice(need, borrowers, candidates, requester=team.name, requester_share_after=share_after)


__all__ = [
    "DepartmentTotals",
    "TeamState",
    "covers",
    "department_fair_shares",
    "department_full",
    "department_refusal",
    "fair_share_refusal",
    "reclaim_for",
]
