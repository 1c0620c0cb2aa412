"""``AccountProcessSpawner``: a local process spawner whose servers run as their users' accounts.

The base of :class:`spawner.local.GPULocalSpawner`; it knows nothing of GPUs.
"""

from __future__ import annotations

import asyncio
import hashlib
import re
import shlex
import shutil
from pathlib import Path
from subprocess import Popen
from typing import Any

from jupyterhub.spawner import LocalProcessSpawner, set_user_setuid
from jupyterhub.utils import random_port
from tornado import web

from spawner.core.limits import WorkloadLimits

from .accounts import Account, AccountError, AccountRefused, UserAccounts
from .cgroups import CgroupError
from .confinement import Confinement, Confiner, UserLimits, get_confiner, server_capture_argv
from .mediator_client import MediatorError
from .processes import owner, process_alive, signal_process, start_time
from .sudo import ROOT, SUDO


def server_cgroup_name(account: str, server_name: str) -> str:
    """The cgroup of ``account``'s server ``server_name`` (a safe name, unique per server)."""
    safe = re.sub(r"[^A-Za-z0-9_-]", "-", server_name)[:40]
    if safe != server_name:
        safe += "-" + hashlib.sha256(server_name.encode()).hexdigest()[:7]
    return f"{account}.server" + (f"-{safe}" if server_name else "")


