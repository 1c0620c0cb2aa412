"""The GPU cull decision: plain data in, a verdict out (no I/O, no clocks).

A server is *GPU-idle* only when we can prove it from **its own session**:
the server started at least one idle timeout ago, and every sample of every
GPU it holds over ``[now - timeout, now]`` is at or below the threshold, with
samples covering the window. A hole of up to ``max_gap_seconds`` between two
samples (one or two missed scrapes) is *unknown*: it neither proves idleness
nor restarts the idle clock. Anything less -- no series, a missing device, a
stale series, a longer hole, a NaN, a server younger than its timeout --
means "not idle". The culler never guesses.

Sources hand the decision either raw samples (:class:`DeviceSeries`: NVML,
dcgm-exporter scraped directly) or a per-device summary computed elsewhere
(:class:`DeviceSummary`: Prometheus aggregates the window itself and answers
a few numbers per GPU). Both are judged by the same rules.

Also here: which idle timeout and maximum lifetime apply (profile vs team), the
warn -> grace -> reclaim state machine (warnings belong to one server
session), the "keep my GPU" policy, and the two GPU-hour figures a reclaim
is reported with. The culler service, the hub API and the benchmarks all
call these functions.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from enum import Enum
from itertools import pairwise
from typing import Any

from .model import Profile, Team
from .units import format_duration

#: Verdict statuses. Only ``IDLE`` allows a warning or a reclaim.
IDLE = "idle"
BUSY = "busy"
MISSING = "missing"  # no series at all for this server
PARTIAL = "partial"  # some of its devices have no series, or a series has holes / bad values
STALE = "stale"  # the newest sample is too old
SHORT = "short"  # the samples (or the server's session) do not reach back to the start of the window
#: The session reached its maximum lifetime: reclaimable whatever its utilisation.
LIFETIME = "lifetime"
STATUSES = (IDLE, BUSY, MISSING, PARTIAL, STALE, SHORT, LIFETIME)


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
class DeviceSummary:
    """What the decision needs to know about one device's samples over one window.

    ``lead``: seconds from the window start to the first sample; ``tail``: age
    of the newest sample; ``max_gap``: the widest hole between two samples
    (``inf`` when unknown but known to be too wide). ``finite``: no NaN/inf
    sample. ``peak``/``mean`` in percent. ``samples == 0`` means none in the window.
    """

    device: str
    samples: int
    peak: float
    mean: float
    lead: float
    tail: float
    max_gap: float
    finite: bool = True
    metric: str = ""
    labels: Mapping[str, str] = field(default_factory=dict)


def summarize(series: DeviceSeries, *, start: float, now: float) -> DeviceSummary:
    """Summarise raw samples over ``[start, now]`` (samples outside are ignored)."""
    in_window = sorted((t, v) for t, v in series.samples if start <= t <= now)
    if not in_window:
        return DeviceSummary(
            series.device, 0, 0.0, 0.0, math.inf, math.inf, math.inf, True, series.metric, series.labels
        )
    values = [v for _, v in in_window]
    finite = all(math.isfinite(v) for v in values)
    stamps = [t for t, _ in in_window]
    gap = max((b - a for a, b in pairwise(stamps)), default=0.0)
    peak = max(values) if finite else math.nan
    mean = sum(values) / len(values) if finite else math.nan
    return DeviceSummary(
        series.device,
        len(values),
        peak,
        mean,
        stamps[0] - start,
        now - stamps[-1],
        gap,
        finite,
        series.metric,
        series.labels,
    )


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
    series: Sequence[DeviceSeries | DeviceSummary],
    *,
    now: float,
    window_seconds: float,
    threshold_percent: float,
    max_gap_seconds: float,
    expected_devices: Iterable[str] | int | None = None,
    started_at: float | None = None,
) -> IdleVerdict:
    """Is this server's GPU idle over ``[now - window_seconds, now]``?

    ``expected_devices``: the device ids the server holds (a set) or how many
    devices it holds (an int); a server with fewer series than that is
    ``partial``. ``started_at``: when the server (or kernel) started; samples
    from before it belong to someone else's session, so a server younger than
    the window is ``short`` whatever its GPU did before. Samples in the
    future (clock skew) are ignored.
    """
    start = now - window_seconds
    evidence: dict[str, Any] = {
        "window_seconds": window_seconds,
        "window_start": start,
        "threshold_percent": threshold_percent,
        "max_gap_seconds": max_gap_seconds,
        "devices": {},
    }
    if started_at is not None:
        evidence["session_started_at"] = started_at
        if started_at > start:
            return IdleVerdict(
                False,
                SHORT,
                f"server started {_secs(now - started_at)} ago; its idle timeout is "
                f"{_secs(window_seconds)}, so only its own samples count",
                evidence,
            )
    if not series:
        return IdleVerdict(False, MISSING, "no GPU utilisation samples for this server", evidence)

    # Several metrics may describe one device; group them, every one must be idle.
    problems: list[tuple[str, str]] = []
    busy: list[str] = []
    seen: set[str] = set()
    for s in series:
        if isinstance(s, DeviceSeries):
            s = summarize(s, start=start, now=now)
        seen.add(s.device)
        info: dict[str, Any] = {"metric": s.metric, "samples": s.samples}
        if s.labels:
            info["labels"] = dict(s.labels)
        evidence["devices"].setdefault(s.device, []).append(info)
        if s.samples == 0:
            problems.append((STALE, f"{s.device}: no sample in the last {_secs(window_seconds)}"))
            continue
        if not s.finite:
            problems.append((PARTIAL, f"{s.device}: non-numeric sample"))
            continue
        # None, not NaN, for what the source did not measure: the evidence is strict JSON.
        info.update(max=s.peak, mean=_round(s.mean), max_gap_seconds=_round(s.max_gap))
        if s.peak > threshold_percent:
            busy.append(f"{s.device} peaked at {s.peak:g}% (threshold {threshold_percent:g}%)")
            continue
        if s.tail > max_gap_seconds:
            if math.isfinite(s.tail):
                problems.append((STALE, f"{s.device}: newest sample is {_secs(s.tail)} old"))
            else:
                # Prometheus answers no newest sample once it marked the series stale (its last
                # scrape failed, or the exporter stopped reporting it).
                problems.append((STALE, f"{s.device}: no sample now (its last scrape failed, or the series ended)"))
            continue
        if s.lead > max_gap_seconds:
            if math.isfinite(s.lead):
                why = f"samples start only {_secs(window_seconds - s.lead)} ago"
            else:
                # Prometheus answers no sample at the window's start for a series born inside the
                # window, and for one it marked stale after a failed scrape of its target.
                why = "no sample at the window's start (a series younger than the window, or a failed scrape then)"
            problems.append((SHORT, f"{s.device}: {why}, window is {_secs(window_seconds)}"))
            continue
        if s.max_gap > max_gap_seconds:
            wide = f"a {_secs(s.max_gap)}" if math.isfinite(s.max_gap) else "a long"
            problems.append(
                (
                    PARTIAL,
                    f"{s.device}: {wide} hole in the samples (at most {_secs(max_gap_seconds)} counts as unknown)",
                )
            )
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
        True,
        IDLE,
        f"every sample of {len(seen)} GPU(s) at or below {threshold_percent:g}% for {_secs(window_seconds)}",
        evidence,
    )


def _round(x: float) -> float | None:
    return round(x, 3) if math.isfinite(x) else None


def _secs(seconds: float) -> str:
    if not math.isfinite(seconds):
        return "unbounded"
    seconds = int(round(seconds))
    if seconds < 120:
        return f"{seconds}s"
    if seconds < 7200:
        return f"{seconds // 60}m{seconds % 60:02d}s" if seconds % 60 else f"{seconds // 60}m"
    return f"{seconds / 3600:.1f}h"


def max_gap_for(scrape_interval: float, missed_scrapes: int) -> float:
    """The widest hole that still counts as *unknown*: ``missed_scrapes`` missing samples
    in a row, plus half an interval of scrape jitter."""
    return (missed_scrapes + 1.5) * scrape_interval


# -- timeouts ---------------------------------------------------------------


def idle_timeout_for(profile: Profile | None, team: Team | None, default_seconds: int) -> tuple[int, str]:
    """The idle timeout for a server and where it came from.

    When both the profile and the team set one, the **shorter wins**: the
    profile's timeout reflects what the hardware costs (a 4-GPU session gets
    30 minutes), the team's reflects the team's own policy; neither can
    loosen the other. Otherwise whichever is set, else ``default_seconds``.
    """
    return idle_timeout_of(
        (profile.slug, profile.idle_timeout_seconds) if profile is not None else None,
        (team.name, team.idle_timeout_seconds) if team is not None else None,
        default_seconds,
    )


def idle_timeout_of(
    profile: tuple[str, int | None] | None, team: tuple[str, int | None] | None, default_seconds: int
) -> tuple[int, str]:
    """:func:`idle_timeout_for` from ``(name, timeout seconds or None)`` pairs, as the culler
    reads them from the hub's idle state (it has no catalog objects)."""
    return shorter_of(profile, team) or (default_seconds, "default")


