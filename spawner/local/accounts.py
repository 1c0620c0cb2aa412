"""System accounts for hub users on a single server, as The Littlest JupyterHub makes them.

Each hub user ``alice`` gets an account ``<prefix>alice`` (default prefix
``jupyter-``), created on first spawn with ``useradd``, its home ``0700``.
Her servers and notebook jobs run under that uid and gid (see
:func:`demote_kwargs`), so the kernel, not gpulab, keeps users apart: file
modes for homes and job outputs, uid checks for ``/proc/<pid>/environ`` and for
signals.

Switching users needs root, or a sudoers rule: a root hub switches itself
(:func:`demote_kwargs`); a hub that is not root runs the mediator
``gpulab-launch`` as the account through ``sudo -n`` (:mod:`spawner.local.sudo`,
``c.UserAccounts.switch``). In both modes every read of a file the user
controls, and the claim of the home for this hub, is a run of the mediator as
the account (:attr:`UserAccounts.launcher`), so the hub never opens a user's
file with its own rights. A hub that can do neither cannot isolate users and
says so; see docs/single-server.md.

An account name that maps to root or to a system account (uid below
``c.UserAccounts.min_uid``) is refused, never run as.

Plain Python (``pwd``, ``grp``, ``subprocess``, asyncio): no tornado, no JupyterHub.
"""

from __future__ import annotations

import asyncio
import grp
import hashlib
import logging
import os
import pwd
import re
import subprocess
import sys
import threading
from dataclasses import dataclass
from pathlib import Path

from traitlets import Bool, Enum, Float, Int, Unicode, default
from traitlets.config import Configurable

from .mediator_client import AccountMediator, MediatorClient, MediatorError
from .sudo import SudoLauncher, useradd_argv

log = logging.getLogger("gpulab.accounts")

#: One account creation at a time in this process: concurrent ``useradd`` runs for
#: one name were seen to each "succeed" with a different uid, the last one winning.
_create_lock = threading.Lock()
#: Accounts whose home the mediator has checked and claimed in this process.
_prepared: set[str] = set()

#: Longest account name ``useradd`` accepts on Linux.
MAX_ACCOUNT_LEN = 32
_UNSAFE = re.compile(r"[^a-z0-9_-]")


class AccountError(RuntimeError):
    """An account cannot be created or used; the message says what to fix."""


class AccountRefused(AccountError):
    """A hub user may not run as this account (root's, a system account, another hub's)."""


@dataclass(frozen=True)
class Account:
    """A system account a hub user's processes run as."""

    name: str
    uid: int
    gid: int
    home: Path
    shell: str
    groups: tuple[int, ...]


def account_name(prefix: str, username: str) -> str:
    """``prefix + username``, made safe for ``useradd``; long names end in a hash.

    Characters outside ``[a-z0-9_-]`` become ``-``; a name that then would be
    ambiguous or too long is cut and given 7 hex digits of the original's
    SHA-256, so two hub users never share an account.
    """
    clean = _UNSAFE.sub("-", username.lower())
    name = prefix + clean
    if clean == username and len(name) <= MAX_ACCOUNT_LEN:
        return name
    digest = hashlib.sha256(username.encode()).hexdigest()[:7]
    keep = MAX_ACCOUNT_LEN - len(prefix) - len(digest) - 1
    if keep < 1:
        raise AccountError(f"account prefix {prefix!r} is too long for {MAX_ACCOUNT_LEN}-character account names")
    return f"{prefix}{clean[:keep]}-{digest}"


