"""GPU-hour budgets: how much GPU time a team (or one user in it) may use per calendar period.

A budget is a number of GPU-hours per calendar month or ISO week (Monday to Monday)
in the usage time zone (``c.GPULabUsage.time_zone``): a period starts at local
midnight of its first day, so a month across a daylight-saving change has an hour
more or less than its days times 24. Usage is what the usage history recorded: one
interval per workload (a notebook server or a job), open while it runs; a running
workload counts up to now. Intervals of the same workload key never count twice,
even when a restart left two overlapping records: per key, each moment counts once,
at the largest share recorded for it.

At 80 % and 100 % of a budget its team's members and the admins are told (the hub's
banners, the lab sidebar, the admin's webhook), each threshold once per period. At
100 % the budget's ``at_limit`` applies to new work: ``over-quota`` admits it only as
preemptible over-quota work (work of a class that never runs over quota is then
refused), ``refuse`` refuses it with a sentence. Running work goes on either way.

Exact arithmetic: budgets are held in integer milli-GPU-hours, usage in integer
milli-GPU-microseconds. Pure code: no I/O, no clock (``now`` is always passed in).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import date, datetime, timedelta, timezone
from decimal import Decimal, DecimalException
from typing import Any
from zoneinfo import ZoneInfo

from .model import is_slug

MONTH, WEEK = "month", "week"
PERIODS = (MONTH, WEEK)
OVER_QUOTA, REFUSE = "over-quota", "refuse"
AT_LIMIT = (OVER_QUOTA, REFUSE)
#: Percentages of a budget at which its team and the admins are told.
THRESHOLDS = (80, 100)
#: Largest budget any team or user may be given (GPU-hours per period).
MAX_GPU_HOURS = 10_000_000
#: Longest user name a budget may name (JupyterHub's own column is 255).
MAX_USER_CHARS = 255

_US_PER_HOUR = 3600 * 10**6
#: One usage unit is one milli-GPU held for one microsecond.
UNITS_PER_MILLI_GPU_HOUR = _US_PER_HOUR

OK, WARNING, EXHAUSTED = "ok", "warning", "exhausted"


class BudgetError(ValueError):
    """A budget that cannot be accepted; the message says what to fix."""


@dataclass(frozen=True)
class Budget:
    """GPU-hours a team (``user`` None) or one user of a team may use per period."""

    team: str
    #: The budget in milli-GPU-hours (``1500`` = 1.5 GPU-hours).
    milli_gpu_hours: int
    period: str = MONTH
    at_limit: str = OVER_QUOTA
    user: str | None = None

    @property
    def key(self) -> str:
        """``team:vision`` or ``user:vision/alice``: one budget per team, one per user and team."""
        return f"team:{self.team}" if self.user is None else f"user:{self.team}/{self.user}"

    @property
    def gpu_hours(self) -> float:
        return self.milli_gpu_hours / 1000

    @property
    def scope_words(self) -> str:
        return f"team {self.team}" if self.user is None else f"{self.user} in team {self.team}"


def parse_gpu_hours(value: object) -> int:
    """A number of GPU-hours (``100``, ``"12.5"``) as integer milli-GPU-hours, above 0."""
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise BudgetError(f"'gpu_hours' must be a number of GPU-hours, not {type(value).__name__}")
    text = repr(value) if isinstance(value, float) else str(value).strip()
    if len(text) > 32:
        raise BudgetError("'gpu_hours' is written with more than 32 characters")
    try:
        dec = Decimal(text)
    except DecimalException:
        raise BudgetError(f"'gpu_hours' must be a number of GPU-hours, not {text[:20]!r}") from None
    if not dec.is_finite() or dec <= 0:
        raise BudgetError(f"'gpu_hours' must be a number above 0, not {text[:20]}")
    if dec > MAX_GPU_HOURS:
        raise BudgetError(f"'gpu_hours' may be at most {MAX_GPU_HOURS:,} per period")
    milli = dec * 1000
    if milli != milli.to_integral_value():
        raise BudgetError(f"'gpu_hours' is finer than a thousandth of a GPU-hour: {text[:20]}")
    return int(milli)


_BUDGET_KEYS = {"team", "user", "gpu_hours", "period", "at_limit"}


def budget_from_dict(data: object, teams: Iterable[str]) -> Budget:
    """One budget as an admin gives it (``{"team", "gpu_hours", "period", "at_limit", "user"}``),
    checked against the catalog's ``teams``; :class:`BudgetError` says what is wrong."""
    if not isinstance(data, Mapping):
        raise BudgetError("a budget must be an object with 'team' and 'gpu_hours'")
    unknown = sorted(str(k)[:40] for k in data if k not in _BUDGET_KEYS)
    if unknown:
        raise BudgetError(f"unknown budget field(s): {', '.join(map(repr, unknown[:5]))}")
    team = data.get("team")
    if not is_slug(team):
        raise BudgetError("'team' must be a team name (lower-case letters, digits and '-')")
    if team not in set(teams):
        raise BudgetError(f"there is no team {team!r}; add the team first")
    user = data.get("user")
    if user is not None:
        if not isinstance(user, str) or not user or len(user) > MAX_USER_CHARS or not user.isprintable():
            raise BudgetError(f"'user' must be a JupyterHub user name of 1 to {MAX_USER_CHARS} printable characters")
    period = data.get("period", MONTH)
    if period not in PERIODS:
        raise BudgetError(f"'period' must be one of {', '.join(PERIODS)}")
    at_limit = data.get("at_limit", OVER_QUOTA)
    if at_limit not in AT_LIMIT:
        raise BudgetError(f"'at_limit' must be one of {', '.join(AT_LIMIT)}")
    if "gpu_hours" not in data:
        raise BudgetError("'gpu_hours' is required: the GPU-hours per period")
    return Budget(str(team), parse_gpu_hours(data["gpu_hours"]), str(period), str(at_limit), user)


