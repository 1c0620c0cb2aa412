"""Usage history: one interval per workload holding GPUs, and NVML utilisation samples.

History comes from the ledger: :func:`attach` subscribes to the process
ledger and records one interval per workload key (opened on the first
``add``, closed on ``remove``). Recording is idempotent by key: a hub restart
re-adopts running workloads, which finds the interval still open and keeps
it, so nothing is counted twice. Open intervals whose workload is no longer
in the ledger (it died while the hub was down and was never re-adopted) are
closed by a periodic reconcile. The reports are in :mod:`.usage`.
"""

from __future__ import annotations

import logging
from bisect import bisect_right
from collections import defaultdict
from collections.abc import Callable
from datetime import datetime
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from sqlalchemy import Boolean, DateTime, Float, Index, Integer, String, select, text, update
from sqlalchemy.orm import Mapped, Session, mapped_column, sessionmaker
from tornado.ioloop import PeriodicCallback
from traitlets import Float as TFloat
from traitlets import TraitError, Unicode, validate
from traitlets.config import Configurable

from hub_config.storage.db import Base, utcnow
from spawner.core.ledger import Workload
from spawner.runtime import GPULabRuntime

log = logging.getLogger("gpulab.usage")


class GPULabUsage(Configurable):
    """Where usage figures come from."""

    reconcile_interval = TFloat(
        60.0,
        config=True,
        help="""Seconds between reconciles: usage intervals left open for workloads the
        ledger no longer holds are closed, and (with NVML) GPU utilisation is sampled.""",
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
    def _valid_zone(self, proposal: dict[str, Any]) -> str:
        value = str(proposal["value"])
        try:
            ZoneInfo(value)
        except (ZoneInfoNotFoundError, ValueError):
            raise TraitError(
                f"c.GPULabUsage.time_zone: unknown time zone {value!r}; "
                "use an IANA name such as 'UTC' or 'Europe/Berlin'"
            ) from None
        return value


class UsageInterval(Base):
    """One workload holding GPUs from ``started_at`` to ``ended_at`` (open: ``None``)."""

    __tablename__ = "gpulab_usage"
    __table_args__ = (
        # At most one open interval per workload key: recording is idempotent.
        Index(
            "ix_gpulab_usage_open_key",
            "key",
            unique=True,
            sqlite_where=text("ended_at IS NULL"),
            postgresql_where=text("ended_at IS NULL"),
        ),
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
    #: GPU memory in use on the workload's devices, MiB (``None``: the source did not report it).
    #: A shared device's figure includes its other tenants': an upper bound of the workload's own.
    memory_mib: Mapped[float | None] = mapped_column(Float, nullable=True)


class UsageRecorder:
    """Ledger observer writing usage intervals; also the reconcile loop."""

    def __init__(self, runtime: GPULabRuntime, sessions: sessionmaker[Session], settings: GPULabUsage):
        self.runtime = runtime
        self.sessions = sessions
        self.settings = settings
        self._callback: Callable[[str, Workload], None] | None = None
        self._periodic: PeriodicCallback | None = None

    def model_of(self, w: Workload) -> str | None:
        profile = self.runtime.catalog.profile(w.profile)
        if profile is not None and profile.gpu_model:
            return profile.gpu_model
        packer = self.runtime.packer
        placement = packer.placement(w.key) if packer is not None else None
        if packer is not None and placement is not None and placement.shares:
            return packer.devices[placement.shares[0][0]].model
        return None

    def observe(self, event: str, w: Workload) -> None:
        if w.milli <= 0:
            return
        now = utcnow()
        with self.sessions.begin() as s:
            open_row = s.scalars(
                select(UsageInterval).where(UsageInterval.key == w.key, UsageInterval.ended_at.is_(None))
            ).first()
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
            s.add(
                UsageInterval(
                    key=w.key,
                    team=w.team,
                    user=w.user,
                    profile=w.profile,
                    kind=w.kind,
                    gpu_milli=w.milli,
                    gpu_model=self.model_of(w),
                    over_quota=w.over_quota,
                    started_at=now,
                )
            )

    def reconcile(self) -> int:
        """Close open intervals of workloads the ledger no longer holds."""
        live = {w.key for w in self.runtime.ledger.workloads()}
        with self.sessions.begin() as s:
            stale = [
                k for k in s.scalars(select(UsageInterval.key).where(UsageInterval.ended_at.is_(None))) if k not in live
            ]
            if stale:
                s.execute(
                    update(UsageInterval)
                    .where(UsageInterval.key.in_(stale), UsageInterval.ended_at.is_(None))
                    .values(ended_at=utcnow())
                )
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
            used: dict[int, float] = {}
            for idx in runtime.packer.devices:
                handle = pynvml.nvmlDeviceGetHandleByIndex(idx)
                util[idx] = float(pynvml.nvmlDeviceGetUtilizationRates(handle).gpu)
                used[idx] = float(pynvml.nvmlDeviceGetMemoryInfo(handle).used) / 2**20
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
                memory = [used[i] for i, _ in placement.shares if i in used]
                rows.append(
                    UtilisationSample(
                        at=now,
                        key=w.key,
                        team=w.team,
                        user=w.user,
                        util_pct=sum(values) / len(values),
                        memory_mib=sum(memory) if memory else None,
                    )
                )
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
            self._periodic = PeriodicCallback(self._safe_reconcile, self.settings.reconcile_interval * 1000)
            self._periodic.start()
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


def next_gpu_holds(sessions: sessionmaker[Session], users: set[str], after: datetime) -> dict[str, list[datetime]]:
    """Per user, the sorted start times of their GPU holdings that began after ``after``."""
    if not users:
        return {}
    with sessions() as s:
        rows = s.execute(
            select(UsageInterval.user, UsageInterval.started_at).where(
                UsageInterval.user.in_(sorted(users)), UsageInterval.started_at > after, UsageInterval.gpu_milli > 0
            )
        ).all()
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
