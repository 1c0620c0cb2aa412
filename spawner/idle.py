"""The GPU cull decision: plain data in, a verdict out (no I/O, no clocks).

A server is *GPU-idle* only when we can prove it: every sample of every GPU it
holds, over the whole idle window, is at or below the threshold, and the
samples cover the window (no device missing, none stale, no hole wider than
``max_gap_seconds``). Anything less -- no series, a missing device, a stale or
gappy series, a NaN -- means "not idle". The culler never guesses.

Also here: which idle timeout applies (profile vs team), the
warn -> grace -> reclaim state machine, the "keep my GPU" policy, and how
reclaimed GPU-hours are counted. The culler service, the hub API and the
benchmarks all call these functions.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from .model import Profile, Team

#: Verdict statuses. Only ``IDLE`` allows a warning or a reclaim.
IDLE = "idle"
BUSY = "busy"
MISSING = "missing"  # no series at all for this server
PARTIAL = "partial"  # some of its devices have no series, or a series has holes / bad values
STALE = "stale"  # the newest sample is too old
SHORT = "short"  # the samples do not reach back to the start of the window


@dataclass(frozen=True)
class DeviceSeries:
    """Utilisation samples of one GPU (or MIG instance) held by one server.

    ``device`` identifies the device (``"node-1/gpu3"``, ``"node-1/gpu3/mig1"``),
    ``samples`` are ``(unix_seconds, percent 0..100)`` pairs in any order.
    """

    device: str
    samples: tuple[tuple[float, float], ...]
    metric: str = ""
    #: Extra identifying labels kept for the audit evidence (UUID, MIG profile...).
    labels: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class IdleVerdict:
    idle: bool
    status: str
    reason: str
    evidence: dict[str, Any]

    @property
    def missing_data(self) -> bool:
        """True when the verdict is "not idle" only because data was missing or unusable."""
        return self.status in (MISSING, PARTIAL, STALE, SHORT)


def judge_gpu_idle(
    series: Sequence[DeviceSeries],
    *,
    now: float,
    window_seconds: float,
    threshold_percent: float,
    max_gap_seconds: float,
    expected_devices: Iterable[str] | int | None = None,
) -> IdleVerdict:
    """Is this server's GPU idle over ``[now - window_seconds, now]``?

    ``expected_devices``: the device ids the server holds (a set) or how many
    devices it holds (an int); a server with fewer series than that is
    ``partial``. Samples in the future (clock skew) are ignored.
    """
    start = now - window_seconds
    evidence: dict[str, Any] = {
        "window_seconds": window_seconds,
        "threshold_percent": threshold_percent,
        "max_gap_seconds": max_gap_seconds,
        "devices": {},
    }
    if not series:
        return IdleVerdict(False, MISSING, "no GPU utilisation samples for this server", evidence)

    # Several metrics may describe one device; group them, every one must be idle.
    problems: list[tuple[str, str]] = []
    busy: list[str] = []
    seen: set[str] = set()
    for s in series:
        seen.add(s.device)
        in_window = sorted((t, v) for t, v in s.samples if start <= t <= now)
        info: dict[str, Any] = {"metric": s.metric, "samples": len(in_window)}
        if s.labels:
            info["labels"] = dict(s.labels)
        evidence["devices"].setdefault(s.device, []).append(info)
        if not in_window:
            problems.append((STALE, f"{s.device}: no sample in the last {_secs(window_seconds)}"))
            continue
        values = [v for _, v in in_window]
        if any(not math.isfinite(v) for v in values):
            problems.append((PARTIAL, f"{s.device}: non-numeric sample"))
            continue
        info.update(max=max(values), mean=round(sum(values) / len(values), 3),
                    first_at=in_window[0][0], last_at=in_window[-1][0])
        if max(values) > threshold_percent:
            busy.append(f"{s.device} peaked at {max(values):g}% (threshold {threshold_percent:g}%)")
            continue
        if now - in_window[-1][0] > max_gap_seconds:
            problems.append((STALE, f"{s.device}: newest sample is {_secs(now - in_window[-1][0])} old"))
            continue
        if in_window[0][0] - start > max_gap_seconds:
            problems.append((SHORT, f"{s.device}: samples start only {_secs(now - in_window[0][0])} ago, "
                                    f"window is {_secs(window_seconds)}"))
            continue
        gap = max((b[0] - a[0] for a, b in zip(in_window, in_window[1:])), default=0.0)
        if gap > max_gap_seconds:
            problems.append((PARTIAL, f"{s.device}: a {_secs(gap)} hole in the samples"))
            continue

    if busy:
        return IdleVerdict(False, BUSY, "GPU in use: " + "; ".join(busy), evidence)
    if expected_devices is not None:
        if isinstance(expected_devices, int):
            if len(seen) < expected_devices:
                problems.append((PARTIAL, f"samples for {len(seen)} of {expected_devices} GPU(s)"))
        else:
            absent = sorted(set(expected_devices) - seen)
            if absent:
                problems.append((PARTIAL, "no samples for " + ", ".join(absent)))
    if problems:
        status = problems[0][0]
        return IdleVerdict(False, status, "not enough data: " + "; ".join(p for _, p in problems), evidence)
    return IdleVerdict(
        True, IDLE,
        f"every sample of {len(seen)} GPU(s) at or below {threshold_percent:g}% for {_secs(window_seconds)}",
        evidence,
    )


def _secs(seconds: float) -> str:
    seconds = int(round(seconds))
    if seconds < 120:
        return f"{seconds}s"
    if seconds < 7200:
        return f"{seconds // 60}m{seconds % 60:02d}s" if seconds % 60 else f"{seconds // 60}m"
    return f"{seconds / 3600:.1f}h"


# -- timeouts ---------------------------------------------------------------


def idle_timeout_for(profile: Profile | None, team: Team | None, default_seconds: int) -> tuple[int, str]:
    """The idle timeout for a server and where it came from.

    When both the profile and the team set one, the **shorter wins**: the
    profile's timeout reflects what the hardware costs (a 4-GPU session gets
    30 minutes), the team's reflects the team's own policy; neither can
    loosen the other. Otherwise whichever is set, else ``default_seconds``.
    """
    p = profile.idle_timeout_seconds if profile is not None else None
    t = team.idle_timeout_seconds if team is not None else None
    if p is not None and t is not None:
        if t < p:
            return t, f"team {team.name}"
        return p, f"profile {profile.slug}"
    if p is not None:
        return p, f"profile {profile.slug}"
    if t is not None:
        return t, f"team {team.name}"
    return default_seconds, "default"


# -- warn -> grace -> reclaim ---------------------------------------------


class Step(str, Enum):
    NOTHING = "nothing"  # not idle, no warning: leave it
    WARN = "warn"  # idle, no warning yet: record one, reclaim after the grace period
    WAIT = "wait"  # warned, still idle, grace not over
    HOLD = "hold"  # warned, but the data is missing now: neither reclaim nor clear
    CLEAR = "clear"  # warned, but busy again (or kept alive): drop the warning
    RECLAIM = "reclaim"  # warned, grace over, still provably idle


@dataclass(frozen=True)
class IdleWarning:
    warned_at: float
    reclaim_at: float


def next_step(verdict: IdleVerdict, warning: IdleWarning | None, keepalive_until: float | None,
              now: float) -> Step:
    """What to do with one server this cycle."""
    if keepalive_until is not None and now < keepalive_until:
        return Step.CLEAR if warning is not None else Step.NOTHING
    if warning is None:
        return Step.WARN if verdict.idle else Step.NOTHING
    if verdict.idle:
        return Step.RECLAIM if now >= warning.reclaim_at else Step.WAIT
    if verdict.status == BUSY:
        return Step.CLEAR
    return Step.HOLD


# -- keep my GPU ------------------------------------------------------------


@dataclass(frozen=True)
class KeepalivePolicy:
    #: How many times a user may press "keep my GPU" per server session.
    max_uses: int = 2
    #: How long each press protects the server from the culler.
    extends_seconds: int = 3600


class KeepaliveRefused(Exception):
    """The policy maximum is used up; the message says so."""


def grant_keepalive(policy: KeepalivePolicy, used: int, until: float | None, now: float) -> tuple[int, float]:
    """One more "keep my GPU": the new ``(used, until)`` or :class:`KeepaliveRefused`.

    The protection runs ``extends_seconds`` from now (presses do not stack:
    a press never shortens a running protection, and never reaches further
    than one extension ahead).
    """
    if used >= policy.max_uses:
        raise KeepaliveRefused(
            f"'keep my GPU' already used {used} of {policy.max_uses} time(s) for this server; "
            "the GPU will be reclaimed if it stays idle"
        )
    return used + 1, max(until or 0.0, now + policy.extends_seconds)


# -- accounting -------------------------------------------------------------


def reclaimed_gpu_hours(gpu_milli: int, idle_since: float, reclaimed_at: float) -> float:
    """GPU-hours a reclaim gives back: the GPUs held times how long they were proven idle.

    ``idle_since`` is the start of the idle window that justified the warning;
    the count ends at the reclaim. (The culler cannot know how long the user
    would have kept the idle GPU; this is the idle time it verified.)
    """
    if gpu_milli <= 0 or reclaimed_at <= idle_since:
        return 0.0
    return round(gpu_milli / 1000 * (reclaimed_at - idle_since) / 3600, 6)
