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
- Limits: each runner starts in a cgroup of its own with its profile's and team's
  memory, CPU and process limits, only its placed GPU device nodes and a private
  /tmp (:mod:`spawner.confinement`), and one user runs at most
  ``max_running_jobs_per_user`` jobs (or her team's ``limits.running_jobs``) at
  once, CPU-only ones included; the rest wait, queued, with the reason.
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
from spawner.accounts import Account, AccountError, lookup
from spawner.cgroups import CgroupError
from spawner.confinement import Confinement, Confiner, UserLimits, get_confiner
from spawner.devices import placed_minors
from spawner.env import gpu_env
from spawner.limits import LimitDefaults, running_jobs_cap, running_jobs_reason, workload_limits
from spawner.local import ensure_packer
from spawner.model import Profile
from spawner.packer import FULL
from spawner.sudo import ROOT, SUDO, SudoError, process_alive

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
        #: The hub is not root: it acts as the owners through the mediator over sudo.
        self.sudo = service.owner_accounts and service.accounts.uses_sudo()
        self.user_limits = UserLimits(config=service.config) if service.config is not None else UserLimits()
        self.state_dir = Path(self.settings.state_dir)
        self.state_dir.mkdir(parents=True, exist_ok=True)
        if service.owner_accounts:  # runners (other accounts) reach their own file; nobody lists
            os.chmod(self.state_dir, 0o711)

    @property
    def packer(self):
        return ensure_packer(self.runtime)

    @property
    def confiner(self) -> Confiner:
        return get_confiner(self.user_limits, SUDO if self.sudo else ROOT)

    def cgroup_name(self, rec: JobRecord) -> str:
        return f"{self.service.accounts.name_for(rec.user)}.job-{rec.id}"

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
        self._reap()
        self._enforce_time_limits()
        self._schedule()

    def _reap(self) -> None:
        for job_id, pid in list(self.pids.items()):
            proc = self.procs.get(job_id)
            done = proc.poll() is not None if proc is not None else not _alive(pid)
            if not done:
                deadline, _ = self.stopping.get(job_id, (None, None))
                if deadline is not None and time.monotonic() > deadline:
                    self._signal(job_id, pid, signal.SIGKILL)
                continue
            self.pids.pop(job_id, None)
            self.procs.pop(job_id, None)
            oom = self._oom_note(job_id)  # read before its cgroup goes
            self._release_devices(job_id)
            if job_id in self.stopping:
                _, then = self.stopping.pop(job_id)
                self.preempting.pop(job_id, None)
                if then:
                    self.service.transition(job_id, then, "requeued after preemption")
                continue
            rec = self.service.get(job_id)
            if rec is not None and rec.state == jobspec.RUNNING:
                self._finish_from_status(rec, gone_reason="the runner exited without an exit status", note=oom)

    def _oom_note(self, job_id: int) -> str:
        """ "; it reached its memory limit: ..." when the OOM killer ended processes in the job's cgroup."""
        rec = self.service.get(job_id)
        if rec is None or not self.service.owner_accounts:
            return ""
        kills = self.confiner.oom_kills(self.cgroup_name(rec))
        if not kills:
            return ""
        return f"; it reached its memory limit: the kernel ended {kills} of its processes (out of memory)"

    def _finish_from_status(self, rec: JobRecord, gone_reason: str, note: str = "") -> None:
        path = self.status_path(rec, rec.attempts)
        try:
            # Through sudo the file is in the owner's home: read as the owner; else it is the hub's own.
            status = json.loads(self.service.read_home_file(rec.user, path) if self.sudo else path.read_bytes())
        except (OSError, ValueError, jobspec.JobSpecError):  # missing, or empty: the runner never finished
            status = None
        if not isinstance(status, dict):
            status = None
        self._release_devices(rec.id)
        if status is None:
            self.service.transition(rec.id, jobspec.FAILED, gone_reason + note)
        elif status.get("returncode") == 0:
            self.service.transition(rec.id, jobspec.SUCCEEDED, "the notebook ran to the end")
        else:
            error = status.get("error") or f"papermill exited with {status.get('returncode')}"
            self.service.transition(rec.id, jobspec.FAILED, f"{error}{note}")

    def _enforce_time_limits(self) -> None:
        now = utcnow()
        for rec in self.service.active(self.name):
            if rec.state != jobspec.RUNNING or rec.id in self.stopping or rec.started_at is None:
                continue
            if (now - as_utc(rec.started_at)).total_seconds() > rec.time_limit_seconds:
                self.service.transition(rec.id, jobspec.TIMED_OUT, f"time limit of {rec.time_limit_seconds} s reached")
                self._terminate(rec.id, None)

    def _schedule(self) -> None:
        active = self.service.active(self.name)
        waiting = [r for r in active if r.state == jobspec.QUEUED]
        waiting.sort(key=lambda r: (-jobspec.priority_for(r.job_class).rank, r.id))
        # Runners alive per user (running, or on their way out after a preemption).
        running: dict[str, int] = {}
        for r in active:
            if r.id in self.pids:
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
            self._start(rec, [list(s) for s in placement.shares] if placement else [])
            if rec.id in self.pids:
                running[rec.user] = running.get(rec.user, 0) + 1

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
            self.preempting[victim_id] = rec.id
            self.service.transition(
                victim_id, jobspec.PREEMPTED, f"preempted by training job {rec.id}, which needs its GPU"
            )
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
        try:
            confinement = self._confine(rec, account, shares, home)
        except (CgroupError, OSError) as e:
            self._release_devices(rec.id)
            self.service.transition(rec.id, jobspec.FAILED, f"cannot set up the job's limits: {e}")
            return
        files = {
            "input": str(source),
            "output": str(output),
            "cwd": str(source.parent),
            "status": str(status),
            "log": str(log_file),
        }
        try:
            if self.sudo and account is not None:  # the mediator starts it in a session of its own
                pid = self.service.accounts.launcher.start_job(
                    account.name,
                    env,
                    attempt=attempt,
                    preexec=confinement.sudo_preexec() if confinement else None,
                    extra=confinement.mediator_request() if confinement else None,
                    **files,
                )
            else:
                cmd = [
                    *(confinement.argv_prefix if confinement else []),
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
                    # In its cgroup, with its private /tmp, then as the owner: before papermill runs.
                    preexec_fn=confinement.root_preexec(account) if confinement else None,
                )
                self.procs[rec.id] = proc
                pid = proc.pid
        except (OSError, subprocess.SubprocessError, SudoError) as e:
            self._release_devices(rec.id)
            self.service.transition(rec.id, jobspec.FAILED, f"cannot start papermill: {e}")
            return
        self.pids[rec.id] = pid
        self.service.transition(
            rec.id,
            jobspec.RUNNING,
            f"on device(s) {','.join(str(i) for i, _ in shares) or 'none (CPU)'}",
            pid=pid,
            shares_json=json.dumps(shares),
            attempts=attempt,
        )
        log.info(
            "gpulab jobs: started job %d (%s) pid %d as %s, %s",
            rec.id,
            key,
            pid,
            account.name if account is not None else "the hub's account",
            env.get("CUDA_VISIBLE_DEVICES"),
        )

    def _confine(
        self, rec: JobRecord, account: Account | None, shares: list[list[int]], home: Path
    ) -> Confinement | None:
        """The job's cgroup (profile's and team's limits, its GPUs only) and private /tmp; ``None`` without accounts."""
        if account is None:
            return None
        profile = self.runtime.catalog.profile(rec.profile)
        team = self.runtime.catalog.team(rec.team)
        # A profile edited away while the job waited: the defaults, under the team's cap.
        limits = workload_limits(profile or Profile(rec.profile, rec.profile), team, self.user_limits.defaults())
        gpus = placed_minors((int(i) for i, _ in shares), self.packer.devices)
        status_folder = self.status_path(rec, rec.attempts + 1).parent
        confinement = self.confiner.prepare(self.cgroup_name(rec), account, limits, gpus, home, (status_folder,))
        log.info("gpulab jobs: job %d runs with %s", rec.id, confinement.words)
        return confinement

    def _release_confinement(self, job_id: int) -> None:
        rec = self.service.get(job_id)
        if rec is None or not self.service.owner_accounts:
            return
        try:
            self.confiner.release(self.cgroup_name(rec))
        except (CgroupError, OSError) as e:
            log.warning("gpulab jobs: cannot remove the cgroup of job %d: %s", job_id, e)

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
        """The job's run ended (or never began): its devices, cgroup and what is left in it go."""
        with self.runtime.lock:
            self.packer.release(jobspec.workload_key(job_id))
        self._release_confinement(job_id)
