"""Parameter sweeps: one submission, many jobs, each admitted on its own by the one ledger.

A sweep (:mod:`spawner.core.sweeps`: its grid or list, its cap, its objective) is
recorded with all of its runs in one request. The :class:`SweepScheduler`, ticked by
the jobs service's loop after the backend, admits them: while fewer than
``max_parallel`` of a sweep's runs hold a share, its next waiting run becomes a job
through :meth:`JobService.create_job <hub_config.jobs.service.JobService.create_job>`
-- the same validation, the same ledger, the same words as any job. A batch run the
ledger admits over the guarantee runs on idle GPUs as preemptible work; a run it refuses
waits, with the ledger's reason, and is tried again at the next tick. Nothing is
admitted behind the ledger's back, so a sweep never holds more than the team may.

A run's metrics are read back from the JSON file beside its log
(:func:`spawner.core.sweeps.metrics_path`, written by :mod:`gpulab_run`), as the job's
owner: while it runs (every ``c.GPULabSweeps.metrics_interval`` seconds) and once
after it ended.
"""

from __future__ import annotations

import asyncio
import datetime
import json
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from sqlalchemy import or_, select, update
from traitlets import Float, Int
from traitlets.config import Configurable

from hub_config.jobs.backends.base import log
from hub_config.jobs.homes import is_busy
from hub_config.jobs.models import JobRecord
from hub_config.jobs.sweep_models import SweepRecord, SweepRunRecord
from hub_config.storage.db import iso, utcnow
from spawner.core import jobprogram, jobspec, sweeps
from spawner.core.jobspec import FINAL_STATES, JobSpecError, validate_idempotency_key
from spawner.core.jobstates import AdmissionRefused
from spawner.local import home_files

if TYPE_CHECKING:
    from hub_config.jobs.service import JobService

#: A run's own states besides its job's: admitted (its job's state is the run's).
ADMITTED = "admitted"


class GPULabSweeps(Configurable):
    """Settings of parameter sweeps (``c.GPULabSweeps.*``)."""

    max_runs = Int(
        500,
        config=True,
        help="""Most runs one sweep may have (a grid's product, or an explicit list). A larger
        sweep is refused with a 413 that says how many runs it makes; nothing is recorded.""",
    )
    max_parallel = Int(
        32,
        config=True,
        help="""Most runs of one sweep a user may ask to hold a share at once (the sweep's
        `max_parallel`). A sweep that names none takes its number of runs or this, the smaller.
        The ledger's quotas apply on top: a run it refuses waits for a free share.""",
    )
    metrics_interval = Float(
        10.0,
        config=True,
        help="""Seconds between reads of a running run's metrics file (as its owner). A run's
        metrics are read once more when it ends.""",
    )
    max_metrics_bytes = Int(
        64 * 1024,
        config=True,
        help="""Largest metrics file read back from a run, in bytes; a larger one is left
        unread and the run says so.""",
    )


def run_name(base: str, index: int) -> str:
    """A run's job name: the sweep's, then ``-r<index>`` (it names the run's output files)."""
    suffix = f"-r{index}"
    return base[: jobspec.MAX_NAME_LEN - len(suffix)].rstrip("-._") + suffix


def run_body(job: Mapping[str, Any], kind: str, parameters: Mapping[str, Any], index: int) -> dict[str, Any]:
    """The job submission of one run: the sweep's job with the run's parameters, as papermill
    parameters over the notebook's own, or as ``--name value`` arguments after the script's."""
    body = dict(job)
    if kind == jobspec.SCRIPT:
        body["args"] = [*(job.get("args") or []), *sweeps.parameter_args(parameters)]
    else:
        body["parameters"] = {**(job.get("parameters") or {}), **parameters}
    body["name"] = run_name(str(job["name"]), index)
    return body


