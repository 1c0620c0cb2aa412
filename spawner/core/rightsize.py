"""Right size: would a smaller profile have done, judged on the user's own recorded sessions?

One line on the spawn page and in the JupyterLab sidebar ("Last 10 sessions of 1 × H100:
peak 11 GiB of 80 GiB, utilisation p95 18 %: 0.25 × H100 would have done"). It is
advice, never applied: the user picks.

The rule, per profile the user is about to start:

* the evidence is the user's last ``window`` finished sessions of that profile for which
  the utilisation source reported both GPU memory and utilisation (samples, or the
  session's p95 where the source computes it: Prometheus on Kubernetes); fewer than
  ``min_sessions`` such sessions: no hint (no memory reported means no hint: a fraction
  gives less memory, and gpulab never guesses a peak);
* a smaller profile of the same team and GPU model would have done when its memory holds
  the peak with ``headroom`` to spare and its share of GPU time holds the utilisation
  p95 with the same headroom. Utilisation is of the whole device(s) the session was
  placed on (what NVML and DCGM report), so a fraction's figure includes its neighbours'
  work: the hint can only be too cautious, never too eager;
* of the profiles that would have done, the smallest is named.

The utilisation p95 of the evidence is that of all its samples pooled; sessions that bring
only their own p95 count with the highest of those. That is never below the pooled p95
(in each session at most 5 % of the time was above its p95, so at most 5 % of all the
time was above the highest), so it too can only make the hint more cautious.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from .model import Profile
from .profile_facts import gib_words
from .units import MILLI_PER_GPU


@dataclass(frozen=True)
class SessionUse:
    """What one finished session of a user used, as the utilisation source reported it."""

    profile: str
    gpu_milli: int
    #: End of the session, epoch seconds (the newest sessions are the evidence).
    ended_at: float
    #: Highest GPU memory in use seen in the session, MiB (``None``: not reported).
    peak_memory_mib: float | None
    #: Utilisation samples in percent of the session's device(s).
    util_samples: tuple[float, ...] = ()
    #: The session's utilisation p95 as its source computed it (Prometheus'
    #: ``quantile_over_time`` on Kubernetes), where it keeps no samples of its own.
    util_p95: float | None = None
    #: Memory of one of the session's devices as its source reported it (dcgm-exporter's
    #: used + free frame buffer), MiB; ``None``: not reported (the catalog's figure is used).
    device_memory_mib: float | None = None

    @property
    def has_utilisation(self) -> bool:
        return bool(self.util_samples) or self.util_p95 is not None


@dataclass(frozen=True)
class RightSizeHint:
    """A smaller profile that would have done, and the evidence."""

    profile: Profile
    smaller: Profile
    sessions: int
    peak_memory_mib: float
    memory_mib: int
    util_p95: float
    #: The one line the pages show.
    line: str


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (0-100) of ``values`` by the nearest-rank method."""
    if not values:
        raise ValueError("percentile of no values")
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return float(ordered[rank - 1])


def evidence_p95(evidence: Iterable[SessionUse]) -> float:
    """The utilisation p95 of sessions: of their pooled samples, or the highest p95 a session
    brought where that is higher (an upper bound of the pooled p95 of all their time)."""
    sessions = list(evidence)
    pooled = [u for s in sessions for u in s.util_samples]
    bounds = [s.util_p95 for s in sessions if s.util_p95 is not None and not s.util_samples]
    candidates = ([percentile(pooled, 95)] if pooled else []) + bounds
    if not candidates:
        raise ValueError("no utilisation in these sessions")
    return max(candidates)


def right_size_hint(
    profile: Profile,
    candidates: Iterable[Profile],
    sessions: Iterable[SessionUse],
    memory_mib_of: Callable[[Profile, int], int | None],
    *,
    window: int = 10,
    min_sessions: int = 3,
    headroom: float = 0.2,
) -> RightSizeHint | None:
    """The smallest of ``candidates`` (same GPU model, fewer GPUs) that the user's last
    ``window`` sessions of ``profile`` would have fitted in, or ``None``.

    ``memory_mib_of(profile, milli)``: the GPU memory ``milli`` of the profile's model
    gives, MiB (``None``: unknown, then no hint for it).
    """
    if not profile.is_gpu:
        return None
    evidence = sorted(
        (
            s
            for s in sessions
            if s.profile == profile.slug and s.peak_memory_mib is not None and s.has_utilisation and s.gpu_milli > 0
        ),
        key=lambda s: -s.ended_at,
    )[: max(1, window)]
    if len(evidence) < min_sessions:
        return None
    memory = memory_mib_of(profile, profile.gpu_milli)
    if not memory:
        return None
    peak = max(float(s.peak_memory_mib or 0.0) for s in evidence)
    util_p95 = evidence_p95(evidence)
    # Utilisation is a percentage of whole devices: a fraction's session used at most
    # util % of one device, a 2-GPU session util % of two.
    devices = max(1, math.ceil(profile.gpu_milli / MILLI_PER_GPU))
    compute_milli = util_p95 / 100 * devices * MILLI_PER_GPU
    fits: list[Profile] = []
    for c in candidates:
        if c.slug == profile.slug or not c.is_gpu or c.retired or not 0 < c.gpu_milli < profile.gpu_milli:
            continue
        if c.gpu_model != profile.gpu_model:
            continue
        c_memory = memory_mib_of(c, c.gpu_milli)
        if not c_memory:
            continue
        if c_memory >= peak * (1 + headroom) and c.gpu_milli >= compute_milli * (1 + headroom):
            fits.append(c)
    if not fits:
        return None
    smaller = min(fits, key=lambda c: (c.gpu_milli, c.slug))
    line = (
        f"Last {len(evidence)} sessions of {profile.display_name}: peak {gib_words(round(peak))} of "
        f"{gib_words(memory)} GPU memory, utilisation p95 {util_p95:.0f} %: "
        f"{smaller.display_name} would have done"
    )
    return RightSizeHint(profile, smaller, len(evidence), peak, memory, util_p95, line)