def budget_to_dict(b: Budget) -> dict[str, Any]:
    out: dict[str, Any] = {
        "key": b.key,
        "team": b.team,
        "gpu_hours": b.gpu_hours,
        "period": b.period,
        "at_limit": b.at_limit,
    }
    if b.user is not None:
        out["user"] = b.user
    return out


# -- calendar periods -------------------------------------------------------------


def _local_date(at: datetime, tz: ZoneInfo) -> date:
    return at.replace(tzinfo=timezone.utc).astimezone(tz).date()


def _first_instant(day: date, tz: ZoneInfo) -> datetime:
    """The first instant (naive UTC) whose local date in ``tz`` is ``day`` or later.

    Local midnight may not exist (a zone that springs forward at midnight) or occur
    twice (one that falls back over it); of both readings of midnight, the earliest
    whose local date is already ``day`` is the one.
    """
    found = []
    for fold in (0, 1):
        u = datetime(day.year, day.month, day.day, fold=fold, tzinfo=tz).astimezone(timezone.utc)
        if u.astimezone(tz).date() >= day:
            found.append(u)
    return min(found).replace(tzinfo=None)


def _period_first_day(day: date, period: str) -> date:
    if period == MONTH:
        return day.replace(day=1)
    if period == WEEK:
        return day - timedelta(days=day.weekday())
    raise BudgetError(f"unknown period {period!r}; use one of {', '.join(PERIODS)}")


def _next_first_day(first: date, period: str) -> date:
    if period == MONTH:
        return date(first.year + (first.month == 12), first.month % 12 + 1, 1)
    return first + timedelta(days=7)


def period_bounds(at: datetime, period: str, zone: str) -> tuple[datetime, datetime]:
    """``[start, end)`` (naive UTC) of the calendar ``period`` that holds the instant ``at``
    (naive UTC), in the IANA ``zone``."""
    tz = ZoneInfo(zone)
    first = _period_first_day(_local_date(at, tz), period)
    return _first_instant(first, tz), _first_instant(_next_first_day(first, period), tz)


def period_words(start: datetime, period: str, zone: str) -> str:
    """``"December 2026"`` or ``"the week of 30 Nov 2026"``: a period as people name it."""
    first = _local_date(start, ZoneInfo(zone))
    if period == MONTH:
        return first.strftime("%B %Y")
    return f"the week of {first.day} {first.strftime('%b %Y')}"


