"""``AccountProcessSpawner``: a local process spawner whose servers run as their users' accounts.

The base of :class:`spawner.local.GPULocalSpawner`; it knows nothing of GPUs.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from jupyterhub.spawner import LocalProcessSpawner, set_user_setuid
from jupyterhub.utils import random_port
from tornado import web

from .accounts import Account, AccountError, UserAccounts
from .sudo import SudoError, process_alive


class AccountProcessSpawner(LocalProcessSpawner):
    """``LocalProcessSpawner`` for ``c.UserAccounts``: each server runs as its user's account.

    A root hub switches user itself in the child before ``exec`` (JupyterHub's
    own user switching). A hub that is not root starts, signals and stops the
    server through the mediator over ``sudo -n`` (:mod:`spawner.local.sudo`), and
    polls it from ``/proc``; ``c.Spawner.cmd`` is then the mediator's own
    ``jupyterhub-singleuser``, as with sudospawner.
    """

    _account: Account | None = None
    # LocalProcessSpawner's state this class sets (JupyterHub ships no type information).
    port: int
    pid: int

    @property
    def accounts(self) -> UserAccounts:
        return UserAccounts(parent=self)

    @property
    def account(self) -> Account:
        """The system account this user's servers run as (created on first use)."""
        if self._account is None:
            self._account = self.accounts.account_for(self.user.name)
        return self._account

    @property
    def _sudo(self) -> bool:
        return self.accounts.uses_sudo()

    async def start(self):
        try:
            self._account = await asyncio.to_thread(self.accounts.account_for, self.user.name)
        except AccountError as e:
            self.log.error("gpulab: %s", e)
            raise web.HTTPError(500, f"cannot prepare the system account of {self.user.name}: {e}") from None
        if not self._sudo:
            return await super().start()
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
            self.pid = await asyncio.to_thread(launcher.start_server, self._account.name, args, env)
        except SudoError as e:
            self.log.error("gpulab: %s", e)
            raise web.HTTPError(500, f"cannot start the server of {self.user.name}: {e}") from None
        self.proc = None
        return (self.ip or "127.0.0.1", self.port)

    def _alive(self) -> bool:
        try:
            uid = self.account.uid
        except AccountError:
            return False
        return process_alive(self.pid, uid)

    async def poll(self):
        if not self._sudo:
            return await super().poll()
        if self.pid and self._alive():
            return None
        self.clear_state()
        return 0

    async def _signal(self, sig):
        if not self._sudo:
            return await super()._signal(sig)
        if sig == 0 or not self._alive():
            return self._alive()
        try:
            return await asyncio.to_thread(self.accounts.launcher.signal, self.account.name, self.pid, sig)
        except SudoError as e:
            self.log.error("gpulab: cannot signal the server of %s: %s", self.user.name, e)
            return self._alive()

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