class SweepScheduler:
    """Records sweeps, admits their runs as jobs within each sweep's cap, reads their metrics back."""

    def __init__(self, jobs: JobService):
        self.jobs = jobs
        config = jobs.config
        self.settings = GPULabSweeps(config=config) if config is not None else GPULabSweeps()
        self.db = jobs.db
        #: One admission pass at a time: a cancel never races a run being admitted.
        self._lock = asyncio.Lock()

    # -- submitting ---------------------------------------------------------------

    async def create_sweep(self, user: str, groups: Iterable[str], body: Mapping[str, Any]) -> tuple[SweepRecord, bool]:
        """Validate and record a sweep and all its runs (none admitted yet); ``(record, created)``.
        Raises :class:`JobSpecError`; a refused sweep records nothing."""
        groups = list(groups)
        s = self.settings
        plan = sweeps.validate_sweep(
            {k: v for k, v in body.items() if k in sweeps.SWEEP_KEYS},
            max_runs=s.max_runs,
            max_parallel=s.max_parallel,
        )
        job = {k: v for k, v in body.items() if k not in sweeps.SWEEP_KEYS and k != "idempotency_key"}
        job.setdefault("job_class", "batch")
        key = validate_idempotency_key(body.get("idempotency_key"))
        kind = jobprogram.program_kind(job)
        # The sweep's job is checked as any job is (fields, catalog, the file in the home), then every
        # run's own parameters against the same limits: a sweep is refused whole or recorded whole.
        sub = await self.jobs.validate(user, groups, job)
        base = sub.to_json()
        limit = self.jobs.settings.max_parameters_bytes
        for i, params in enumerate(plan.runs):
            try:
                if kind == jobspec.SCRIPT:
                    jobprogram.validate_args(run_body(base, kind, params, i)["args"], kind, limit)
                else:
                    jobspec.validate_parameters(run_body(base, kind, params, i)["parameters"], limit)
            except JobSpecError as e:
                raise JobSpecError(f"run {i} ({json.dumps(params)[:80]}): {e}", e.status) from None
        full = self.jobs.runtime.disk_full()
        if full is not None:
            raise JobSpecError(full, 507)
        if key is not None:
            with self.db() as db:
                existing = db.scalars(
                    select(SweepRecord).where(SweepRecord.user == user, SweepRecord.idempotency_key == key)
                ).first()
            if existing is not None:
                return existing, False
        base.pop("idempotency_key", None)
        with self.db() as db:
            rec = SweepRecord(
                name=base["name"],
                user=user,
                team=sub.request.team.name,
                job_json=json.dumps(base),
                groups_json=json.dumps(groups),
                grid_json=json.dumps({k: list(v) for k, v in plan.grid.items()} if plan.grid is not None else None),
                max_parallel=plan.max_parallel,
                objective_json=json.dumps(plan.objective.to_json() if plan.objective else None),
                state=sweeps.ACTIVE,
                reason="",
                idempotency_key=key,
                created_at=utcnow(),
            )
            db.add(rec)
            db.flush()
            db.add_all(
                SweepRunRecord(
                    sweep_id=rec.id,
                    index=i,
                    parameters_json=json.dumps(dict(params)),
                    state=sweeps.WAITING,
                    reason="waiting for the sweep's scheduler",
                    metrics_json="{}",
                    metrics_final=False,
                )
                for i, params in enumerate(plan.runs)
            )
            db.commit()
        log.info(
            "gpulab sweeps: sweep %d (%s) by %s in team %s: %d runs, at most %d at once",
            rec.id,
            rec.name,
            user,
            rec.team,
            len(plan.runs),
            plan.max_parallel,
        )
        self.jobs.wake()
        return rec, True

    # -- reading ----------------------------------------------------------------------

    def get_sweep(self, sweep_id: int) -> SweepRecord | None:
        with self.db() as db:
            return db.get(SweepRecord, sweep_id)

    def list_sweeps(self, user: str | None = None, limit: int = 200) -> list[SweepRecord]:
        q = select(SweepRecord).order_by(SweepRecord.id.desc()).limit(limit)
        if user is not None:
            q = q.where(SweepRecord.user == user)
        with self.db() as db:
            return list(db.scalars(q))

    def _runs_and_jobs(self, sweep_ids: Sequence[int]) -> tuple[list[SweepRunRecord], dict[int, JobRecord]]:
        with self.db() as db:
            runs = list(
                db.scalars(
                    select(SweepRunRecord)
                    .where(SweepRunRecord.sweep_id.in_(sweep_ids))
                    .order_by(SweepRunRecord.sweep_id, SweepRunRecord.index)
                )
            )
            ids = [r.job_id for r in runs if r.job_id is not None]
            jobs = {j.id: j for j in db.scalars(select(JobRecord).where(JobRecord.id.in_(ids)))} if ids else {}
        return runs, jobs

    def to_json(self, sweep: SweepRecord, with_runs: bool = True) -> dict[str, Any]:
        """The sweep as the API shows it: its job, cap, objective, state, counts and best run (and its runs)."""
        runs, jobs = self._runs_and_jobs([sweep.id])
        return self._json(sweep, runs, jobs, with_runs)

    def list_json(self, records: Sequence[SweepRecord]) -> list[dict[str, Any]]:
        runs, jobs = self._runs_and_jobs([r.id for r in records])
        by_sweep: dict[int, list[SweepRunRecord]] = {}
        for run in runs:
            by_sweep.setdefault(run.sweep_id, []).append(run)
        return [self._json(r, by_sweep.get(r.id, []), jobs, False) for r in records]

    def _json(
        self, sweep: SweepRecord, runs: Sequence[SweepRunRecord], jobs: Mapping[int, JobRecord], with_runs: bool
    ) -> dict[str, Any]:
        objective_data = sweep.objective
        objective = sweeps.Objective(**objective_data) if objective_data else None
        rows = [run_json(run, jobs.get(run.job_id) if run.job_id is not None else None) for run in runs]
        best = sweeps.best_run([row["metrics"] for row in rows], objective)
        job = sweep.job
        kind = jobspec.SCRIPT if "script" in job else jobspec.NOTEBOOK
        out: dict[str, Any] = {
            "id": sweep.id,
            "name": sweep.name,
            "user": sweep.user,
            "team": sweep.team,
            "profile": job.get("profile"),
            "job_class": job.get("job_class"),
            "kind": kind,
            kind: job.get(kind),
            "job": job,
            "grid": sweep.grid,
            "max_parallel": sweep.max_parallel,
            "objective": objective_data,
            "state": sweep.state,
            "reason": sweep.reason,
            "runs_total": len(rows),
            "counts": sweeps.count_states([row["state"] for row in rows]),
            "best_run": best,
            "parameter_names": sorted({k for row in rows for k in row["parameters"]}),
            "metric_names": sorted({k for row in rows for k in row["metrics"]}),
            # On Kubernetes without the homes mounted the hub cannot read the metrics files.
            "metrics_readable": self.jobs.backend.sees_homes,
            "created_at": iso(sweep.created_at),
            "finished_at": iso(sweep.finished_at),
        }
        if with_runs:
            for row in rows:
                row["best"] = row["index"] == best
            out["runs"] = rows
        return out

    # -- cancelling ---------------------------------------------------------------------

    async def cancel(self, sweep: SweepRecord, by: str) -> SweepRecord:
        """Admit no more runs; cancel every waiting run and every run's job that has not ended."""
        async with self._lock:
            with self.db() as db:
                rec = db.get(SweepRecord, sweep.id)
                if rec is None or rec.state != sweeps.ACTIVE:
                    state = rec.state if rec is not None else "gone"
                    raise JobSpecError(f"sweep {sweep.id} is already {state}", 409)
                now = utcnow()
                rec.state, rec.reason, rec.finished_at = jobspec.CANCELLED, f"cancelled by {by}", now
                db.execute(
                    update(SweepRunRecord)
                    .where(SweepRunRecord.sweep_id == rec.id, SweepRunRecord.state == sweeps.WAITING)
                    .values(state=jobspec.CANCELLED, reason=f"cancelled by {by} before it was admitted")
                )
                db.commit()
            runs, jobs = self._runs_and_jobs([sweep.id])
            for run in runs:
                job = jobs.get(run.job_id) if run.job_id is not None else None
                if job is not None and job.state not in FINAL_STATES:
                    try:
                        await self.jobs.cancel(job, by)
                    except JobSpecError as e:  # it ended meanwhile
                        log.info("gpulab sweeps: sweep %d: run %d: %s", sweep.id, run.index, e)
        log.info("gpulab sweeps: sweep %d cancelled by %s", sweep.id, by)
        return self.get_sweep(sweep.id) or sweep

    # -- the scheduler ------------------------------------------------------------------

    async def tick(self) -> None:
        """Read the metrics that are due, admit what each active sweep's cap and the ledger allow."""
        with self.db() as db:
            pending_metrics = select(SweepRunRecord.sweep_id).where(
                SweepRunRecord.state == ADMITTED, SweepRunRecord.metrics_final.is_(False)
            )
            ids = list(
                db.scalars(
                    select(SweepRecord.id)
                    .where(or_(SweepRecord.state == sweeps.ACTIVE, SweepRecord.id.in_(pending_metrics)))
                    .order_by(SweepRecord.id)
                )
            )
        for sweep_id in ids:
            async with self._lock:
                await self._advance(sweep_id)

    async def _advance(self, sweep_id: int) -> None:
        sweep = self.get_sweep(sweep_id)
        if sweep is None:
            return
        runs, jobs = self._runs_and_jobs([sweep_id])
        await self._read_metrics(sweep, runs, jobs)
        if sweep.state != sweeps.ACTIVE:
            return
        holding = sum(1 for r in runs if r.state == ADMITTED and _job_state(jobs, r) not in FINAL_STATES)
        waiting = [r for r in runs if r.state == sweeps.WAITING]
        job = sweep.job
        kind = jobspec.SCRIPT if "script" in job else jobspec.NOTEBOOK
        for n, run in enumerate(waiting):
            if holding >= sweep.max_parallel:
                self._set_waiting_reason(
                    waiting[n:],
                    f"waiting: {holding} of the sweep's runs hold a share (max_parallel {sweep.max_parallel})",
                )
                break
            body = run_body(job, kind, run.parameters, run.index)
            # The same key every time: a run admitted just before a restart is found, not admitted twice.
            body["idempotency_key"] = f"gpulab-sweep:{sweep_id}:{run.index}"
            try:
                # A notebook's parameters are its papermill ones (the sweep's over its own); a script's
                # arguments carry them, and its record keeps them (GPULAB_JOB_PARAMETERS).
                own = run.parameters if kind == jobspec.SCRIPT else None
                rec, _ = await self.jobs.create_job(sweep.user, sweep.groups, body, run_parameters=own)
            except AdmissionRefused as e:
                self._set_waiting_reason(waiting[n:], f"waiting for a share: {e}")
                break
            except JobSpecError as e:
                if is_busy(e):  # its owner's calls are all taken (nothing was asked): the next tick tries again
                    self._set_waiting_reason(waiting[n:], f"waiting to be submitted: {e}")
                    break
                # Not the ledger's, not for now: this run cannot run (its notebook went away ...).
                self._set_run(run.id, state=jobspec.FAILED, reason=f"could not be submitted: {e}")
                log.warning("gpulab sweeps: sweep %d: run %d could not be submitted: %s", sweep_id, run.index, e)
                continue
            self._set_run(run.id, state=ADMITTED, reason="", job_id=rec.id)
            holding += 1
            log.info("gpulab sweeps: sweep %d: run %d admitted as job %d", sweep_id, run.index, rec.id)
        runs, jobs = self._runs_and_jobs([sweep_id])
        if all(_run_state(r, jobs) in FINAL_STATES for r in runs):
            with self.db() as db:
                done = db.get(SweepRecord, sweep_id)
                if done is not None and done.state == sweeps.ACTIVE:
                    done.state, done.finished_at = sweeps.DONE, utcnow()
                    done.reason = ", ".join(
                        f"{n} {s}" for s, n in sorted(sweeps.count_states([_run_state(r, jobs) for r in runs]).items())
                    )
                    db.commit()
            log.info("gpulab sweeps: sweep %d done", sweep_id)

    def _set_run(self, run_id: int, **values: Any) -> None:
        with self.db() as db:
            db.execute(update(SweepRunRecord).where(SweepRunRecord.id == run_id).values(**values))
            db.commit()

    def _set_waiting_reason(self, runs: Sequence[SweepRunRecord], reason: str) -> None:
        ids = [r.id for r in runs if r.reason != reason]
        if ids:
            with self.db() as db:
                db.execute(update(SweepRunRecord).where(SweepRunRecord.id.in_(ids)).values(reason=reason))
                db.commit()

    async def _read_metrics(
        self, sweep: SweepRecord, runs: Sequence[SweepRunRecord], jobs: Mapping[int, JobRecord]
    ) -> None:
        """Each admitted run's metrics file, as the owner: when its job ended (then never again), and
        every ``metrics_interval`` seconds while it runs."""
        if not self.jobs.backend.sees_homes:
            return
        now = utcnow()
        due = datetime.timedelta(seconds=self.settings.metrics_interval)
        home = self.jobs.homes.home_dir(sweep.user)
        cap = self.settings.max_metrics_bytes
        for run in runs:
            job = jobs.get(run.job_id) if run.job_id is not None else None
            if run.state != ADMITTED or run.metrics_final or job is None or not job.log_path:
                continue
            final = job.state in FINAL_STATES
            if not final and (
                job.state != jobspec.RUNNING or (run.metrics_read_at and now - run.metrics_read_at < due)
            ):
                continue
            try:
                found = await self.jobs.homes.read(sweep.user, home / sweeps.metrics_path(job.log_path), 0, cap, cap)
            except JobSpecError as e:  # the home cannot be asked now: try again at the next tick
                log.warning("gpulab sweeps: sweep %d: run %d: metrics not read: %s", sweep.id, run.index, e)
                continue
            values: dict[str, Any] = {"metrics_read_at": now, "metrics_final": final}
            if found.state == home_files.OK:
                metrics, problem = sweeps.parse_metrics(found.data)
                values["metrics_json"] = json.dumps(metrics)
                if problem:
                    log.info("gpulab sweeps: sweep %d: run %d: %s", sweep.id, run.index, problem)
            elif found.state != home_files.ABSENT:
                log.info(
                    "gpulab sweeps: sweep %d: run %d: metrics file not read (%s)", sweep.id, run.index, found.state
                )
            self._set_run(run.id, **values)


def _job_state(jobs: Mapping[int, JobRecord], run: SweepRunRecord) -> str:
    job = jobs.get(run.job_id) if run.job_id is not None else None
    return job.state if job is not None else jobspec.FAILED


def _run_state(run: SweepRunRecord, jobs: Mapping[int, JobRecord]) -> str:
    """The run's state: its job's once admitted, else its own (waiting, cancelled, failed)."""
    return _job_state(jobs, run) if run.state == ADMITTED else run.state


def run_json(run: SweepRunRecord, job: JobRecord | None) -> dict[str, Any]:
    """One run as the API shows it: its parameters, its state (its job's once admitted), metrics, files."""
    return {
        "index": run.index,
        "parameters": run.parameters,
        "state": job.state if run.state == ADMITTED and job is not None else run.state,
        "reason": job.reason if job is not None else run.reason,
        "job_id": run.job_id,
        "metrics": run.metrics,
        "output_path": job.output_path if job is not None else "",
        "log_path": job.log_path if job is not None else "",
        "started_at": iso(job.started_at) if job is not None else None,
        "finished_at": iso(job.finished_at) if job is not None else None,
        "attempts": job.attempts if job is not None else 0,
    }