# -- usage --------------------------------------------------------------------------


@dataclass(frozen=True)
class Holding:
    """One recorded workload holding GPUs: ``end`` None while it runs."""

    key: str
    team: str
    user: str
    milli: int
    start: datetime
    end: datetime | None = None


def _us(delta: timedelta) -> int:
    return delta // timedelta(microseconds=1)


def usage_units(holdings: Iterable[Holding], start: datetime, end: datetime, now: datetime) -> int:
    """Milli-GPU-microseconds held within ``[start, min(end, now))``.

    Per workload key each moment counts once, at the largest share any of its
    intervals records for it (a restart that left two overlapping records of one
    server never doubles it)."""
    hi = min(end, now)
    by_key: dict[str, list[tuple[datetime, datetime, int]]] = defaultdict(list)
    for h in holdings:
        lo_h, hi_h = max(start, h.start), min(hi, h.end or now)
        if hi_h > lo_h and h.milli > 0:
            by_key[h.key].append((lo_h, hi_h, h.milli))
    total = 0
    for spans in by_key.values():
        if len(spans) == 1:
            lo_h, hi_h, milli = spans[0]
            total += _us(hi_h - lo_h) * milli
            continue
        edges = sorted({t for lo_h, hi_h, _ in spans for t in (lo_h, hi_h)})
        for a, b in zip(edges, edges[1:], strict=False):
            held = max((m for lo_h, hi_h, m in spans if lo_h <= a and hi_h >= b), default=0)
            total += _us(b - a) * held
    return total


def applies_to(b: Budget, h: Holding) -> bool:
    return h.team == b.team and (b.user is None or h.user == b.user)


@dataclass(frozen=True)
class BudgetStatus:
    """Where one budget stands in the period that holds ``now``."""

    budget: Budget
    period_start: datetime
    period_end: datetime
    used_units: int
    zone: str

    @property
    def limit_units(self) -> int:
        return self.budget.milli_gpu_hours * UNITS_PER_MILLI_GPU_HOUR

    @property
    def used_gpu_hours(self) -> float:
        return self.used_units / UNITS_PER_MILLI_GPU_HOUR / 1000

    @property
    def percent(self) -> float:
        return 100 * self.used_units / self.limit_units

    @property
    def crossed(self) -> tuple[int, ...]:
        """The thresholds reached (``used * 100 >= threshold * limit``, exactly)."""
        return tuple(t for t in THRESHOLDS if self.used_units * 100 >= t * self.limit_units)

    @property
    def level(self) -> str:
        crossed = self.crossed
        if 100 in crossed:
            return EXHAUSTED
        return WARNING if crossed else OK

    @property
    def words(self) -> str:
        """``"Team vision has used 81.2 of its 100 GPU-hours for December 2026 (81 %)"``, or
        ``"In team vision, alice has used ..."`` (a user name keeps its case)."""
        b = self.budget
        who = f"Team {b.team} has used" if b.user is None else f"In team {b.team}, {b.user} has used"
        whose = "its" if b.user is None else "their"
        return (
            f"{who} {self.used_gpu_hours:.1f} of {whose} {b.gpu_hours:g} GPU-hours "
            f"for {period_words(self.period_start, b.period, self.zone)} ({self.percent:.0f} %)"
        )

    def resets_words(self) -> str:
        end = self.period_end.replace(tzinfo=timezone.utc).astimezone(ZoneInfo(self.zone))
        return f"{end.strftime('%d %b %Y %H:%M')} {self.zone}"

    def banner(self) -> str:
        """The sentence a banner shows (empty below 80 %)."""
        if self.level == OK:
            return ""
        if self.level == WARNING:
            return f"{self.words}."
        then = (
            "new GPU work starts only over quota, preemptible by other teams' work"
            if self.budget.at_limit == OVER_QUOTA
            else "new GPU work is refused"
        )
        return f"{self.words}: {then} until the budget resets on {self.resets_words()}."


def budget_status(b: Budget, holdings: Iterable[Holding], now: datetime, zone: str) -> BudgetStatus:
    start, end = period_bounds(now, b.period, zone)
    used = usage_units((h for h in holdings if applies_to(b, h)), start, end, now)
    return BudgetStatus(b, start, end, used, zone)


