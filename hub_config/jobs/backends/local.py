"""The single-server job backend: papermill processes on this machine's GPUs.

- Placement goes through the runtime's :class:`~spawner.packer.DevicePacker`
  -- the one the notebook spawner uses -- so jobs and notebooks never share
  more of a GPU than it has.
- The queue is ordered by priority (training before batch), then age. A job
  that does not fit waits; a training job that does not fit preempts running
  batch jobs when releasing them would make it fit: SIGTERM to the runner's
  process group, the job is recorded ``preempted`` and, once its process is
  gone, ``queued`` again (it keeps its quota admission and runs again later).
- Time limits: a job running longer than its limit is stopped and ``timed-out``.
- Users: when servers run as the users' own system accounts (``c.UserAccounts``),
  a job's runner runs as its owner's account too. The runner itself creates the
  output folder and the log in the owner's home, so everything there is the
  owner's and the hub never writes into a home as root. Its exit-status file is
  created by the hub, owned by the owner, in a folder others cannot list.
  A hub that is not root does all of this through the mediator over sudo
  (:mod:`spawner.sudo`): the runner starts as the owner, signals go through
  the mediator, and the exit-status file lives in the owner's home
  (``~/.gpulab/jobs/``), where the hub reads it, like the log, as the owner.
- Hub restarts: runners live in their own session and outlive the hub; on start
  a ``running`` job whose runner still lives is re-adopted (devices and quota),
  one whose runner is gone is finished from its exit-status file, or marked
  ``failed`` with the reason when there is none. Nothing is lost silently.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from hub_config.jobs.backends.base import JobBackend, log
from hub_config.jobs.models import JobRecord
from hub_config.storage.db import as_utc, utcnow
from spawner import jobspec
from spawner.accounts import Account, AccountError, demote_kwargs, lookup
from spawner.env import gpu_env
from spawner.local import ensure_packer
from spawner.packer import FULL
from spawner.sudo import SudoError, process_alive

RUNNER_MODULE = "hub_config.jobs.runner"


def _alive(pid: int) -> bool:
    """Is ``pid`` a live (non-zombie) process? (Runners outlive the hub: not always our children.)"""
    return process_alive(pid)


def _cmdline(pid: int) -> list[str]:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
    except OSError:
        return []


class LocalJobBackend(JobBackend):
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
        #: job id -> (SIGKILL deadline, state to enter once the process is gone or None).
        self.stopping: dict[int, tuple[float, str | None]] = {}
        #: victim job id -> the training job it was preempted for.
        self.preempting: dict[int, int] = {}
        #: job id -> (reason, fields) of a start whose runner runs but whose record could not
        #: be written (the database was locked or its disk full): written at the next tick.
        self.unrecorded_starts: dict[int, tuple[str, dict[str, Any]]] = {}
        #: The hub is not root: it acts as the owners through the mediator over sudo.
        self.sudo = service.owner_accounts and service.accounts.uses_sudo()
        self.state_dir = Path(self.settings.state_dir)
        self.state_dir.mkdir(parents=True, exist_ok=True)
        if service.owner_accounts:  # runners (other accounts) reach their own file; nobody lists
            os.chmod(self.state_dir, 0o711)

    @property
    def packer(self):
        return ensure_packer(self.runtime)

    # -- the service's calls ---------------------------------------------------

    def prepare(self, request, v: dict[str, Any]) -> int:
        """The milli-GPUs the job takes; refuses a profile this server can never hold."""
        profile = request.profile
        milli = profile.gpu_milli
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
        else:
            self.service.transition(rec.id, jobspec.CANCELLED, reason)
            self._release_devices(rec.id)

    def status_path(self, rec: JobRecord, attempt: int) -> Path:
        """Where the runner of ``rec``'s attempt writes its exit status."""
        name = f"job-{rec.id}-attempt-{attempt}.json"
        if self.sudo:  # the owner's file, in the owner's home: the hub reads it through the mediator
            return self.service.home_dir(rec.user) / ".gpulab" / "jobs" / name
        return self.state_dir / name

    # -- restart ------------------------------------------------------------------

    async def recover(self) -> None:
        self.packer  # noqa: B018 -- create the shared packer now, so /me shows capacity before any spawn
        for rec in self.service.active(self.name):
            if rec.state == jobspec.PREEMPTED:  # the hub stopped while the runner was being stopped
                if rec.pid and _alive(rec.pid) and RUNNER_MODULE in _cmdline(rec.pid):
                    self.pids[rec.id] = rec.pid
                    with self.runtime.lock:
                        try:
                            self.packer.adopt(jobspec.workload_key(rec.id), rec.shares)
                        except Exception as e:
                            log.error("gpulab jobs: cannot re-adopt devices of job %d: %s", rec.id, e)
                    self._terminate(rec.id, jobspec.QUEUED)
                else:
                    self.service.transition(rec.id, jobspec.QUEUED, "requeued after preemption")
                continue
            if rec.state != jobspec.RUNNING:
                continue
            key = jobspec.workload_key(rec.id)
            cmd = _cmdline(rec.pid) if rec.pid else []
            status = str(self.status_path(rec, rec.attempts))
            if rec.pid and _alive(rec.pid) and RUNNER_MODULE in cmd and status in cmd:
                try:
                    with self.runtime.lock:
                        self.packer.adopt(key, rec.shares)
                except Exception as e:  # devices changed under us: the job goes on, say so
                    log.error("gpulab jobs: cannot re-adopt devices %s of job %d: %s", rec.shares, rec.id, e)
                self.pids[rec.id] = rec.pid  # the ledger adopted it in JobService.start()
                log.info("gpulab jobs: re-adopted running job %d (pid %d)", rec.id, rec.pid)
            else:
                self._finish_from_status(
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

    def _record_starts(self) -> None:
        for job_id, (reason, fields) in list(self.unrecorded_starts.items()):
            self.service.transition(job_id, jobspec.RUNNING, reason, **fields)
            del self.unrecorded_starts[job_id]

    def _reap(self) -> None:
        for job_id, pid in list(self.pids.items()):
            proc = self.procs.get(job_id)
            done = proc.poll() is not None if proc is not None else not _alive(pid)
            if not done:
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
            else:
                rec = self.service.get(job_id)
                if rec is not None and rec.state == jobspec.RUNNING:
                    self._finish_from_status(rec, gone_reason="the runner exited without an exit status")
            self.pids.pop(job_id, None)
            self.procs.pop(job_id, None)
            self._release_devices(job_id)

    def _finish_from_status(self, rec: JobRecord, gone_reason: str) -> None:
        path = self.status_path(rec, rec.attempts)
        try:
            # Through sudo the file is in the owner's home: read as the owner; else it is the hub's own.
            status = json.loads(self.service.read_home_file(rec.user, path) if self.sudo else path.read_bytes())
        except (OSError, ValueError, jobspec.JobSpecError):  # missing, or empty: the runner never finished
            status = None
        if not isinstance(status, dict):
            status = None
        if status is None:
            self.service.transition(rec.id, jobspec.FAILED, gone_reason)
        elif status.get("returncode") == 0:
            self.service.transition(rec.id, jobspec.SUCCEEDED, "the notebook ran to the end")
        else:
            self.service.transition(
                rec.id, jobspec.FAILED, status.get("error") or f"papermill exited with {status.get('returncode')}"
            )
        self._release_devices(rec.id)

    def _enforce_time_limits(self) -> None:
        now = utcnow()
        for rec in self.service.active(self.name):
            if rec.state != jobspec.RUNNING or rec.id in self.stopping or rec.started_at is None:
                continue
            if (now - as_utc(rec.started_at)).total_seconds() > rec.time_limit_seconds:
                self.service.transition(rec.id, jobspec.TIMED_OUT, f"time limit of {rec.time_limit_seconds} s reached")
                self._terminate(rec.id, None)

    def _schedule(self) -> None:
        # A job whose runner already runs (its start not yet recorded) is not started again.
        waiting = [r for r in self.service.active(self.name) if r.state == jobspec.QUEUED and r.id not in self.pids]
        waiting.sort(key=lambda r: (-jobspec.priority_for(r.job_class).rank, r.id))
        for rec in waiting:
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
            self._start(rec, [list(s) for s in placement.shares] if placement else [])

    # -- preemption ----------------------------------------------------------------------

    def _preempt_for(self, rec: JobRecord, models) -> None:
        """Stop just enough running batch jobs for ``rec`` to fit, if that can make it fit."""
        if rec.id in self.preempting.values():
            return  # victims are on their way out
        running = [
            r
            for r in self.service.active(self.name)
            if r.state == jobspec.RUNNING
            and r.job_class == "batch"
            and r.id in self.pids
            and r.id not in self.stopping
            and r.gpu_milli
        ]
        # Over-quota work first, then the youngest: the least work lost.
        running.sort(key=lambda r: (not r.over_quota, -(r.started_at.timestamp() if r.started_at else 0)))
        victims: list[tuple[int, Any]] = []
        fits = False
        with self.runtime.lock:
            packer = self.packer
            try:
                for victim in running:
                    placement = packer.release(jobspec.workload_key(victim.id))
                    if placement is None:
                        continue
                    victims.append((victim.id, placement))
                    if packer.can_place(rec.gpu_milli, models):
                        fits = True
                        break
            finally:  # a what-if: put everything back, the processes still run
                for _, placement in victims:
                    packer.adopt(placement.key, placement.shares)
        if not fits:
            return
        for victim_id, _ in victims:
            self.service.transition(
                victim_id, jobspec.PREEMPTED, f"preempted by training job {rec.id}, which needs its GPU"
            )
            self.preempting[victim_id] = rec.id
            self._terminate(victim_id, jobspec.QUEUED)

    # -- processes -------------------------------------------------------------------------

    def _start(self, rec: JobRecord, shares: list[list[int]]) -> None:
        key = jobspec.workload_key(rec.id)
        account: Account | None = None
        try:
            if self.service.owner_accounts:
                account = self.service.accounts.account_for(rec.user)
            home = self.service.home_dir(rec.user)
            source = self.service.check_notebook(rec.user, rec.notebook)
            output = home / rec.output_path
            log_file = home / rec.log_path
            # Checked here, created by the runner as the owner: never by the hub inside a home.
            self.service.safe_path(rec.user, output, create_parent=account is None)
            self.service.safe_path(rec.user, log_file)
        except (jobspec.JobSpecError, AccountError) as e:  # e.g. the file went away while queued
            self._release_devices(rec.id)
            self.service.transition(rec.id, jobspec.FAILED, str(e))
            return
        attempt = rec.attempts + 1
        status = self.status_path(rec, attempt)
        try:
            if not self.sudo:  # through sudo, the mediator clears it and the runner creates it
                self._create_status_file(status, account)
        except OSError as e:
            self._release_devices(rec.id)
            self.service.transition(rec.id, jobspec.FAILED, f"cannot create the job's status file: {e}")
            return
        env = {k: os.environ[k] for k in self.settings.env_keep if k in os.environ}
        env.update(gpu_env(rec.team, rec.profile, rec.gpu_milli, rec.over_quota, shares, self.packer.devices))
        env.update(
            {
                "HOME": str(home),
                "GPULAB_JOB_ID": str(rec.id),
                "GPULAB_JOB_CLASS": rec.job_class,
                "GPULAB_JOB_PARAMETERS": json.dumps(rec.parameters),
                # A batch job is always preemptible here, whatever its quota.
                "GPULAB_PREEMPTIBLE": "1" if rec.job_class == "batch" or rec.over_quota else "0",
                "PYTHONUNBUFFERED": "1",
            }
        )
        if account is not None:
            env.update({"USER": account.name, "LOGNAME": account.name, "SHELL": account.shell})
        files = {
            "input": str(source),
            "output": str(output),
            "cwd": str(source.parent),
            "status": str(status),
            "log": str(log_file),
        }
        try:
            if self.sudo and account is not None:  # the mediator starts it in a session of its own
                pid = self.service.accounts.launcher.start_job(account.name, env, attempt=attempt, **files)
            else:
                cmd = [
                    sys.executable,
                    "-m",
                    RUNNER_MODULE,
                    *(a for k, v in files.items() for a in (f"--{k}", v)),
                    "--attempt",
                    str(attempt),
                ]
                proc = subprocess.Popen(
                    cmd,
                    cwd=str(source.parent),
                    env=env,
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                    stdin=subprocess.DEVNULL,
                    start_new_session=True,  # own group: SIGTERM reaches the kernel too
                    **(demote_kwargs(account) if account is not None else {}),
                )
                self.procs[rec.id] = proc
                pid = proc.pid
        except (OSError, subprocess.SubprocessError, SudoError) as e:
            self._release_devices(rec.id)
            self.service.transition(rec.id, jobspec.FAILED, f"cannot start papermill: {e}")
            return
        self.pids[rec.id] = pid
        reason = f"on device(s) {','.join(str(i) for i, _ in shares) or 'none (CPU)'}"
        fields: dict[str, Any] = {"pid": pid, "shares_json": json.dumps(shares), "attempts": attempt}
        try:
            self.service.transition(rec.id, jobspec.RUNNING, reason, **fields)
        except Exception:  # the runner runs: record it at the next tick, never start it twice
            self.unrecorded_starts[rec.id] = (reason, fields)
            raise
        log.info(
            "gpulab jobs: started job %d (%s) pid %d as %s, %s",
            rec.id,
            key,
            pid,
            account.name if account is not None else "the hub's account",
            env.get("CUDA_VISIBLE_DEVICES"),
        )

    @staticmethod
    def _create_status_file(path: Path, account: Account | None) -> None:
        """An empty status file only the runner's account (and the hub) may read or write."""
        path.unlink(missing_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        try:
            if account is not None:
                os.fchown(fd, account.uid, account.gid)
        finally:
            os.close(fd)

    def _signal(self, job_id: int, pid: int, sig: int) -> None:
        """``sig`` to the runner's process group (papermill's kernel is in it)."""
        if self.sudo:
            rec = self.service.get(job_id)
            account = lookup(self.service.accounts.name_for(rec.user)) if rec is not None else None
            if account is None:
                log.error("gpulab jobs: cannot signal job %d: its owner's account is gone", job_id)
                return
            try:
                self.service.accounts.launcher.signal(account.name, pid, sig, group=True)
            except SudoError as e:
                log.error("gpulab jobs: cannot signal job %d: %s", job_id, e)
            return
        try:
            os.killpg(pid, sig)
        except (ProcessLookupError, PermissionError):
            pass

    def _terminate(self, job_id: int, then: str | None) -> None:
        pid = self.pids.get(job_id)
        if pid is None:
            self._release_devices(job_id)
            if then:
                self.service.transition(job_id, then, "requeued after preemption")
            return
        self.stopping[job_id] = (time.monotonic() + self.settings.stop_grace_seconds, then)
        self._signal(job_id, pid, signal.SIGTERM)

    def _release_devices(self, job_id: int) -> None:
        with self.runtime.lock:
            self.packer.release(jobspec.workload_key(job_id))