class UserAccounts(Configurable):
    """Which system account a hub user's servers and jobs run as (``c.UserAccounts.*``)."""

    enabled = Bool(
        False,
        config=True,
        help="""Run servers and notebook jobs as each user's own system account.
        Always on for the `gpu-local` spawner; the embedded hub turns it on when it
        runs as root.""",
    )
    prefix = Unicode(
        "jupyter-",
        config=True,
        help="""Account name = prefix + hub user name (as The Littlest JupyterHub does),
        so hub users never collide with system accounts such as `root` or `daemon`.
        Set to `""` to use existing accounts named exactly like the hub users.""",
    )
    create = Bool(
        True,
        config=True,
        help="Create a missing account (`useradd`, home 0700) on the user's first spawn or job.",
    )
    home_root = Unicode(
        "/home",
        config=True,
        help="Folder that holds the homes of created accounts (`<home_root>/<account>`).",
    )
    shell = Unicode("/bin/bash", config=True, help="Login shell of created accounts (JupyterLab's terminals).")
    group = Unicode(
        "",
        config=True,
        help="Extra group every created account joins (created if missing); empty: none.",
    )

    switch = Enum(
        ["auto", "root", "sudo"],
        "auto",
        config=True,
        help="""How the hub starts, signals and reads as the users' accounts.
        `root`: the hub is root and switches user itself in the child before `exec`.
        `sudo`: the hub is not root and runs the mediator (`mediator`) as the account
        with `sudo -n -u <account>` (a sudoers drop-in: `gpulab sudoers`).
        `auto`: `root` when the hub runs as root, else `sudo`.""",
    )
    mediator = Unicode(
        config=True,
        help="""The program a non-root hub runs as the accounts through sudo
        (`gpulab-launch` next to this Python interpreter). The sudoers rule must name
        exactly this path; it and the virtualenv it lives in must not be writable by
        the hub's account.""",
    )
    sudo = Unicode("sudo", config=True, help="The sudo program (a name on PATH or an absolute path).")
    mediator_timeout = Float(
        10.0,
        config=True,
        help="""Seconds the hub waits for one run of the mediator as a user's account (a read
        of a job's log, a server or job start through sudo, a signal). A run that has not
        answered by then is stopped, and only that user's request fails, with a sentence: the
        account's own processes, which the user may stop, never hold up anyone else.""",
    )
    mediator_max_pending = Int(
        4,
        config=True,
        help="""Most runs of the mediator as one account that may wait for an answer at once;
        more are refused at once until they end.""",
    )
    min_uid = Int(
        config=True,
        help="""Lowest uid a hub user's account may have. A hub user whose account is root
        (uid or gid 0), a system account, or any uid below this is refused with a sentence,
        never run as. Default: UID_MIN of /etc/login.defs (1000 when it says nothing).""",
    )
    hub_id = Unicode(
        config=True,
        help="""What this hub writes into each account's `~/.gpulab/hub` on first use. An account
        whose marker names another hub is refused with a sentence: two hubs with the same
        account prefix would otherwise share accounts and homes. Default: the real path of
        `$GPULAB_DATA_DIR` (the hub's data folder), else of the hub's working directory.""",
    )

    @default("mediator")
    def _default_mediator(self) -> str:
        return str(Path(sys.executable).with_name("gpulab-launch"))

    @default("min_uid")
    def _default_min_uid(self) -> int:
        return login_defs_uid_min()

    @default("hub_id")
    def _default_hub_id(self) -> str:
        return os.path.realpath(os.environ.get("GPULAB_DATA_DIR") or os.getcwd())

    def uses_sudo(self) -> bool:
        """Does this hub act as the accounts through sudo (rather than as root)?"""
        return self.switch == "sudo" or (self.switch == "auto" and not can_switch_users())

    @property
    def launcher(self) -> MediatorClient:
        """How this hub runs the mediator as an account: through sudo, or (root) switched to it."""
        if self.uses_sudo():
            return SudoLauncher(self.mediator, self.sudo, self.mediator_timeout, self.mediator_max_pending)
        return AccountMediator(self.mediator, self.mediator_timeout, self.mediator_max_pending)

    def name_for(self, username: str) -> str:
        return account_name(self.prefix, username)

    def checked(self, account: Account, username: str) -> Account:
        """``account`` when a hub user may run as it; :class:`AccountError` (a sentence) otherwise."""
        if account.uid == 0 or account.gid == 0:
            raise AccountRefused(
                f"hub user {username} maps to system account {account.name} (uid {account.uid}, "
                f"gid {account.gid}), which is root's: gpulab never runs a hub user as root"
            )
        if account.uid < self.min_uid:
            raise AccountRefused(
                f"hub user {username} maps to system account {account.name} with uid {account.uid}, "
                f"below {self.min_uid} (c.UserAccounts.min_uid): gpulab never runs a hub user as a system account"
            )
        return account

    def existing(self, username: str) -> Account:
        """The user's account as it is: never created, and no process of the account's is run."""
        name = self.name_for(username)
        account = lookup(name)
        if account is None:
            raise AccountError(f"system account {name} for hub user {username} does not exist")
        return self.checked(account, username)

    def account_for(self, username: str) -> Account:
        """The user's account; created when missing and :attr:`create` is on (root's ``useradd``).

        Runs no process as the account: :meth:`prepare` also claims the home, as the account.
        """
        name = self.name_for(username)
        found = lookup(name)
        if found is not None:
            self.checked(found, username)  # before anything touches a system account's home
        if self.uses_sudo():
            return self.checked(self._sudo_account(name, username), username)
        if self.create:
            return self.checked(ensure_account(name, self.home_root, shell=self.shell, group=self.group), username)
        if found is None:
            raise AccountError(
                f"system account {name} for hub user {username} does not exist "
                "(c.UserAccounts.create is off): create it first"
            )
        return found

    async def prepare(self, username: str) -> Account:
        """The user's account, created if needed, its home 0700 and claimed for this hub.

        The claim runs the mediator as the account (with its deadline); an
        account another hub claimed first is refused with a sentence.
        """
        account = await asyncio.to_thread(self.account_for, username)
        if account.name in _prepared:
            return account
        try:
            reply = await self.launcher.prepare_home(account.name, self.hub_id)
        except MediatorError as e:
            raise AccountError(f"cannot prepare the home of {account.name}: {e}") from None
        owner = reply.get("owner", self.hub_id)
        if owner != self.hub_id:
            raise AccountRefused(
                f"system account {account.name} belongs to another gpulab hub ({str(owner)[:200]}): two "
                f"hubs with the account prefix {self.prefix!r} would share its home. Give each hub its own "
                "prefix (GPULAB_ACCOUNT_PREFIX, c.UserAccounts.prefix); to move the account to this hub, "
                f"remove {account.home}/.gpulab/hub"
            )
        _prepared.add(account.name)
        return account

    def _sudo_account(self, name: str, username: str) -> Account:
        """The account, created with the drop-in's one ``useradd`` line."""
        try:
            return self._sudo_account_unchecked(name, username)
        except MediatorError as e:
            raise AccountError(str(e)) from None

    def _sudo_account_unchecked(self, name: str, username: str) -> Account:
        with _create_lock:
            account = lookup(name)
            if account is None:
                if not self.create:
                    raise AccountError(
                        f"system account {name} for hub user {username} does not exist "
                        "(c.UserAccounts.create is off): create it first"
                    )
                if not self.group:
                    raise AccountError(
                        "c.UserAccounts.group must name the group of the sudoers rule "
                        "(e.g. jupyterhub-users) for a hub that is not root"
                    )
                SudoLauncher(self.mediator, self.sudo).create_account(name, self.home_root, self.shell, self.group)
                log.info("gpulab: created system account %s through sudo", name)
                account = lookup(name)
                if account is None:
                    raise AccountError(f"useradd reported success but account {name} does not exist")
        return account

    def home_of(self, username: str) -> Path:
        """Where the user's home is (or will be once the account exists)."""
        account = lookup(self.name_for(username))
        return account.home if account is not None else Path(self.home_root) / self.name_for(username)


