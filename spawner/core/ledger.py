"""The quota ledger: what each team and user holds, in integer milli-GPUs.

Every admission -- a notebook spawn, a job -- goes through :meth:`Ledger.reserve`,
which checks and records in one step under a lock, so concurrent admissions
can never both take the last GPU. Reservations (spawns still starting) count
exactly like running work. The ledger can be rebuilt at any time from the
workloads that actually run (pods with labels, processes with saved state):
the cluster is the source of truth, the ledger is a cache of it.

Costs are O(1) per admission: per-team and per-user totals are kept
incrementally rather than summed over workloads.

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

from .model import Team
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


@dataclass(frozen=True)
class Decision:
    """The answer to an admission request."""

    allowed: bool
    #: Empty when allowed; otherwise the exact human-readable reason.
    reason: str
    team: str
    user: str
    milli: int
    #: The work would run above the team's guarantee (and is preemptible).
    over_quota: bool = False
    #: Members of the gang asked for (1: not a gang); ``milli`` is the whole gang's.
    members: int = 1

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
    __slots__ = ("held", "in_quota", "over_quota", "reserved", "count", "per_user")

    def __init__(self) -> None:
        self.held = 0
        self.in_quota = 0
        self.over_quota = 0
        self.reserved = 0
        self.count = 0
        self.per_user: dict[str, int] = {}

    def add(self, w: Workload, sign: int) -> None:
        self.held += sign * w.milli
        if w.over_quota:
            self.over_quota += sign * w.milli
        else:
            self.in_quota += sign * w.milli
        if w.state == RESERVED:
            self.reserved += sign * w.milli
        self.count += sign
        held = self.per_user.get(w.user, 0) + sign * w.milli
        if held:
            self.per_user[w.user] = held
        else:
            self.per_user.pop(w.user, None)


class Ledger:
    """Thread-safe quota ledger over a set of teams."""

    def __init__(self, teams: Mapping[str, Team] | Iterable[Team] = ()):
        self._lock = threading.RLock()
        self._teams: dict[str, Team] = {}
        self._workloads: dict[str, Workload] = {}
        self._totals: dict[str, _Totals] = {}
        self._observers: list[LedgerObserver] = []
        self.set_teams(teams)

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

    def set_teams(self, teams: Mapping[str, Team] | Iterable[Team]) -> None:
        """Replace the team definitions (admin edits); holdings are kept."""
        items = teams.values() if isinstance(teams, Mapping) else teams
        with self._lock:
            self._teams = {t.name: t for t in items}

    def team(self, name: str) -> Team | None:
        return self._teams.get(name)

    # -- decisions --------------------------------------------------------

    def _decide(self, team_name: str, user: str, milli: int, may_burst: bool, members: int = 1) -> Decision:
        def refuse(reason: str) -> Decision:
            return Decision(False, reason, team_name, user, milli, members=members)

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
            return Decision(True, "", team_name, user, 0, False, members)
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
        over = held + milli > team.guarantee_milli
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
        return Decision(True, "", team_name, user, milli, over, members)

    def admit(self, team: str, user: str, milli: int, *, may_burst: bool = True, members: int = 1) -> Decision:
        """Would this request (a gang of ``members`` sharing ``milli``) be admitted now? Records nothing."""
        with self._lock:
            return self._decide(team, user, milli, may_burst, members)

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
    ) -> Decision:
        """Admit and record in one atomic step (as a reservation).

        ``members`` > 1: a gang whose ``milli`` is split evenly over its members,
        recorded whole or not at all. ``preemptible``: the work is recorded over quota
        (preemptible) even where the guarantee would hold it (a team past its GPU-hour
        budget, :mod:`spawner.core.budgets`)."""
        with self._lock:
            if key in self._workloads:
                held = self._workloads[key]
                return Decision(
                    False, f"{key} already holds {format_gpus(held.milli)} GPUs in team {held.team}", team, user, milli
                )
            decision = self._decide(team, user, milli, may_burst, members)
            if decision.allowed and preemptible and milli > 0 and not decision.over_quota:
                decision = replace(decision, over_quota=True)
            if decision.allowed:
                w = Workload(key, team, user, milli, profile, kind, decision.over_quota, RESERVED, members)
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
            for w in live:
                self._remove(w.key)
                self._add(w)
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

    def user_held(self, team_name: str, user: str) -> int:
        with self._lock:
            t = self._totals.get(team_name)
            return t.per_user.get(user, 0) if t else 0

    # -- internals --------------------------------------------------------

    def _add(self, w: Workload) -> None:
        self._workloads[w.key] = w
        self._totals.setdefault(w.team, _Totals()).add(w, +1)

    def _remove(self, key: str) -> Workload | None:
        w = self._workloads.pop(key, None)
        if w is not None:
            self._totals[w.team].add(w, -1)
        return w
