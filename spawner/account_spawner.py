"""``AccountProcessSpawner``: a local process spawner whose servers run as their users' accounts.

The base of :class:`spawner.local.GPULocalSpawner`; it knows nothing of GPUs.
"""

from __future__ import annotations

from pathlib import Path

from jupyterhub.spawner import LocalProcessSpawner, set_user_setuid
from jupyterhub.utils import random_port
from tornado import web

from .accounts import Account, AccountError, AccountRefused, UserAccounts
from .mediator_client import MediatorError
from .processes import owner, process_alive, signal_process, start_time


class AccountProcessSpawner(LocalProcessSpawner):
    """``LocalProcessSpawner`` for ``c.UserAccounts``: each server runs as its user's account.

    A root hub switches user itself in the child before ``exec`` (JupyterHub's
    own user switching). A hub that is not root starts, signals and stops the
    server through the mediator over ``sudo -n`` (:mod:`spawner.sudo`), and
    polls it from ``/proc``; ``c.Spawner.cmd`` is then the mediator's own
    ``jupyterhub-singleuser``, as with sudospawner.

    Either way the server is known by its pid, its account's uid and its start
    time (saved with the pid in the hub's state): after a hub restart, a pid
    that now names another process is neither counted alive nor signalled.
    """

    _account: Account | None = None
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

    async def start(self):
        try:
            self._account = await self.accounts.prepare(self.user.name)
        except AccountError as e:
            self.log.error("gpulab: %s", e)
            status = 403 if isinstance(e, AccountRefused) else 500
            raise web.HTTPError(status, f"cannot prepare the system account of {self.user.name}: {e}") from None
        if not self._sudo:
            address = await super().start()
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
        try:
            pid = await launcher.start_server(self._account.name, args, env)
        except MediatorError as e:
            self.log.error("gpulab: %s", e)
            raise web.HTTPError(500, f"cannot start the server of {self.user.name}: {e}") from None
        if owner(pid) != self._account.uid:  # the answer is the account's word: check it
            raise web.HTTPError(500, f"the mediator answered pid {pid}, which is not a process of {self._account.name}")
        self.pid, self.pid_started = pid, start_time(pid)
        self.proc = None
        return (self.ip or "127.0.0.1", self.port)

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
            return await super().poll()  # our child: its exit code; else _signal(0) below
        if self.pid and self._alive():
            return None
        self.clear_state()
        return 0

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