def shorter_of(profile: tuple[str, int | None] | None, team: tuple[str, int | None] | None) -> tuple[int, str] | None:
    """The shorter of a profile's and a team's duration, with where it came from
    (``"profile h100"``, ``"team vision"``); ``None`` when neither sets one."""
    from_profile = (profile[1], f"profile {profile[0]}") if profile is not None and profile[1] is not None else None
    from_team = (team[1], f"team {team[0]}") if team is not None and team[1] is not None else None
    if from_profile is not None and from_team is not None:
        return from_team if from_team[0] < from_profile[0] else from_profile
    return from_profile or from_team


# -- maximum lifetime -------------------------------------------------------


def max_lifetime_for(profile: Profile | None, team: Team | None) -> tuple[int, str] | None:
    """A GPU server's maximum lifetime and where it came from, or ``None`` (unlimited).

    Like the idle timeout, the shorter of the profile's and the team's wins. Only GPU
    servers have one: a CPU profile's server is never stopped for its age.
    """
    if profile is not None and not profile.is_gpu:
        return None
    return shorter_of(
        (profile.slug, profile.max_lifetime_seconds) if profile is not None else None,
        (team.name, team.max_lifetime_seconds) if team is not None else None,
    )


@dataclass(frozen=True)
class Lifetime:
    """One server session's maximum lifetime: ``seconds`` from the session start ``started_at``."""

    seconds: int
    #: Where it came from: ``"profile h100-4"`` or ``"team vision"``.
    origin: str
    started_at: float

    @property
    def ends_at(self) -> float:
        return self.started_at + self.seconds

    def reached(self, now: float) -> bool:
        return now >= self.ends_at

    @property
    def reason(self) -> str:
        return f"maximum lifetime {format_duration(self.seconds)} of {self.origin} reached"


