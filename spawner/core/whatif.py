"""The what-if replay: recorded sessions replayed under a proposed catalog, quotas and idle timeout.

Input: sessions as they were recorded (who, which team, how much GPU, from
when to when) and, where recorded, their GPU utilisation samples. Each
session asks again at its recorded start, under the proposal:

1. its size is rounded up to the smallest size of the proposed catalog
   (none large enough: *not offered*);
2. the proposed team quotas admit it or not (:class:`spawner.core.ledger.Ledger`,
   the hub's own admission: guarantee, burst, per-user cap, the quota of the
   session's GPU pool (from its recorded profile) and its team's department);
3. with a device list, the packer must find room (:class:`spawner.core.packer.DevicePacker`);
4. with GPU-hour budgets (:mod:`spawner.core.budgets`), a session that starts when a
   budget binding it has reached 100 % of its period is refused (``refuse``) or runs
   only over quota (``over-quota``, counted in ``budget_over_quota``); the usage a
   budget counts is what the replay served, so a tighter quota also spends less budget;
5. with an idle timeout, it is reclaimed at the first moment its samples
   prove it idle for the timeout plus the warning's grace period, decided
   by :func:`spawner.core.idle.judge_gpu_idle` (the culler's own rule: no
   samples, no reclaim).

Figures, in GPU-hours of the proposal's (rounded) sizes: *served* (held
while running), *refused* (asked for but not admitted, by reason),
*reclaimed* (handed back by the culler: from each reclaim to the session's
recorded end) and *regret*: reclaims after which the same user came back
within an hour (their reclaimed session shows GPU use again, or they started
another session). A refused session is not retried: the replay cannot know
whether its user would have waited or given up, and says so.

The capacity benchmark replays the Alibaba trace through this same engine.
Pure code: no I/O, no clocks.
"""

from __future__ import annotations

import bisect
import heapq
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

from .budgets import REFUSE, Budget, Holding, admission_verdict, budget_status, budgets_for
from .idle import DeviceSeries, judge_gpu_idle
from .ledger import Ledger
from .model import Team
from .packer import DevicePacker, GPUDevice
from .quota_tree import Department
from .units import MILLI_PER_GPU

REGRET_WINDOW_SECONDS = 3600
REFUSAL_REASONS = ("not offered", "quota", "budget", "no device fits")


@dataclass(frozen=True)
class RecordedSession:
    """One recorded workload holding GPUs (times in seconds)."""

    key: str
    team: str
    user: str
    gpu_milli: int
    start: float
    end: float
    models: frozenset[str] = frozenset()
    #: ``(seconds, percent)`` utilisation samples, in time order; empty = none recorded.
    samples: tuple[tuple[float, float], ...] = ()
    #: The profile it was started with (its GPU pool comes from it); ``""``: unknown.
    profile: str = ""


@dataclass(frozen=True)
class Proposal:
    """What the admin is about to save."""

    #: Catalog sizes in milli-GPUs; ``None`` = every session keeps its recorded size.
    sizes: tuple[int, ...] | None = None
    #: Team quotas; teams absent here (or ``None`` for all) are not limited.
    teams: Mapping[str, Team] | None = None
    #: Departments over the teams (their bounds apply too); ``None``: none.
    departments: Mapping[str, Department] | None = None
    #: Profile slug -> GPU pool (the catalog's ``profile_pools``), for per-pool quotas.
    profile_pools: Mapping[str, str] | None = None
    #: Idle timeout in seconds for every team; ``None`` = each team's own
    #: ``idle_timeout_seconds`` (no culling for a team without one).
    idle_timeout_seconds: int | None = None
    grace_seconds: int = 900
    threshold_percent: float = 1.0
    max_gap_seconds: float = 180.0
    #: GPU-hour budgets; empty = none (each budget's period in ``time_zone``).
    budgets: tuple[Budget, ...] = ()
    time_zone: str = "UTC"


