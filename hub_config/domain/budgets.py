"""GPU-hour budgets in the hub: stored budgets, their status from the usage history, the
admission check both spawners and the jobs service call, and the threshold notices.

The arithmetic is :mod:`spawner.core.budgets`; this module reads and writes gpulab's
database. Budgets are edited by admins (``/hub/api/gpulab/budgets``), audited like catalog
edits, and kept in their own table, so a budget survives catalog edits and a hub restart.
A budget whose team no longer exists binds nothing and is shown as such.

Threshold notices (80 % and 100 %, each once per budget and period) are rows of
``gpulab_budget_notice``, unique by (budget, period, threshold): the row is the "once", so a
hub restart or two checks at once never tell twice. The webhook delivery of each notice is
:mod:`.budget_webhook`.
"""

from __future__ import annotations

import json
import logging
from datetime import datetime
from typing import Any

from sqlalchemy import DateTime, Integer, String, Text, UniqueConstraint, select
from sqlalchemy.exc import IntegrityError, SQLAlchemyError
from sqlalchemy.orm import Mapped, Session, mapped_column, sessionmaker
from traitlets import Float
from traitlets import Integer as TInteger
from traitlets.config import Configurable

from hub_config.domain.catalog_store import add_audit_entry
from hub_config.domain.usage_records import GPULabUsage, UsageInterval
from hub_config.storage.db import Base, iso, utcnow
from spawner.core.budgets import (
    ALLOW,
    REFUSE,
    Budget,
    BudgetStatus,
    BudgetVerdict,
    Holding,
    admission_verdict,
    budget_from_dict,
    budget_to_dict,
    budgets_for,
    period_bounds,
    statuses,
    thresholds_due,
)

log = logging.getLogger("gpulab.budgets")

#: Longest webhook URL an admin may set.
MAX_WEBHOOK_URL = 2048


class GPULabBudgets(Configurable):
    """How budgets are checked and their thresholds told (the budgets themselves are edited
    on the admin page or ``/hub/api/gpulab/budgets``)."""

    check_interval = Float(
        60.0,
        min=1.0,
        config=True,
        help="""Seconds between checks of every budget against the usage history: a budget that
        reached 80 % or 100 % of its period since the last check gets its notice (banners show
        the live figure at once; the webhook is told at the next check).""",
    )
    webhook_timeout = Float(
        10.0,
        min=0.5,
        config=True,
        help="Seconds one webhook POST may take (connect and answer) before it counts as failed.",
    )
    webhook_attempts = TInteger(
        6,
        min=1,
        config=True,
        help="""Attempts per notice before the hub gives up on it (shown on the admin page as
        failed, with the last error). A 2xx answer delivers; a 5xx, 408, 429 or a network error
        is retried; any other answer (a 4xx: the receiver refuses the body) is not.""",
    )
    webhook_retry_seconds = Float(
        30.0,
        min=0.0,
        config=True,
        help="""Seconds before the first retry of a failed webhook POST; each further retry waits
        twice as long (30 s, 1 min, 2 min, ...), at most an hour.""",
    )


class BudgetRow(Base):
    """One budget: a team's (``user`` empty) or one user's in a team."""

    __tablename__ = "gpulab_budget"

    key: Mapped[str] = mapped_column(String(330), primary_key=True)
    team: Mapped[str] = mapped_column(String(63), index=True)
    user: Mapped[str] = mapped_column(String(255), default="")
    milli_gpu_hours: Mapped[int] = mapped_column(Integer)
    period: Mapped[str] = mapped_column(String(16))
    at_limit: Mapped[str] = mapped_column(String(16))
    updated_at: Mapped[datetime] = mapped_column(DateTime)
    updated_by: Mapped[str] = mapped_column(String(255))

    def budget(self) -> Budget:
        return Budget(self.team, self.milli_gpu_hours, self.period, self.at_limit, self.user or None)


class BudgetSettingsRow(Base):
    """The admin's webhook (one row)."""

    __tablename__ = "gpulab_budget_settings"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    webhook_url: Mapped[str] = mapped_column(String(MAX_WEBHOOK_URL), default="")
    updated_at: Mapped[datetime] = mapped_column(DateTime)
    updated_by: Mapped[str] = mapped_column(String(255))


#: A notice's webhook delivery: waiting for its next attempt, delivered, given up, or not
#: sent because no webhook URL was set when the threshold was reached.
PENDING, DELIVERED, FAILED, NO_WEBHOOK = "pending", "delivered", "failed", "no-webhook"


