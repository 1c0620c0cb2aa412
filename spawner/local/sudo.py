"""A non-root hub acts as users' accounts through sudo and ``gpulab-launch``.

The design is sudospawner's: the hub's account may run one program, the
mediator (:mod:`spawner.local.mediator`), as the members of one group, without a
password (``scripts/gpulab.sudoers``). Every action on a user's behalf --
start a server or a job runner, signal it, read a job's log -- is one
``sudo -n -u <account> -- <mediator>`` with a fixed argument list and one
JSON request on stdin; the answer is one JSON object on stdout. Nothing goes
through a shell, and no token is ever on a command line.

Account creation is the one step that needs root: the drop-in allows exactly
one ``useradd`` command line (a sudoers regular expression pins every option;
only the prefixed name varies, and useradd names the home for it), or the
admin creates the accounts ahead and turns creation off (``c.UserAccounts.create = False``).

Liveness is read from ``/proc`` (no sudo per poll): a process is alive while
its pid exists, is not a zombie, belongs to the account and started when it
was recorded (:mod:`spawner.local.processes`). Each call is asynchronous with a
deadline (:mod:`spawner.local.mediator_client`).

Plain Python (``subprocess``, asyncio): no tornado, no JupyterHub.
"""

from __future__ import annotations

import asyncio
import logging
import os
import re
import shutil
import signal
import subprocess
from pathlib import Path
from typing import Any

from .mediator_client import MediatorClient, MediatorError

log = logging.getLogger("gpulab.sudo")

#: How the hub runs users' processes as their accounts.
ROOT, SUDO, NONE = "root", "sudo", "not isolated"

USERADD = "/usr/sbin/useradd"
#: The comment on created accounts (one word: the sudoers rule pins it).
ACCOUNT_COMMENT = "gpulab"


class SudoError(MediatorError):
    """sudo refused, or the mediator refused or failed; the message says what to fix."""


def useradd_argv(name: str, home_root: str | Path, shell: str, group: str) -> list[str]:
    """The one ``useradd`` command line a non-root hub may run (as root, through sudo).

    The home is ``<home_root>/<name>`` because useradd makes it so (``--base-dir``):
    no option names the home, so the sudoers rule cannot let a home differ from its account.
    """
    groups = ["--groups", group] if group else []
    return [
        USERADD,
        "--create-home",
        "--base-dir",
        str(Path(home_root)),
        "--shell",
        shell,
        "--user-group",
        *groups,
        "--comment",
        ACCOUNT_COMMENT,
        name,
    ]


class SudoLauncher(MediatorClient):
    """Runs the mediator as a user's account: ``sudo -n -u <account> -- <mediator>``."""

    how = "through sudo as"

    def __init__(self, mediator: str, sudo: str = "sudo", timeout: float = 10.0, max_pending: int = 4):
        super().__init__(mediator, timeout, max_pending)
        self.sudo = sudo

    def argv(self, account: str) -> list[str]:
        return [self.sudo, "-n", "-u", account, "--", self.mediator]

    def command(self, account: str) -> tuple[list[str], dict[str, Any]]:
        return self.argv(account), {}

    async def stop(self, proc: asyncio.subprocess.Process) -> None:
        """sudo runs as root with our real uid, so we may signal it (not the mediator, the account's).

        sudo passes SIGTERM and SIGCONT on to the mediator (a stopped one wakes
        up to die), then sudo itself is killed, which ends our wait.
        """
        for sig in (signal.SIGTERM, signal.SIGCONT):
            os.kill(proc.pid, sig)
        try:
            await asyncio.wait_for(proc.wait(), 0.5)
        except asyncio.TimeoutError:
            os.kill(proc.pid, signal.SIGKILL)

    def setup_hint(self, account: str) -> str:
        return (
            f" (is the sudoers rule installed, naming this path, and is {account} in its group? "
            "docs/single-server.md#the-sudoers-rule)"
        )

    def create_account(self, name: str, home_root: str | Path, shell: str, group: str) -> None:
        """``useradd`` through sudo: the drop-in allows this one command line (root's, not the user's)."""
        cmd = [self.sudo, "-n", "--", *useradd_argv(name, home_root, shell, group)]
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=60, cwd="/", start_new_session=True)
        except (OSError, subprocess.TimeoutExpired) as e:
            raise SudoError(f"cannot create account {name} through sudo: {e}") from None
        if proc.returncode != 0:
            raise SudoError(
                f"cannot create account {name}: {' '.join(cmd)} exited with {proc.returncode}: "
                f"{(proc.stderr or proc.stdout).strip()[:300]}. Install the useradd rule of "
                "the sudoers drop-in (`gpulab sudoers`), or create the account ahead and set "
                "c.UserAccounts.create = False"
            )