@dataclass
class ReplayResult:
    sessions: int = 0
    served: int = 0
    refused: dict[str, int] = field(default_factory=lambda: dict.fromkeys(REFUSAL_REASONS, 0))
    served_gpu_hours: float = 0.0
    #: The same sessions' GPU-hours as asked for, before rounding up to the catalog.
    served_requested_gpu_hours: float = 0.0
    refused_gpu_hours: dict[str, float] = field(default_factory=lambda: dict.fromkeys(REFUSAL_REASONS, 0.0))
    reclaims: int = 0
    reclaimed_gpu_hours: float = 0.0
    #: Sessions a budget at 100 % let start only over quota (preemptible).
    budget_over_quota: int = 0
    regret: int = 0
    regret_gpu_hours: float = 0.0
    sessions_without_samples: int = 0
    peak_held_milli: int = 0
    peak_sessions: int = 0
    #: Consistency of the replay itself: everything released at the end, ledger and packer agree.
    checks: dict[str, bool] = field(default_factory=dict)
    #: Per team: served / refused / reclaimed GPU-hours and regret.
    by_team: dict[str, dict[str, float]] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {
            "sessions": self.sessions,
            "served": self.served,
            "refused": dict(self.refused),
            "served_gpu_hours": self.served_gpu_hours,
            "refused_gpu_hours": dict(self.refused_gpu_hours),
            "refused_gpu_hours_total": sum(self.refused_gpu_hours.values()),
            "reclaims": self.reclaims,
            "reclaimed_gpu_hours": self.reclaimed_gpu_hours,
            "budget_over_quota": self.budget_over_quota,
            "regret": self.regret,
            "regret_gpu_hours": self.regret_gpu_hours,
            "sessions_without_samples": self.sessions_without_samples,
            "served_requested_gpu_hours": self.served_requested_gpu_hours,
            "peak_held_gpus": self.peak_held_milli / MILLI_PER_GPU,
            "peak_sessions": self.peak_sessions,
            "by_team": self.by_team,
            "checks": dict(self.checks),
        }


def _round_up(milli: int, sizes: Sequence[int] | None) -> int | None:
    if sizes is None:
        return milli
    pos = bisect.bisect_left(sizes, milli)
    return sizes[pos] if pos < len(sizes) else None


def timeout_for(session: RecordedSession, proposal: Proposal) -> int | None:
    if proposal.idle_timeout_seconds is not None:
        return proposal.idle_timeout_seconds
    team = (proposal.teams or {}).get(session.team)
    return team.idle_timeout_seconds if team is not None else None


def reclaim_time(session: RecordedSession, proposal: Proposal) -> float | None:
    """When the culler, with the proposal's timeout, would have reclaimed ``session`` (``None``: never).

    The first sample time at which every sample of the last ``timeout + grace``
    seconds is at or below the threshold; confirmed with the culler's own
    :func:`spawner.core.idle.judge_gpu_idle` (gaps, coverage, bad values).
    """
    timeout = timeout_for(session, proposal)
    if timeout is None or not session.samples:
        return None
    window = timeout + proposal.grace_seconds
    series = DeviceSeries(session.key, session.samples)
    idle_since: float | None = None
    last_t: float | None = None
    for t, value in session.samples:
        if t > session.end:
            break
        gap = last_t is not None and t - last_t > proposal.max_gap_seconds
        last_t = t
        if not (value <= proposal.threshold_percent) or gap:  # NaN counts as busy
            idle_since = None if not (value <= proposal.threshold_percent) else t
            continue
        if idle_since is None:
            idle_since = t
        if t - idle_since >= window:
            verdict = judge_gpu_idle(
                [series],
                now=t,
                window_seconds=window,
                threshold_percent=proposal.threshold_percent,
                max_gap_seconds=proposal.max_gap_seconds,
                expected_devices=1,
            )
            if verdict.idle:
                return t
    return None


def _came_back(session: RecordedSession, at: float, next_start: float | None, threshold: float) -> bool:
    """Did the user want the GPU again within an hour of a reclaim at ``at``?"""
    limit = at + REGRET_WINDOW_SECONDS
    if next_start is not None and at <= next_start <= limit:
        return True
    return any(at < t <= limit and t <= session.end and v > threshold for t, v in session.samples)


def _utc(seconds: float) -> datetime:
    return datetime.fromtimestamp(seconds, timezone.utc).replace(tzinfo=None)


def budget_action(s: RecordedSession, proposal: Proposal, served: Mapping[str, list[Holding]]) -> str:
    """What the proposal's budgets say about ``s`` at its start, given what was ``served``
    (per team) before it: ``allow``, ``over-quota`` or ``refuse``."""
    bound = budgets_for(proposal.budgets, s.team, s.user)
    if not bound:
        return "allow"
    now = _utc(s.start)
    team_served = served.get(s.team, ())
    return admission_verdict([budget_status(b, team_served, now, proposal.time_zone) for b in bound], True).action


