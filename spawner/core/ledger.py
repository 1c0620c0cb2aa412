"""The quota ledger: what each team and user holds, in integer milli-GPUs.

Every admission -- a notebook spawn, a job -- goes through :meth:`Ledger.reserve`,
which checks and records in one step under a lock, so concurrent admissions
can never both take the last GPU. Reservations (spawns still starting) count
exactly like running work. The ledger can be rebuilt at any time from the
workloads that actually run (pods with labels, processes with saved state):
the cluster is the source of truth, the ledger is a cache of it.

Costs are O(1) per admission: per-team, per-user, per-pool and per-department
totals are kept incrementally rather than summed over workloads.

GPU pools and departments (:mod:`spawner.core.quota_tree`, checked by
:mod:`spawner.core.ledger_tree`): a workload's pool comes from its profile
(``profile_pools``); it counts against the team's quota in that pool, if the team has
one, as well as the team's totals, and against the team's department's burst. Borrowing
within a department is weighted: while another team of the department waits (the spawn
queue's waiting entries, :meth:`Ledger.set_waiting`) below its fair share, a team may
borrow only up to its own. A refusal for a full department carries the reclaim choice
(``Decision.reclaim``): the borrowed, preemptible work that taking back would make
room, from the team furthest over its weighted share first. The ledger only names it;
the caller takes it back (the single server's jobs: :mod:`hub_config.jobs.reclaim`).

A multi-node job is a gang: ``members`` nodes of the same GPUs each. It is one
workload holding the GPUs of all its members, reserved in the same single step
as any other, so it is admitted whole or not at all -- never a part of it that
would hold GPUs while waiting for the rest -- and a refusal says what the whole
gang needs ("needs 16 GPUs in one go; team vision has 10 free of its guarantee").
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace

from .ledger_tree import (
    DepartmentTotals,
    TeamState,
    covers,
    department_full,
    department_refusal,
    fair_share_refusal,
    reclaim_for,
)
from .model import Team
from .quota_tree import ANY_POOL, Department, NodeUsage, pool_quota
from .units import format_gpus

RESERVED = "reserved"
RUNNING = "running"

#: ``callback(event, workload)``: ``("add", w)`` when ``w`` is recorded or its
#: record changes (reserve, confirm, adopt, rebuild), ``("remove", w)`` when it
#: is freed. Called after the change, outside the ledger lock.
LedgerObserver = Callable[[str, "Workload"], None]


def gang_need(milli: int, members: int) -> str:
    """``"this job of 2 × 8 GPUs needs 16 GPUs in one go"``: what a whole gang asks for."""
    return f"this job of {members} × {format_gpus(milli // members)} GPUs needs {format_gpus(milli)} GPUs in one go"


def notebook_key(username: str, server_name: str) -> str:
    """Ledger key of a notebook server (one per user and named server), on either platform."""
    return f"notebook:{username}/{server_name}"


@dataclass(frozen=True)
class Workload:
    """One GPU holder: a notebook server or a job."""

    #: Unique key, e.g. ``notebook:alice/`` or ``job:17``.
    key: str
    team: str
    user: str
    milli: int
    profile: str = ""
    #: ``notebook`` or ``job``.
    kind: str = "notebook"
    #: Decided at admission: runs above the team guarantee, so preemptible.
    over_quota: bool = False
    state: str = RUNNING
    #: Members of a gang (a multi-node job's nodes), each holding ``milli // members``;
    #: ``milli`` is always the whole gang's.
    members: int = 1
    #: The GPU pool its GPUs come from (``""``: none named; counted in totals only).
    pool: str = ANY_POOL


@dataclass(frozen=True)
class Decision:
    """The answer to an admission request."""

    allowed: bool
    #: Empty when allowed; otherwise the exact human-readable reason.
    reason: str
    team: str
    user: str
    milli: int
    #: The work would run above the team's guarantee (and is preemptible); in a refusal for a
    #: full department, whether it would have (``False``: in-quota work that reclaim may make room for).
    over_quota: bool = False
    #: Members of the gang asked for (1: not a gang); ``milli`` is the whole gang's.
    members: int = 1
    #: The GPU pool asked for.
    pool: str = ANY_POOL
    #: Refused because the department is full of borrowed work: the preemptible workloads
    #: reclaim would take back to make room (from the team furthest over its weighted share
    #: first); empty when nothing may be taken back for this request.
    reclaim: tuple[str, ...] = ()

    @property
    def quota_label(self) -> str:
        return "over-quota" if self.over_quota else "in-quota"


@dataclass(frozen=True)
class TeamUsage:
    team: str
    guarantee_milli: int
    burst_milli: int
    #: Everything held, reservations included.
    held_milli: int
    in_quota_milli: int
    over_quota_milli: int
    reserved_milli: int
    workloads: int

    @property
    def free_milli(self) -> int:
        """Headroom up to the burst limit."""
        return max(0, self.burst_milli - self.held_milli)


class _Totals:
    __slots__ = ("held", "in_quota", "over_quota", "reserved", "count", "per_user", "per_pool")

    def __init__(self) -> None:
        self.held = 0
        self.in_quota = 0
        self.over_quota = 0
        self.reserved = 0
        self.count = 0
        self.per_user: dict[str, int] = {}
        self.per_pool: dict[str, int] = {}

    def add(self, w: Workload, sign: int) -> None:
        m = sign * w.milli
        self.held += m
        if w.over_quota:
            self.over_quota += m
        else:
            self.in_quota += m
        if w.state == RESERVED:
            self.reserved += m
        self.count += sign
        held = self.per_user.get(w.user, 0) + m
        if held:
            self.per_user[w.user] = held
        else:
            self.per_user.pop(w.user, None)
        if w.pool:
            in_pool = self.per_pool.get(w.pool, 0) + m
            if in_pool:
                self.per_pool[w.pool] = in_pool
            else:
                self.per_pool.pop(w.pool, None)


class Ledger:
    """Thread-safe quota ledger over a set of teams."""

    def __init__(
        self,
        teams: Mapping[str, Team] | Iterable[Team] = (),
        departments: Mapping[str, Department] | Iterable[Department] = (),
        profile_pools: Mapping[str, str] | None = None,
    ):
        self._lock = threading.RLock()
        self._teams: dict[str, Team] = {}
        self._departments: dict[str, Department] = {}
        #: Profile slug -> the pool of its GPUs (the catalog's :meth:`Catalog.profile_pools`).
        self._profile_pools: dict[str, str] = {}
        self._workloads: dict[str, Workload] = {}
        self._totals: dict[str, _Totals] = {}
        #: Per department: what its teams hold together (kept with the teams' totals), and
        #: the same object by each of its teams' names (one lookup per change).
        self._dept_totals: dict[str, DepartmentTotals] = {}
        self._team_dept: dict[str, DepartmentTotals] = {}
        self._observers: list[LedgerObserver] = []
        #: Team -> milli-GPUs of its waiting work (the spawn queue): the demand weighted borrowing reads.
        self._waiting: dict[str, int] = {}
        #: Team -> its first waiting request (what it would start next).
        self._waiting_next: dict[str, int] = {}
        self.set_teams(teams, departments, profile_pools)

    # -- observers ----------------------------------------------------------

    def subscribe(self, callback: LedgerObserver) -> None:
        """Call ``callback(event, workload)`` after every change (usage history)."""
        self._observers.append(callback)

    def _notify(self, events: list[tuple[str, Workload]]) -> None:
        for event, w in events:
            for callback in list(self._observers):
                try:
                    callback(event, w)
                except Exception:  # an observer's failure never undoes an admission
                    logging.getLogger("gpulab.ledger").exception(
                        "ledger observer %r failed on %s %s", callback, event, w.key
                    )

    # -- configuration ----------------------------------------------------

    def set_teams(
        self,
        teams: Mapping[str, Team] | Iterable[Team],
        departments: Mapping[str, Department] | Iterable[Department] | None = None,
        profile_pools: Mapping[str, str] | None = None,
    ) -> None:
        """Replace the team definitions (admin edits), and the departments and profiles'
        pools when given; holdings are kept (a workload keeps the pool it was admitted in)."""
        items = teams.values() if isinstance(teams, Mapping) else teams
        with self._lock:
            self._teams = {t.name: t for t in items}
            if departments is not None:
                deps = departments.values() if isinstance(departments, Mapping) else departments
                self._departments = {d.name: d for d in deps}
            if profile_pools is not None:
                self._profile_pools = dict(profile_pools)
            self._reset_departments()
            for w in self._workloads.values():  # a team may have moved department
                dt = self._team_dept.get(w.team)
                if dt is not None:
                    dt.add(w.milli, w.pool, +1)

    def _reset_departments(self) -> None:
        """Empty department totals, and which team adds to which."""
        self._dept_totals = {
            name: DepartmentTotals(d.burst_milli, bool(d.pools)) for name, d in self._departments.items()
        }
        self._team_dept = {
            t.name: self._dept_totals[t.department] for t in self._teams.values() if t.department in self._dept_totals
        }
        for name, dt in self._team_dept.items():
            dt.teams.append(name)
        self._note_waiting()

    def set_waiting(self, requests: Iterable[tuple[str, int]]) -> None:
        """Replace what waits: ``(team, milli)`` of each waiting request (the spawn queue's
        waiting entries), in queue order. A team with waiting work may keep another team of
        its department from borrowing past its fair share (:mod:`spawner.core.ledger_tree`)."""
        total: dict[str, int] = {}
        first: dict[str, int] = {}
        for team, milli in requests:
            if milli > 0:
                total[team] = total.get(team, 0) + milli
                first.setdefault(team, milli)
        with self._lock:
            self._waiting = total
            self._waiting_next = first
            self._note_waiting()

    def _note_waiting(self) -> None:
        """Each department's teams with waiting work (read by every borrowing admission)."""
        for dt in self._dept_totals.values():
            dt.waiting = [name for name in dt.teams if name in self._waiting]
            dt.waiting_milli = sum(self._waiting[name] for name in dt.waiting)

    def waiting(self) -> dict[str, int]:
        """Milli-GPUs waiting per team, as last set (:meth:`set_waiting`)."""
        with self._lock:
            return dict(self._waiting)

    def department(self, name: str) -> Department | None:
        return self._departments.get(name)

    def pool_for(self, profile: str) -> str:
        """The pool a profile's GPUs come from (``""``: none)."""
        return self._profile_pools.get(profile, ANY_POOL)

    def team(self, name: str) -> Team | None:
        return self._teams.get(name)

    # -- decisions --------------------------------------------------------

    def _decide(
        self,
        team_name: str,
        user: str,
        milli: int,
        may_burst: bool,
        members: int = 1,
        pool: str = ANY_POOL,
        reclaim_kinds: frozenset[str] | None = None,
    ) -> Decision:
        def refuse(reason: str, reclaim: tuple[str, ...] = (), over: bool = False) -> Decision:
            return Decision(False, reason, team_name, user, milli, over, members, pool, reclaim)

        if isinstance(milli, bool) or not isinstance(milli, int) or milli < 0:
            return refuse(f"invalid GPU request {milli!r}: must be a whole number of milli-GPUs, at least 0")
        if isinstance(members, bool) or not isinstance(members, int) or members < 1:
            return refuse(f"invalid gang size {members!r}: must be a whole number of members, at least 1")
        if milli % members:
            return refuse(f"a gang's {format_gpus(milli)} GPUs do not split evenly across its {members} members")
        team = self._teams.get(team_name)
        if team is None:
            return refuse(f"unknown team {team_name!r}")
        if milli == 0:
            return Decision(True, "", team_name, user, 0, False, members, pool)
        totals = self._totals.get(team_name) or _Totals()
        held = totals.held
        if held + milli > team.burst_milli:
            if members > 1:
                return refuse(
                    f"{gang_need(milli, members)}; team {team.name} has {format_gpus(max(0, team.burst_milli - held))} "
                    f"free of its {format_gpus(team.burst_milli)} GPU burst limit"
                )
            return refuse(
                f"team {team.name} holds {format_gpus(held)} of its {format_gpus(team.burst_milli)} "
                f"GPU burst limit; this request needs {format_gpus(milli)}"
            )
        if team.per_user_cap_milli is not None:
            mine = totals.per_user.get(user, 0)
            if mine + milli > team.per_user_cap_milli:
                if members > 1:
                    return refuse(
                        f"{gang_need(milli, members)}; {user} may take "
                        f"{format_gpus(max(0, team.per_user_cap_milli - mine))} more of the "
                        f"{format_gpus(team.per_user_cap_milli)} GPUs one user may hold in team {team.name}"
                    )
                return refuse(
                    f"{user} holds {format_gpus(mine)} of the {format_gpus(team.per_user_cap_milli)} "
                    f"GPUs one user may hold in team {team.name}; this request needs {format_gpus(milli)}"
                )
        pq = pool_quota(team.pools, pool) if pool and team.pools else None
        in_pool = totals.per_pool.get(pool, 0) if pq is not None else 0
        if pq is not None and in_pool + milli > pq.burst_milli:
            need = gang_need(milli, members) if members > 1 else f"this request needs {format_gpus(milli)}"
            return refuse(
                f"team {team.name} holds {format_gpus(in_pool)} of its {format_gpus(pq.burst_milli)} "
                f"GPU burst limit in pool {pool}; {need}"
            )
        over = held + milli > team.guarantee_milli or (pq is not None and in_pool + milli > pq.guarantee_milli)
        if over and pq is not None and not may_burst and in_pool + milli > pq.guarantee_milli:
            return refuse(
                f"team {team.name} holds {format_gpus(in_pool)} of its {format_gpus(pq.guarantee_milli)} "
                f"GPU guarantee in pool {pool}; this work is never admitted over quota and needs {format_gpus(milli)}"
            )
        if over and not may_burst:
            if members > 1:
                return refuse(
                    f"{gang_need(milli, members)}; team {team.name} has "
                    f"{format_gpus(max(0, team.guarantee_milli - held))} free of its guarantee "
                    f"({format_gpus(team.guarantee_milli)} GPUs), and this work is never admitted over quota"
                )
            return refuse(
                f"team {team.name} holds {format_gpus(held)} of its {format_gpus(team.guarantee_milli)} "
                f"GPU guarantee; this work is never admitted over quota and needs {format_gpus(milli)}"
            )
        dt = self._team_dept.get(team_name)
        if dt is not None and (dt.by_pool or dt.held + milli > dt.burst):  # the department's bounds
            dept = self._departments[team.department or ""]
            full = department_full(dept, self._dept_totals.get(dept.name), pool, milli)
            if full is not None:
                where, held_d, burst_d = full
                held_by = {name: t.held for name, t in self._totals.items()}
                work = (
                    (w.key, w.team, w.milli, w.pool)
                    for w in self._workloads.values()
                    if w.over_quota and (reclaim_kinds is None or w.kind in reclaim_kinds)
                )
                short = held_d + milli - burst_d
                at = pool if where else ANY_POOL
                reclaim = reclaim_for(team, dept, at, short, over, milli, self._teams.values(), held_by, work)
                asks = gang_need(milli, members) if members > 1 else f"this request needs {format_gpus(milli)}"
                return refuse(department_refusal(dept.name, where, held_d, burst_d, asks, reclaim), reclaim, over)
        if over and dt is not None and dt.waiting and dt.waiting != [team_name] and not covers(dt, team, milli):
            said = self._weighted_refusal(team, dt, milli)  # others wait for what this would take: by weight
            if said:
                return refuse(said)
        return Decision(True, "", team_name, user, milli, over, members, pool)

    def _weighted_refusal(self, team: Team, dt: DepartmentTotals, milli: int) -> str:
        """Weighted borrowing's refusal of this request (``""``: it may borrow); every team's
        state is read only when a waiting team comes first."""

        def state(name: str) -> TeamState:
            totals = self._totals.get(name)
            return TeamState.of(self._teams[name], totals.held if totals else 0, self._waiting, self._waiting_next)

        others = [state(n) for n in dt.waiting if n != team.name]
        every = lambda: [state(n) for n in dt.teams]  # noqa: E731
        return fair_share_refusal(team.department or "", dt.burst, dt.held, state(team.name), others, every, milli)

    def admit(
        self,
        team: str,
        user: str,
        milli: int,
        *,
        may_burst: bool = True,
        members: int = 1,
        profile: str = "",
        reclaim_kinds: frozenset[str] | None = None,
    ) -> Decision:
        """Would this request (a gang of ``members`` sharing ``milli``, of ``profile``'s pool) be
        admitted now? Records nothing. ``reclaim_kinds``: the kinds of work (``job``,
        ``notebook``) a refusal's reclaim choice may name (``None``: every kind)."""
        with self._lock:
            return self._decide(team, user, milli, may_burst, members, self.pool_for(profile), reclaim_kinds)

    def reserve(
        self,
        key: str,
        team: str,
        user: str,
        milli: int,
        *,
        profile: str = "",
        kind: str = "notebook",
        may_burst: bool = True,
        members: int = 1,
        preemptible: bool = False,
        reclaim_kinds: frozenset[str] | None = None,
    ) -> Decision:
        """Admit and record in one atomic step (as a reservation).

        ``members`` > 1: a gang whose ``milli`` is split evenly over its members,
        recorded whole or not at all. ``preemptible``: the work is recorded over quota
        (preemptible) even where the guarantee would hold it (a team past its GPU-hour
        budget, :mod:`spawner.core.budgets`). ``reclaim_kinds``: as for :meth:`admit`."""
        with self._lock:
            if key in self._workloads:
                held = self._workloads[key]
                return Decision(
                    False, f"{key} already holds {format_gpus(held.milli)} GPUs in team {held.team}", team, user, milli
                )
            decision = self._decide(team, user, milli, may_burst, members, self.pool_for(profile), reclaim_kinds)
            if decision.allowed and preemptible and milli > 0 and not decision.over_quota:
                decision = replace(decision, over_quota=True)
            if decision.allowed:
                w = Workload(
                    key, team, user, milli, profile, kind, decision.over_quota, RESERVED, members, decision.pool
                )
                self._add(w)
        if decision.allowed:
            self._notify([("add", w)])
        return decision

    def confirm(self, key: str) -> Workload | None:
        """A reserved workload is now running."""
        with self._lock:
            w = self._workloads.get(key)
            if w is None or w.state == RUNNING:
                return w
            self._remove(key)
            w = replace(w, state=RUNNING)
            self._add(w)
        self._notify([("add", w)])
        return w

    def release(self, key: str) -> Workload | None:
        """Free what ``key`` holds (stop, failure, death). Idempotent."""
        with self._lock:
            w = self._remove(key)
        if w is not None:
            self._notify([("remove", w)])
        return w

    def adopt(self, workload: Workload) -> None:
        """Record work that already runs (from the cluster), without checks.

        Replaces any record under the same key, so adopting twice never
        double counts.
        """
        with self._lock:
            self._remove(workload.key)
            workload = self._with_pool(workload)
            self._add(workload)
        self._notify([("add", workload)])

    def rebuild(self, live: Iterable[Workload], *, keep_reserved: bool = True) -> None:
        """Replace the running set with ``live``.

        Reservations whose key is not (yet) among ``live`` are kept when
        ``keep_reserved``: they are spawns still starting.
        """
        with self._lock:
            before = dict(self._workloads)
            pending = [w for w in self._workloads.values() if w.state == RESERVED] if keep_reserved else []
            self._workloads.clear()
            self._totals.clear()
            self._reset_departments()
            for w in live:
                self._remove(w.key)
                self._add(self._with_pool(w))
            for w in pending:
                if w.key not in self._workloads:
                    self._add(w)
            events = [("remove", w) for k, w in before.items() if k not in self._workloads]
            events += [("add", w) for k, w in self._workloads.items() if before.get(k) != w]
        self._notify(events)

    # -- reading ----------------------------------------------------------

    def get(self, key: str) -> Workload | None:
        return self._workloads.get(key)

    def workloads(self, team: str | None = None) -> list[Workload]:
        with self._lock:
            return [w for w in self._workloads.values() if team is None or w.team == team]

    def usage(self, team_name: str) -> TeamUsage:
        with self._lock:
            team = self._teams.get(team_name)
            t = self._totals.get(team_name) or _Totals()
            return TeamUsage(
                team=team_name,
                guarantee_milli=team.guarantee_milli if team else 0,
                burst_milli=team.burst_milli if team else 0,
                held_milli=t.held,
                in_quota_milli=t.in_quota,
                over_quota_milli=t.over_quota,
                reserved_milli=t.reserved,
                workloads=t.count,
            )

    def pool_usage(self, team_name: str, pool: str) -> NodeUsage | None:
        """What ``team_name`` holds in ``pool`` against its quota there (``None``: it has none)."""
        with self._lock:
            team = self._teams.get(team_name)
            q = pool_quota(team.pools, pool) if team else None
            if q is None:
                return None
            t = self._totals.get(team_name) or _Totals()
            return NodeUsage(pool, q.guarantee_milli, q.burst_milli, t.per_pool.get(pool, 0))

    def held_in_pools(self, team_name: str) -> dict[str, int]:
        """What a team holds per pool (pools it holds nothing in are left out)."""
        with self._lock:
            t = self._totals.get(team_name)
            return dict(t.per_pool) if t else {}

    def department_usage(self, name: str) -> NodeUsage | None:
        """What a department's teams hold together against its guarantee and burst."""
        with self._lock:
            d = self._departments.get(name)
            if d is None:
                return None
            t = self._dept_totals.get(name)
            return NodeUsage(name, d.guarantee_milli, d.burst_milli, t.held if t else 0)

    def department_pools(self, name: str) -> dict[str, int]:
        """What a department's teams hold together per pool."""
        with self._lock:
            t = self._dept_totals.get(name)
            return dict(t.per_pool) if t else {}

    def user_held(self, team_name: str, user: str) -> int:
        with self._lock:
            t = self._totals.get(team_name)
            return t.per_user.get(user, 0) if t else 0

    # -- internals --------------------------------------------------------

    def _with_pool(self, w: Workload) -> Workload:
        """Work recorded without a pool (adopted from pods or saved state) gets its profile's."""
        if w.pool or not w.profile:
            return w
        pool = self._profile_pools.get(w.profile, ANY_POOL)
        return replace(w, pool=pool) if pool else w

    def _add(self, w: Workload) -> None:
        self._workloads[w.key] = w
        self._totals.setdefault(w.team, _Totals()).add(w, +1)
        dt = self._team_dept.get(w.team)
        if dt is not None:
            if dt.by_pool:
                dt.add(w.milli, w.pool, +1)
            else:
                dt.held += w.milli

    def _remove(self, key: str) -> Workload | None:
        w = self._workloads.pop(key, None)
        if w is not None:
            self._totals[w.team].add(w, -1)
            dt = self._team_dept.get(w.team)
            if dt is not None:
                if dt.by_pool:
                    dt.add(w.milli, w.pool, -1)
                else:
                    dt.held -= w.milli
        return w
