"""Usage accounting: GPU-hours per team and user, cost, reclaims, jobs, utilisation.

The history (intervals and samples) is recorded by :mod:`.usage_records`;
the idle culler's reclaims and the notebook jobs are read through their own
models (:mod:`.idle_records`, :mod:`hub_config.jobs.models`).
"""

from __future__ import annotations

import logging
from bisect import bisect_right
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import Any
from zoneinfo import ZoneInfo

from sqlalchemy import func, select
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import Session, sessionmaker

from hub_config.domain.idle_records import IdleEventRow
from hub_config.domain.usage_records import (
    GPULabUsage,
    UsageInterval,
    UtilisationSample,
    freed_until,
    next_gpu_holds,
)
from hub_config.jobs.models import JobRecord
from hub_config.storage.db import as_utc, iso, to_epoch, utcnow
from spawner.core.catalog import Catalog
from spawner.core.idle import gpu_hours_freed

log = logging.getLogger("gpulab.usage")


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
    #: GPU-hours per GPU pool (the catalog's ``pools``; from the session's profile), when it has one.
    by_pool: dict[str, float] = field(default_factory=dict)

    def add(self, hours: float, over_quota: bool, cost: float, model: str | None, pool: str = "") -> None:
        self.gpu_hours += hours
        if over_quota:
            self.burst_gpu_hours += hours
        else:
            self.in_quota_gpu_hours += hours
        self.cost += cost
        self.by_model[model or "unknown"] = self.by_model.get(model or "unknown", 0.0) + hours
        if pool:
            self.by_pool[pool] = self.by_pool.get(pool, 0.0) + hours

    def to_dict(self) -> dict[str, Any]:
        return {
            "gpu_hours": round(self.gpu_hours, 6),
            "in_quota_gpu_hours": round(self.in_quota_gpu_hours, 6),
            "burst_gpu_hours": round(self.burst_gpu_hours, 6),
            "cost": round(self.cost, 4),
            "utilisation_pct": round(self.util_sum / self.util_n, 1) if self.util_n else None,
            "gpu_hours_by_model": {k: round(v, 6) for k, v in sorted(self.by_model.items())},
            "gpu_hours_by_pool": {k: round(v, 6) for k, v in sorted(self.by_pool.items())},
        }


def reclaim_figures(
    sessions: sessionmaker[Session],
    start: datetime,
    end: datetime,
    now: datetime | None = None,
) -> dict[tuple[str, str], tuple[float, float]] | None:
    """``{(team, user): (idle GPU-hours before reclaim, GPU-hours freed)}`` of the
    reclaims in ``[start, end)``; ``None`` (logged) when the culler's records cannot be read.

    *Idle GPU-hours before reclaim*: the GPUs held times the idle time the culler
    proved before it reclaimed them (waste that happened). *GPU-hours freed*: the
    GPUs taken back times the time from the reclaim until the user next held a
    GPU again, or ``now`` (what the reclaim gave back to everyone else). A kernel
    shutdown frees no allocation (the server keeps its GPU): 0 freed.
    """
    now = now or utcnow()
    e = IdleEventRow
    try:
        with sessions() as s:
            rows = s.execute(
                select(e.at, e.team, e.user, e.gpu_milli, e.action, e.idle_gpu_hours).where(
                    e.kind == "reclaim", e.at >= as_utc(start), e.at < as_utc(end)
                )
            ).all()
    except SQLAlchemyError as err:
        log.warning("gpulab: cannot read the idle culler's reclaims: %s", err)
        return None
    holds = next_gpu_holds(sessions, {r.user for r in rows}, min(r.at for r in rows)) if rows else {}
    epoch = to_epoch(now)
    out: dict[tuple[str, str], tuple[float, float]] = {}
    for at, team, user, milli, action, idle_hours in rows:
        freed = 0.0
        if action == "stop-server":
            nxt = freed_until(holds, user, at)
            freed = gpu_hours_freed(int(milli or 0), to_epoch(at), None if nxt is None else to_epoch(nxt), epoch)
        idle0, freed0 = out.get((team or "", user or ""), (0.0, 0.0))
        out[(team or "", user or "")] = (idle0 + float(idle_hours or 0), freed0 + freed)
    return out


def jobs_by_state(
    sessions: sessionmaker[Session], start: datetime, end: datetime
) -> dict[tuple[str, str], dict[str, int]] | None:
    """``{(team, user): {state: count}}`` of the jobs created in ``[start, end)``;
    ``None`` (logged) when the jobs cannot be read."""
    j = JobRecord
    try:
        with sessions() as s:
            rows = s.execute(
                select(j.team, j.user, j.state, func.count())
                .where(j.created_at >= start, j.created_at < end)
                .group_by(j.team, j.user, j.state)
            ).all()
    except SQLAlchemyError as err:
        log.warning("gpulab: cannot read the notebook jobs: %s", err)
        return None
    out: dict[tuple[str, str], dict[str, int]] = defaultdict(dict)
    for team, user, state, n in rows:
        out[(team or "", user or "")][state] = int(n)
    return dict(out)