def replay(
    sessions: Iterable[RecordedSession],
    proposal: Proposal,
    devices: Sequence[GPUDevice] | None = None,
    scoring: str = "bestfit",
    team: str | None = None,
) -> ReplayResult:
    """Replay ``sessions`` in start order under ``proposal``; see the module docstring.

    With ``team``, every session still runs (other teams' sessions hold
    GPUs the team's may need) but only the team's sessions are counted.
    """
    ordered = sorted(sessions, key=lambda s: (s.start, s.key))
    sizes = tuple(sorted(set(proposal.sizes))) if proposal.sizes is not None else None
    teams = dict(proposal.teams or {})
    ledger = Ledger(list(teams.values()), dict(proposal.departments or {}), proposal.profile_pools)
    packer = DevicePacker(devices, scoring=scoring) if devices else None
    starts_by_user: dict[str, list[float]] = {}
    for s in ordered:
        starts_by_user.setdefault(s.user, []).append(s.start)
    out = ReplayResult()
    ends: list[tuple[float, str]] = []
    served_by_team: dict[str, list[Holding]] = {}
    held = 0
    held_by_key: dict[str, int] = {}

    def team_row(team: str) -> dict[str, float]:
        return out.by_team.setdefault(
            team,
            {"served_gpu_hours": 0.0, "refused_gpu_hours": 0.0, "reclaimed_gpu_hours": 0.0, "regret": 0, "sessions": 0},
        )

    def release_until(t: float) -> None:
        nonlocal held
        while ends and ends[0][0] <= t:
            _, done = heapq.heappop(ends)
            held -= held_by_key.pop(done)
            ledger.release(done)
            if packer is not None:
                packer.release(done)

    for n, s in enumerate(ordered):
        key = f"{n}:{s.key}"  # a server name recurs across sessions
        release_until(s.start)
        counted = team is None or s.team == team
        # the figures of sessions not counted go to a scratch result
        res = out if counted else ReplayResult()
        res.sessions += 1
        row = (
            team_row(s.team)
            if counted
            else dict.fromkeys(
                ("served_gpu_hours", "refused_gpu_hours", "reclaimed_gpu_hours", "regret", "sessions"), 0.0
            )
        )
        row["sessions"] += 1
        if not s.samples:
            res.sessions_without_samples += 1
        hours = max(0.0, s.end - s.start) / 3600
        alloc = _round_up(s.gpu_milli, sizes)
        reason = None
        budget = budget_action(s, proposal, served_by_team) if proposal.budgets else "allow"
        if alloc is None:
            reason, alloc = "not offered", s.gpu_milli
        elif budget == REFUSE:
            reason = "budget"
        elif s.team in teams:
            preemptible = budget != "allow"
            if not ledger.reserve(
                key, s.team, s.user, alloc, kind="whatif", profile=s.profile, preemptible=preemptible
            ).allowed:
                reason = "quota"
        if reason is None and packer is not None and packer.place(key, alloc, s.models or None) is None:
            ledger.release(key)
            reason = "no device fits"
        if reason is not None:
            res.refused[reason] += 1
            res.refused_gpu_hours[reason] += alloc * hours / MILLI_PER_GPU
            row["refused_gpu_hours"] += alloc * hours / MILLI_PER_GPU
            continue
        res.served += 1
        if budget != "allow":
            res.budget_over_quota += 1
        end = s.end
        at = reclaim_time(s, proposal)
        if at is not None and at < s.end:
            end = at
            reclaimed = alloc * (s.end - at) / 3600 / MILLI_PER_GPU
            res.reclaims += 1
            res.reclaimed_gpu_hours += reclaimed
            row["reclaimed_gpu_hours"] += reclaimed
            starts = starts_by_user[s.user]
            nxt = starts[bisect.bisect_left(starts, at)] if bisect.bisect_left(starts, at) < len(starts) else None
            if _came_back(s, at, nxt, proposal.threshold_percent):
                res.regret += 1
                res.regret_gpu_hours += reclaimed
                row["regret"] += 1
        served = alloc * max(0.0, end - s.start) / 3600 / MILLI_PER_GPU
        res.served_gpu_hours += served
        res.served_requested_gpu_hours += s.gpu_milli * max(0.0, end - s.start) / 3600 / MILLI_PER_GPU
        row["served_gpu_hours"] += served
        held += alloc
        held_by_key[key] = alloc
        out.peak_held_milli = max(out.peak_held_milli, held)
        out.peak_sessions = max(out.peak_sessions, len(held_by_key))
        heapq.heappush(ends, (end, key))
        if proposal.budgets:
            served_by_team.setdefault(s.team, []).append(
                Holding(key, s.team, s.user, alloc, _utc(s.start), _utc(max(s.start, end)))
            )
        if len(teams) == 1 and s.team in teams:  # one team holds everything: its ledger total is ours
            agree = ledger.usage(s.team).held_milli == held and (
                packer is None or packer.total_milli() - packer.free_milli() == held
            )
            out.checks["ledger_equals_held"] = out.checks.get("ledger_equals_held", True) and agree
    release_until(float("inf"))
    out.checks["all_released_at_end"] = not ledger.workloads() and (
        packer is None or packer.free_milli() == packer.total_milli()
    )
    if packer is not None:
        out.checks["within_capacity"] = out.peak_held_milli <= packer.total_milli()
    return out