def session_lifetime(
    profile: Profile | None, team: Team | None, gpu_milli: int, started_at: float | None
) -> Lifetime | None:
    """The maximum lifetime of a running session that holds ``gpu_milli`` of ``profile`` in
    ``team`` since ``started_at``, as the hub knows it (``None``: no GPU, no start, no lifetime)."""
    found = max_lifetime_for(profile, team) if gpu_milli > 0 and started_at is not None else None
    return None if found is None or started_at is None else Lifetime(found[0], found[1], started_at)


def lifetime_verdict(lifetime: Lifetime | None, now: float) -> IdleVerdict | None:
    """The verdict of a session past its maximum lifetime (reclaimable whatever its GPU does),
    or ``None`` while it is within it (or has none): then it is judged on its utilisation."""
    if lifetime is None or not lifetime.reached(now):
        return None
    evidence = {
        "max_lifetime_seconds": lifetime.seconds,
        "max_lifetime_from": lifetime.origin,
        "session_started_at": lifetime.started_at,
        "lifetime_ends_at": lifetime.ends_at,
    }
    return IdleVerdict(True, LIFETIME, lifetime.reason, evidence)


def capped_keepalive(keepalive_until: float | None, lifetime_ends_at: float | None) -> float | None:
    """A keep-alive protects a server at most until its lifetime ends."""
    if keepalive_until is None or lifetime_ends_at is None:
        return keepalive_until
    return min(keepalive_until, lifetime_ends_at)


@dataclass(frozen=True)
class IdleFacts:
    """What the hub knows of its GPU idle culler, for the one idle sentence every page shows."""

    #: Whether this hub runs the culler (``None``: unknown, e.g. it runs outside the hub's config).
    culler_on: bool | None = None
    #: "Keep my GPU": presses per server session (0: none), and how long each one keeps the GPU.
    keepalive_uses: int = 0
    keepalive_seconds: int = 0


def idle_timeout_words(profile: Profile, team: Team | None) -> str:
    """A GPU profile's idle timeout in ``team``: ``"2h"``, or "the culler's default idle time"."""
    if profile.idle_timeout_seconds is None and (team is None or team.idle_timeout_seconds is None):
        return "the culler's default idle time"
    seconds, _ = idle_timeout_for(profile, team, 0)
    return format_duration(seconds)


def idle_policy_text(profile: Profile, team: Team | None, facts: IdleFacts) -> str:
    """What happens to an idle GPU of this profile, in one sentence: the spawn page, the lab's
    sidebar, the progress page, the admin page and the what-if page all say it with this
    (the spawn page, with many cards, says the timeout on each and :func:`idle_rule` once).

    The timeout (the shorter of the profile's and the team's, else the culler's default), the
    warning and its grace period, "Keep my GPU", and whether this hub runs the culler at all:
    a timeout that nothing enforces is named as such, never promised.
    """
    if not profile.is_gpu:
        return ""
    text = idle_rule(facts, idle_timeout_words(profile, team))
    lifetime = lifetime_rule(profile, team, facts)
    return f"{text}; {lifetime}" if lifetime else text


