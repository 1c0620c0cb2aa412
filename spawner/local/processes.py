"""Which process a pid names: pid, owner uid and start time, read from ``/proc``.

A pid alone names a process only while that process lives; once it is gone the
kernel hands the number to the next process, possibly another user's. The hub
therefore records a started server's or job runner's start time (field 22 of
``/proc/<pid>/stat``, clock ticks after boot) with its pid, and counts it alive
or signals it only while the pid still belongs to the same account and started
at the same tick.

Standard library only: the mediator imports it.
"""

from __future__ import annotations

import errno
import os
import signal as signals
from pathlib import Path


def _stat_fields(pid: int) -> list[str] | None:
    """The fields of ``/proc/<pid>/stat`` after the command name (which may hold spaces and ``)``)."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    try:
        return text.rsplit(")", 1)[1].split()
    except IndexError:
        return None


def start_time(pid: int) -> int | None:
    """When ``pid`` started, in clock ticks after boot (``/proc/<pid>/stat`` field 22); ``None`` if gone."""
    if pid <= 0:
        return None
    fields = _stat_fields(pid)
    try:  # fields[0] is field 3 (state): field 22 is fields[19]
        return int(fields[19]) if fields else None
    except (IndexError, ValueError):
        return None


def owner(pid: int) -> int | None:
    """The uid owning ``pid`` (that of ``/proc/<pid>``), ``None`` if gone."""
    try:
        return os.stat(f"/proc/{pid}").st_uid
    except OSError:
        return None


def command_line(pid: int) -> list[str]:
    """The arguments ``pid`` was started with (``[]`` once it is gone or unreadable)."""
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
    except OSError:
        return []


def process_alive(pid: int | None, uid: int | None = None, started: int | None = None) -> bool:
    """Is ``pid`` a live (non-zombie) process, owned by ``uid`` and started at ``started`` when given?"""
    if not pid or pid <= 0:
        return False
    if uid is not None and owner(pid) != uid:
        return False  # gone, or the number now names another account's process
    fields = _stat_fields(pid)
    if fields is None:
        return False
    if started is not None and start_time(pid) != started:
        return False  # the same account's number, but a later process
    return bool(fields) and fields[0] != "Z"


def signal_process(pid: int, uid: int | None, started: int | None, sig: int) -> bool:
    """Send ``sig`` to ``pid`` if it is still the process identified; whether it was.

    The pid is pinned with a pidfd before it is checked, so the signal cannot
    reach a process that took the number between the check and the send.
    """
    if sig == 0:
        return process_alive(pid, uid, started)
    try:
        pidfd = os.pidfd_open(pid)
    except OSError:
        return False
    try:
        if not process_alive(pid, uid, started):
            return False
        signals.pidfd_send_signal(pidfd, sig)
        return True
    except ProcessLookupError:
        return False
    finally:
        os.close(pidfd)


def signal_group(pid: int, uid: int | None, started: int | None, sig: int) -> bool:
    """Send ``sig`` to the process group led by ``pid`` if its leader is still the process identified.

    A group cannot be pinned like a process; its number stays taken while any
    member lives, so once the leader is checked the group is the leader's.
    """
    if not process_alive(pid, uid, started):
        return False
    if sig == 0:
        return True
    try:
        os.killpg(pid, sig)
    except ProcessLookupError:
        return False
    except PermissionError as e:  # another account's group: never ours to touch
        if e.errno == errno.EPERM:
            return False
        raise
    return True


def descendants(root: int) -> list[int]:
    """Every live process below ``root`` (children, theirs, ...), from ``/proc``'s parent pids.

    A process that left ``root``'s session or group (``setsid``, as Jupyter kernels and
    daemons do) is still found while ``root`` is its ancestor, and, once orphaned, when
    ``root`` is a child subreaper (:func:`become_subreaper`): the kernel then hands it to
    ``root`` instead of init. Zombies are left out (nothing to signal).
    """
    children: dict[int, list[int]] = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        fields = _stat_fields(int(entry.name))
        if not fields or len(fields) < 2 or fields[0] == "Z":
            continue
        try:
            children.setdefault(int(fields[1]), []).append(int(entry.name))
        except ValueError:
            continue
    found: list[int] = []
    todo = list(children.get(root, ()))
    while todo:
        pid = todo.pop()
        found.append(pid)
        todo.extend(children.get(pid, ()))
    return found


def zombie_children(parent: int) -> list[int]:
    """``parent``'s children that exited and wait to be reaped (``Z`` in ``/proc/<pid>/stat``)."""
    found = []
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            fields = _stat_fields(int(entry.name))
            if fields and len(fields) > 1 and fields[0] == "Z" and fields[1] == str(parent):
                found.append(int(entry.name))
    return found


#: prctl(2) option: orphaned descendants are re-parented to this process, not to init.
PR_SET_CHILD_SUBREAPER = 36


def become_subreaper() -> bool:
    """Make this process a child subreaper (Linux >= 3.4); ``False`` where the call is unavailable."""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False
