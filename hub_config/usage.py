"""Usage accounting: GPU-hours per team and user, cost, reclaims, jobs, utilisation.

History comes from the ledger: :func:`attach` subscribes to the process
ledger and records one interval per workload key (opened on the first
``add``, closed on ``remove``). Recording is idempotent by key: a hub restart
re-adopts running workloads, which finds the interval still open and keeps
it, so nothing is counted twice. Open intervals whose workload is no longer
in the ledger (it died while the hub was down and was never re-adopted) are
closed by a periodic reconcile.

Other features' records are read through small functions here that degrade
to ``None`` when their tables do not exist: the idle culler's reclaims
and the notebook jobs.
"""

from __future__ import annotations

import logging
from bisect import bisect_right
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from sqlalchemy import Boolean, DateTime, Float, Index, Integer, String, inspect, select, text, update
from sqlalchemy.orm import Mapped, Session, mapped_column, sessionmaker
from traitlets import Float as TFloat
from traitlets import TraitError, Unicode, validate
from traitlets.config import Configurable

from spawner.catalog import Catalog
from spawner.ledger import Workload

from .catalog_store import iso, utcnow
from .db import Base

log = logging.getLogger("gpulab.usage")


class GPULabUsage(Configurable):
    """Where usage figures come from."""

    reconcile_interval = TFloat(
        60.0,
        config=True,
        help="""Seconds between reconciles: usage intervals left open for workloads the
        ledger no longer holds are closed, and (with NVML) GPU utilisation is sampled.""",
    )
    reclaims_table = Unicode(
        "",
        config=True,
        help="""Table of the idle culler's events in gpulab's database. Default: the
        first table with the culler's audit event columns (`idle_gpu_hours`, `action`,
        `gpu_milli`, `team`, `user`, `kind`, `at`). Absent: reclaim figures are reported as unknown.""",
    )
    jobs_table = Unicode(
        "",
        config=True,
        help="""Table of notebook jobs in gpulab's database. Default: the first table
        with `job_class`, `state`, `team` and `user` columns. Absent: jobs are not reported.""",
    )
    currency = Unicode(
        "",
        config=True,
        help="""Currency of the prices per GPU-hour and of every cost shown (admin page,
        usage API and CSV), e.g. `"EUR"` or `"USD"`. Empty: costs are plain numbers in
        whatever unit the prices were given.""",
    )
    time_zone = Unicode(
        "UTC",
        config=True,
        help="""IANA time zone (e.g. `"Europe/Berlin"`) of the usage charts' buckets: a day
        bucket is a calendar day from local midnight to midnight (23 or 25 hours across a
        daylight-saving change), an hour bucket a clock hour. Also the zone the bucket labels are in.""",
    )

    @validate("time_zone")
    def _valid_zone(self, proposal):
        value = proposal["value"]
        try:
            ZoneInfo(value)
        except (ZoneInfoNotFoundError, ValueError):
            raise TraitError(f"c.GPULabUsage.time_zone: unknown time zone {value!r}; "
                             "use an IANA name such as 'UTC' or 'Europe/Berlin'") from None
        return value