def idle_and_lifetime_words(profile: Profile, team: Team | None) -> str:
    """A GPU profile's idle timeout in ``team`` and its maximum lifetime, if any ("2h, maximum
    lifetime 1d"), as the admin and what-if pages list them per team."""
    found = max_lifetime_for(profile, team)
    idle = idle_timeout_words(profile, team)
    return idle if found is None else f"{idle}, maximum lifetime {format_duration(found[0])}"


def lifetime_rule(profile: Profile, team: Team | None, facts: IdleFacts) -> str:
    """A GPU profile's maximum lifetime in ``team``, in words ("" when it has none): "stopped after
    24h, whatever it does, after a warning and its grace", or, culler off, that nothing enforces it."""
    lifetime = max_lifetime_for(profile, team)
    if lifetime is None:
        return ""
    words = format_duration(lifetime[0])
    if facts.culler_on is False:
        return f"maximum lifetime {words}, not enforced"
    return f"stopped after {words}, whatever it does, after a warning and its grace"


def idle_rule(facts: IdleFacts, after: str = "") -> str:
    """The idle rule of this hub for a server idle ``after`` (``"2h"``), or, without ``after``,
    for every GPU server at its own timeout (said once on a page that lists the timeouts)."""
    if facts.culler_on is False:
        head = f"Idle timeout {after}, not enforced" if after else "Idle timeouts are not enforced"
        who = "the server keeps" if after else "a server keeps"
        return f"{head}: the GPU idle culler is off on this hub, so {who} its GPU until it is stopped"
    text = (
        f"After {after or 'its idle timeout'} with the GPU idle you get a warning; after a grace period the "
        "server is stopped and its GPU released, unless you use the GPU"
    )
    if facts.keepalive_uses > 0:
        times = "once" if facts.keepalive_uses == 1 else f"{facts.keepalive_uses} times"
        text += f" or press “Keep my GPU” ({format_duration(facts.keepalive_seconds)} more, {times} per session)"
    if facts.culler_on is None:
        text += " (if this hub runs the GPU idle culler)"
    return text


# -- warn -> grace -> reclaim ---------------------------------------------


class Step(str, Enum):
    NOTHING = "nothing"  # not idle, no warning: leave it
    WARN = "warn"  # idle, no warning yet: record one, reclaim after the grace period
    WAIT = "wait"  # warned, still idle, grace not over (or already on hold)
    HOLD = "hold"  # warned, but the data is missing now: neither reclaim nor clear; put the warning on hold
    REWARN = "rewarn"  # warned, held through missing data, provably idle again: a new reclaim time, a fresh grace
    CLEAR = "clear"  # warned, but busy again (or kept alive): drop the warning
    VOID = "void"  # the warning belongs to an earlier session of this server (it restarted): drop it
    RECLAIM = "reclaim"  # warned, grace over, still provably idle


@dataclass(frozen=True)
class IdleWarning:
    warned_at: float
    reclaim_at: float
    #: The server session the warning belongs to (its start time, as the hub reports it).
    session: str = ""
    #: Data went missing after the warning: the reclaim waits for data, then a fresh grace.
    held: bool = False


def next_step(
    verdict: IdleVerdict,
    warning: IdleWarning | None,
    keepalive_until: float | None,
    now: float,
    session: str = "",
    lifetime_ends_at: float | None = None,
) -> Step:
    """What to do with one server this cycle.

    ``session`` identifies the running server session (its start time); a
    warning recorded for another session is void, so a restarted server gets
    its full timeout and grace. From ``lifetime_ends_at`` on (the session's maximum
    lifetime) the server counts as idle whatever the verdict, and no keep-alive
    protects it: it is warned, then reclaimed after the grace.
    """
    if warning is not None and warning.session != session:
        return Step.VOID
    keepalive_until = capped_keepalive(keepalive_until, lifetime_ends_at)
    if keepalive_until is not None and now < keepalive_until:
        return Step.CLEAR if warning is not None else Step.NOTHING
    idle = verdict.idle or (lifetime_ends_at is not None and now >= lifetime_ends_at)
    if warning is None:
        return Step.WARN if idle else Step.NOTHING
    if idle:
        if warning.held:
            return Step.REWARN
        return Step.RECLAIM if reclaim_refusal(warning, keepalive_until, session, now) is None else Step.WAIT
    if verdict.status == BUSY:
        return Step.CLEAR
    return Step.WAIT if warning.held else Step.HOLD