_SAFE_PATH = re.compile(r"^/[A-Za-z0-9_./-]*$")
_SAFE_NAME = re.compile(r"^[a-z_][a-z0-9_-]*$")


def _ere(text: str) -> str:
    """``text`` as a literal in a POSIX extended regular expression (only ``.`` can occur)."""
    return text.replace(".", "[.]")


def sudoers_rule(
    hub_user: str,
    mediator: str,
    group: str = "jupyterhub-users",
    prefix: str = "jupyter-",
    home_root: str = "/home",
    shell: str = "/bin/bash",
    create_accounts: bool = True,
) -> str:
    """The sudoers drop-in for a non-root hub (what ``gpulab sudoers`` prints).

    The hub's account may run the mediator, with no arguments, as members of
    ``group`` (root is not one), and -- when it creates accounts -- exactly the
    :func:`useradd_argv` command line as root, with a prefixed name of
    ``[a-z0-9_-]`` (a sudoers regular expression, sudo >= 1.9.10).
    """
    for what, value, pattern in (
        ("hub user", hub_user, _SAFE_NAME),
        ("group", group, _SAFE_NAME),
        ("mediator", mediator, _SAFE_PATH),
        ("home root", home_root, _SAFE_PATH),
        ("shell", shell, _SAFE_PATH),
    ):
        if not pattern.match(value):
            raise ValueError(f"{what} {value!r} has characters a sudoers rule would need to escape")
    if prefix and not re.fullmatch(r"[a-z_][a-z0-9_-]*", prefix):
        raise ValueError(f"account prefix {prefix!r} must be made of [a-z0-9_-]")
    name = f"{_ere(prefix)}[a-z0-9_-]+"
    empty = "''"  # the empty prefix, as a shell takes it
    useradd = useradd_argv("NAME", home_root.rstrip("/") or "/", shell, group)
    useradd_re = " ".join(name if arg == "NAME" else _ere(arg) for arg in useradd[1:])
    lines = [
        "# gpulab: a JupyterHub that is not root runs each user's servers and notebook jobs",
        "# as the user's own account, through sudo (docs/single-server.md#the-sudoers-rule).",
        f"# Made by: gpulab sudoers --hub-user {hub_user} --group {group} --mediator {mediator} "
        f"--prefix {prefix or empty} --home-root {home_root} --shell {shell}"
        + ("" if create_accounts else " --no-create"),
        "# Check and install:  visudo -cf gpulab.sudoers && install -m 0440 gpulab.sudoers /etc/sudoers.d/gpulab",
        "",
        "# The account the hub runs as.",
        f"User_Alias GPULAB_HUB = {hub_user}",
        "# Whom it may act as: members of the users' group (created accounts join it; root never does).",
        f"Runas_Alias GPULAB_USERS = %{group}",
        "# What it may run as them: the mediator, with no arguments (one JSON request on stdin).",
        f'Cmnd_Alias GPULAB_LAUNCH = {mediator} ""',
    ]
    if create_accounts:
        lines += [
            "# What it may run as root: this one useradd command line; only the name varies (the home is named for it).",
            f"Cmnd_Alias GPULAB_USERADD = {USERADD} ^{useradd_re}$",
        ]
    lines += [
        "",
        "Defaults:GPULAB_HUB !requiretty",
        "GPULAB_HUB ALL = (GPULAB_USERS) NOPASSWD: GPULAB_LAUNCH",
    ]
    if create_accounts:
        lines.append("GPULAB_HUB ALL = (root) NOPASSWD: GPULAB_USERADD")
    return "\n".join(lines) + "\n"


def sudo_allows(mediator: str, sudo: str = "sudo") -> tuple[bool, str]:
    """Does ``sudo -n -l`` list ``mediator`` for this account? ``(yes, why not)``."""
    path = shutil.which(sudo)
    if path is None:
        return False, "sudo is not installed"
    try:
        proc = subprocess.run([path, "-n", "-l"], capture_output=True, text=True, timeout=30, cwd="/")
    except (OSError, subprocess.TimeoutExpired) as e:
        return False, f"sudo -n -l failed: {e}"
    if proc.returncode != 0:
        return False, f"sudo -n -l refused: {(proc.stderr or proc.stdout).strip()[:200]}"
    if re.search(rf"(^|[\s:,]){re.escape(mediator)}($|[\s,])", proc.stdout, re.M) is None:
        return False, f"sudo -n -l does not list {mediator} for this account"
    return True, ""


def isolation_mode(mediator: str, sudo: str = "sudo") -> tuple[str, str]:
    """``(mode, reason)``: root, sudo (a rule for the mediator) or not isolated (and why)."""
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        return ROOT, "the hub is root"
    allowed, why = sudo_allows(mediator, sudo)
    if allowed:
        return SUDO, f"sudo -n -l allows {mediator}"
    return NONE, f"the hub is not root and {why}"