def login_defs_uid_min(path: str = "/etc/login.defs") -> int:
    """``UID_MIN`` of ``/etc/login.defs`` (the lowest uid useradd gives a regular account); 1000 if unset."""
    try:
        for line in Path(path).read_text().splitlines():
            fields = line.split()
            if len(fields) >= 2 and fields[0] == "UID_MIN" and fields[1].isdigit():
                return int(fields[1])
    except OSError:
        pass
    return 1000


def unreachable_by_others(path: str | Path) -> Path | None:
    """The first folder on the way to ``path`` that other accounts cannot enter, or ``None``.

    An interpreter under ``/root`` (pyenv) or a data folder in a 0700 home cannot
    serve other accounts; the hub refuses to start rather than fail on every spawn.
    """
    real = Path(os.path.realpath(path))
    for folder in [*reversed(real.parents)][1:] + ([real] if real.is_dir() else []):
        try:
            if not folder.stat().st_mode & 0o001:
                return folder
        except OSError:
            return folder
    return None


def can_switch_users() -> bool:
    """Can this process start programs as other accounts (is it root)?"""
    return hasattr(os, "geteuid") and os.geteuid() == 0


def lookup(name: str) -> Account | None:
    """The account ``name``, or ``None`` when it does not exist."""
    try:
        pw = pwd.getpwnam(name)
    except KeyError:
        return None
    groups = tuple(sorted({pw.pw_gid, *(g.gr_gid for g in grp.getgrall() if name in g.gr_mem)}))
    return Account(name, pw.pw_uid, pw.pw_gid, Path(pw.pw_dir), pw.pw_shell or "/bin/sh", groups)