class BudgetNoticeRow(Base):
    """A budget reached a threshold in a period: told once (the unique key is the "once")."""

    __tablename__ = "gpulab_budget_notice"
    __table_args__ = (UniqueConstraint("budget_key", "period_start", "threshold", name="uq_gpulab_budget_notice"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    budget_key: Mapped[str] = mapped_column(String(330), index=True)
    team: Mapped[str] = mapped_column(String(63))
    period_start: Mapped[datetime] = mapped_column(DateTime)
    threshold: Mapped[int] = mapped_column(Integer)
    at: Mapped[datetime] = mapped_column(DateTime)
    #: The webhook body, as sent (and re-sent on retries).
    body: Mapped[str] = mapped_column(Text)
    state: Mapped[str] = mapped_column(String(16))
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    next_attempt_at: Mapped[datetime | None] = mapped_column(DateTime, nullable=True)
    delivered_at: Mapped[datetime | None] = mapped_column(DateTime, nullable=True)
    last_error: Mapped[str] = mapped_column(String(500), default="")

    def to_dict(self) -> dict[str, Any]:
        return {
            "budget": self.budget_key,
            "team": self.team,
            "period_start": iso(self.period_start),
            "threshold_percent": self.threshold,
            "at": iso(self.at),
            "webhook": self.state,
            "attempts": self.attempts,
            "delivered_at": iso(self.delivered_at),
            "last_error": self.last_error,
        }


def status_dict(s: BudgetStatus) -> dict[str, Any]:
    """A budget and where it stands, as the pages, the sidebar and the API show it."""
    return {
        **budget_to_dict(s.budget),
        "period_start": iso(s.period_start),
        "period_end": iso(s.period_end),
        "time_zone": s.zone,
        "used_gpu_hours": round(s.used_gpu_hours, 3),
        "percent": round(s.percent, 1),
        "level": s.level,
        "banner": s.banner(),
    }


class BudgetBook:
    """The hub's budgets: stored rows, their status, the admission check, the notices."""

    def __init__(self, runtime: Any, sessions: sessionmaker[Session], usage: GPULabUsage, settings: GPULabBudgets):
        self.runtime = runtime
        self.sessions = sessions
        self.usage = usage
        self.settings = settings
        #: The periodic check (:class:`.budget_webhook.BudgetNotifier`), set when the hub attaches it.
        self.notifier: Any = None

    @property
    def zone(self) -> str:
        return self.usage.time_zone or "UTC"

    # -- budgets -----------------------------------------------------------------

    def budgets(self) -> list[Budget]:
        with self.sessions() as s:
            return [r.budget() for r in s.scalars(select(BudgetRow).order_by(BudgetRow.key))]

    def set_budget(self, data: dict[str, Any], actor: str) -> Budget:
        """Store (create or replace) one budget, checked by the core; audited. :class:`BudgetError`
        (from :func:`budget_from_dict`) changes nothing."""
        budget = budget_from_dict(data, self.runtime.catalog.teams)
        with self.sessions.begin() as s:
            row = s.get(BudgetRow, budget.key)
            old = budget_to_dict(row.budget()) if row is not None else None
            if row is None:
                row = BudgetRow(key=budget.key, team=budget.team, user=budget.user or "")
                s.add(row)
            row.milli_gpu_hours, row.period, row.at_limit = budget.milli_gpu_hours, budget.period, budget.at_limit
            row.updated_at, row.updated_by = utcnow(), actor
            add_audit_entry(s, actor, "budget.set", budget.key, old, budget_to_dict(budget))
        log.info("gpulab budgets: %s set to %s GPU-hours a %s (%s at 100 %%) by %s", budget.key,
                 f"{budget.gpu_hours:g}", budget.period, budget.at_limit, actor)  # fmt: skip
        return budget

    def delete_budget(self, key: str, actor: str) -> bool:
        with self.sessions.begin() as s:
            row = s.get(BudgetRow, key)
            if row is None:
                return False
            add_audit_entry(s, actor, "budget.delete", key, budget_to_dict(row.budget()), None)
            s.delete(row)
        log.info("gpulab budgets: %s removed by %s", key, actor)
        return True

    def webhook_url(self) -> str:
        with self.sessions() as s:
            row = s.get(BudgetSettingsRow, 1)
            return row.webhook_url if row is not None else ""

    def set_webhook_url(self, url: str, actor: str) -> None:
        """Store the webhook URL (already checked by :func:`.budget_webhook.check_webhook_url`)."""
        with self.sessions.begin() as s:
            row = s.get(BudgetSettingsRow, 1)
            old = row.webhook_url if row is not None else ""
            if row is None:
                row = BudgetSettingsRow(id=1)
                s.add(row)
            row.webhook_url, row.updated_at, row.updated_by = url, utcnow(), actor
            add_audit_entry(s, actor, "budget.webhook", "webhook", {"url": old}, {"url": url})

    # -- status ------------------------------------------------------------------

    def holdings(self, budgets: list[Budget], now: datetime) -> list[Holding]:
        """The usage intervals that may count for ``budgets`` in their current periods."""
        if not budgets:
            return []
        since = min(period_bounds(now, b.period, self.zone)[0] for b in budgets)
        teams = sorted({b.team for b in budgets})
        with self.sessions() as s:
            rows = s.execute(
                select(
                    UsageInterval.key,
                    UsageInterval.team,
                    UsageInterval.user,
                    UsageInterval.gpu_milli,
                    UsageInterval.started_at,
                    UsageInterval.ended_at,
                ).where(
                    UsageInterval.team.in_(teams),
                    UsageInterval.started_at < now,
                    UsageInterval.ended_at.is_(None) | (UsageInterval.ended_at > since),
                )
            ).all()
        return [Holding(*r) for r in rows]

    def statuses(self, budgets: list[Budget] | None = None, now: datetime | None = None) -> list[BudgetStatus]:
        now = now or utcnow()
        budgets = self.budgets() if budgets is None else budgets
        return statuses(budgets, self.holdings(budgets, now), now, self.zone)

    def statuses_for(self, team: str, user: str, now: datetime | None = None) -> list[BudgetStatus]:
        """The statuses of the budgets that bind ``user``'s work in ``team``."""
        return self.statuses(budgets_for(self.budgets(), team, user), now)

    def verdict(self, team: str, user: str, may_burst: bool) -> BudgetVerdict:
        """What the budgets say about new work of ``user`` in ``team`` now (the spawners and
        the jobs service ask before they reserve)."""
        bound = budgets_for(self.budgets(), team, user)
        if not bound:
            return BudgetVerdict(ALLOW)
        return admission_verdict(self.statuses(bound), may_burst, self.runtime.admin_contact)

    def gate(self, team: str, user: str, may_burst: bool) -> BudgetVerdict:
        """:meth:`verdict` for the admission path: a database that cannot be read now refuses
        new work with a sentence (a budget is never skipped because its usage was unreadable)."""
        try:
            return self.verdict(team, user, may_burst)
        except SQLAlchemyError as e:
            log.warning("gpulab budgets: cannot read the budgets or the usage history: %s", e)
            return BudgetVerdict(
                REFUSE,
                "The hub cannot read the GPU-hour budgets right now (its database is busy or unavailable); "
                "try again shortly, or ask an admin to check gpulab's database.",
            )

    def for_user(self, user: str, teams: list[str]) -> list[dict[str, Any]]:
        """What ``user`` is told: the budgets of their teams and their own, with banners."""
        bound = [b for b in self.budgets() if b.team in teams and (b.user is None or b.user == user)]
        return [status_dict(s) for s in self.statuses(bound)]

    # -- notices -----------------------------------------------------------------

    def record_due_notices(self, now: datetime | None = None, body_for: Any = None) -> list[BudgetNoticeRow]:
        """Record a notice for each threshold a budget reached this period and has not told.

        ``body_for(status, threshold) -> dict`` builds the webhook body. Returns the new rows;
        the unique key makes a second check (or a second hub) record nothing again."""
        now = now or utcnow()
        url = self.webhook_url()
        made: list[BudgetNoticeRow] = []
        for st in self.statuses(now=now):
            if st.budget.team not in self.runtime.catalog.teams:
                continue  # a budget of a removed team binds nothing
            with self.sessions() as s:
                sent = s.scalars(
                    select(BudgetNoticeRow.threshold).where(
                        BudgetNoticeRow.budget_key == st.budget.key, BudgetNoticeRow.period_start == st.period_start
                    )
                ).all()
            for threshold in thresholds_due(st, sent):
                row = BudgetNoticeRow(
                    budget_key=st.budget.key,
                    team=st.budget.team,
                    period_start=st.period_start,
                    threshold=threshold,
                    at=now,
                    body=json.dumps(body_for(st, threshold) if body_for else {}),
                    state=PENDING if url else NO_WEBHOOK,
                    attempts=0,
                    next_attempt_at=now if url else None,
                    last_error="" if url else "no webhook URL was set",
                )
                try:
                    with self.sessions.begin() as s:
                        s.add(row)
                except IntegrityError:  # another check recorded it first: told once
                    continue
                log.info("gpulab budgets: %s reached %d %% (%s)", st.budget.key, threshold, st.words)
                made.append(row)
        return made

    def notices(self, limit: int = 50) -> list[BudgetNoticeRow]:
        with self.sessions() as s:
            return list(s.scalars(select(BudgetNoticeRow).order_by(BudgetNoticeRow.id.desc()).limit(limit)))

    def due_deliveries(self, now: datetime) -> list[BudgetNoticeRow]:
        with self.sessions() as s:
            return list(
                s.scalars(
                    select(BudgetNoticeRow)
                    .where(BudgetNoticeRow.state == PENDING, BudgetNoticeRow.next_attempt_at <= now)
                    .order_by(BudgetNoticeRow.id)
                )
            )

    def record_attempt(
        self, notice_id: int, *, delivered: bool, error: str = "", retry_at: datetime | None = None
    ) -> None:
        with self.sessions.begin() as s:
            row = s.get(BudgetNoticeRow, notice_id)
            if row is None:
                return
            row.attempts += 1
            row.last_error = error[:500]
            if delivered:
                row.state, row.delivered_at, row.next_attempt_at = DELIVERED, utcnow(), None
            elif retry_at is None:
                row.state, row.next_attempt_at = FAILED, None
            else:
                row.next_attempt_at = retry_at
