"""What the red-team tests (tests/integration/test_redteam.py) do as a user, and the machine tricks they need.

The attacker's code runs as the user's own account: a process with exactly her
uid, gid and groups, no capabilities, in her home, as a terminal of her
JupyterLab gives her. The tricks (a subreaper, a chosen pid) are the test's,
run as root, to stage what the kernel does on its own on a busy machine (a pid
handed to the next process).
"""

from __future__ import annotations

import ctypes
import os
import secrets
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from spawner.local.accounts import Account

PR_SET_CHILD_SUBREAPER = 36  # linux/prctl.h


def as_user(account: Account, code: str, *args: str) -> subprocess.Popen:
    """Start ``python -c code args...`` as ``account`` (its own session), stdout piped."""
    return subprocess.Popen(
        [sys.executable, "-c", code, *args],
        user=account.uid,
        group=account.gid,
        extra_groups=[g for g in account.groups if g != account.gid],
        cwd=str(account.home),
        env={"HOME": str(account.home), "USER": account.name, "PATH": os.environ["PATH"]},
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )


def run_as_user(account: Account, code: str, *args: str, timeout: float = 60) -> str:
    """Run ``python -c code args...`` as ``account`` to the end; its stdout (it must succeed)."""
    proc = as_user(account, code, *args)
    out, err = proc.communicate(timeout=timeout)
    if proc.returncode != 0:
        raise AssertionError(f"as {account.name}: exit {proc.returncode}: {err[-2000:]}")
    return out


#: Alice swaps ``argv[1]`` between a copy of itself and symlinks to ``argv[2:]``, as fast as she can.
SWAP = r"""
import itertools, os, sys
path, targets = sys.argv[1], sys.argv[2:]
data = open(path, "rb").read()
tmp = path + ".swap"
for i in itertools.count():
    try:
        os.unlink(tmp)
    except FileNotFoundError:
        pass
    if i % 2:
        os.symlink(targets[(i // 2) % len(targets)], tmp)
    else:
        with open(tmp, "xb") as f:
            f.write(data)
    os.replace(tmp, path)
"""

#: Alice SIGSTOPs every process of hers whose command line holds ``argv[1]``, for ``argv[2]`` seconds,
#: printing each pid it stopped.
STOPPER = r"""
import os, signal, sys, time
uid, mark, until = os.getuid(), sys.argv[1].encode(), time.monotonic() + float(sys.argv[2])
stopped = {str(os.getpid())}  # its own command line holds the mark too
while time.monotonic() < until:
    for name in os.listdir("/proc"):
        if not name.isdigit() or name in stopped:
            continue
        try:
            if os.stat("/proc/" + name).st_uid != uid:
                continue
            with open("/proc/" + name + "/cmdline", "rb") as f:
                if mark not in f.read():
                    continue
            os.kill(int(name), signal.SIGSTOP)
        except OSError:
            continue
        stopped.add(name)
        print(name, flush=True)
    time.sleep(0.001)
"""


class Stopper:
    """Alice's process that stops her own mediators as they start (see :data:`STOPPER`)."""

    def __init__(self, account: Account, mark: str, seconds: float):
        self.proc = as_user(account, STOPPER, mark, str(seconds))
        self.stopped: list[tuple[int, float]] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.stopped.append((int(line), time.monotonic()))

    def wait_for_one(self, timeout: float) -> tuple[int, float] | None:
        deadline = time.monotonic() + timeout
        while not self.stopped and time.monotonic() < deadline:
            time.sleep(0.05)
        return self.stopped[0] if self.stopped else None

    def close(self) -> None:
        self.proc.kill()
        self.proc.wait()
        for pid, _ in self.stopped:  # whatever the hub left of them
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def set_subreaper(on: bool) -> None:
    """Make this process adopt its orphaned descendants (so it can reap them and free their pids).

    This machine's PID 1 reaps nothing: an orphan that dies would keep its pid forever.
    """
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_CHILD_SUBREAPER, int(on), 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_CHILD_SUBREAPER)")


def group_members(pgid: int) -> list[int]:
    out = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except (OSError, IndexError):
                continue
            if int(fields[2]) == pgid:
                out.append(int(entry.name))
    return out


def kill_and_reap_group(pgid: int) -> None:
    """SIGKILL the process group and reap every member, so that their pids (and the group's) are free.

    They are this process's to reap as the subreaper: the leader once the hub is gone, the
    others once the leader is.
    """
    pending = set(group_members(pgid))
    os.killpg(pgid, signal.SIGKILL)
    deadline = time.monotonic() + 20
    while pending and time.monotonic() < deadline:
        for pid in list(pending):
            try:
                if os.waitpid(pid, os.WNOHANG)[0] == pid:
                    pending.discard(pid)
            except ChildProcessError:  # not (yet) ours; gone when nobody holds it
                if not Path(f"/proc/{pid}").exists():
                    pending.discard(pid)
        time.sleep(0.05)
    if pending:
        raise AssertionError(f"processes {sorted(pending)} of group {pgid} could not be reaped")


class PidHeld(AssertionError):
    """The pid went to some other process or thread of the machine before the test could take it
    (pids wrap at ``kernel.pid_max``, and a busy machine reuses them fast)."""


def pid_holder(pid: int) -> str | None:
    """The command of the process or thread holding ``pid`` now (a thread's id is in /proc too)."""
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return None


def spawn_with_pid(pid: int, account: Account, argv: list[str], attempts: int = 500) -> subprocess.Popen:
    """Start ``argv`` as ``account`` with exactly ``pid``: the kernel's next pid is set first
    (``/proc/sys/kernel/ns_last_pid``, as CRIU restores processes); another process forking
    in between takes the number, so it is tried again. When another task of the machine holds
    the number for good, :class:`PidHeld` names it."""
    deadline = time.monotonic() + 10
    while pid_holder(pid) is not None and time.monotonic() < deadline:
        time.sleep(0.1)  # a task that took it in passing
    holder = pid_holder(pid)
    if holder is not None:
        raise PidHeld(f"pid {pid} is held by another task of this machine ({holder!r}) for over 10 s")
    for _ in range(attempts):
        with open("/proc/sys/kernel/ns_last_pid", "w") as f:
            f.write(str(pid - 1))
        proc = subprocess.Popen(
            argv,
            user=account.uid,
            group=account.gid,
            extra_groups=[],
            cwd="/",
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        if proc.pid == pid:
            return proc
        proc.kill()
        proc.wait()
    raise PidHeld(f"pid {pid} never came free for a new process in {attempts} tries (now: {pid_holder(pid)!r})")


def peak_rss_bytes(pid: int) -> int:
    """The process's peak resident memory (``VmHWM``)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no VmHWM for {pid}")


def root_only_file(folder: Path, text: str) -> tuple[Path, str]:
    """A file only root may read (0600) holding ``text`` and a fresh secret; ``(path, secret)``."""
    secret = secrets.token_hex(16)
    path = folder / f"root-only-{secret[:6]}"
    path.write_text(text.replace("SECRET", secret))
    os.chmod(path, 0o600)
    return path, secret
