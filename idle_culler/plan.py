"""One cull cycle's decisions, made without I/O: what to do with each GPU server.

:func:`plan_cycle` takes what the cycle read (the GPU servers, their utilisation, the
hub's warnings and keep-alives, each server's idle timeout and maximum lifetime) and returns a
:class:`CyclePlan`: the warnings of servers no longer running, and per server its
verdict (:func:`spawner.core.idle.judge_gpu_idle`, or
:func:`spawner.core.idle.lifetime_verdict` once its session is past its maximum lifetime) and step
(:func:`spawner.core.idle.next_step`). ``GPUIdleCuller.cycle`` reads, plans, applies
(records in the hub, stops servers) and finishes with a :class:`CycleSummary`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from spawner.core.idle import (
    IdleVerdict,
    IdleWarning,
    Lifetime,
    Step,
    judge_gpu_idle,
    lifetime_verdict,
    next_step,
    shorter_of,
)

from .attribution import SHARED_GPU_NOTE, shares_whole_gpu
from .targets import ServerTarget

#: ``(user, server)``
Who = tuple[str, str]


@dataclass(frozen=True)
class HubRead:
    """What a cycle read from the hub: the users' servers and gpulab's idle state, at ``now``."""

    users: list[dict[str, Any]]
    profiles: dict[str, Any]
    teams: dict[str, Any]
    warnings: dict[Who, IdleWarning]
    keepalives: dict[Who, float]
    #: Servers ready or pending (a warning of any other server is void).
    running: set[Who]
    now: float
    #: The unattributed servers the hub has from the culler (``None``: none reported since it started).
    unattributed: list[dict[str, Any]] | None = None


@dataclass(frozen=True)
class ServerStep:
    """One GPU server's verdict and step this cycle, and the timeout it was judged by."""

    target: ServerTarget
    verdict: IdleVerdict
    step: Step
    timeout_seconds: int
    timeout_from: str
    warning: IdleWarning | None


@dataclass(frozen=True)
class CyclePlan:
    #: Warnings of servers that are no longer running (stopped by their users): cleared.
    gone: tuple[Who, ...]
    steps: tuple[ServerStep, ...]


def plan_cycle(
    targets: Sequence[ServerTarget],
    data: Mapping[str, Sequence[Any]],
    warnings: Mapping[Who, IdleWarning],
    keepalives: Mapping[Who, float],
    timeouts: Mapping[str, tuple[int, str]],
    running: Iterable[Who],
    *,
    now: float,
    threshold_percent: float,
    max_gap_seconds: float,
    lifetimes: Mapping[str, Lifetime] | None = None,
) -> CyclePlan:
    """Decide every server of the cycle (pure: the same inputs, the same plan).

    ``lifetimes``: the maximum lifetime of each server session that has one, by server key;
    past it a server is judged by its age alone, whatever its utilisation and keep-alive."""
    running = set(running)
    gone = tuple(who for who in warnings if who not in running)
    lifetimes = lifetimes or {}
    steps = []
    for t in targets:
        seconds, origin = timeouts[t.key]
        lifetime = lifetimes.get(t.key)
        verdict = lifetime_verdict(lifetime, now) or judge_gpu_idle(
            data.get(t.key, ()),
            now=now,
            window_seconds=seconds,
            threshold_percent=threshold_percent,
            max_gap_seconds=max_gap_seconds,
            expected_devices=t.expected_devices,
            started_at=t.started_at,
        )
        warning = warnings.get((t.user, t.server))
        keepalive = keepalives.get((t.user, t.server))
        step = next_step(verdict, warning, keepalive, now, t.started, lifetime.ends_at if lifetime else None)
        steps.append(ServerStep(t, verdict, step, seconds, origin, warning))
    return CyclePlan(gone, tuple(steps))


def lifetimes_of(
    targets: Iterable[ServerTarget], profiles: Mapping[str, Any], teams: Mapping[str, Any]
) -> dict[str, Lifetime]:
    """Each server session's maximum lifetime (the shorter of its profile's and its team's, as the
    hub's idle state lists them), by server key; sessions without one, or without a start, are left out."""
    out: dict[str, Lifetime] = {}
    for t in targets:
        found = shorter_of(
            (t.profile, (profiles.get(t.profile) or {}).get("max_lifetime_seconds")) if t.profile else None,
            (t.team, (teams.get(t.team) or {}).get("max_lifetime_seconds")) if t.team else None,
        )
        if found is not None and t.started_at is not None:
            out[t.key] = Lifetime(found[0], found[1], t.started_at)
    return out


@dataclass
class CycleSummary:
    """What one cycle did, for the log line, the tests and the benchmark (``to_json``)."""

    servers: int = 0
    gpu_servers: int = 0
    non_gpu: int = 0
    warned: list[str] = field(default_factory=list)
    cleared: list[str] = field(default_factory=list)
    reclaimed: list[str] = field(default_factory=list)
    kernels: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    held: list[str] = field(default_factory=list)
    #: Verdict status per server key.
    verdicts: dict[str, str] = field(default_factory=dict)
    #: Servers no series names (never judged idle), with the reason's code.
    unattributed: dict[str, str] = field(default_factory=dict)
    #: Why the cycle decided nothing (the hub or the source could not answer).
    source_error: str | None = None
    source_wait_seconds: float | None = None
    queries: int = 0
    seconds: float = 0.0

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def decision_record(
    t: ServerTarget, verdict: IdleVerdict, seconds: int, origin: str, decided_at: float, source: str
) -> dict[str, Any]:
    """What a warning and a reclaim claim both say about the server and the decision."""
    evidence = {
        **verdict.evidence,
        **({"shared_gpu": SHARED_GPU_NOTE} if shares_whole_gpu(t) else {}),
        "idle_timeout_seconds": seconds,
        "idle_timeout_from": origin,
        "hub_last_activity": t.last_activity,  # kept to show activity is not utilisation
        "decided_at": decided_at,
        "source": source,
    }
    return {
        "user": t.user,
        "server": t.server,
        "session": t.started,
        "team": t.team,
        "profile": t.profile,
        "gpu_milli": t.gpu_milli,
        "reason": verdict.reason,
        "evidence": evidence,
    }
