"""The users' homes as the jobs service reaches them: one of two ways, chosen once.

- :class:`OwnerHomes` (jobs run as their owners' system accounts, root or sudo mode):
  every read of a user's file is a run of the mediator as that user, with its deadline.
- :class:`HubHomes` (jobs run as the hub's own account): the hub reads itself, and checks
  what the runner will write, since nothing else separates the users from the hub.

Either way no symlink is followed below the home, only a regular file is read, without
blocking, never more than a limit (:func:`spawner.local.home_files.read_beneath`), and a
file that cannot be read is a sentence with its status (:func:`refusal`).
"""

from __future__ import annotations

import abc
import asyncio
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from hub_config.jobs.backends.base import config_value
from hub_config.jobs.settings import GPULabJobs
from spawner.core import jobspec
from spawner.core.jobspec import JobSpecError
from spawner.local import home_files
from spawner.local.accounts import AccountError, AccountRefused, UserAccounts
from spawner.local.mediator_client import MediatorBusy, MediatorError, MediatorTimeout


class Homes(abc.ABC):
    """Where each user's home is, and how its files are read."""

    def __init__(self, settings: GPULabJobs, accounts: UserAccounts, config: Any = None):
        self.settings = settings
        self.accounts = accounts
        self.config = config

    def home_dir(self, user: str) -> Path:
        template = (
            self.settings.home_dir_template
            or config_value(self.config, "SimpleLocalProcessSpawner", "home_dir_template")
            or ""
        )
        if template:
            return Path(template.format(username=user))
        return Path(os.path.expanduser(f"~{user}"))

    @abc.abstractmethod
    async def read(
        self, user: str, path: Path, offset: int = 0, limit: int = 0, max_size: int | None = None
    ) -> home_files.Found:
        """What is at ``path`` in ``user``'s home; raises :class:`JobSpecError` (a sentence)
        when it cannot be asked at all."""

    @abc.abstractmethod
    async def keep_copy(self, user: str, source: Path, target: Path, max_size: int) -> tuple[home_files.Found, bool]:
        """Copy ``source`` to the new file ``target`` in ``user``'s home, as its owner where there is
        one (:func:`spawner.local.home_files.copy_to_new_file`): ``(what was found, whether made)``."""


class HubHomes(Homes):
    """The hub reads the homes itself (its jobs run as its own account)."""

    async def read(
        self, user: str, path: Path, offset: int = 0, limit: int = 0, max_size: int | None = None
    ) -> home_files.Found:
        home = str(self.home_dir(user))
        return await asyncio.to_thread(home_files.read_beneath, home, str(path), offset, limit, max_size)

    async def keep_copy(self, user: str, source: Path, target: Path, max_size: int) -> tuple[home_files.Found, bool]:
        home = str(self.home_dir(user))
        return await asyncio.to_thread(home_files.copy_to_new_file, home, str(source), str(target), max_size)

    def safe_path(self, user: str, path: Path, create_parent: bool = False) -> Path:
        """``path`` inside ``user``'s home, refusing symlinks that lead out of it (jobs without accounts).

        Only for a hub whose jobs run as its own account: nothing then separates
        the users from the hub, and the runner writes as the hub. Jobs run as
        their owners write as their owners, and the hub checks nothing there itself.
        """
        home = self.home_dir(user).resolve()
        if create_parent:
            parent = path.parent
            if not parent.is_symlink():
                parent.mkdir(parents=True, exist_ok=True)
        real_parent = path.parent.resolve()
        if real_parent != home and home not in real_parent.parents:
            raise jobspec.JobSpecError(f"{path.parent.name}/ leads out of the home directory (symlink)", 403)
        if path.is_symlink():
            raise jobspec.JobSpecError(f"{path.name} is a symlink; refusing to write or read through it", 403)
        return path


class OwnerHomes(Homes):
    """Each home is its owner's system account's, read as the owner through the mediator."""

    def home_dir(self, user: str) -> Path:
        if not self.settings.home_dir_template:
            return self.accounts.home_of(user)
        return super().home_dir(user)

    async def read(
        self, user: str, path: Path, offset: int = 0, limit: int = 0, max_size: int | None = None
    ) -> home_files.Found:
        name = self._account(user)
        if name is None:
            return home_files.Found(home_files.ABSENT, detail=self.accounts.name_for(user))
        with self._asking(name, path.name, "read"):
            return await self.accounts.launcher.read(name, str(path), offset, limit, max_size)

    async def keep_copy(self, user: str, source: Path, target: Path, max_size: int) -> tuple[home_files.Found, bool]:
        name = self._account(user)
        if name is None:
            return home_files.Found(home_files.ABSENT, detail=self.accounts.name_for(user)), False
        with self._asking(name, source.name, "copy"):
            return await self.accounts.launcher.keep_copy(name, str(source), str(target), max_size)

    def _account(self, user: str) -> str | None:
        """The name of ``user``'s system account; ``None`` when it does not exist yet."""
        try:
            return self.accounts.existing(user).name
        except AccountRefused as e:
            raise JobSpecError(str(e), 403) from None
        except AccountError:
            return None

    @contextmanager
    def _asking(self, name: str, what: str, verb: str) -> Iterator[None]:
        """A mediator run as ``name`` that fails is a sentence with its status."""
        try:
            yield
        except MediatorTimeout:
            raise JobSpecError(
                f"{verb}ing {what} as {name} took longer than {self.accounts.mediator_timeout:g} s and was "
                f"stopped: processes of {name} may be stopped or overloaded; try again",
                504,
            ) from None
        except MediatorBusy as e:
            raise JobSpecError(f"cannot {verb} {what} now: {e}", BUSY) from None
        except MediatorError as e:
            raise JobSpecError(f"cannot {verb} {what} as {name}: {e}", 502) from None


#: The status of a request that could not be asked as the account *now* (its mediator calls are
#: all taken): nothing was run; the caller tries again later rather than failing a job for it.
BUSY = 429


def is_busy(error: JobSpecError) -> bool:
    """Was ``error`` only "too many calls as this account right now" (try again), not an answer?"""
    return error.status == BUSY


def refusal(found: home_files.Found, what: str, limit_name: str = "") -> JobSpecError:
    """The sentence (and status) for a file that could not be read."""
    words = {
        home_files.SYMLINK: (403, f"{what} is a symlink or lies below one; refusing to read through it"),
        home_files.NOT_A_FILE: (403, f"{what} is not a regular file (a FIFO, socket, device or folder)"),
        home_files.OUTSIDE: (403, f"{what} is not inside the home directory"),
        home_files.DENIED: (403, f"{what} cannot be read by its owner"),
        home_files.ABSENT: (404, f"{what} does not exist"),
        home_files.TOO_LARGE: (
            413,
            f"{what} is {found.size} bytes, more than this hub serves ({limit_name}); open it from your server",
        ),
    }
    status, sentence = words.get(found.state, (502, f"{what}: {found.state}"))
    return JobSpecError(sentence, status)