def statuses(budgets: Iterable[Budget], holdings: Sequence[Holding], now: datetime, zone: str) -> list[BudgetStatus]:
    """Every budget's status; the holdings are grouped by team once."""
    by_team: dict[str, list[Holding]] = defaultdict(list)
    for h in holdings:
        by_team[h.team].append(h)
    return [budget_status(b, by_team.get(b.team, ()), now, zone) for b in budgets]


def budgets_for(budgets: Iterable[Budget], team: str, user: str) -> list[Budget]:
    """The budgets that bind ``user``'s work in ``team``: the team's and the user's own."""
    return [b for b in budgets if b.team == team and (b.user is None or b.user == user)]


# -- admission ----------------------------------------------------------------------

ALLOW = "allow"


@dataclass(frozen=True)
class BudgetVerdict:
    """What the budgets say about new work: ``allow``, ``over-quota`` (only as preemptible
    over-quota work) or ``refuse`` (``sentence`` says why and until when)."""

    action: str
    sentence: str = ""
    status: BudgetStatus | None = None


def admission_verdict(bound: Iterable[BudgetStatus], may_burst: bool, admin_contact: str = "") -> BudgetVerdict:
    """The verdict for new work of a class that may (or may never) run over quota, from
    the statuses of the budgets that bind it: a ``refuse`` budget at 100 % refuses; an
    ``over-quota`` one admits the work only over quota, and refuses work that may not burst."""
    ask = admin_contact or "an admin"
    exhausted = [s for s in bound if s.level == EXHAUSTED]
    for s in exhausted:
        if s.budget.at_limit == REFUSE:
            return BudgetVerdict(
                REFUSE,
                f"{s.words}: new GPU work is refused until the budget resets on "
                f"{s.resets_words()}. Ask {ask} to raise the budget, or stop work you no longer need.",
                s,
            )
    if exhausted:
        s = exhausted[0]
        if not may_burst:
            return BudgetVerdict(
                REFUSE,
                f"{s.words}: new GPU work starts only over quota (preemptible) until "
                f"{s.resets_words()}, and this class of work never runs over quota. Choose a profile or job "
                f"class that may run over quota, or ask {ask} to raise the budget.",
                s,
            )
        return BudgetVerdict(OVER_QUOTA, f"{s.words}: this work runs over quota.", s)
    return BudgetVerdict(ALLOW)


# -- notices ------------------------------------------------------------------------


def thresholds_due(status: BudgetStatus, sent: Iterable[int]) -> list[int]:
    """Thresholds this period has reached and not yet told (each once per period)."""
    done = set(sent)
    return [t for t in status.crossed if t not in done]


#: Version of the webhook's JSON body (docs/admin.md).
WEBHOOK_SCHEMA = "gpulab.budget-threshold/v1"


def _iso_z(dt: datetime) -> str:
    return dt.replace(microsecond=0).isoformat() + "Z"


def webhook_body(status: BudgetStatus, threshold: int, members: Sequence[str], hub_url: str = "") -> dict[str, Any]:
    """The JSON an admin's webhook receives when ``status`` reaches ``threshold`` (docs/admin.md)."""
    b = status.budget
    return {
        "schema": WEBHOOK_SCHEMA,
        "event": "budget.threshold",
        # The same for every attempt of one notice: a receiver drops repeats by it (a POST
        # that timed out may have arrived, and is sent again).
        "id": f"{b.key}@{_iso_z(status.period_start)}#{threshold}",
        "threshold_percent": threshold,
        "budget": budget_to_dict(b),
        "period": {
            "kind": b.period,
            "start": _iso_z(status.period_start),
            "end": _iso_z(status.period_end),
            "time_zone": status.zone,
            "name": period_words(status.period_start, b.period, status.zone),
        },
        "used_gpu_hours": round(status.used_gpu_hours, 3),
        "percent": round(status.percent, 1),
        "at_limit": b.at_limit,
        "members": list(members),
        "message": status.banner(),
        "hub_url": hub_url,
    }
