"""The spawn queue ("queue me"): who waits for what, in which order, and when it may start.

Pure decisions over plain records; the hub stores the entries
(``hub_config/domain/queue_store.py``) and its runner starts the next one through the
one ledger when capacity frees (``hub_config/domain/queue_runner.py``).

Fairness:

* **Order**: higher priority class first (``PriorityClass.rank``), then first come,
  first served (the time the entry joined, then its id).
* **No overtaking**: an entry that does not fit blocks every later entry that waits
  for the same thing -- the same team's quota (``"team"``), the same user's cap in that
  team (``"user"``), or the same GPU model's devices (``"capacity"``) -- so a stream of
  small requests never starves a large one queued before them. Later entries that
  wait for something else (another team, another model) are not held up.
* **Bounded per user**: a user has at most ``max_per_user`` waiting entries, and one
  per server.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from .units import format_gpus

WAITING = "waiting"
STARTING = "starting"
STARTED = "started"
CANCELLED = "cancelled"
FAILED = "failed"
#: Every state an entry can be in; only ``waiting`` and ``starting`` are "in the queue".
STATES = (WAITING, STARTING, STARTED, CANCELLED, FAILED)
ACTIVE_STATES = (WAITING, STARTING)

#: What a refused start waits for (see :func:`next_to_start`); ``""``: it fits now.
BLOCK_TEAM, BLOCK_USER, BLOCK_CAPACITY = "team", "user", "capacity"
BLOCKS = (BLOCK_TEAM, BLOCK_USER, BLOCK_CAPACITY)


@dataclass(frozen=True)
class QueueEntry:
    """One user's server waiting for a GPU profile."""

    id: int
    user: str
    #: The named server to start (``""``: the default server).
    server_name: str
    team: str
    profile: str
    #: milli-GPUs the profile asks for (after the sharing backend rounds up).
    milli: int
    #: ``PriorityClass.rank`` of the profile: higher goes first.
    rank: int
    #: When the entry joined, epoch seconds.
    enqueued_at: float
    #: The profile's GPU model (``None``: any model).
    gpu_model: str | None = None
    image: str = ""
    state: str = WAITING


def order_key(entry: QueueEntry) -> tuple[int, float, int]:
    """Sort key of the queue: priority class first, then first come, first served."""
    return (-entry.rank, entry.enqueued_at, entry.id)


def queue_order(entries: Iterable[QueueEntry]) -> list[QueueEntry]:
    """The entries still in the queue, in the order they are served."""
    return sorted((e for e in entries if e.state in ACTIVE_STATES), key=order_key)


def enqueue_refusal(waiting: Iterable[QueueEntry], user: str, server_name: str, max_per_user: int) -> str:
    """Why ``user`` may not queue ``server_name`` now (``""``: they may).

    One entry per server (a server starts once); at most ``max_per_user`` entries per user."""
    mine = [e for e in waiting if e.user == user and e.state in ACTIVE_STATES]
    for e in mine:
        if e.server_name == server_name:
            what = f"your server “{server_name}”" if server_name else "your default server"
            return f"{what} is already in the queue (for {e.profile} in team {e.team}); cancel that entry first"
    if len(mine) >= max_per_user:
        return (
            f"you already have {len(mine)} of the {max_per_user} queue entries one user may have; "
            "cancel one or wait until it starts"
        )
    return ""


def ahead_of(entries: Iterable[QueueEntry], entry: QueueEntry) -> list[QueueEntry]:
    """The entries served before ``entry`` that compete with it: the same team's quota or,
    on a server whose devices the hub places, the same GPU model."""
    mine = order_key(entry)
    return [
        e
        for e in queue_order(entries)
        if e.id != entry.id and order_key(e) < mine and (e.team == entry.team or _same_devices(e, entry))
    ]


def _same_devices(a: QueueEntry, b: QueueEntry) -> bool:
    return a.milli > 0 and b.milli > 0 and (a.gpu_model is None or b.gpu_model is None or a.gpu_model == b.gpu_model)


