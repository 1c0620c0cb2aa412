"""Files below a user's home, opened without following any symlink and without blocking.

Every read of a file a user controls (a job's log, output notebook and exit
status, the notebook of a submission and the job's own copy of it) goes through
:func:`read_beneath`:

- the walk starts at the home, opened by the path the account database gives
  (the administrator's, not the user's), and opens each further component
  relative to its parent (``openat``) with ``O_NOFOLLOW``: a symlink anywhere
  below the home is refused, not followed. Python's :mod:`os` has no
  ``openat2`` (``RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS``), so the walk goes one
  component at a time, which gives the same guarantee on every kernel;
- the last component is opened with ``O_NONBLOCK`` (a FIFO neither blocks the
  reader nor is read), then ``fstat`` decides: only a regular file is read;
- a size cap is checked on the open file before anything is read (a 1 TiB
  sparse file costs one ``fstat``), and at most ``limit`` bytes are read.

The mediator runs it as the file's owner (so a hard link to a file the owner
cannot read stays unreadable too); a hub without accounts runs it itself.
The read timeout is the caller's: the hub kills a mediator that does not answer.

Standard library only: the mediator imports it.
"""

from __future__ import annotations

import errno
import os
import stat
from dataclasses import dataclass

#: What a read found. ``ok``: a regular file (``data`` holds what was read).
OK, ABSENT, DENIED, OUTSIDE, SYMLINK, NOT_A_FILE, TOO_LARGE = (
    "ok",
    "absent",
    "denied",
    "outside",
    "symlink",
    "not-a-file",
    "too-large",
)
STATES = (OK, ABSENT, DENIED, OUTSIDE, SYMLINK, NOT_A_FILE, TOO_LARGE)

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


class Beneath(Exception):
    """A path cannot be opened below the base; ``state`` says why (one of :data:`STATES`)."""

    def __init__(self, state: str, detail: str = ""):
        super().__init__(detail or state)
        self.state = state
        self.detail = detail


@dataclass(frozen=True)
class Found:
    """What :func:`read_beneath` found: its state, the bytes read and the file's size."""

    state: str
    data: bytes = b""
    size: int = 0
    detail: str = ""


def parts_below(base: str, path: str) -> list[str]:
    """The components of ``path`` below ``base`` (both absolute); :class:`Beneath` ``outside`` otherwise.

    Purely lexical: ``.``, ``..`` and empty components are refused, never resolved.
    """
    if not isinstance(path, str) or not path.startswith("/") or "\0" in path:
        raise Beneath(OUTSIDE, "paths must be absolute")
    root = base.rstrip("/") + "/"
    if not path.startswith(root):
        raise Beneath(OUTSIDE, f"{path} is not inside {base}")
    parts = path[len(root) :].split("/")
    if not parts or any(p in ("", ".", "..") for p in parts):
        raise Beneath(OUTSIDE, f"{path} names no file below {base} plainly (no '.', '..' or '//')")
    return parts


def _failed(e: OSError, name: str, parent: int | None) -> Beneath:
    """The state an ``openat`` failure means, looking at what is there when that is ambiguous."""
    if e.errno == errno.ENOENT:
        return Beneath(ABSENT, name)
    if e.errno in (errno.EACCES, errno.EPERM):
        return Beneath(DENIED, name)
    if e.errno == errno.ELOOP:
        return Beneath(SYMLINK, name)
    if e.errno == errno.ENOTDIR and parent is not None:
        try:  # O_DIRECTORY|O_NOFOLLOW on a symlink says ENOTDIR on some kernels
            if stat.S_ISLNK(os.stat(name, dir_fd=parent, follow_symlinks=False).st_mode):
                return Beneath(SYMLINK, name)
        except OSError:
            pass
        return Beneath(NOT_A_FILE, name)
    if e.errno in (errno.ENXIO, errno.ENODEV, errno.EISDIR, errno.ENOTDIR):
        return Beneath(NOT_A_FILE, name)  # a socket, a device without a driver, a folder
    raise e