def reclaim_refusal(
    warning: IdleWarning | None,
    keepalive_until: float | None,
    session: str,
    now: float,
    who: str = "the server",
    lifetime_ends_at: float | None = None,
) -> str | None:
    """Why an idle server may not be reclaimed now, or ``None`` when it may.

    The one rule for both processes: the culler's :func:`next_step` reclaims only when
    this allows it, and the hub applies it again, to its own records, when the culler
    claims the reclaim (a "keep my GPU" pressed since the culler read the state wins).
    No warning (cleared or kept alive), a warning of an earlier session (the server
    restarted), a warning on hold (data went missing), a grace period not yet over and a
    keep-alive still running each refuse it; a keep-alive runs at most until the session's
    maximum lifetime ends (``lifetime_ends_at``).
    """
    keepalive_until = capped_keepalive(keepalive_until, lifetime_ends_at)
    if warning is None:
        return f"no idle warning for {who} (cleared or kept alive); not reclaiming"
    if warning.session != session:
        return f"the warning of {who} belongs to an earlier session; not reclaiming"
    if warning.held:
        return f"the warning of {who} is held until its data returns"
    if now < warning.reclaim_at:
        return f"the grace period of {who} ends at {utc_iso(warning.reclaim_at)}"
    if keepalive_until is not None and now < keepalive_until:
        return f"{who} is kept alive until {utc_iso(keepalive_until)}"
    return None


def utc_iso(ts: float) -> str:
    """Epoch seconds as ISO 8601 UTC to the second, with a ``Z`` (as the hub writes times)."""
    return datetime.fromtimestamp(ts, timezone.utc).replace(tzinfo=None).isoformat(timespec="seconds") + "Z"


# -- keep my GPU ------------------------------------------------------------


@dataclass(frozen=True)
class KeepalivePolicy:
    #: How many times a user may press "keep my GPU" per server session.
    max_uses: int = 2
    #: How long each press protects the server from the culler.
    extends_seconds: int = 3600


class KeepaliveRefused(Exception):
    """The policy maximum is used up; the message says so."""


def grant_keepalive(
    policy: KeepalivePolicy, used: int, until: float | None, now: float, lifetime: Lifetime | None = None
) -> tuple[int, float]:
    """One more "keep my GPU": the new ``(used, until)`` or :class:`KeepaliveRefused`.

    The protection runs ``extends_seconds`` from now (presses do not stack:
    a press never shortens a running protection, and never reaches further
    than one extension ahead), and never past the session's maximum ``lifetime``:
    once that has passed, a press is refused.
    """
    if lifetime is not None and lifetime.reached(now):
        raise KeepaliveRefused(
            f"'keep my GPU' cannot extend this server past its maximum lifetime ({format_duration(lifetime.seconds)} "
            f"of {lifetime.origin}), reached at {utc_iso(lifetime.ends_at)}; it is stopped after its warning's "
            "grace period, whatever its GPU does"
        )
    if used >= policy.max_uses:
        raise KeepaliveRefused(
            f"'keep my GPU' already used {used} of {policy.max_uses} time(s) for this server; "
            "the GPU will be reclaimed if it stays idle"
        )
    extended = max(until or 0.0, now + policy.extends_seconds)
    return used + 1, extended if lifetime is None else min(extended, lifetime.ends_at)


# -- accounting -------------------------------------------------------------


def idle_gpu_hours_observed(gpu_milli: int, idle_since: float, reclaimed_at: float) -> float:
    """Idle GPU-hours observed before a reclaim: the GPUs held times how long they were proven idle.

    ``idle_since`` is the start of the idle window that justified the warning
    (the warning time minus the idle timeout); the count ends at the reclaim.
    It measures waste that already happened, not capacity given back.
    """
    if gpu_milli <= 0 or reclaimed_at <= idle_since:
        return 0.0
    return round(gpu_milli / 1000 * (reclaimed_at - idle_since) / 3600, 6)


def gpu_hours_freed(gpu_milli: int, reclaimed_at: float, next_held_at: float | None, now: float) -> float:
    """GPU-hours a reclaim freed: the GPUs it took back, from the reclaim until the user
    next holds a GPU again (``next_held_at``), or until ``now`` while they hold none."""
    end = now if next_held_at is None else min(next_held_at, now)
    if gpu_milli <= 0 or end <= reclaimed_at:
        return 0.0
    return round(gpu_milli / 1000 * (end - reclaimed_at) / 3600, 6)