class AccountProcessSpawner(LocalProcessSpawner):
    """``LocalProcessSpawner`` for ``c.UserAccounts``: each server runs as its user's account.

    A root hub switches user itself in the child before ``exec`` (JupyterHub's
    own user switching). A hub that is not root starts, signals and stops the
    server through the mediator over ``sudo -n`` (:mod:`spawner.local.sudo`), and
    polls it from ``/proc``; ``c.Spawner.cmd`` is then the mediator's own
    ``jupyterhub-singleuser``, as with sudospawner.

    Either way the server is known by its pid, its account's uid and its start
    time (saved with the pid in the hub's state): after a hub restart, a pid
    that now names another process is neither counted alive nor signalled.
    """

    _account: Account | None = None
    #: The cgroup, device rules and private /tmp of the running server (this hub process's start).
    _confinement: Confinement | None = None
    # LocalProcessSpawner's state this class sets (JupyterHub ships no type information).
    port: int
    pid: int
    #: When the server's process started (``/proc/<pid>/stat`` field 22), saved with its pid.
    pid_started: int | None = None

    @property
    def accounts(self) -> UserAccounts:
        return UserAccounts(parent=self)

    @property
    def account(self) -> Account:
        """The system account this user's servers run as (as it is: :meth:`start` prepares it)."""
        if self._account is None:
            self._account = self.accounts.existing(self.user.name)
        return self._account

    @property
    def _sudo(self) -> bool:
        return self.accounts.uses_sudo()

    # -- limits --------------------------------------------------------------

    @property
    def user_limits(self) -> UserLimits:
        return UserLimits(parent=self)

    @property
    def confiner(self) -> Confiner:
        return get_confiner(self.user_limits, SUDO if self._sudo else ROOT)

    def workload_limits(self) -> WorkloadLimits:
        """The server's memory, CPU and process limits (the GPU spawner's come from its profile and team)."""
        d = self.user_limits.defaults()
        return WorkloadLimits(memory=d.memory, cpu=d.cpu, processes=d.processes)

    def placed_gpus(self) -> set[int]:
        """``N`` of the ``/dev/nvidiaN`` nodes the server may open (none here; the GPU spawner's placement)."""
        return set()

    @property
    def cgroup_name(self) -> str:
        return server_cgroup_name(self.accounts.name_for(self.user.name), self.name or "")

    def _confine(self) -> Confinement:
        confiner = self.confiner
        account = self.account
        confinement = confiner.prepare(
            self.cgroup_name, account, self.workload_limits(), self.placed_gpus(), account.home
        )
        self.log.info("gpulab: server %s of %s runs with %s", self.name or "(default)", account.name, confinement.words)
        return confinement

    def _release_confinement(self) -> None:
        self._confinement = None
        try:
            if not self.confiner.release(self.cgroup_name):
                self.log.info("gpulab: cgroup %s still holds processes; removed at its next start", self.cgroup_name)
        except (CgroupError, OSError) as e:
            self.log.warning("gpulab: cannot remove cgroup %s: %s", self.cgroup_name, e)

    def _capture(self) -> list[str]:
        """The output capture in front of the server's command (``[]``: output to the hub's log)."""
        cap = self.user_limits.server_output_max_bytes
        return server_capture_argv(self.account.home, self.name or "", cap) if cap > 0 else []

    # -- start / stop ----------------------------------------------------------

    async def start(self):
        try:
            self._account = await self.accounts.prepare(self.user.name)
        except AccountError as e:
            self.log.error("gpulab: %s", e)
            status = 403 if isinstance(e, AccountRefused) else 500
            raise web.HTTPError(status, f"cannot prepare the system account of {self.user.name}: {e}") from None
        try:
            self._confinement = await asyncio.to_thread(self._confine)
        except (CgroupError, OSError) as e:
            self.log.error("gpulab: cannot confine the server of %s: %s", self.user.name, e)
            raise web.HTTPError(500, f"cannot set up the limits of {self.user.name}'s server: {e}") from None
        if not self._sudo:
            address = await self._start_as_root(self._confinement)
            self.pid_started = start_time(self.pid)
            return address
        if self.port == 0:
            self.port = random_port()
        env, args = self.get_env(), self.get_args()
        launcher = self.accounts.launcher
        if self.cmd and Path(self.cmd[0]).name != "jupyterhub-singleuser":
            self.log.warning(
                "gpulab: c.Spawner.cmd %s is not used through sudo: %s starts the "
                "jupyterhub-singleuser of its own virtualenv",
                self.cmd[0],
                launcher.mediator,
            )
        self.log.info(
            "gpulab: spawning jupyterhub-singleuser %s as %s through %s",
            " ".join(args),
            self._account.name,
            launcher.mediator,
        )
        extra = self._confinement.mediator_request()
        cap = self.user_limits.server_output_max_bytes
        if cap > 0:
            extra["output_max_bytes"] = cap
        try:
            pid = await launcher.start_server(
                self._account.name,
                args,
                env,
                preexec=self._confinement.sudo_preexec(),
                extra=extra,
            )
        except MediatorError as e:
            self.log.error("gpulab: %s", e)
            raise web.HTTPError(500, f"cannot start the server of {self.user.name}: {e}") from None
        if owner(pid) != self._account.uid:  # the answer is the account's word: check it
            raise web.HTTPError(500, f"the mediator answered pid {pid}, which is not a process of {self._account.name}")
        self.pid, self.pid_started = pid, start_time(pid)
        self.proc = None
        return (self.ip or "127.0.0.1", self.port)

    async def _start_as_root(self, confinement: Confinement):
        """``LocalProcessSpawner.start``, with the child confined before it ``exec``s the server.

        The child joins the server's cgroup, gets its private /tmp and switches to
        the account (in that order: the last two need root); the server's output
        goes to a bounded file of the user's, not the hub's log.
        """
        if self.port == 0:
            self.port = random_port()
        env = self.get_env()
        cmd = [*self.cmd, *self.get_args()]
        if self.shell_cmd:
            cmd = [*self.shell_cmd, " ".join(shlex.quote(s) for s in cmd)]
        cmd = [*confinement.argv_prefix, *self._capture(), *cmd]
        self.log.info("Spawning %s", " ".join(shlex.quote(s) for s in cmd))
        popen_kwargs: dict[str, Any] = {
            "preexec_fn": confinement.root_preexec(self.account, chdir=str(self.account.home)),
            "start_new_session": True,
        }
        popen_kwargs.update(self.popen_kwargs)
        popen_kwargs["env"] = env
        try:
            self.proc = Popen(cmd, **popen_kwargs)
        except PermissionError:
            script = shutil.which(cmd[0]) or cmd[0]
            self.log.error(
                "Permission denied trying to run %r. Does %s have access to this file?", script, self.user.name
            )
            raise
        self.pid = self.proc.pid
        return (self.ip or "127.0.0.1", self.port)

    async def stop(self, now: bool = False):
        try:
            await super().stop(now=now)
        finally:
            await asyncio.to_thread(self._release_confinement)

    def _uid(self) -> int | None:
        try:
            return self.account.uid
        except AccountError:
            return None

    def _alive(self) -> bool:
        uid = self._uid()
        return uid is not None and process_alive(self.pid, uid, self.pid_started)

    async def poll(self):
        if not self._sudo:
            status = await super().poll()  # our child: its exit code; else _signal(0) below
        elif self.pid and self._alive():
            return None
        else:
            self.clear_state()
            status = 0
        if status is not None:  # it died (or never ran): its cgroup and what it left go too
            await asyncio.to_thread(self._release_confinement)
        return status

    async def _signal(self, sig):
        """``sig`` to the server's process while it is still the one started (pid, uid, start time)."""
        if not self.pid or not self._alive():
            return False
        if not self._sudo:
            return signal_process(self.pid, self._uid(), self.pid_started, sig)
        if sig == 0:
            return True
        try:
            return await self.accounts.launcher.signal(self.account.name, self.pid, sig, started=self.pid_started)
        except MediatorError as e:
            self.log.error("gpulab: cannot signal the server of %s: %s", self.user.name, e)
            return self._alive()

    def get_state(self):
        state = super().get_state()
        if self.pid and self.pid_started is not None:
            state["pid_started"] = self.pid_started
        return state

    def load_state(self, state):
        super().load_state(state)
        started = state.get("pid_started")
        self.pid_started = started if isinstance(started, int) else None

    def clear_state(self):
        super().clear_state()
        self.pid_started = None

    def runs_as_words(self) -> str:
        return f"as system account {self.account.name}"

    def make_preexec_fn(self, name):
        return set_user_setuid(self.account.name)

    def user_env(self, env: dict[str, str]) -> dict[str, str]:
        account = self.account
        env["USER"] = account.name
        env["HOME"] = str(account.home)
        env["SHELL"] = account.shell
        return env
