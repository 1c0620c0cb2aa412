"""A private ``/tmp`` and ``/dev/shm`` for one server or job: a mount namespace of its own.

In the child, before ``exec``, the process enters a new mount namespace
(``unshare(CLONE_NEWNS)``), makes every mount a slave of the host's (mounts
made later on the host still appear; its own never leak out), and mounts an
empty tmpfs (``nosuid,nodev``, mode 1777, size-capped) on ``/tmp`` and on
``/dev/shm``. Every process of the server or job shares them; other users'
never see them, and they vanish with the last process of the namespace: cleaned
per session by construction. Their pages are charged to the writer's memory
cgroup, so the memory limit bounds them too. This is what systemd's
``PrivateTmp=yes`` does (mount_namespaces(7)).

A root hub does it in the child before switching to the user's uid. A hub that
is not root cannot: the mediator, as the user, does it inside a user namespace
that maps only the user's own uid and gid (``CLONE_NEWUSER``,
user_namespaces(7)); kernels that forbid unprivileged user namespaces refuse,
and the mediator reports that instead of starting without saying so.

A folder the process needs that lies under ``/tmp`` (a home there, on a test
machine) is bound back into the new tmpfs at the same path.

Standard library only (``ctypes`` for ``unshare`` and ``mount``): the mediator
imports it.
"""

from __future__ import annotations

import ctypes
import os
from collections.abc import Sequence
from pathlib import Path

CLONE_NEWNS = 0x00020000
CLONE_NEWUSER = 0x10000000
MS_NOSUID = 0x2
MS_NODEV = 0x4
MS_BIND = 0x1000
MS_REC = 0x4000
MS_SLAVE = 0x80000
#: The folders made private.
PRIVATE_FOLDERS = ("/tmp", "/dev/shm")

_libc = ctypes.CDLL(None, use_errno=True)  # loaded in the parent; the child only calls it


def _call(result: int, what: str) -> None:
    if result != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def _under(path: str, folder: str) -> bool:
    return path == folder or path.startswith(folder.rstrip("/") + "/")


#: Where gpulab itself is imported from (site-packages, or a checkout with an editable
#: install): servers and runners import it, so it stays reachable inside a private /tmp
#: when it lies there (a checkout under /tmp; sys.prefix alone is only its virtualenv).
GPULAB_IMPORT_ROOT = str(Path(__file__).resolve().parents[2])


def _write_proc(name: str, text: str) -> None:
    fd = os.open(f"/proc/self/{name}", os.O_WRONLY)
    try:
        os.write(fd, text.encode())
    finally:
        os.close(fd)


def private_tmp(
    size_bytes: int | None = None,
    keep: Sequence[str] = (),
    *,
    user_namespace: bool = False,
    folders: Sequence[str] = PRIVATE_FOLDERS,
) -> None:
    """Give the calling process (a child before ``exec``) private, empty ``folders``.

    ``size_bytes``: the cap of each tmpfs (``None``: the kernel's default, half the
    RAM). ``keep``: folders under ``folders`` to bind back (the home).
    ``user_namespace``: the caller is not root (the mediator, as the user).
    """
    uid, gid = os.getuid(), os.getgid()
    _call(_libc.unshare(CLONE_NEWNS | (CLONE_NEWUSER if user_namespace else 0)), "unshare")
    if user_namespace:  # map only our own uid and gid: nothing more than we had
        _write_proc("setgroups", "deny")
        _write_proc("uid_map", f"{uid} {uid} 1")
        _write_proc("gid_map", f"{gid} {gid} 1")
    _call(_libc.mount(b"none", b"/", None, MS_REC | MS_SLAVE, None), "mount --make-rslave /")
    # Held open in the new namespace (a bind source must be one of its mounts), before /tmp is hidden.
    kept = [
        (path, os.open(path, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC))
        for path in keep
        if any(_under(path, f) for f in folders)
    ]
    options = "mode=1777" + (f",size={int(size_bytes)}" if size_bytes else "")
    for folder in folders:
        _call(
            _libc.mount(b"tmpfs", folder.encode(), b"tmpfs", MS_NOSUID | MS_NODEV, options.encode()),
            f"mount tmpfs on {folder}",
        )
    for path, fd in kept:
        os.makedirs(path, 0o711, exist_ok=True)
        _call(_libc.mount(f"/proc/self/fd/{fd}".encode(), path.encode(), None, MS_BIND | MS_REC, None), f"bind {path}")
        os.close(fd)