def ensure_account(name: str, home_root: str | Path, *, shell: str = "/bin/bash", group: str = "") -> Account:
    """The account ``name``, created if missing; its home exists, is its own and ``0700``.

    ``home_root``: the folder holding the homes (``/home`` for real users).
    ``group``: an extra group every account joins (e.g. for a sudoers rule), created if missing.
    """
    with _create_lock:
        account = lookup(name) or _create_account(name, home_root, shell, group)
    home = account.home
    if not home.is_dir():
        home.mkdir(parents=True, mode=0o700)
    # The home itself, never what a symlink in its place leads to.
    try:
        fd = os.open(home, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    except OSError as e:
        raise AccountError(f"the home {home} of {name} is not a folder of its own: {e.strerror}") from None
    try:
        st = os.fstat(fd)
        if st.st_uid != account.uid or st.st_gid != account.gid:
            os.fchown(fd, account.uid, account.gid)
        if st.st_mode & 0o777 != 0o700:
            os.fchmod(fd, 0o700)
    finally:
        os.close(fd)
    return account


def _create_account(name: str, home_root: str | Path, shell: str, group: str) -> Account:
    if not can_switch_users():
        raise AccountError(f"cannot create account {name}: the hub is not root")
    if group:
        _ensure_group(group)
    _run(useradd_argv(name, home_root, shell, group), f"create account {name}")
    log.info("gpulab: created system account %s (home %s)", name, Path(home_root) / name)
    account = lookup(name)
    if account is None:
        raise AccountError(f"useradd reported success but account {name} does not exist")
    return account


def delete_account(name: str, remove_home: bool = True) -> None:
    """Remove the account (and its home); kills nothing: stop its processes first."""
    if lookup(name) is None:
        return
    _run(
        ["userdel", *(["--remove"] if remove_home else []), name], f"delete account {name}", ok_codes=(0, 12)
    )  # 12: home could not be removed (already gone)
    try:
        grp.getgrnam(name)
    except KeyError:
        return
    _run(["groupdel", name], f"delete group {name}", ok_codes=(0, 6))


def demote_kwargs(account: Account) -> dict:
    """``subprocess.Popen`` keyword arguments that start the child as ``account``.

    Python sets the groups, then the gid, then the uid in the child before
    ``exec``; no shell and no helper binary in between.
    """
    return {"user": account.uid, "group": account.gid, "extra_groups": list(account.groups)}


def _ensure_group(group: str) -> None:
    try:
        grp.getgrnam(group)
    except KeyError:
        _run(["groupadd", "--system", group], f"create group {group}", ok_codes=(0, 9))


def _run(cmd: list[str], what: str, ok_codes: tuple[int, ...] = (0,)) -> None:
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise AccountError(f"cannot {what}: {e}") from None
    if proc.returncode not in ok_codes:
        raise AccountError(
            f"cannot {what}: {' '.join(cmd)} exited with {proc.returncode}: "
            f"{(proc.stderr or proc.stdout).strip()[:300]}"
        )