def _merge_counts(into: dict[str, int], more: dict[str, int]) -> None:
    for k, v in more.items():
        into[k] = into.get(k, 0) + v


def _reclaim_totals(figures: list[tuple[float, float]], unknown: bool) -> dict[str, float | None]:
    """The two reclaim figures, named for what they measure (None: the culler's table is absent)."""
    if unknown:
        return {"idle_gpu_hours_before_reclaim": None, "gpu_hours_freed": None}
    return {
        "idle_gpu_hours_before_reclaim": round(sum(i for i, _ in figures), 6),
        "gpu_hours_freed": round(sum(f for _, f in figures), 6),
    }


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


def period_report(
    runtime,
    sessions: sessionmaker[Session],
    settings: GPULabUsage,
    start: datetime,
    end: datetime,
    bucket: timedelta = timedelta(days=1),
    *,
    others: bool = True,
) -> dict[str, Any]:
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
        rows = s.scalars(
            select(UsageInterval).where(
                UsageInterval.started_at < end, (UsageInterval.ended_at.is_(None)) | (UsageInterval.ended_at > start)
            )
        ).all()
        samples = s.scalars(
            select(UtilisationSample).where(UtilisationSample.at >= start, UtilisationSample.at < end)
        ).all()
    for r in rows:
        lo = max(start, r.started_at)
        hi = min(end, r.ended_at or now, now)
        if hi <= lo:
            continue
        hours = (hi - lo).total_seconds() / 3600 * r.gpu_milli / 1000
        cost = hours * price_for(catalog, r.gpu_model)
        pool = catalog.profile_pools.get(r.profile or "", "")
        teams[r.team].add(hours, r.over_quota, cost, r.gpu_model, pool)
        users[(r.team, r.user)].add(hours, r.over_quota, cost, r.gpu_model, pool)
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
    reclaims = reclaim_figures(sessions, start, end) if others else None
    jobs = jobs_by_state(sessions, start, end) if others else None
    names = sorted(set(teams) | set(catalog.teams) | {t for t, _ in (reclaims or {})} | {t for t, _ in (jobs or {})})
    out_teams = []
    for name in names:
        d: dict[str, Any] = {"team": name, **teams[name].to_dict()}
        d.update(_reclaim_totals([h for (t, _), h in (reclaims or {}).items() if t == name], reclaims is None))
        if jobs is not None:
            counts: dict[str, int] = {}
            for (team_name, _), by_state in jobs.items():
                if team_name == name:
                    _merge_counts(counts, by_state)
            d["jobs"] = counts
        else:
            d["jobs"] = None
        user_names = sorted(
            {u for t, u in users if t == name}
            | {u for t, u in (reclaims or {}) if t == name and u}
            | {u for t, u in (jobs or {}) if t == name and u}
        )
        d["users"] = []
        for u in user_names:
            ud = {"user": u, **users[(name, u)].to_dict()}
            ud.update(_reclaim_totals([reclaims.get((name, u), (0.0, 0.0))] if reclaims else [], reclaims is None))
            ud["jobs"] = dict(jobs.get((name, u), {})) if jobs is not None else None
            d["users"].append(ud)
        d["series"] = [round(series[name].get(i, 0.0), 6) for i in range(n_buckets)]
        out_teams.append(d)
    return {
        "start": iso(start),
        "end": iso(end),
        "bucket_seconds": int(bucket.total_seconds()),
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
            "reclaims": IdleEventRow.__tablename__ if reclaims is not None else None,
            "jobs": JobRecord.__tablename__ if jobs is not None else None,
        },
    }


def current_report(runtime) -> list[dict[str, Any]]:
    """What each team (and each of its users) holds right now, from the ledger."""
    ledger = runtime.ledger
    names = sorted(set(runtime.catalog.teams) | {w.team for w in ledger.workloads()})
    out = []
    for name in names:
        u = ledger.usage(name)
        per_user: dict[str, dict[str, int]] = defaultdict(
            lambda: {"held_milli": 0, "in_quota_milli": 0, "over_quota_milli": 0}
        )
        team = runtime.catalog.team(name)
        held_by_pool = ledger.held_in_pools(name)
        for w in ledger.workloads(name):
            pu = per_user[w.user]
            pu["held_milli"] += w.milli
            pu["over_quota_milli" if w.over_quota else "in_quota_milli"] += w.milli
        out.append(
            {
                "team": name,
                "guarantee_milli": u.guarantee_milli,
                "burst_milli": u.burst_milli,
                "held_milli": u.held_milli,
                "in_quota_milli": u.in_quota_milli,
                "over_quota_milli": u.over_quota_milli,
                "reserved_milli": u.reserved_milli,
                "workloads": u.workloads,
                "held_by_pool_milli": held_by_pool,
                "pools": [
                    {
                        "pool": q.pool,
                        "guarantee_milli": q.guarantee_milli,
                        "burst_milli": q.burst_milli,
                        "held_milli": held_by_pool.get(q.pool, 0),
                    }
                    for q in (team.pools if team is not None else ())
                ],
                "users": [{"user": k, **v} for k, v in sorted(per_user.items())],
            }
        )
    return out