def ordinal(n: int) -> str:
    """1 -> "1st", 2 -> "2nd", 11 -> "11th", 23 -> "23rd"."""
    if 10 <= n % 100 <= 20:
        suffix = "th"
    else:
        suffix = {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"


def position_sentence(position: int, what: str, team: str) -> str:
    """ "You are 2nd in line for 0.5 × H100 in team vision"."""
    if position <= 1:
        return f"You are next in line for {what} in team {team}"
    return f"You are {ordinal(position)} in line for {what} in team {team}"


#: ``fits(entry) -> block``: ``""`` when the entry could start now, else what it waits for
#: (:data:`BLOCK_TEAM`, :data:`BLOCK_USER` or :data:`BLOCK_CAPACITY`). Records nothing.
FitsFn = Callable[[QueueEntry], str]


def next_to_start(entries: Iterable[QueueEntry], fits: FitsFn) -> QueueEntry | None:
    """The first waiting entry, in queue order, that may start now without overtaking an
    earlier entry that waits for the same team, the same user's cap or the same devices."""
    blocked_teams: set[str] = set()
    blocked_users: set[tuple[str, str]] = set()
    blocked_models: set[str | None] = set()
    for e in queue_order(entries):
        if e.state != WAITING:
            if e.state == STARTING:  # being started: what it takes is not free for those behind
                blocked_users.add((e.team, e.user))
            continue
        if e.team in blocked_teams or (e.team, e.user) in blocked_users:
            continue
        if e.milli > 0 and (None in blocked_models or e.gpu_model in blocked_models):
            continue
        block = fits(e)
        if not block:
            return e
        if block == BLOCK_TEAM:
            blocked_teams.add(e.team)
        elif block == BLOCK_USER:
            blocked_users.add((e.team, e.user))
        elif block == BLOCK_CAPACITY:
            blocked_models.add(e.gpu_model)
        else:
            raise ValueError(f"unknown block {block!r}; expected one of {', '.join(BLOCKS)} or ''")
    return None


# -- the predicted start -----------------------------------------------------------------

#: Where a holder's expected end comes from, strongest first.
BASIS_RECLAIM = "idle reclaim"
BASIS_TIME_LIMIT = "time limit"
BASIS_LIFETIME = "maximum lifetime"
BASIS_HISTORY = "recorded sessions"


@dataclass(frozen=True)
class Holder:
    """Work that holds GPUs now, with when it is expected to free them."""

    key: str
    team: str
    milli: int
    gpu_model: str | None
    #: Expected release, epoch seconds (``None``: nothing gpulab knows bounds it).
    ends_at: float | None
    basis: str = ""


def expected_end(
    started_at: float,
    now: float,
    past_durations: Sequence[float] = (),
    *,
    reclaim_at: float | None = None,
    time_limit_end: float | None = None,
    lifetime_end: float | None = None,
    min_history: int = 3,
) -> tuple[float | None, str]:
    """When work started at ``started_at`` is expected to free its GPUs, and why.

    * A warned-idle server is reclaimed when its grace ends (``reclaim_at``), a job is
      stopped at its time limit, a server at its maximum lifetime: each is a bound.
    * Recorded session lengths of the same kind of work (``past_durations``: the
      user's own for this profile, else the profile's) give the typical end: the median
      length of the past sessions that ran longer than this one has so far (a session
      already 3 h old is compared with sessions that lasted over 3 h). Fewer than
      ``min_history`` such sessions: no estimate from history.

    The earliest of the bounds and the history estimate wins; ``(None, "")`` when
    nothing is known. Never earlier than ``now``.
    """
    bounds = [
        (t, basis)
        for t, basis in (
            (reclaim_at, BASIS_RECLAIM),
            (time_limit_end, BASIS_TIME_LIMIT),
            (lifetime_end, BASIS_LIFETIME),
        )
        if t is not None
    ]
    elapsed = max(0.0, now - started_at)
    longer = sorted(d for d in past_durations if d > elapsed)
    if len(longer) >= min_history:
        bounds.append((started_at + _median(longer), BASIS_HISTORY))
    if not bounds:
        return None, ""
    t, basis = min(bounds, key=lambda b: b[0])
    return max(t, now), basis


def _median(values: Sequence[float]) -> float:
    n = len(values)
    mid = n // 2
    return float(values[mid]) if n % 2 else (values[mid - 1] + values[mid]) / 2


@dataclass(frozen=True)
class Prediction:
    """When a queue entry is expected to start (``at`` epoch seconds; ``None``: unknown)."""

    at: float | None
    #: How it was found, in words ("when 2 of the team's sessions end (recorded sessions)").
    basis: str


#: ``length(entry) -> seconds``: how long a queued entry is expected to hold its GPUs once
#: started (``None``: unknown), for the entries ahead of the one predicted.
LengthFn = Callable[[QueueEntry], "float | None"]


def _fifo_start(
    entry: QueueEntry,
    ahead: Sequence[QueueEntry],
    free_now: int,
    holders: Iterable[Holder],
    now: float,
    length: LengthFn | None,
) -> tuple[float | None, list[str]]:
    """When ``entry`` starts if the queue is served in order: the holders free their GPUs at
    their expected ends, each entry ahead starts as soon as its share is free and holds it
    for its expected length; ``None`` when something it waits for has no expected end."""
    ends = [(h.ends_at, h.milli, h.basis) for h in holders if h.ends_at is not None]
    heapq.heapify(ends)
    free, t = free_now, now
    bases: list[str] = []
    for q in [*ahead, entry]:
        while free < q.milli:
            if not ends:
                return None, bases
            end, milli, basis = heapq.heappop(ends)
            t, free = max(t, end), free + milli
            if basis and basis not in bases:
                bases.append(basis)
        if q is entry:
            return t, bases
        free -= q.milli
        held = length(q) if length is not None else None
        if held is not None:
            heapq.heappush(ends, (t + held, q.milli, BASIS_HISTORY))
    return t, bases


def predict_start(
    entry: QueueEntry,
    ahead: Sequence[QueueEntry],
    holders: Sequence[Holder],
    now: float,
    *,
    team_free_milli: int,
    device_free_milli: int | None = None,
    length: LengthFn | None = None,
) -> Prediction:
    """When ``entry`` is expected to start.

    The queue is played forward in its order: the work holding GPUs frees them at its
    expected end (:func:`expected_end`), each entry ahead starts as soon as its share is
    free and then holds it for its expected length (``length``), and ``entry`` starts
    when its own share is free. This is done for its team's quota (``team_free_milli``
    now, the team's holders and queued entries) and, where the hub places devices
    (``device_free_milli`` not ``None``: the single server), for the devices of its GPU
    model; the later of the two is the prediction. Fragmentation (free fractions on
    different GPUs) is not modelled: a placement that needs one GPU with room may start
    later than predicted.
    """
    team_ahead = [e for e in ahead if e.team == entry.team]
    team_holders = [h for h in holders if h.team == entry.team]
    t, bases = _fifo_start(entry, team_ahead, team_free_milli, team_holders, now, length)
    if device_free_milli is not None and entry.milli > 0 and t is not None:
        dev_ahead = [e for e in ahead if _same_devices(e, entry)]
        dev_holders = [
            h
            for h in holders
            if h.milli > 0 and (entry.gpu_model is None or h.gpu_model is None or h.gpu_model == entry.gpu_model)
        ]
        t_dev, dev_bases = _fifo_start(entry, dev_ahead, device_free_milli, dev_holders, now, length)
        bases += [b for b in dev_bases if b not in bases]
        t = None if t_dev is None else max(t, t_dev)
    if t is None:
        return Prediction(
            None, "no estimate: what holds these GPUs has no time limit, idle warning or recorded history"
        )
    words = f"from {', '.join(bases)}" if bases else "GPUs are free now"
    return Prediction(t, words)


def prediction_sentence(prediction: Prediction, now: float) -> str:
    """ "Predicted start in about 25 min (from recorded sessions)"."""
    if prediction.at is None:
        return "No predicted start yet (" + prediction.basis.removeprefix("no estimate: ") + ")"
    minutes = max(0, round((prediction.at - now) / 60))
    if minutes < 1:
        when = "within a minute"
    elif minutes < 90:
        when = f"in about {minutes} min"
    else:
        when = f"in about {minutes / 60:.1f} h"
    return f"Predicted start {when} ({prediction.basis})"


def entry_words(entry: QueueEntry, display_name: str) -> str:
    """What the entry waits for, as its line says it ("0.5 × H100 (0.5 GPU)")."""
    if entry.milli and format_gpus(entry.milli) not in display_name:
        return f"{display_name} ({format_gpus(entry.milli)} GPU)"
    return display_name
