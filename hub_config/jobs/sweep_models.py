"""The sweeps tables, on gpulab's own database (:mod:`hub_config.storage.db`): a sweep, and its runs.

A run is one parameter set of the sweep; once the sweep admits it, it is a job
(``job_id``, a row of ``gpulab_jobs``) whose state it shows. Until then it is ``waiting``.
"""

from __future__ import annotations

import datetime
import json
from typing import Any

from sqlalchemy import Boolean, DateTime, ForeignKey, Integer, String, Text, UniqueConstraint
from sqlalchemy.orm import Mapped, mapped_column

from hub_config.storage.db import Base, utcnow


class SweepRecord(Base):
    """One sweep: the job every run is made from, its grid or list, its cap, its objective."""

    __tablename__ = "gpulab_sweeps"
    __table_args__ = (UniqueConstraint("user", "idempotency_key", name="uq_gpulab_sweeps_idempotency"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    name: Mapped[str] = mapped_column(String(63))
    user: Mapped[str] = mapped_column(String(255), index=True)
    team: Mapped[str] = mapped_column(String(63), index=True)
    #: The job submission each run is made from (the sweep's keys taken out), as JSON.
    job_json: Mapped[str] = mapped_column(Text)
    #: The submitter's groups at submission: the catalog resolves each run's profile with them.
    groups_json: Mapped[str] = mapped_column(Text, default="[]")
    #: The grid as submitted; ``null`` for an explicit list of runs.
    grid_json: Mapped[str] = mapped_column(Text, default="null")
    max_parallel: Mapped[int] = mapped_column(Integer)
    #: ``{"metric": ..., "direction": "min"|"max"}``, or ``null``.
    objective_json: Mapped[str] = mapped_column(Text, default="null")
    #: ``active``, ``done`` or ``cancelled``.
    state: Mapped[str] = mapped_column(String(16), index=True)
    reason: Mapped[str] = mapped_column(Text, default="")
    idempotency_key: Mapped[str | None] = mapped_column(String(128), nullable=True)
    created_at: Mapped[datetime.datetime] = mapped_column(DateTime, default=utcnow)
    finished_at: Mapped[datetime.datetime | None] = mapped_column(DateTime, nullable=True)

    @property
    def job(self) -> dict[str, Any]:
        return json.loads(self.job_json)

    @property
    def groups(self) -> list[str]:
        return json.loads(self.groups_json or "[]")

    @property
    def grid(self) -> dict[str, list[Any]] | None:
        return json.loads(self.grid_json or "null")

    @property
    def objective(self) -> dict[str, str] | None:
        return json.loads(self.objective_json or "null")


class SweepRunRecord(Base):
    """One run of a sweep: its parameters, its job once admitted, the metrics it reported."""

    __tablename__ = "gpulab_sweep_runs"
    __table_args__ = (UniqueConstraint("sweep_id", "index", name="uq_gpulab_sweep_runs_index"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    sweep_id: Mapped[int] = mapped_column(Integer, ForeignKey("gpulab_sweeps.id", ondelete="CASCADE"), index=True)
    #: The run's place in the sweep (0-based, the grid's product order).
    index: Mapped[int] = mapped_column(Integer)
    parameters_json: Mapped[str] = mapped_column(Text)
    #: ``waiting`` (no job yet), ``admitted`` (its job's state is the run's), or ``cancelled`` /
    #: ``failed`` without a job (cancelled while waiting; its job could not be made).
    state: Mapped[str] = mapped_column(String(16), index=True)
    reason: Mapped[str] = mapped_column(Text, default="")
    job_id: Mapped[int | None] = mapped_column(Integer, nullable=True, index=True)
    #: The metrics the run reported (name -> number), as last read from its metrics file.
    metrics_json: Mapped[str] = mapped_column(Text, default="{}")
    #: Read for the last time (its job had ended): never read again.
    metrics_final: Mapped[bool] = mapped_column(Boolean, default=False)
    metrics_read_at: Mapped[datetime.datetime | None] = mapped_column(DateTime, nullable=True)

    @property
    def parameters(self) -> dict[str, Any]:
        return json.loads(self.parameters_json)

    @property
    def metrics(self) -> dict[str, float]:
        return json.loads(self.metrics_json or "{}")