def open_dir(base: str, parts: list[str], create: bool = False) -> int:
    """A file descriptor of the folder ``base/parts...``, every component below ``base`` unfollowed.

    ``create``: make missing folders (``0700``) on the way.
    """
    try:
        fd = os.open(base, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError as e:
        raise _failed(e, base, None) from None
    try:
        for part in parts:
            if create:
                try:
                    os.mkdir(part, 0o700, dir_fd=fd)
                except FileExistsError:
                    pass
            try:
                nfd = os.open(part, _DIR_FLAGS, dir_fd=fd)
            except OSError as e:
                raise _failed(e, part, fd) from None
            os.close(fd)
            fd = nfd
    except BaseException:
        os.close(fd)
        raise
    return fd


def open_file(base: str, path: str) -> int:
    """A read-only descriptor of the regular file ``path`` below ``base``; :class:`Beneath` otherwise."""
    parts = parts_below(base, path)
    parent = open_dir(base, parts[:-1])
    try:
        try:
            fd = os.open(parts[-1], _FILE_FLAGS, dir_fd=parent)
        except OSError as e:
            raise _failed(e, parts[-1], parent) from None
    finally:
        os.close(parent)
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise Beneath(NOT_A_FILE, parts[-1])
    return fd


def read_beneath(base: str, path: str, offset: int = 0, limit: int = 0, max_size: int | None = None) -> Found:
    """Up to ``limit`` bytes from ``offset`` of the regular file ``path`` below ``base``.

    ``max_size``: refuse (``too-large``) a file larger than this without reading it.
    ``limit`` 0 only checks the file (its state and size).
    """
    try:
        fd = open_file(base, path)
    except Beneath as e:
        return Found(e.state, detail=e.detail)
    try:
        size = os.fstat(fd).st_size
        if max_size is not None and size > max_size:
            return Found(TOO_LARGE, size=size)
        chunks: list[bytes] = []
        want, at = max(0, limit), max(0, offset)
        while want > 0 and at < size:
            chunk = os.pread(fd, min(want, 1 << 20), at)
            if not chunk:
                break
            chunks.append(chunk)
            want -= len(chunk)
            at += len(chunk)
        return Found(OK, b"".join(chunks), size)
    finally:
        os.close(fd)


def write_new_file(base: str, path: str, data: bytes, mode: int = 0o600) -> bool:
    """Create ``path`` below ``base`` (its folders too, ``0700``) holding ``data``; ``False`` if it exists.

    Never follows a symlink and never writes into an existing file. The file appears whole
    or not at all: ``data`` goes into a new temporary file beside it, which is then linked
    under its name (``linkat`` fails on any existing name, a symlink included), so a reader
    racing the writer (two spawns of one user claiming the home at once) never reads it
    half-written.
    """
    parts = parts_below(base, path)
    fd = open_dir(base, parts[:-1], create=True)
    try:
        temp = f".{parts[-1]}.{os.getpid()}.{os.urandom(4).hex()}.tmp"
        out = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, mode, dir_fd=fd)
        try:
            try:
                view = memoryview(data)
                while view:
                    view = view[os.write(out, view) :]
            finally:
                os.close(out)
            try:
                os.link(temp, parts[-1], src_dir_fd=fd, dst_dir_fd=fd, follow_symlinks=False)
            except FileExistsError:
                return False
            return True
        finally:
            os.unlink(temp, dir_fd=fd)
    finally:
        os.close(fd)


def copy_to_new_file(base: str, source: str, target: str, max_size: int) -> tuple[Found, bool]:
    """Copy the regular file ``source`` to the new file ``target``, both below ``base``: read as
    :func:`read_beneath` reads (at most ``max_size`` bytes, else ``too-large``), written as
    :func:`write_new_file` writes. ``(what was found, whether target was made)``; a target that
    cannot be made is the found state of its path (``symlink``, ``not-a-file``, ...)."""
    found = read_beneath(base, source, 0, max_size, max_size)
    if found.state != OK:
        return found, False
    try:
        return Found(OK, size=found.size), write_new_file(base, target, found.data)
    except Beneath as e:
        return Found(e.state, size=found.size, detail=f"{target}: {e.detail}"), False
