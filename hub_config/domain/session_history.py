"""What the recorded sessions say: how long sessions of a profile last, what a user's used.

Read from the usage history (:mod:`.usage_records`): the predicted start of a queue
entry uses session lengths (:func:`spawner.core.queue.expected_end`), the right-size
hint the user's own sessions' GPU memory and utilisation samples
(:func:`spawner.core.rightsize.right_size_hint`).
"""

from __future__ import annotations

from collections import defaultdict

from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from hub_config.domain.idle_records import IdleWarningRow
from hub_config.domain.session_gpu import MEASURED, SessionGPU
from hub_config.domain.usage_records import UsageInterval, UtilisationSample
from hub_config.jobs.models import JobRecord
from hub_config.storage.db import to_epoch
from spawner.core.jobspec import RUNNING, workload_key
from spawner.core.rightsize import SessionUse

#: How many of the newest finished sessions of a profile count for its typical length.
LENGTH_HISTORY = 200


def session_lengths(sessions: sessionmaker[Session], profiles: set[str]) -> dict[tuple[str, str], list[float]]:
    """Finished session lengths in seconds, by ``(profile, user)`` and by ``(profile, "")``
    (every user's), the newest :data:`LENGTH_HISTORY` per profile."""
    out: dict[tuple[str, str], list[float]] = defaultdict(list)
    if not profiles:
        return out
    with sessions() as s:
        for profile in sorted(profiles):
            rows = s.execute(
                select(UsageInterval.user, UsageInterval.started_at, UsageInterval.ended_at)
                .where(UsageInterval.profile == profile, UsageInterval.ended_at.is_not(None))
                .order_by(UsageInterval.ended_at.desc())
                .limit(LENGTH_HISTORY)
            ).all()
            for user, started, ended in rows:
                if ended is None:  # excluded by the query; the column is nullable
                    continue
                length = (ended - started).total_seconds()
                out[(profile, user)].append(length)
                out[(profile, "")].append(length)
    return out


def open_since(sessions: sessionmaker[Session]) -> dict[str, float]:
    """When each workload holding GPUs now started (epoch seconds), by ledger key."""
    with sessions() as s:
        rows = s.execute(
            select(UsageInterval.key, UsageInterval.started_at).where(UsageInterval.ended_at.is_(None))
        ).all()
    return {key: to_epoch(started) for key, started in rows}


def session_uses(sessions: sessionmaker[Session], user: str, profile: str, limit: int = 10) -> list[SessionUse]:
    """``user``'s newest ``limit`` finished sessions of ``profile`` with what was recorded of their
    GPUs: the NVML samples taken in them (single server), or the peak and p95 Prometheus
    answered at their end (Kubernetes, :mod:`.session_gpu`; only ``measured`` ones)."""
    with sessions() as s:
        intervals = s.scalars(
            select(UsageInterval)
            .where(UsageInterval.user == user, UsageInterval.profile == profile, UsageInterval.ended_at.is_not(None))
            .order_by(UsageInterval.ended_at.desc())
            .limit(limit)
        ).all()
        out = []
        for iv in intervals:
            samples = s.execute(
                select(UtilisationSample.util_pct, UtilisationSample.memory_mib).where(
                    UtilisationSample.key == iv.key,
                    UtilisationSample.at >= iv.started_at,
                    UtilisationSample.at <= iv.ended_at,
                )
            ).all()
            memory = [m for _, m in samples if m is not None]
            measured = s.scalars(
                select(SessionGPU).where(SessionGPU.usage_id == iv.id, SessionGPU.state == MEASURED)
            ).first()
            if measured is not None and measured.peak_memory_mib is not None:
                memory.append(measured.peak_memory_mib)
            out.append(
                SessionUse(
                    profile=iv.profile,
                    gpu_milli=iv.gpu_milli,
                    ended_at=to_epoch(iv.ended_at) if iv.ended_at else 0.0,
                    peak_memory_mib=max(memory) if memory else None,
                    util_samples=tuple(u for u, _ in samples),
                    util_p95=measured.util_p95 if measured is not None else None,
                    device_memory_mib=measured.device_memory_mib if measured is not None else None,
                )
            )
    return out


def warned_reclaims(sessions: sessionmaker[Session]) -> dict[tuple[str, str], float]:
    """The culler's warned-idle servers not on hold: ``(user, server) -> reclaim_at`` epoch seconds
    (each is reclaimed then, unless its user keeps it or it gets busy)."""
    with sessions() as s:
        rows = s.scalars(select(IdleWarningRow).where(IdleWarningRow.held_at.is_(None))).all()
        return {(w.user, w.server): to_epoch(w.reclaim_at) for w in rows}


def job_time_limits(sessions: sessionmaker[Session]) -> dict[str, float]:
    """When each running job reaches its time limit (epoch seconds), by ledger key."""
    with sessions() as s:
        rows = s.execute(
            select(JobRecord.id, JobRecord.started_at, JobRecord.time_limit_seconds).where(
                JobRecord.state == RUNNING, JobRecord.started_at.is_not(None)
            )
        ).all()
    return {workload_key(i): to_epoch(started) + limit for i, started, limit in rows if started is not None}
