"""The job service: validation, admission by the shared ledger, the state machine.

One :class:`JobService` per hub process, kept on the runtime (:func:`get_service`). The API
handlers call :meth:`JobService.create_job`, :meth:`cancel`, :meth:`rerun` ...;
the service records every change in gpulab's database and hands execution to
a backend (:mod:`.local` or :mod:`.kube`), which reports state changes back
through :meth:`JobService.transition`.

Quota: a job is admitted at submission by :meth:`Ledger.reserve
<spawner.core.ledger.Ledger.reserve>` -- the same ledger, the same rules as a
notebook spawn (``batch`` may burst above the guarantee as preemptible work,
``training`` never goes over quota) -- and holds its share until it reaches a
final state. A refusal says why and stores nothing. In-quota work held back by
borrowers of its department takes their jobs back first, on a backend that runs jobs
itself (:mod:`hub_config.jobs.reclaim`).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterable, Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

from sqlalchemy import select

from hub_config.jobs import reclaim
from hub_config.jobs.backends.base import JobBackend, log
from hub_config.jobs.homes import Homes, HubHomes, OwnerHomes, refusal
from hub_config.jobs.models import JobRecord
from hub_config.jobs.settings import GPULabJobs
from hub_config.jobs.sweeps import SweepScheduler
from hub_config.storage.db import database_file, session_factory, storage_failure, utcnow
from spawner.core import jobprogram, jobspec
from spawner.core.budgets import ALLOW, REFUSE
from spawner.core.jobspec import FINAL_STATES, RERUN_CHOICES, RERUN_KEPT, JobSpecError, Submission
from spawner.core.jobstates import AdmissionRefused
from spawner.core.ledger import RESERVED, RUNNING, Workload
from spawner.core.policy import PolicyError, SpawnRequest, resolve_request
from spawner.local import home_files
from spawner.local.accounts import UserAccounts, lookup
from spawner.runtime import GPULabRuntime, get_runtime

#: Keys a submission may carry; anything else is refused (never silently ignored).
SUBMIT_KEYS = frozenset(
    {
        "notebook",
        "script",
        "args",
        "nodes",
        "job_class",
        "profile",
        "team",
        "image",
        "parameters",
        "time_limit_seconds",
        "name",
        "idempotency_key",
    }
)


class JobService:
    """Submissions, the state machine and the database, over one backend."""

    def __init__(self, config: Any = None, runtime: GPULabRuntime | None = None):
        self.config = config
        self.settings = GPULabJobs(config=config) if config is not None else GPULabJobs()
        self.runtime = runtime or get_runtime(config=config)
        self.db = session_factory(config)
        self.accounts = UserAccounts(config=config) if config is not None else UserAccounts()
        #: Jobs run as their owner's system account, like the owner's servers.
        self.owner_accounts = self.accounts.enabled or self.runtime.user_accounts
        self._task: asyncio.Task | None = None
        self._wake = asyncio.Event()
        #: Jobs recorded as queued whose notebook is still being kept (:meth:`keep_input`):
        #: no backend starts them before their copy exists.
        self.preparing: set[int] = set()
        #: How the users' homes are read: as their owners, or by the hub itself (chosen once).
        self.homes: Homes = (OwnerHomes if self.owner_accounts else HubHomes)(self.settings, self.accounts, config)
        self.backend = self._make_backend()
        #: Parameter sweeps: each run a job of this service, admitted by the same ledger.
        self.sweeps = SweepScheduler(self)

    # -- configuration ------------------------------------------------------

    def _make_backend(self) -> JobBackend:
        return self.settings.backend_class(self)

    # -- lifecycle ----------------------------------------------------------

    def start(self) -> None:
        """Recover jobs from the database (after a restart) and start the poll loop."""
        if self._task is not None:
            return
        for rec in self.active_jobs():
            if not rec.quota_held:  # reclaim took its share: it waits to be admitted again
                continue
            w = Workload(
                jobspec.workload_key(rec.id),
                rec.team,
                rec.user,
                rec.gpu_milli,
                rec.profile,
                "job",
                rec.over_quota,
                RUNNING if rec.state == jobspec.RUNNING else RESERVED,
                rec.nodes,
            )
            self.runtime.ledger.adopt(w)
        reclaim.install(self)  # notebook spawns take borrowed jobs back too
        self._task = asyncio.ensure_future(self._loop())
        log.info("gpulab jobs: %s backend started", self.backend.name)

    async def _loop(self) -> None:
        try:
            await self.backend.recover()
        except Exception:  # keep serving: the ticks still reconcile what they can
            log.exception("gpulab jobs: recovering jobs after the restart failed")
        while True:
            # Cleared before the ticks: a wake during one (a job submitted, a sweep's run ended) ticks again.
            self._wake.clear()
            for what, tick in (
                ("reclaim", self._readmit),
                ("backend", self.backend.tick),
                ("sweeps", self.sweeps.tick),
            ):
                try:
                    await tick()
                except Exception as e:
                    failure = storage_failure(e, database_file(self.config))
                    if failure is not None:  # the next tick does what this one could not record
                        log.warning("gpulab jobs: the jobs wait: %s", failure)
                    else:
                        log.exception("gpulab jobs: %s tick failed", what)
            try:
                await asyncio.wait_for(self._wake.wait(), self.settings.poll_interval)
            except asyncio.TimeoutError:
                pass

    async def _readmit(self) -> None:
        if self.backend.takes_back:
            reclaim.readmit(self)

    def wake(self) -> None:
        """Run the backend's next tick now (a job was submitted, cancelled or ended)."""
        self._wake.set()

    # -- reading ------------------------------------------------------------

    def get_job(self, job_id: int) -> JobRecord | None:
        with self.db() as s:
            return s.get(JobRecord, job_id)

    def list_jobs(
        self, user: str | None = None, team: str | None = None, state: str | None = None, limit: int = 500
    ) -> list[JobRecord]:
        q = select(JobRecord).order_by(JobRecord.id.desc()).limit(limit)
        if user is not None:
            q = q.where(JobRecord.user == user)
        if team is not None:
            q = q.where(JobRecord.team == team)
        if state is not None:
            q = q.where(JobRecord.state == state)
        with self.db() as s:
            return list(s.scalars(q))

    def active_jobs(self, backend: str | None = None) -> list[JobRecord]:
        q = select(JobRecord).where(JobRecord.state.not_in(FINAL_STATES)).order_by(JobRecord.id)
        if backend:
            q = q.where(JobRecord.backend == backend)
        with self.db() as s:
            return list(s.scalars(q))

    # -- files in the user's home -----------------------------------------------

    def _need_homes(self) -> None:
        if not self.backend.sees_homes:
            raise JobSpecError(
                "the hub does not mount the users' homes (c.GPULabJobs.home_dir_template); "
                "open the log and output notebook from your server",
                409,
            )

    async def read_log(self, rec: JobRecord, offset: int, limit: int, rank: int = 0) -> tuple[bytes, int]:
        """Up to ``limit`` bytes of the job's log (of node ``rank`` of a multi-node job) from
        ``offset``, and the next offset."""
        self._need_homes()
        path = jobprogram.rank_log_path(rec.log_path, rank)
        found = await self.homes.read(rec.user, self.homes.home_dir(rec.user) / path, offset, limit)
        if found.state == home_files.ABSENT:
            if offset:
                raise JobSpecError(f"offset {offset} is past the end of the log, which does not exist yet", 400)
            return b"", offset
        if found.state != home_files.OK:
            raise refusal(found, "the job's log")
        if offset > found.size:
            raise JobSpecError(f"offset {offset} is past the end of the log ({found.size} bytes)", 400)
        return found.data, offset + len(found.data)

    async def read_output(self, rec: JobRecord) -> bytes | None:
        """The executed notebook's bytes; ``None`` while there is none."""
        self._need_homes()
        cap = self.settings.max_output_bytes
        found = await self.homes.read(rec.user, self.homes.home_dir(rec.user) / rec.output_path, 0, cap, cap)
        if found.state == home_files.ABSENT:
            return None
        if found.state != home_files.OK:
            raise refusal(found, "the output notebook", f"c.GPULabJobs.max_output_bytes = {cap}")
        return found.data

    # -- submitting ---------------------------------------------------------

    async def validate(
        self, user: str, groups: Iterable[str], body: dict[str, Any], check_notebook: bool = True
    ) -> Submission:
        unknown = sorted(str(k)[:40] for k in body if k not in SUBMIT_KEYS)
        if unknown:
            raise JobSpecError(
                "unknown field(s): " + ", ".join(unknown[:5]) + "; GPU size, resources and "
                "priority come from the profile and the job class"
            )
        groups = list(groups)

        def resolve(options: Mapping[str, Any]) -> SpawnRequest:
            try:
                return resolve_request(self.runtime.catalog, user, groups, dict(options))
            except PolicyError as e:
                raise JobSpecError(str(e), e.status) from None

        s = self.settings
        submission = Submission.from_json(
            body,
            resolve,
            max_parameters_bytes=s.max_parameters_bytes,
            default_time_limit=s.default_time_limit_seconds,
            max_time_limit=s.max_time_limit_seconds,
            max_nodes=s.max_nodes,
        )
        # A Re-run of a kept notebook runs the copy; a script is never copied (it would not find
        # its neighbours' imports elsewhere): it runs where it is, so it is checked every time.
        if check_notebook or submission.kind == jobspec.SCRIPT:
            await self.check_notebook(user, submission.notebook, submission.kind)
        return submission

    async def keep_input(self, rec: JobRecord, source: str) -> None:
        """Keep the notebook a job runs, as submitted, in its own file beside its output
        (:func:`spawner.core.jobspec.kept_input_path`), written as the job's owner with no symlink
        followed. ``source``: the notebook, or the kept copy of the job a Re-run repeats. On
        Kubernetes, where the hub does not reach the homes, the job's pod makes the same copy.
        A script is not copied: it runs where it is."""
        if not self.backend.sees_homes or rec.kind == jobspec.SCRIPT:
            return
        home = self.homes.home_dir(rec.user)
        target = jobspec.kept_input_path(rec.output_path)
        cap = self.settings.max_notebook_bytes
        found, created = await self.homes.keep_copy(rec.user, home / source, home / target, cap)
        repeated = source != rec.notebook
        if found.state == home_files.ABSENT and repeated:
            raise JobSpecError(
                f"the notebook as job {rec.rerun_of} ran it is no longer kept ({source} is not in your home); "
                "re-run with the current notebook instead",
                404,
            )
        if found.state != home_files.OK:
            what = f"the notebook as job {rec.rerun_of} ran it ({source})" if repeated else f"notebook {source!r}"
            raise refusal(found, what, f"c.GPULabJobs.max_notebook_bytes = {cap}")
        if not created:
            raise JobSpecError(f"{target} exists already in your home: the job's own copy is never overwritten", 409)

    async def job_input(self, rec: JobRecord) -> Path:
        """What a job runs: its kept copy (a job submitted before jobs kept one: its notebook now);
        a script job its script."""
        if rec.kind == jobspec.SCRIPT:
            return await self.check_notebook(rec.user, rec.notebook, rec.kind)
        home = self.homes.home_dir(rec.user)
        kept = home / jobspec.kept_input_path(rec.output_path)
        if not self.backend.sees_homes:
            return kept
        found = await self.homes.read(rec.user, kept)
        if found.state == home_files.ABSENT:
            return await self.check_notebook(rec.user, rec.notebook)
        if found.state != home_files.OK:
            raise refusal(found, "the job's own copy of its notebook")
        return kept

    async def check_notebook(self, user: str, notebook: str, kind: str = jobspec.NOTEBOOK) -> Path:
        """The notebook's (or script's) path in the home: a regular file, reached through no symlink
        (checked as its owner)."""
        home = self.homes.home_dir(user)
        path = home / notebook
        if not self.backend.sees_homes:
            return path
        if self.owner_accounts and lookup(self.accounts.name_for(user)) is None:
            raise JobSpecError("your home directory does not exist yet: start a server once", 404)
        found = await self.homes.read(user, path)
        if found.state == home_files.OK:
            return path
        if found.state == home_files.ABSENT:
            if found.detail == str(home):
                raise JobSpecError("your home directory does not exist yet: start a server once", 404)
            raise JobSpecError(f"{kind} {notebook!r} does not exist in your home directory", 404)
        if found.state == home_files.SYMLINK:
            raise JobSpecError(
                f"{kind} path {notebook!r} goes through a symlink ({found.detail}); give the real path in your home",
                403,
            )
        if found.state == home_files.NOT_A_FILE:
            raise JobSpecError(f"{kind} {notebook!r} is not a regular file in your home directory", 404)
        raise refusal(found, f"{kind} {notebook!r}")

    async def create_job(
        self,
        user: str,
        groups: Iterable[str],
        body: dict[str, Any],
        rerun_of: JobRecord | None = None,
        run_parameters: Mapping[str, Any] | None = None,
    ) -> tuple[JobRecord, bool]:
        """Validate, admit and record a job, and keep its notebook; ``(record, created)``.
        ``rerun_of``: the job whose kept notebook this one runs again. ``run_parameters``: a sweep
        run's parameters, recorded (and in ``GPULAB_JOB_PARAMETERS``) for a script too, whose
        arguments carry them. Raises :class:`JobSpecError` (:class:`AdmissionRefused` when the
        ledger has no share for it now)."""
        groups = list(groups)
        sub = await self.validate(user, groups, body, check_notebook=rerun_of is None)
        full = self.runtime.disk_full()
        if full is not None:  # before anything is written
            raise JobSpecError(full, 507)
        if sub.idempotency_key:
            with self.db() as s:
                existing = s.scalars(
                    select(JobRecord).where(JobRecord.user == user, JobRecord.idempotency_key == sub.idempotency_key)
                ).first()
            if existing is not None:
                return existing, False
        request = sub.request
        profile = request.profile
        # The GPUs of all its nodes at once: a multi-node job is a gang, admitted whole or not at all.
        milli = self.backend.prepare(sub) * sub.nodes
        ledger = self.runtime.ledger
        may_burst = sub.priority.may_burst
        # Decide first, write after: no database transaction may stay open while
        # the ledger runs its observers (they write to the same database).
        budget = self.runtime.budget_verdict(request.team.name, user, may_burst) if milli else None
        if budget is not None and budget.action == REFUSE:
            log.warning("gpulab jobs: refused %s for %s: %s", sub.name, user, budget.sentence)
            raise JobSpecError(budget.sentence, 403)
        preemptible = budget is not None and budget.action != ALLOW
        kinds = reclaim.RECLAIM_KINDS if self.backend.takes_back else None
        decision = ledger.admit(
            request.team.name,
            user,
            milli,
            may_burst=may_burst,
            members=sub.nodes,
            profile=profile.slug,
            reclaim_kinds=kinds,
        )
        if not decision.allowed and decision.reclaim and not decision.over_quota and kinds is not None:
            # In-quota work held back by borrowers of its department: take their jobs back, then admit.
            taken = reclaim.take_back(self, decision, f"team {request.team.name}'s {sub.job_class} job {sub.name!r}")
            if taken:
                decision = ledger.admit(
                    request.team.name, user, milli, may_burst=may_burst, members=sub.nodes, profile=profile.slug
                )
        if decision.allowed and preemptible and not decision.over_quota:
            decision = replace(decision, over_quota=True)  # past its budget: preemptible
        if not decision.allowed:
            log.warning("gpulab jobs: refused %s for %s: %s", sub.name, user, decision.reason)
            raise AdmissionRefused(decision.reason, 403)
        stamp = utcnow().strftime("%Y%m%d-%H%M%S")
        with self.db() as s:
            rec = JobRecord(
                name=sub.name,
                user=user,
                team=request.team.name,
                profile=profile.slug,
                job_class=sub.job_class,
                state=jobspec.QUEUED,
                reason="",
                gpu_milli=milli,
                notebook=sub.notebook,
                kind=sub.kind,
                args_json=json.dumps(list(sub.args)),
                nodes=sub.nodes,
                output_path="",
                log_path="",
                parameters_json=json.dumps(dict(sub.parameters) if run_parameters is None else dict(run_parameters)),
                time_limit_seconds=sub.time_limit_seconds,
                idempotency_key=sub.idempotency_key,
                rerun_of=rerun_of.id if rerun_of is not None else None,
                backend=self.backend.name,
                created_at=utcnow(),
                over_quota=decision.over_quota,
            )
            s.add(rec)
            s.flush()  # the id names the ledger key and the output files
            run = f"{stamp}-{rec.id}"
            rec.output_path, rec.log_path = jobspec.output_paths(sub.notebook, sub.name, run, sub.kind)
            rec.checkpoint_path = jobspec.checkpoint_path(sub.notebook, sub.name, run)
            rec.record(
                jobspec.QUEUED,
                "admitted "
                + ("over quota (preemptible)" if decision.over_quota else "within the team guarantee")
                + (f" ({budget.sentence})" if preemptible and budget is not None else ""),
            )
            s.commit()
        key = jobspec.workload_key(rec.id)
        decision = ledger.reserve(
            key,
            request.team.name,
            user,
            milli,
            profile=profile.slug,
            kind="job",
            may_burst=may_burst,
            members=sub.nodes,
            preemptible=preemptible,
        )
        if not decision.allowed or decision.over_quota != rec.over_quota:
            # Someone else took the share between the two steps: undo the record.
            if decision.allowed:
                ledger.release(key)
            with self.db() as s:
                s.delete(s.get(JobRecord, rec.id))
                s.commit()
            raise AdmissionRefused(decision.reason or "quota changed while admitting; submit again", 409)
        source = jobspec.kept_input_path(rerun_of.output_path) if rerun_of is not None else sub.notebook
        self.preparing.add(rec.id)
        try:
            await self.keep_input(rec, source)
        except JobSpecError:  # nothing of the job stays: neither its share nor its record
            ledger.release(key)
            with self.db() as s:
                s.delete(s.get(JobRecord, rec.id))
                s.commit()
            raise
        finally:
            self.preparing.discard(rec.id)
        log.info(
            "gpulab jobs: job %d (%s, %s) by %s admitted in team %s: %d milli-GPU, %s",
            rec.id,
            rec.name,
            rec.job_class,
            user,
            rec.team,
            milli,
            decision.quota_label,
        )
        self.backend.submitted(rec)
        self.wake()
        return rec, True

    async def rerun(self, rec: JobRecord, groups: Iterable[str], notebook: str = RERUN_KEPT) -> JobRecord:
        """Submit ``rec`` again with its profile, team, class, parameters or arguments, nodes and time
        limit: the notebook exactly as it ran (its kept copy; the new job's ``rerun_of``), or, with
        ``notebook="current"``, the notebook as it is now (a new submission of the same settings).
        A script runs as it is now either way (it is never copied)."""
        if notebook not in RERUN_CHOICES:
            raise JobSpecError(f"notebook must be one of {', '.join(RERUN_CHOICES)}, not {str(notebook)[:40]!r}")
        body: dict[str, Any] = {
            rec.kind: rec.notebook,
            "job_class": rec.job_class,
            "profile": rec.profile,
            "team": rec.team,
            "time_limit_seconds": rec.time_limit_seconds,
            "name": rec.name,
            "nodes": rec.nodes,
        }
        if rec.kind == jobspec.SCRIPT:
            body["args"] = rec.args
        else:
            body["parameters"] = rec.parameters
        new, _ = await self.create_job(rec.user, groups, body, rerun_of=rec if notebook == RERUN_KEPT else None)
        return new

    # -- state changes ------------------------------------------------------

    def transition(self, job_id: int, state: str, reason: str = "", **fields: Any) -> JobRecord | None:
        """Move a job to ``state`` (if the state machine allows it) and keep the ledger in step."""
        with self.db() as s:
            rec = s.get(JobRecord, job_id)
            if rec is None:
                return None
            if rec.state == state and not fields:
                return rec
            if rec.state != state and not jobspec.may_transition(rec.state, state):
                log.warning("gpulab jobs: job %d: ignored %s -> %s (%s)", job_id, rec.state, state, reason)
                return rec
            now = utcnow()
            for k, val in fields.items():
                setattr(rec, k, val)
            held = rec.quota_held  # False: reclaim took its share; it waits to be admitted again
            changed = rec.state != state
            if changed:
                rec.record(state, reason, now)
                if state == jobspec.RUNNING and "started_at" not in fields:
                    rec.started_at = now
                if state in FINAL_STATES:
                    rec.finished_at = now
            s.commit()
        key = jobspec.workload_key(job_id)
        ledger = self.runtime.ledger
        if state == jobspec.RUNNING:
            ledger.confirm(key)
        elif state in (jobspec.PREEMPTED, jobspec.QUEUED) and held:
            w = ledger.get(key)
            if w is None:
                # Its pod is gone (Kueue suspended the Job, or a preemption), so
                # a ledger rebuilt from pods dropped it: the job still holds its share.
                ledger.adopt(
                    Workload(
                        key, rec.team, rec.user, rec.gpu_milli, rec.profile, "job", rec.over_quota, RESERVED, rec.nodes
                    )
                )
            elif w.state != RESERVED:  # still admitted, waiting for devices again
                ledger.adopt(replace(w, state=RESERVED))
        elif state in FINAL_STATES:
            ledger.release(key)
            if changed:  # its share is free: a sweep may admit its next run now
                self.wake()
        if changed:
            log.info("gpulab jobs: job %d -> %s%s", job_id, state, f" ({reason})" if reason else "")
        return rec

    def set_reason(self, job_id: int, reason: str) -> None:
        """Say why a job stays in its state (a queued job waiting for its owner's running jobs)."""
        with self.db() as s:
            rec = s.get(JobRecord, job_id)
            if rec is not None and rec.reason != reason:
                rec.reason = reason
                s.commit()

    async def cancel(self, rec: JobRecord, by: str) -> JobRecord:
        if rec.state in FINAL_STATES:
            raise JobSpecError(f"job {rec.id} already {rec.state}", 409)
        await self.backend.cancel(rec, f"cancelled by {by}")
        self.wake()
        return self.get_job(rec.id) or rec


def get_service(config: Any = None) -> JobService:
    """The hub process's job service, kept on the runtime (created and started on first use)."""
    runtime = get_runtime(config=config)
    if runtime.jobs is None:
        runtime.jobs = JobService(config, runtime)
        runtime.jobs.start()
    service: JobService = runtime.jobs
    return service


def start_with_hub() -> None:
    """Start the service as soon as the hub has initialised (jobs recover without a request).

    Called when the handlers are imported from the hub's config file, which
    JupyterHub loads inside its running event loop.
    """
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:
        return

    async def wait_for_hub() -> None:
        from jupyterhub.app import JupyterHub

        if not JupyterHub.initialized():
            return
        app = JupyterHub.instance()
        for _ in range(6000):
            if getattr(app, "tornado_application", None) is not None:
                get_service(app.config)
                return
            await asyncio.sleep(0.1)

    loop.create_task(wait_for_hub())
