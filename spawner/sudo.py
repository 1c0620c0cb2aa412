"""A non-root hub acts as users' accounts through sudo and ``gpulab-launch``.

The design is sudospawner's: the hub's account may run one program, the
mediator (:mod:`spawner.mediator`), as the members of one group, without a
password (``scripts/gpulab.sudoers``). Every action on a user's behalf --
start a server or a job runner, signal it, read a job's log -- is one
``sudo -n -u <account> -- <mediator>`` with a fixed argument list and one
JSON request on stdin; the answer is one JSON object on stdout. Nothing goes
through a shell, and no token is ever on a command line.

Account creation is the one step that needs root: the drop-in allows exactly
one ``useradd`` command line (a sudoers regular expression pins every option;
only the prefixed name and home vary), or the admin creates the accounts
ahead and turns creation off (``c.UserAccounts.create = False``).

Liveness is read from ``/proc`` (no sudo per poll): a pid is alive while it
exists, is not a zombie and belongs to the account.

Plain Python (``subprocess``, ``json``): no tornado, no JupyterHub.
"""

from __future__ import annotations

import base64
import json
import logging
import os
import re
import shutil
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

log = logging.getLogger("gpulab.sudo")

#: How the hub runs users' processes as their accounts.
ROOT, SUDO, NONE = "root", "sudo", "not isolated"

USERADD = "/usr/sbin/useradd"
#: The comment on created accounts (one word: the sudoers rule pins it).
ACCOUNT_COMMENT = "gpulab"


class SudoError(RuntimeError):
    """sudo refused, or the mediator refused or failed; the message says what to fix."""


@dataclass(frozen=True)
class FileRead:
    """What the mediator found at a path in the account's home."""

    state: str  # ok, absent, denied, outside, not-a-file
    data: bytes = b""
    size: int = 0
    real: str = ""


def useradd_argv(name: str, home_root: str | Path, shell: str, group: str) -> list[str]:
    """The one ``useradd`` command line a non-root hub may run (as root, through sudo)."""
    groups = ["--groups", group] if group else []
    return [
        USERADD,
        "--create-home",
        "--home-dir",
        f"{Path(home_root)}/{name}",
        "--shell",
        shell,
        "--user-group",
        *groups,
        "--comment",
        ACCOUNT_COMMENT,
        name,
    ]


class SudoLauncher:
    """Runs the mediator as a user's account: ``sudo -n -u <account> -- <mediator>``."""

    def __init__(self, mediator: str, sudo: str = "sudo", timeout: float = 60):
        self.mediator = mediator
        self.sudo = sudo
        self.timeout = timeout

    def argv(self, account: str) -> list[str]:
        return [self.sudo, "-n", "-u", account, "--", self.mediator]

    def call(
        self,
        account: str,
        request: dict[str, Any],
        hub_stderr: bool = False,
        preexec: Callable[[], None] | None = None,
    ) -> dict[str, Any]:
        """One request as ``account``; the mediator's answer.

        ``hub_stderr``: the mediator (and the program it starts) write to the
        hub's own stderr; otherwise its stderr is collected for the error
        message. ``preexec``: run in the child before it ``exec``s sudo (it joins
        the workload's cgroup, so sudo, the mediator and what it starts run inside).
        """
        try:
            proc = subprocess.run(
                self.argv(account),
                input=json.dumps(request).encode(),
                stdout=subprocess.PIPE,
                stderr=None if hub_stderr else subprocess.PIPE,
                timeout=self.timeout,
                cwd="/",
                close_fds=True,
                start_new_session=True,
                preexec_fn=preexec,
            )  # no terminal: sudo never puts it in a pty
        except (OSError, subprocess.TimeoutExpired) as e:
            raise SudoError(f"cannot run {self.mediator} as {account} through sudo: {e}") from None
        try:
            reply = json.loads(proc.stdout or b"null")
        except ValueError:
            reply = None
        if not isinstance(reply, dict):
            err = (proc.stderr or b"").decode(errors="replace").strip()[:500]
            raise SudoError(
                f"sudo -n -u {account} {self.mediator} exited with {proc.returncode}"
                f"{': ' + err if err else ''} (is the sudoers rule installed, naming this path, and is "
                f"{account} in its group? docs/single-server.md#the-sudoers-rule)"
            )
        if not reply.get("ok"):
            raise SudoError(f"{self.mediator} as {account} refused {request.get('action')}: {reply.get('error')}")
        return reply

    # -- the actions ----------------------------------------------------------

    def start_server(
        self,
        account: str,
        args: list[str],
        env: dict[str, str],
        preexec: Callable[[], None] | None = None,
        extra: dict[str, Any] | None = None,
    ) -> int:
        """Start the server; ``extra``: the mediator's own set-up (private /tmp, output capture)."""
        request = {"action": "start-server", "args": args, "env": env, **(extra or {})}
        # Without a capture the server writes to the mediator's stderr: the hub's, never a pipe.
        reply = self.call(account, request, hub_stderr="output_max_bytes" not in request, preexec=preexec)
        return int(reply["pid"])

    def start_job(
        self,
        account: str,
        env: dict[str, str],
        *,
        input: str,
        output: str,
        cwd: str,
        status: str,
        log: str,
        attempt: int,
        preexec: Callable[[], None] | None = None,
        extra: dict[str, Any] | None = None,
    ) -> int:
        reply = self.call(
            account,
            {
                "action": "start-job",
                "env": env,
                "input": input,
                "output": output,
                "cwd": cwd,
                "status": status,
                "log": log,
                "attempt": attempt,
                **(extra or {}),
            },
            preexec=preexec,
        )
        return int(reply["pid"])

    def signal(self, account: str, pid: int, sig: int, group: bool = False) -> bool:
        """Send ``sig``; whether the process still existed."""
        return bool(self.call(account, {"action": "signal", "pid": pid, "signal": int(sig), "group": group})["alive"])

    def read(self, account: str, path: str | Path, offset: int = 0, limit: int = 64 << 20) -> FileRead:
        reply = self.call(account, {"action": "read", "path": str(path), "offset": offset, "limit": limit})
        return FileRead(
            reply["state"],
            base64.b64decode(reply.get("data") or ""),
            int(reply.get("size") or 0),
            reply.get("real") or "",
        )

    def prepare_home(self, account: str) -> dict[str, Any]:
        return self.call(account, {"action": "prepare-home"})

    def create_account(self, name: str, home_root: str | Path, shell: str, group: str) -> None:
        """``useradd`` through sudo: the drop-in allows this one command line."""
        cmd = [self.sudo, "-n", "--", *useradd_argv(name, home_root, shell, group)]
        try:
            proc = subprocess.run(
                cmd, capture_output=True, text=True, timeout=self.timeout, cwd="/", start_new_session=True
            )
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
    useradd_re = " ".join(useradd[1:]).replace("NAME", name)
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
            "# What it may run as root: this one useradd command line; only the name varies.",
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


def process_alive(pid: int, uid: int | None = None) -> bool:
    """Is ``pid`` a live (non-zombie) process, owned by ``uid`` when given? Read from ``/proc``."""
    if pid <= 0:
        return False
    try:
        owner = os.stat(f"/proc/{pid}").st_uid
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    if uid is not None and owner != uid:
        return False  # the pid was reused by another account's process
    try:
        return stat.rsplit(")", 1)[1].split()[0] != "Z"
    except IndexError:
        return True


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