class UsageInterval(Base):
    """One workload holding GPUs from ``started_at`` to ``ended_at`` (open: ``None``)."""

    __tablename__ = "gpulab_usage"
    __table_args__ = (
        # At most one open interval per workload key: recording is idempotent.
        Index("ix_gpulab_usage_open_key", "key", unique=True,
              sqlite_where=text("ended_at IS NULL"), postgresql_where=text("ended_at IS NULL")),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    key: Mapped[str] = mapped_column(String(255), index=True)
    team: Mapped[str] = mapped_column(String(63), index=True)
    user: Mapped[str] = mapped_column(String(255))
    profile: Mapped[str] = mapped_column(String(63))
    kind: Mapped[str] = mapped_column(String(32))
    gpu_milli: Mapped[int] = mapped_column(Integer)
    gpu_model: Mapped[str | None] = mapped_column(String(64), nullable=True)
    over_quota: Mapped[bool] = mapped_column(Boolean)
    started_at: Mapped[datetime] = mapped_column(DateTime, index=True)
    ended_at: Mapped[datetime | None] = mapped_column(DateTime, nullable=True)


class UtilisationSample(Base):
    """GPU utilisation of one workload's devices at one moment (NVML)."""

    __tablename__ = "gpulab_util_sample"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    at: Mapped[datetime] = mapped_column(DateTime, index=True)
    key: Mapped[str] = mapped_column(String(255))
    team: Mapped[str] = mapped_column(String(63))
    user: Mapped[str] = mapped_column(String(255))
    util_pct: Mapped[float] = mapped_column(Float)


class UsageRecorder:
    """Ledger observer writing usage intervals; also the reconcile loop."""

    def __init__(self, runtime, sessions: sessionmaker[Session], settings: GPULabUsage):
        self.runtime = runtime
        self.sessions = sessions
        self.settings = settings
        self._callback = None

    def model_of(self, w: Workload) -> str | None:
        profile = self.runtime.catalog.profile(w.profile)
        if profile is not None and profile.gpu_model:
            return profile.gpu_model
        packer = getattr(self.runtime, "packer", None)
        placement = packer.placement(w.key) if packer is not None else None
        if placement is not None and placement.shares:
            return packer.devices[placement.shares[0][0]].model
        return None

    def observe(self, event: str, w: Workload) -> None:
        if w.milli <= 0:
            return
        now = utcnow()
        with self.sessions.begin() as s:
            open_row = s.scalars(select(UsageInterval).where(
                UsageInterval.key == w.key, UsageInterval.ended_at.is_(None))).first()
            if event == "remove":
                if open_row is not None:
                    open_row.ended_at = now
                return
            if open_row is not None:
                # confirm, or re-adoption after a restart: the interval goes on. The device
                # model of a profile without one is known once the work is placed.
                if open_row.gpu_model is None:
                    open_row.gpu_model = self.model_of(w)
                return
            s.add(UsageInterval(key=w.key, team=w.team, user=w.user, profile=w.profile, kind=w.kind,
                                gpu_milli=w.milli, gpu_model=self.model_of(w), over_quota=w.over_quota,
                                started_at=now))

    def reconcile(self) -> int:
        """Close open intervals of workloads the ledger no longer holds."""
        live = {w.key for w in self.runtime.ledger.workloads()}
        with self.sessions.begin() as s:
            stale = [k for k in s.scalars(select(UsageInterval.key).where(UsageInterval.ended_at.is_(None)))
                     if k not in live]
            if stale:
                s.execute(update(UsageInterval).where(UsageInterval.key.in_(stale),
                                                      UsageInterval.ended_at.is_(None)).values(ended_at=utcnow()))
        if stale:
            log.info("gpulab: closed usage of %d workload(s) no longer running: %s", len(stale), ", ".join(stale[:5]))
        self.sample_utilisation()
        return len(stale)

    def sample_utilisation(self) -> None:
        """With NVML, record each workload's device utilisation; without, nothing (never a guess)."""
        runtime = self.runtime
        if runtime.inventory_source != "nvml" or runtime.packer is None:
            return
        try:
            import pynvml

            pynvml.nvmlInit()
        except Exception:
            return
        try:
            util: dict[int, float] = {}
            for idx in runtime.packer.devices:
                handle = pynvml.nvmlDeviceGetHandleByIndex(idx)
                util[idx] = float(pynvml.nvmlDeviceGetUtilizationRates(handle).gpu)
        except Exception as e:
            log.warning("gpulab: NVML utilisation read failed: %s", e)
            return
        finally:
            try:
                pynvml.nvmlShutdown()
            except Exception:
                pass
        now = utcnow()
        rows = []
        for w in runtime.ledger.workloads():
            placement = runtime.packer.placement(w.key)
            if placement is None or not placement.shares:
                continue
            values = [util[i] for i, _ in placement.shares if i in util]
            if values:
                rows.append(UtilisationSample(at=now, key=w.key, team=w.team, user=w.user,
                                              util_pct=sum(values) / len(values)))
        if rows:
            with self.sessions.begin() as s:
                s.add_all(rows)

    def start(self) -> None:
        self._callback = self.observe
        self.runtime.ledger.subscribe(self._callback)
        # Workloads adopted before we subscribed (none, normally: hooks run first).
        for w in self.runtime.ledger.workloads():
            self.observe("add", w)
        try:
            from tornado.ioloop import PeriodicCallback

            pc = PeriodicCallback(self._safe_reconcile, self.settings.reconcile_interval * 1000)
            pc.start()
            self._periodic = pc
        except RuntimeError:  # no event loop in this process (a script): no reconcile loop
            self._periodic = None

    def _safe_reconcile(self) -> None:
        try:
            self.reconcile()
        except Exception:
            log.exception("gpulab: usage reconcile failed")


def attach(runtime, sessions: sessionmaker[Session], config) -> UsageRecorder:
    recorder = UsageRecorder(runtime, sessions, GPULabUsage(config=config))
    recorder.start()
    return recorder


# --------------------------------------------------------------------------
# Reports


def price_for(catalog: Catalog, model: str | None) -> float:
    prices = catalog.prices
    if model and model in prices:
        return prices[model]
    return prices.get("*", 0.0)


@dataclass
class Totals:
    gpu_hours: float = 0.0
    in_quota_gpu_hours: float = 0.0
    burst_gpu_hours: float = 0.0
    cost: float = 0.0
    util_sum: float = 0.0
    util_n: int = 0
    by_model: dict[str, float] = field(default_factory=dict)

    def add(self, hours: float, over_quota: bool, cost: float, model: str | None) -> None:
        self.gpu_hours += hours
        if over_quota:
            self.burst_gpu_hours += hours
        else:
            self.in_quota_gpu_hours += hours
        self.cost += cost
        self.by_model[model or "unknown"] = self.by_model.get(model or "unknown", 0.0) + hours

    def to_dict(self) -> dict[str, Any]:
        return {
            "gpu_hours": round(self.gpu_hours, 6),
            "in_quota_gpu_hours": round(self.in_quota_gpu_hours, 6),
            "burst_gpu_hours": round(self.burst_gpu_hours, 6),
            "cost": round(self.cost, 4),
            "utilisation_pct": round(self.util_sum / self.util_n, 1) if self.util_n else None,
            "gpu_hours_by_model": {k: round(v, 6) for k, v in sorted(self.by_model.items())},
        }


def _find_table(engine, explicit: str, needed: set[str]):
    """The reflected table named ``explicit``, else the first with columns ``needed``; or ``None``."""
    from sqlalchemy import MetaData, Table

    insp = inspect(engine)
    names = insp.get_table_names()
    if explicit:
        candidates = [explicit] if explicit in names else []
    else:
        candidates = [n for n in sorted(names) if needed <= {c["name"] for c in insp.get_columns(n)}]
    if not candidates:
        return None
    return Table(candidates[0], MetaData(), autoload_with=engine)


def _time_value(column, dt: datetime):
    """Bind ``dt`` (naive UTC) for a timestamp column: epoch seconds for numeric columns."""
    from sqlalchemy import Float as SAFloat
    from sqlalchemy import Integer as SAInteger
    from sqlalchemy import Numeric

    if isinstance(column.type, (SAFloat, SAInteger, Numeric)):
        return dt.replace(tzinfo=timezone.utc).timestamp()
    return dt


#: Columns the idle culler's audit events carry (hub_config/api/idle.py).
RECLAIM_COLUMNS = {"idle_gpu_hours", "gpu_milli", "action", "team", "user", "kind", "at"}


def next_gpu_holds(sessions: sessionmaker[Session], users: set[str], after: datetime) -> dict[str, list[datetime]]:
    """Per user, the sorted start times of their GPU holdings that began after ``after``."""
    if not users:
        return {}
    with sessions() as s:
        rows = s.execute(select(UsageInterval.user, UsageInterval.started_at)
                         .where(UsageInterval.user.in_(sorted(users)), UsageInterval.started_at > after,
                                UsageInterval.gpu_milli > 0)).all()
    out: dict[str, list[datetime]] = defaultdict(list)
    for user, started in rows:
        out[user].append(started)
    for starts in out.values():
        starts.sort()
    return out


def freed_until(holds: dict[str, list[datetime]], user: str, reclaimed_at: datetime) -> datetime | None:
    """When ``user`` next held a GPU after a reclaim at ``reclaimed_at`` (None: not since)."""

    starts = holds.get(user, [])
    i = bisect_right(starts, reclaimed_at)
    return starts[i] if i < len(starts) else None


def reclaim_figures(sessions: sessionmaker[Session], settings: GPULabUsage, start: datetime, end: datetime,
                    now: datetime | None = None,
                    ) -> tuple[str | None, dict[tuple[str, str], tuple[float, float]] | None]:
    """``(table, {(team, user): (idle GPU-hours before reclaim, GPU-hours freed)})`` of the
    reclaims in ``[start, end)``, or ``(None, None)`` when the culler's table is absent.

    *Idle GPU-hours before reclaim*: the GPUs held times the idle time the culler
    proved before it reclaimed them (waste that happened). *GPU-hours freed*: the
    GPUs taken back times the time from the reclaim until the user next held a
    GPU again, or ``now`` (what the reclaim gave back to everyone else). A kernel
    shutdown frees no allocation (the server keeps its GPU): 0 freed.
    """
    from spawner.idle import gpu_hours_freed

    now = now or utcnow()
    engine = sessions.kw["bind"]
    try:
        table = _find_table(engine, settings.reclaims_table, RECLAIM_COLUMNS)
    except Exception as e:
        log.warning("gpulab: cannot inspect gpulab's database for reclaims: %s", e)
        return None, None
    if table is None:
        return None, None
    c = table.c
    q = (select(c.at, c.team, c.user, c.gpu_milli, c.action, c.idle_gpu_hours)
         .where(c.kind == "reclaim", c.at >= _time_value(c.at, start), c.at < _time_value(c.at, end)))
    try:
        with engine.connect() as conn:
            rows = conn.execute(q).all()
    except Exception as e:
        log.warning("gpulab: cannot read the culler's reclaims from %s: %s", table.name, e)
        return table.name, None
    at_of = [(datetime.fromtimestamp(float(at), timezone.utc).replace(tzinfo=None)
              if isinstance(at, (int, float)) else at) for at, *_ in rows]
    holds = next_gpu_holds(sessions, {r[2] for r in rows}, min(at_of)) if rows else {}
    epoch = now.replace(tzinfo=timezone.utc).timestamp()
    out: dict[tuple[str, str], tuple[float, float]] = {}
    for (_, team, user, milli, action, idle_hours), at in zip(rows, at_of):
        freed = 0.0
        if action == "stop-server":
            nxt = freed_until(holds, user, at)
            freed = gpu_hours_freed(int(milli or 0), at.replace(tzinfo=timezone.utc).timestamp(),
                                    None if nxt is None else nxt.replace(tzinfo=timezone.utc).timestamp(), epoch)
        idle0, freed0 = out.get((team or "", user or ""), (0.0, 0.0))
        out[(team or "", user or "")] = (idle0 + float(idle_hours or 0), freed0 + freed)
    return table.name, out


def jobs_by_state(sessions: sessionmaker[Session], settings: GPULabUsage, start: datetime,
                  end: datetime) -> tuple[str | None, dict[tuple[str, str], dict[str, int]] | None]:
    """``(table, {(team, user): {state: count}})`` of jobs created in the period, or ``(None, None)``.

    Jobs live in gpulab's database with ``team``, ``user``, ``state``,
    ``job_class`` and ``created_at`` columns.
    """
    from sqlalchemy import func

    engine = sessions.kw["bind"]
    try:
        table = _find_table(engine, settings.jobs_table, {"job_class", "state", "team", "user"})
    except Exception as e:
        log.warning("gpulab: cannot inspect gpulab's database for jobs: %s", e)
        return None, None
    if table is None:
        return None, None
    c = table.c
    q = select(c.team, c.user, c.state, func.count()).group_by(c.team, c.user, c.state)
    if "created_at" in c:
        q = q.where(c.created_at >= _time_value(c.created_at, start), c.created_at < _time_value(c.created_at, end))
    try:
        with engine.connect() as conn:
            rows = conn.execute(q).all()
    except Exception as e:
        log.warning("gpulab: cannot read jobs from %s: %s", table.name, e)
        return table.name, None
    out: dict[tuple[str, str], dict[str, int]] = defaultdict(dict)
    for team, user, state, n in rows:
        out[(team or "", user or "")][state] = int(n)
    return table.name, dict(out)


def _merge_counts(into: dict[str, int], more: dict[str, int]) -> None:
    for k, v in more.items():
        into[k] = into.get(k, 0) + v


def _reclaim_totals(figures: list[tuple[float, float]], unknown: bool) -> dict[str, float | None]:
    """The two reclaim figures, named for what they measure (None: the culler's table is absent)."""
    if unknown:
        return {"idle_gpu_hours_before_reclaim": None, "gpu_hours_freed": None}
    return {"idle_gpu_hours_before_reclaim": round(sum(i for i, _ in figures), 6),
            "gpu_hours_freed": round(sum(f for _, f in figures), 6)}


def bucket_edges(start: datetime, end: datetime, bucket: timedelta, zone: str = "UTC") -> list[datetime]:
    """Bucket boundaries (naive UTC) covering ``[start, end)``: calendar days from local
    midnight when ``bucket`` is a day or more, else clock hours, in the IANA ``zone``.

    The first bucket starts at or before ``start`` (the day or hour it falls in); the
    last ends at or after ``end``. Days across a daylight-saving change have 23 or 25 hours.
    """
    tz = ZoneInfo(zone)
    local = start.replace(tzinfo=timezone.utc).astimezone(tz)
    edges = []
    if bucket >= timedelta(days=1):
        day = local.date()
        while True:
            edge = datetime(day.year, day.month, day.day, tzinfo=tz).astimezone(timezone.utc).replace(tzinfo=None)
            edges.append(edge)
            if edge >= end:
                break
            day += timedelta(days=1)
    else:
        edge = local.replace(minute=0, second=0, microsecond=0).astimezone(timezone.utc).replace(tzinfo=None)
        while True:
            edges.append(edge)
            if edge >= end:
                break
            edge += bucket
    if len(edges) == 1:
        edges.append(edges[0] + bucket)
    return edges


def local_iso(dt: datetime, zone: str) -> str:
    """A naive UTC time as ISO 8601 in ``zone``, with its offset ("2026-11-30T00:00:00+01:00")."""
    return dt.replace(tzinfo=timezone.utc).astimezone(ZoneInfo(zone)).isoformat(timespec="seconds")


def period_report(runtime, sessions: sessionmaker[Session], settings: GPULabUsage, start: datetime,
                  end: datetime, bucket: timedelta = timedelta(days=1), *, others: bool = True) -> dict[str, Any]:
    """GPU-hours, cost, reclaims, jobs and utilisation per team and user over ``[start, end)``.

    ``others=False`` skips the culler's and the jobs' tables (metrics scrapes).
    """
    now = utcnow()
    catalog: Catalog = runtime.catalog
    teams: dict[str, Totals] = defaultdict(Totals)
    users: dict[tuple[str, str], Totals] = defaultdict(Totals)
    series: dict[str, dict[int, float]] = defaultdict(lambda: defaultdict(float))
    zone = settings.time_zone or "UTC"
    edges = bucket_edges(start, end, bucket, zone)
    n_buckets = len(edges) - 1
    with sessions() as s:
        rows = s.scalars(select(UsageInterval).where(
            UsageInterval.started_at < end,
            (UsageInterval.ended_at.is_(None)) | (UsageInterval.ended_at > start))).all()
        samples = s.scalars(select(UtilisationSample).where(
            UtilisationSample.at >= start, UtilisationSample.at < end)).all()
    for r in rows:
        lo = max(start, r.started_at)
        hi = min(end, r.ended_at or now, now)
        if hi <= lo:
            continue
        hours = (hi - lo).total_seconds() / 3600 * r.gpu_milli / 1000
        cost = hours * price_for(catalog, r.gpu_model)
        teams[r.team].add(hours, r.over_quota, cost, r.gpu_model)
        users[(r.team, r.user)].add(hours, r.over_quota, cost, r.gpu_model)
        # Split into the chart's calendar buckets.
        t = lo
        i = bisect_right(edges, t) - 1
        while t < hi and i < n_buckets:
            b_end = min(hi, edges[i + 1])
            series[r.team][i] += (b_end - t).total_seconds() / 3600 * r.gpu_milli / 1000
            t = b_end
            i += 1
    for smp in samples:
        for tot in (teams[smp.team], users[(smp.team, smp.user)]):
            tot.util_sum += smp.util_pct
            tot.util_n += 1
    reclaim_table, reclaims = reclaim_figures(sessions, settings, start, end) if others else (None, None)
    jobs_table, jobs = jobs_by_state(sessions, settings, start, end) if others else (None, None)
    names = sorted(set(teams) | set(catalog.teams) | {t for t, _ in (reclaims or {})} | {t for t, _ in (jobs or {})})
    out_teams = []
    for name in names:
        d = {"team": name, **teams[name].to_dict()}
        d.update(_reclaim_totals([h for (t, _), h in (reclaims or {}).items() if t == name], reclaims is None))
        if jobs is not None:
            counts: dict[str, int] = {}
            for (t, _), c in jobs.items():
                if t == name:
                    _merge_counts(counts, c)
            d["jobs"] = counts
        else:
            d["jobs"] = None
        user_names = sorted({u for t, u in users if t == name} | {u for t, u in (reclaims or {}) if t == name and u}
                            | {u for t, u in (jobs or {}) if t == name and u})
        d["users"] = []
        for u in user_names:
            ud = {"user": u, **users[(name, u)].to_dict()}
            ud.update(_reclaim_totals([reclaims.get((name, u), (0.0, 0.0))] if reclaims else [], reclaims is None))
            ud["jobs"] = dict(jobs.get((name, u), {})) if jobs is not None else None
            d["users"].append(ud)
        d["series"] = [round(series[name].get(i, 0.0), 6) for i in range(n_buckets)]
        out_teams.append(d)
    return {
        "start": iso(start), "end": iso(end), "bucket_seconds": int(bucket.total_seconds()),
        "time_zone": zone,
        "buckets": [local_iso(e, zone) for e in edges[:-1]],
        "currency": settings.currency,
        "teams": out_teams,
        "total": {
            "gpu_hours": round(sum(t.gpu_hours for t in teams.values()), 6),
            "cost": round(sum(t.cost for t in teams.values()), 4),
            **_reclaim_totals(list((reclaims or {}).values()), reclaims is None),
        },
        "prices": dict(catalog.prices),
        "sources": {
            "gpu_hours": "gpulab_usage",
            "utilisation": "nvml" if samples else None,
            "reclaims": reclaim_table if reclaims is not None else None,
            "jobs": jobs_table if jobs is not None else None,
        },
    }


def current_report(runtime) -> list[dict[str, Any]]:
    """What each team (and each of its users) holds right now, from the ledger."""
    ledger = runtime.ledger
    names = sorted(set(runtime.catalog.teams) | {w.team for w in ledger.workloads()})
    out = []
    for name in names:
        u = ledger.usage(name)
        per_user: dict[str, dict[str, int]] = defaultdict(lambda: {"held_milli": 0, "in_quota_milli": 0,
                                                                   "over_quota_milli": 0})
        for w in ledger.workloads(name):
            pu = per_user[w.user]
            pu["held_milli"] += w.milli
            pu["over_quota_milli" if w.over_quota else "in_quota_milli"] += w.milli
        out.append({
            "team": name, "guarantee_milli": u.guarantee_milli, "burst_milli": u.burst_milli,
            "held_milli": u.held_milli, "in_quota_milli": u.in_quota_milli,
            "over_quota_milli": u.over_quota_milli, "reserved_milli": u.reserved_milli,
            "workloads": u.workloads,
            "users": [{"user": k, **v} for k, v in sorted(per_user.items())],
        })
    return out


def open_interval_count(sessions: sessionmaker[Session], key: str) -> int:
    from sqlalchemy import func

    with sessions() as s:
        return s.scalar(select(func.count(UsageInterval.id)).where(
            UsageInterval.key == key, UsageInterval.ended_at.is_(None))) or 0
