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
``c.UserAccounts.switch``). A hub that can do neither cannot isolate users and
says so; see docs/single-server.md.

Plain Python (``pwd``, ``grp``, ``subprocess``): no tornado, no JupyterHub.
"""

from __future__ import annotations

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

from traitlets import Bool, Enum, Unicode, default
from traitlets.config import Configurable

from .sudo import SudoError, SudoLauncher, useradd_argv

log = logging.getLogger("gpulab.accounts")

#: One account creation at a time in this process: concurrent ``useradd`` runs for
#: one name were seen to each "succeed" with a different uid, the last one winning.
_create_lock = threading.Lock()
#: Accounts whose home the mediator has checked in this process (sudo mode).
_prepared: set[str] = set()

#: Longest account name ``useradd`` accepts on Linux.
MAX_ACCOUNT_LEN = 32
_UNSAFE = re.compile(r"[^a-z0-9_-]")


class AccountError(RuntimeError):
    """An account cannot be created or used; the message says what to fix."""


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

    @default("mediator")
    def _default_mediator(self) -> str:
        return str(Path(sys.executable).with_name("gpulab-launch"))

    def uses_sudo(self) -> bool:
        """Does this hub act as the accounts through sudo (rather than as root)?"""
        return self.switch == "sudo" or (self.switch == "auto" and not can_switch_users())

    @property
    def launcher(self) -> SudoLauncher:
        return SudoLauncher(self.mediator, self.sudo)

    def name_for(self, username: str) -> str:
        return account_name(self.prefix, username)

    def account_for(self, username: str) -> Account:
        """The user's account; created when missing and :attr:`create` is on."""
        name = self.name_for(username)
        if self.uses_sudo():
            return self._sudo_account(name, username)
        if self.create:
            return ensure_account(name, self.home_root, shell=self.shell, group=self.group)
        account = lookup(name)
        if account is None:
            raise AccountError(
                f"system account {name} for hub user {username} does not exist "
                "(c.UserAccounts.create is off): create it first"
            )
        return account

    def _sudo_account(self, name: str, username: str) -> Account:
        """The account, created with the drop-in's one ``useradd`` line; its home made 0700 by itself."""
        try:
            return self._sudo_account_unchecked(name, username)
        except SudoError as e:
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
                self.launcher.create_account(name, self.home_root, self.shell, self.group)
                log.info("gpulab: created system account %s through sudo", name)
                account = lookup(name)
                if account is None:
                    raise AccountError(f"useradd reported success but account {name} does not exist")
        if name not in _prepared:
            self.launcher.prepare_home(name)
            _prepared.add(name)
        return account

    def home_of(self, username: str) -> Path:
        """Where the user's home is (or will be once the account exists)."""
        account = lookup(self.name_for(username))
        return account.home if account is not None else Path(self.home_root) / self.name_for(username)


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
    st = home.lstat()
    if st.st_uid != account.uid or st.st_gid != account.gid:
        os.chown(home, account.uid, account.gid, follow_symlinks=False)
    if st.st_mode & 0o777 != 0o700:
        os.chmod(home, 0o700)
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
