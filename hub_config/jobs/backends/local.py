"""The single-server job backend: job runners (papermill or a script) on this machine's GPUs.

- Placement goes through the runtime's :class:`~spawner.core.packer.DevicePacker`
  -- the one the notebook spawner uses -- so jobs and notebooks never share
  more of a GPU than it has.
- The queue is ordered by priority (training before batch), then age. A job
  that does not fit waits; a training job that does not fit preempts running
  batch jobs when releasing them would make it fit: SIGTERM to the runner's
  process group, the job is recorded ``preempted`` and, once its process is
  gone, ``queued`` again (it keeps its quota admission and runs again later).
- Time limits: a job running longer than its limit is stopped and ``timed-out``.
- Limits: each runner starts in a cgroup of its own with its profile's and team's
  memory, CPU and process limits, only its placed GPU device nodes and a private
  /tmp (:mod:`spawner.local.confinement`), and one user runs at most
  ``max_running_jobs_per_user`` jobs (or her team's ``limits.running_jobs``) at
  once, CPU-only ones included; the rest wait, queued, with the reason.
- Users: when servers run as the users' own system accounts (``c.UserAccounts``),
  a job's runner runs as its owner's account too. The runner itself creates the
  output folder, the log and its exit-status file (``~/.gpulab/jobs/``) in the
  owner's home, so everything there is the owner's, no other user can list or
  read it, and the hub never writes into a home. The hub reads the log, the
  output and the exit status as the owner, through the mediator
  (:mod:`spawner.local.mediator`: as root switched to the account, or over sudo). A hub
  that is not root also starts and signals the runner through the mediator.
- Nothing a user can stop holds up another: every start, signal and exit-status read
  through the mediator is its job's own task, with the mediator's deadline, never in the tick.
- A runner is known by its pid, its account's uid and its start time
  (:mod:`spawner.local.processes`), recorded at start: a pid that now names another
  process is neither counted alive nor signalled.
- Hub restarts: runners live in their own session and outlive the hub; on start
  each job is recovered on its own: a ``running`` job whose runner still lives
  is re-adopted (devices and quota), one whose runner is gone is finished from
  its exit-status file -- whatever its owner put there: a file that cannot be
  read, or is not the runner's, fails that job with the reason and nothing else.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import time
from collections.abc import Coroutine
from pathlib import Path
from typing import Any

from hub_config.jobs.backends.base import JobBackend, log
from hub_config.jobs.backends.local_confinement import JobConfinement
from hub_config.jobs.backends.local_reclaim import JobTakeBack
from hub_config.jobs.backends.local_runner import (
    MAX_STATUS_BYTES,
    RUNNER_MODULE,
    outcome_from_status,
    run_options,
    runner_argv,
    runner_env,
)
from hub_config.jobs.homes import HubHomes, is_busy
from hub_config.jobs.models import JobRecord
from hub_config.storage.db import as_utc, database_file, storage_failure, utcnow
from spawner.core import jobspec
from spawner.core.jobspec import Submission
from spawner.core.limits import LimitDefaults, running_jobs_cap, running_jobs_reason
from spawner.core.packer import FULL
from spawner.local import home_files
from spawner.local.accounts import Account, AccountError, lookup
from spawner.local.cgroups import CgroupError
from spawner.local.confinement import UserLimits
from spawner.local.inventory import ensure_packer
from spawner.local.mediator_client import MediatorError
from spawner.local.processes import command_line, owner, process_alive, signal_group, start_time

#: Seconds past the grace before the hub's own SIGKILL to the runner's group.
KILL_MARGIN_SECONDS = 3.0


class LocalJobBackend(JobConfinement, JobTakeBack, JobBackend):
    """Runs jobs as local processes; see the module docstring."""

    name = "local"
    #: The hub can read the users' homes (check notebooks, serve logs and outputs).
    sees_homes = True

    def __init__(self, service):
        super().__init__(service)
        #: job id -> our child process (jobs adopted after a restart have none).
        self.procs: dict[int, subprocess.Popen] = {}
        #: job id -> pid of every runner we track (children and adopted).
        self.pids: dict[int, int] = {}
        #: job id -> (uid, start time) of its runner: what its pid must still name.
        self.identities: dict[int, tuple[int | None, int | None]] = {}
        #: Why a gone runner left no exit status, where that is not "it exited" (a restart).
        self.gone_reasons: dict[int, str] = {}
        #: job id -> (SIGKILL deadline, state to enter once the process is gone or None).
        self.stopping: dict[int, tuple[float, str | None]] = {}
        #: victim job id -> the training job it was preempted for.
        self.preempting: dict[int, int] = {}
        #: job id -> its start or finish in progress (each job's own task: one stuck user stalls no other).
        self.busy: dict[int, asyncio.Task] = {}
        #: job ids with a signal on its way.
        self.signalling: set[int] = set()
        #: job id -> (reason, fields) of a start whose runner runs but whose record could not
        #: be written (the database was locked or its disk full): written at the next tick.
        self.unrecorded_starts: dict[int, tuple[str, dict[str, Any]]] = {}
        #: The hub is not root: it acts as the owners through the mediator over sudo.
        self.sudo = service.owner_accounts and service.accounts.uses_sudo()
        self.user_limits = UserLimits(config=service.config) if service.config is not None else UserLimits()
        self.state_dir = Path(self.settings.state_dir)
        if not service.owner_accounts:  # the runners are the hub's account: its own folder
            self.state_dir.mkdir(parents=True, exist_ok=True)
            os.chmod(self.state_dir, 0o700)

    @property
    def packer(self):
        return ensure_packer(self.runtime)

    # -- the service's calls ---------------------------------------------------

    def prepare(self, submission: Submission) -> int:
        """The milli-GPUs the job takes; refuses a profile this server can never hold."""
        profile = submission.request.profile
        milli = profile.gpu_milli
        if submission.nodes > 1:
            raise jobspec.JobSpecError(
                f"this server is one node: a job here takes nodes: 1 (for more of its GPUs, pick a profile "
                f"with more GPUs than {profile.slug})",
                409,
            )
        if milli:
            models = {profile.gpu_model} if profile.gpu_model else None
            devices = [d for d in self.packer.devices.values() if not models or d.model in models]
            need = max(1, milli // FULL)
            if len(devices) < need:
                raise jobspec.JobSpecError(
                    f"this server has {len(devices)} {profile.gpu_model or 'GPU'}(s); "
                    f"profile {profile.slug} needs {need}",
                    409,
                )
        return milli

    def submitted(self, rec: JobRecord) -> None:
        pass  # the next tick places it

    async def cancel(self, rec: JobRecord, reason: str) -> None:
        if rec.id in self.stopping:  # being preempted: stop it for good instead of requeueing
            deadline, _ = self.stopping[rec.id]
            self.stopping[rec.id] = (deadline, None)
            self.service.transition(rec.id, jobspec.CANCELLED, reason)
        elif rec.state == jobspec.RUNNING and rec.id in self.pids:
            self.service.transition(rec.id, jobspec.CANCELLED, reason)
            self._terminate(rec.id, None)
        else:  # queued (a start in progress sees the cancellation and starts nothing)
            self.service.transition(rec.id, jobspec.CANCELLED, reason)
            self._release_devices(rec.id)

    def status_path(self, rec: JobRecord, attempt: int) -> Path:
        """Where the runner of ``rec``'s attempt writes its exit status."""
        name = f"job-{rec.id}-attempt-{attempt}.json"
        if self.service.owner_accounts:  # the owner's file, in the owner's home, read as the owner
            return self.service.homes.home_dir(rec.user) / ".gpulab" / "jobs" / name
        return self.state_dir / name

    def _uid_of(self, user: str) -> int | None:
        """The uid a user's runners run as (``None``: the account is gone)."""
        if not self.service.owner_accounts:
            return os.getuid()
        account = lookup(self.service.accounts.name_for(user))
        return account.uid if account is not None else None

    def _spawn(self, job_id: int, work: Coroutine[Any, Any, None]) -> None:
        """Run ``work`` as ``job_id``'s own task (at most one at a time per job)."""
        task = asyncio.get_running_loop().create_task(work)
        self.busy[job_id] = task

        def done(t: asyncio.Task) -> None:
            if self.busy.get(job_id) is t:
                del self.busy[job_id]
            error = None if t.cancelled() else t.exception()
            failure = storage_failure(error, database_file(self.service.config)) if error is not None else None
            if failure is not None:  # the next tick does what this task could not record
                log.warning("gpulab jobs: job %d waits: %s", job_id, failure)
            elif error is not None:
                log.error("gpulab jobs: job %d: %s", job_id, error, exc_info=error)
            self.service.wake()

        task.add_done_callback(done)

    # -- restart ------------------------------------------------------------------

    async def recover(self) -> None:
        """Each active job on its own: one whose files or processes are odd fails alone, with the reason."""
        self.packer  # noqa: B018 -- create the shared packer now, so /me shows capacity before any spawn
        records = self.service.active_jobs(self.name)
        await asyncio.gather(*(self._recover_one(rec) for rec in records))

    async def _recover_one(self, rec: JobRecord) -> None:
        try:
            await self._recover(rec)
        except Exception as e:  # noqa: BLE001 -- whatever it was, the other jobs still recover
            log.exception("gpulab jobs: cannot recover job %d", rec.id)
            self.pids.pop(rec.id, None)
            self._release_devices(rec.id)
            self.service.transition(
                rec.id, jobspec.FAILED, f"could not be recovered after the hub restarted: {type(e).__name__}: {e}"[:500]
            )

    def _runner_lives(self, rec: JobRecord, status: str) -> bool:
        """Is ``rec.pid`` still this job's runner: the owner's uid, the recorded start time?"""
        uid = self._uid_of(rec.user)
        if not rec.pid or uid is None or not process_alive(rec.pid, uid, rec.pid_started):
            return False
        if rec.pid_started is not None:
            return True
        cmd = command_line(rec.pid)  # recorded before start times were: the command line must match too
        return RUNNER_MODULE in cmd and status in cmd

    def _adopt_devices(self, rec: JobRecord) -> None:
        try:
            with self.runtime.lock:
                self.packer.adopt(jobspec.workload_key(rec.id), rec.shares)
        except Exception as e:  # devices changed under us: the job goes on, say so
            log.error("gpulab jobs: cannot re-adopt devices %s of job %d: %s", rec.shares, rec.id, e)

    async def _recover(self, rec: JobRecord) -> None:
        status = str(self.status_path(rec, rec.attempts))
        pid = rec.pid or 0
        if rec.state == jobspec.PREEMPTED:  # the hub stopped while the runner was being stopped
            if self._runner_lives(rec, status):
                self._track(rec.id, pid, self._uid_of(rec.user), rec.pid_started)
                self._adopt_devices(rec)
                self._terminate(rec.id, jobspec.QUEUED)
            else:
                self.service.transition(rec.id, jobspec.QUEUED, "requeued after preemption")
            return
        if rec.state != jobspec.RUNNING:
            return
        if self._runner_lives(rec, status):
            self._adopt_devices(rec)
            self._track(rec.id, pid, self._uid_of(rec.user), rec.pid_started)  # the ledger adopted it
            log.info("gpulab jobs: re-adopted running job %d (pid %d)", rec.id, pid)
        else:
            await self._finish_from_status(
                rec,
                gone_reason=(
                    "its process was gone when the hub restarted and left no exit status "
                    "(killed together with the hub?)"
                ),
            )

    # -- the loop ---------------------------------------------------------------------

    async def tick(self) -> None:
        # Every step writes its record before it forgets a process or frees its devices: a
        # write that fails (database locked, disk full) leaves the step to the next tick.
        self._record_starts()
        self._reap()
        self._enforce_time_limits()
        self._schedule()

    def _track(self, job_id: int, pid: int, uid: int | None, started: int | None) -> None:
        self.pids[job_id] = pid
        self.identities[job_id] = (uid, started)

    def _runner_gone(self, job_id: int, pid: int) -> bool:
        proc = self.procs.get(job_id)
        if proc is not None:
            return proc.poll() is not None  # our child: exact
        uid, started = self.identities.get(job_id, (None, None))
        return uid is None or not process_alive(pid, uid, started)

    def _record_starts(self) -> None:
        for job_id, (reason, fields) in list(self.unrecorded_starts.items()):
            now = self.service.transition(job_id, jobspec.RUNNING, reason, **fields)
            del self.unrecorded_starts[job_id]
            if (now is None or now.state != jobspec.RUNNING) and job_id in self.pids:  # cancelled meanwhile
                self.stopping[job_id] = (self._kill_deadline(), None)
                self._signal(job_id, self.pids[job_id], signal.SIGTERM)

    def _forget(self, job_id: int) -> None:
        """The job's runner is gone and its record says so: stop tracking it, free its devices."""
        self.pids.pop(job_id, None)
        self.procs.pop(job_id, None)
        self.identities.pop(job_id, None)
        self.gone_reasons.pop(job_id, None)
        self._release_devices(job_id)

    def _reap(self) -> None:
        for job_id, pid in list(self.pids.items()):
            if job_id in self.busy:  # its start (or its outcome) is still being recorded
                continue
            if not self._runner_gone(job_id, pid):
                deadline, _ = self.stopping.get(job_id, (None, None))
                if deadline is not None and time.monotonic() > deadline:
                    self._signal(job_id, pid, signal.SIGKILL)
                continue
            if job_id in self.stopping:
                _, then = self.stopping[job_id]
                if then:
                    self.service.transition(job_id, then, "requeued after preemption")
                del self.stopping[job_id]
                self.preempting.pop(job_id, None)
                self._forget(job_id)
                continue
            rec = self.service.get_job(job_id)
            if rec is not None and rec.state == jobspec.RUNNING:
                oom = self._oom_note(job_id)  # read before its cgroup goes
                # It forgets the runner once the outcome is written; a failed write tries again.
                gone = self.gone_reasons.get(job_id, "the runner exited without an exit status")
                self._spawn(job_id, self._finish_from_status(rec, gone_reason=gone, note=oom))
            else:
                self._forget(job_id)

    async def _finish_from_status(self, rec: JobRecord, gone_reason: str, note: str = "") -> None:
        path = self.status_path(rec, rec.attempts)
        try:
            if self.service.owner_accounts:
                found = await self.service.homes.read(rec.user, path, 0, MAX_STATUS_BYTES, MAX_STATUS_BYTES)
            else:  # the hub's own folder, written by runners of the hub's own account
                found = await asyncio.to_thread(
                    home_files.read_beneath, str(self.state_dir), str(path), 0, MAX_STATUS_BYTES, MAX_STATUS_BYTES
                )
        except jobspec.JobSpecError as e:  # the owner's mediator did not answer: say so, on this job only
            if is_busy(e):  # nothing was asked: a later tick's reap reads it
                log.info("gpulab jobs: job %d: exit status read later: %s", rec.id, e)
                # Known as a gone runner, so the reap asks again (after a restart it was not
                # tracked at all), with this reason; no identity: it is known to be gone.
                self.pids.setdefault(rec.id, rec.pid or 0)
                self.identities.setdefault(rec.id, (None, None))
                self.gone_reasons[rec.id] = gone_reason
                await asyncio.sleep(self.settings.poll_interval)  # held busy meanwhile: no tight retry
                return
            state, reason = jobspec.FAILED, f"its exit status could not be read: {e}"
        else:
            state, reason = outcome_from_status(found, gone_reason)
        self.service.transition(rec.id, state, reason + note if state == jobspec.FAILED else reason)
        self._forget(rec.id)

    def _enforce_time_limits(self) -> None:
        now = utcnow()
        for rec in self.service.active_jobs(self.name):
            if rec.state != jobspec.RUNNING or rec.id in self.stopping or rec.started_at is None:
                continue
            if (now - as_utc(rec.started_at)).total_seconds() > rec.time_limit_seconds:
                self.service.transition(rec.id, jobspec.TIMED_OUT, f"time limit of {rec.time_limit_seconds} s reached")
                self._terminate(rec.id, None)

    def _schedule(self) -> None:
        active = self.service.active_jobs(self.name)
        # A job whose runner already runs (its start not yet recorded) is not started again.
        # Nor one whose notebook is still being kept: it would run the notebook as it is then.
        waiting = [
            r
            for r in active
            if r.state == jobspec.QUEUED
            and r.quota_held  # one reclaim took the share of waits to be admitted again
            and r.id not in self.busy
            and r.id not in self.pids
            and r.id not in self.service.preparing
        ]
        waiting.sort(key=lambda r: (-jobspec.priority_for(r.job_class).rank, r.id))
        # Runners alive per user (running, or on their way out after a preemption).
        running: dict[str, int] = {}
        for r in active:
            if r.id in self.pids or (r.id in self.busy and r.state == jobspec.QUEUED):  # running, or starting
                running[r.user] = running.get(r.user, 0) + 1
        for rec in waiting:
            if self._over_running_cap(rec, running.get(rec.user, 0)):
                continue
            key = jobspec.workload_key(rec.id)
            profile = self.runtime.catalog.profile(rec.profile)
            models = {profile.gpu_model} if profile is not None and profile.gpu_model else None
            placement = None
            if rec.gpu_milli:
                with self.runtime.lock:
                    if self.packer.placement(key) is None:
                        placement = self.packer.place(key, rec.gpu_milli, models)
                    else:
                        placement = self.packer.placement(key)
                if placement is None:
                    if rec.job_class == "training":
                        self._preempt_for(rec, models)
                    continue
            self._spawn(rec.id, self._start(rec, [list(s) for s in placement.shares] if placement else []))
            running[rec.user] = running.get(rec.user, 0) + 1  # its start is under way

    def _over_running_cap(self, rec: JobRecord, running: int) -> bool:
        """Does ``rec``'s owner already run as many jobs as she may? Then it waits, and says why."""
        team = self.runtime.catalog.team(rec.team)
        cap = running_jobs_cap(team, LimitDefaults(running_jobs=self.settings.max_running_jobs_per_user or None))
        if cap is None or running < cap:
            return False
        reason = running_jobs_reason(rec.user, running, cap, team)
        if rec.reason != reason:
            self.service.set_reason(rec.id, reason)
        return True

    # -- preemption ----------------------------------------------------------------------

    def _preempt_for(self, rec: JobRecord, models) -> None:
        """Stop just enough running batch jobs for ``rec`` to fit, if that can make it fit."""
        if rec.id in self.preempting.values():
            return  # victims are on their way out
        running = [
            r
            for r in self.service.active_jobs(self.name)
            if r.state == jobspec.RUNNING
            and r.job_class == "batch"
            and r.id in self.pids
            and r.id not in self.stopping
            and r.gpu_milli
        ]
        # Over-quota work first, then the youngest: the least work lost.
        running.sort(key=lambda r: (not r.over_quota, -(r.started_at.timestamp() if r.started_at else 0)))
        with self.runtime.lock:
            victims = self.packer.fewest_to_free((jobspec.workload_key(r.id) for r in running), rec.gpu_milli, models)
        by_key = {jobspec.workload_key(r.id): r.id for r in running}
        for victim_id in (by_key[k] for k in victims or ()):
            self.service.transition(
                victim_id, jobspec.PREEMPTED, f"preempted by training job {rec.id}, which needs its GPU"
            )
            self.preempting[victim_id] = rec.id
            self._terminate(victim_id, jobspec.QUEUED)

    # -- processes -------------------------------------------------------------------------

    def _still_queued(self, job_id: int) -> bool:
        rec = self.service.get_job(job_id)
        return rec is not None and rec.state == jobspec.QUEUED

    def _give_up(self, job_id: int, reason: str) -> None:
        self._release_devices(job_id)
        if self._still_queued(job_id):  # a job cancelled meanwhile stays cancelled
            self.service.transition(job_id, jobspec.FAILED, reason)

    async def _start(self, rec: JobRecord, shares: list[list[int]]) -> None:
        """Check the job's files as its owner, start its runner, and record it running (the job's own task)."""
        key = jobspec.workload_key(rec.id)
        account: Account | None = None
        try:
            if self.service.owner_accounts:
                account = await self.service.accounts.prepare(rec.user)
            home = self.service.homes.home_dir(rec.user)
            source = await self.service.job_input(rec)  # its notebook as submitted, or its script
            output = home / rec.output_path if rec.output_path else None
            log_file = home / rec.log_path
            checkpoint = home / rec.checkpoint_path if rec.checkpoint_path else None
            homes = self.service.homes
            if isinstance(homes, HubHomes):  # the runner writes as the hub: check what it would write through
                for path in (output, checkpoint):
                    if path is not None:
                        homes.safe_path(rec.user, path, create_parent=True)
                homes.safe_path(rec.user, log_file)
        except jobspec.JobSpecError as e:
            if is_busy(e):  # the owner's mediator calls are all taken: start it at a later tick
                self._release_devices(rec.id)
                self.service.set_reason(rec.id, f"waiting to start: {e}")
                await asyncio.sleep(self.settings.poll_interval)  # held busy meanwhile: no tight retry
                return
            self._give_up(rec.id, str(e))  # e.g. the file went away while queued
            return
        except AccountError as e:
            self._give_up(rec.id, str(e))
            return
        if not self._still_queued(rec.id):  # cancelled while its files were checked
            self._release_devices(rec.id)
            return
        attempt = rec.attempts + 1
        status = self.status_path(rec, attempt)  # the runner makes it (as the owner)
        env = runner_env(
            rec, shares, self.packer.devices, home, account, self.settings.env_keep, self.settings.torchrun_command
        )
        try:
            confinement = self._confine(rec, account, shares, home)
        except (CgroupError, OSError) as e:
            self._release_devices(rec.id)
            self.service.transition(rec.id, jobspec.FAILED, f"cannot set up the job's limits: {e}")
            return
        files = {
            "input": str(source),
            "output": str(output or ""),
            "cwd": str((home / rec.notebook).parent),  # the notebook's (script's) folder: its relative paths hold
            "status": str(status),
            "log": str(log_file),
            "checkpoint": str(checkpoint or ""),
        }
        run = run_options(rec, self.settings.stop_grace_seconds)
        uid = account.uid if account is not None else os.getuid()
        try:
            if self.sudo and account is not None:  # the mediator starts it in a session of its own
                pid = await self.service.accounts.launcher.start_job(
                    account.name,
                    env,
                    attempt=attempt,
                    run=run,
                    preexec=confinement.sudo_preexec() if confinement else None,
                    extra=confinement.mediator_request() if confinement else None,
                    **files,
                )
                if owner(pid) != account.uid:  # the answer is the account's word: check it
                    raise MediatorError(f"the mediator answered pid {pid}, which is not a process of {account.name}")
            else:
                proc = subprocess.Popen(
                    runner_argv(confinement.argv_prefix if confinement else [], files, attempt, run),
                    cwd=files["cwd"],
                    env=env,
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                    stdin=subprocess.DEVNULL,
                    start_new_session=True,  # own group: SIGTERM reaches the kernel too
                    # In its cgroup, with its private /tmp, then as the owner: before papermill runs.
                    preexec_fn=confinement.root_preexec(account) if confinement else None,
                )
                self.procs[rec.id] = proc
                pid = proc.pid
        except (OSError, subprocess.SubprocessError, MediatorError) as e:
            self._give_up(rec.id, f"cannot start the job's runner: {e}")
            return
        started = start_time(pid)
        self._track(rec.id, pid, uid, started)
        reason = f"on device(s) {','.join(str(i) for i, _ in shares) or 'none (CPU)'}"
        fields: dict[str, Any] = {
            "pid": pid,
            "pid_started": started,
            "shares_json": json.dumps(shares),
            "attempts": attempt,
        }
        try:
            now = self.service.transition(rec.id, jobspec.RUNNING, reason, **fields)
        except Exception:  # the runner runs: record it at the next tick, never start it twice
            self.unrecorded_starts[rec.id] = (reason, fields)
            raise
        if now is None or now.state != jobspec.RUNNING:  # cancelled while the mediator started it
            self.stopping[rec.id] = (self._kill_deadline(), None)
            self._signal(rec.id, pid, signal.SIGTERM)
            return
        log.info(
            "gpulab jobs: started job %d (%s) pid %d as %s, %s",
            rec.id,
            key,
            pid,
            account.name if account is not None else "the hub's account",
            env.get("CUDA_VISIBLE_DEVICES"),
        )

    def _signal(self, job_id: int, pid: int, sig: int) -> None:
        """``sig`` to the runner's process group (papermill's kernel is in it), while it is still the runner."""
        uid, started = self.identities.get(job_id, (None, None))
        if not self.sudo:
            if uid is None:
                log.error("gpulab jobs: cannot signal job %d: its owner's account is gone", job_id)
            elif not signal_group(pid, uid, started, sig):
                log.info("gpulab jobs: job %d: pid %d is no longer its runner; not signalled", job_id, pid)
            return
        if job_id in self.signalling:  # one on its way already; the next tick sends again if needed
            return
        self.signalling.add(job_id)
        task = asyncio.get_running_loop().create_task(self._signal_as_owner(job_id, pid, sig, started))
        task.add_done_callback(lambda _: self.signalling.discard(job_id))

    async def _signal_as_owner(self, job_id: int, pid: int, sig: int, started: int | None) -> None:
        rec = self.service.get_job(job_id)
        account = lookup(self.service.accounts.name_for(rec.user)) if rec is not None else None
        if account is None:
            log.error("gpulab jobs: cannot signal job %d: its owner's account is gone", job_id)
            return
        try:
            await self.service.accounts.launcher.signal(account.name, pid, sig, group=True, started=started)
        except MediatorError as e:
            log.error("gpulab jobs: cannot signal job %d: %s", job_id, e)

    def _terminate(self, job_id: int, then: str | None) -> None:
        pid = self.pids.get(job_id)
        if pid is None:
            self._release_devices(job_id)
            if then:
                self.service.transition(job_id, then, "requeued after preemption")
            return
        self.stopping[job_id] = (self._kill_deadline(), then)
        self._signal(job_id, pid, signal.SIGTERM)

    def _kill_deadline(self) -> float:
        """When the hub SIGKILLs a runner it sent SIGTERM: a moment after the grace, which the
        runner itself ends by killing every process of the job still there (those outside its
        process group too, which a SIGKILL to the group would miss)."""
        return time.monotonic() + self.settings.stop_grace_seconds + KILL_MARGIN_SECONDS

    def _release_devices(self, job_id: int) -> None:
        """The job's run ended (or never began): its devices, cgroup and what is left in it go."""
        with self.runtime.lock:
            self.packer.release(jobspec.workload_key(job_id))
        self._release_confinement(job_id)
