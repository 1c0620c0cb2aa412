"""The jobs table, on gpulab's own database (:mod:`hub_config.storage.db`)."""

from __future__ import annotations

import datetime
import json
from typing import Any

from sqlalchemy import BigInteger, Boolean, DateTime, Integer, String, Text, UniqueConstraint, true
from sqlalchemy.orm import Mapped, mapped_column

from hub_config.storage.db import Base, iso, utcnow
from spawner.core.jobspec import kept_input_path


class JobRecord(Base):
    """One job (a notebook or a script): what was asked, where it runs, and every state it went through."""

    __tablename__ = "gpulab_jobs"
    __table_args__ = (UniqueConstraint("user", "idempotency_key", name="uq_gpulab_jobs_idempotency"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    name: Mapped[str] = mapped_column(String(63))
    user: Mapped[str] = mapped_column(String(255), index=True)
    team: Mapped[str] = mapped_column(String(63), index=True)
    profile: Mapped[str] = mapped_column(String(63))
    job_class: Mapped[str] = mapped_column(String(16))
    state: Mapped[str] = mapped_column(String(16), index=True)
    reason: Mapped[str] = mapped_column(Text, default="")
    gpu_milli: Mapped[int] = mapped_column(Integer, default=0)
    over_quota: Mapped[bool] = mapped_column(Boolean, default=False)
    #: It holds its quota admission in the ledger (running, or queued for devices). ``False``: a
    #: queued job whose share reclaim took back for another team's in-quota work; it waits to be
    #: admitted again (:mod:`hub_config.jobs.reclaim`).
    quota_held: Mapped[bool] = mapped_column(Boolean, default=True, server_default=true())
    #: The path of what runs: the notebook, or the script when ``kind`` is ``script``.
    notebook: Mapped[str] = mapped_column(Text)
    #: ``notebook`` (papermill) or ``script`` (Python with ``args``).
    kind: Mapped[str] = mapped_column(String(16), default="notebook", server_default="notebook")
    args_json: Mapped[str] = mapped_column(Text, default="[]", server_default="[]")
    #: Nodes of the profile's GPUs; ``gpu_milli`` is all of them (a gang when more than one).
    nodes: Mapped[int] = mapped_column(Integer, default=1, server_default="1")
    #: The checkpoint folder (relative to the home), kept across the job's attempts.
    checkpoint_path: Mapped[str] = mapped_column(Text, default="", server_default="")
    output_path: Mapped[str] = mapped_column(Text)
    log_path: Mapped[str] = mapped_column(Text)
    parameters_json: Mapped[str] = mapped_column(Text, default="{}")
    time_limit_seconds: Mapped[int] = mapped_column(Integer)
    idempotency_key: Mapped[str | None] = mapped_column(String(128), nullable=True)
    rerun_of: Mapped[int | None] = mapped_column(Integer, nullable=True)
    backend: Mapped[str] = mapped_column(String(16))
    created_at: Mapped[datetime.datetime] = mapped_column(DateTime, default=utcnow)
    started_at: Mapped[datetime.datetime | None] = mapped_column(DateTime, nullable=True)
    finished_at: Mapped[datetime.datetime | None] = mapped_column(DateTime, nullable=True)
    #: Times the job was started (a preempted job starts again).
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    #: Single server: the runner's process id (= its process group) and its device shares.
    pid: Mapped[int | None] = mapped_column(Integer, nullable=True)
    #: ... and when that process started (``/proc/<pid>/stat`` field 22): with the owner's uid, what
    #: makes the pid this runner's and not a later process's.
    pid_started: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    shares_json: Mapped[str] = mapped_column(Text, default="[]")
    #: Kubernetes: where the Job object lives.
    kube_namespace: Mapped[str | None] = mapped_column(String(63), nullable=True)
    kube_name: Mapped[str | None] = mapped_column(String(63), nullable=True)
    history_json: Mapped[str] = mapped_column(Text, default="[]")

    @property
    def parameters(self) -> dict[str, Any]:
        return json.loads(self.parameters_json or "{}")

    @property
    def args(self) -> list[str]:
        return json.loads(self.args_json or "[]")

    @property
    def shares(self) -> list[list[int]]:
        return json.loads(self.shares_json or "[]")

    @property
    def history(self) -> list[dict[str, Any]]:
        return json.loads(self.history_json or "[]")

    def record(self, state: str, reason: str = "", at: datetime.datetime | None = None) -> None:
        """Enter ``state`` (the caller checked the transition) and log it in the history."""
        at = at or utcnow()
        self.state = state
        self.reason = reason
        self.history_json = json.dumps(self.history + [{"state": state, "at": iso(at), "reason": reason}])

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "name": self.name,
            "user": self.user,
            "team": self.team,
            "profile": self.profile,
            "job_class": self.job_class,
            "state": self.state,
            "reason": self.reason,
            "gpu_milli": self.gpu_milli,
            "over_quota": self.over_quota,
            "quota_held": self.quota_held,
            "kind": self.kind,
            # The path of what runs, for either kind: clients written before scripts read it.
            "notebook": self.notebook,
            "script": self.notebook if self.kind == "script" else None,
            "args": self.args,
            "nodes": self.nodes,
            "output_path": self.output_path,
            "checkpoint_path": self.checkpoint_path,
            "log_path": self.log_path,
            # The notebook as submitted, which the job runs and Re-run runs again.
            "input_path": kept_input_path(self.output_path) if self.output_path else "",
            "parameters": self.parameters,
            "time_limit_seconds": self.time_limit_seconds,
            "created_at": iso(self.created_at),
            "started_at": iso(self.started_at),
            "finished_at": iso(self.finished_at),
            "attempts": self.attempts,
            "rerun_of": self.rerun_of,
            "backend": self.backend,
            "history": self.history,
        }
