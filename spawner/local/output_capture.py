"""A server's output (its stdout and stderr, its kernels') in a bounded file of the user's own.

``python -m spawner.local.output_capture --file PATH --max-bytes N -- COMMAND...``
runs as the user, inside the server's cgroup and namespace: it opens a pipe,
forks a writer that appends what comes through the pipe to ``PATH`` (``0600``,
in a ``0700`` folder of the user's home), and then ``exec``s ``COMMAND`` with
its stdout and stderr on the pipe, so the server keeps this process's pid.
When ``PATH`` would pass ``N`` bytes it is renamed ``PATH.1`` (replacing the
previous one) and a new ``PATH`` begins: never more than ``2 × N`` bytes on disk.

The hub's own log never sees a byte of it: a user cannot forge hub log lines
or fill the hub's disk with her kernel's output, and she can read her own log.
The writer ignores SIGINT, SIGTERM and SIGHUP (stopping the server ends it
with the last process holding the pipe), and, as the user's own process, can
write nothing she could not write herself.

Standard library only: the mediator starts it too.
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import sys
from pathlib import Path

#: Default cap of one capture file.
DEFAULT_MAX_BYTES = 10 << 20
CHUNK = 64 << 10


def server_log_path(home: str | Path, server_name: str = "") -> Path:
    """Where the output of the user's server ``server_name`` is kept (in her home)."""
    safe = re.sub(r"[^A-Za-z0-9_-]", "-", server_name)[:100]
    name = f"server-{safe}.log" if safe else "server.log"
    return Path(home) / ".gpulab" / "logs" / name


def capture_argv(python: str, path: str | Path, max_bytes: int) -> list[str]:
    """The command line that puts the command after it under capture (append the command)."""
    return [python, "-m", "spawner.local.output_capture", "--file", str(path), "--max-bytes", str(int(max_bytes)), "--"]


def _open(path: Path) -> int:
    return os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)


def write_bounded(source: int, path: Path, max_bytes: int) -> None:
    """Copy ``source`` to ``path`` until end of file, rotating to ``path.1`` at ``max_bytes``.

    A file that cannot be opened or written (a full disk, a symlink in its place)
    does not stop the reading: the rest is dropped, so the server never blocks on,
    or dies of, a pipe nobody reads.
    """
    fd: int | None
    try:
        fd = _open(path)
        size = os.fstat(fd).st_size
    except OSError:
        fd, size = None, 0
    while True:
        try:
            data = os.read(source, CHUNK)
        except InterruptedError:
            continue
        if not data:
            break
        while data and fd is not None:
            try:
                if size >= max_bytes:
                    os.close(fd)
                    fd = None
                    os.replace(path, path.with_name(path.name + ".1"))
                    fd, size = _open(path), 0
                part, data = data[: max_bytes - size], data[max_bytes - size :]
                os.write(fd, part)
                size += len(part)
            except OSError:
                if fd is not None:
                    os.close(fd)
                fd = None
    if fd is not None:
        os.close(fd)


def make_private_folder(folder: Path) -> None:
    """``folder`` and the folders on the way below the home, each ``0700``."""
    missing = [p for p in [folder, *folder.parents] if not p.exists()]
    for p in reversed(missing):
        p.mkdir(mode=0o700)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m spawner.local.output_capture")
    parser.add_argument("--file", required=True)
    parser.add_argument("--max-bytes", type=int, default=DEFAULT_MAX_BYTES)
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command or args.max_bytes < 4096:
        parser.error("give a command after -- and --max-bytes of at least 4096")
    path = Path(args.file)
    make_private_folder(path.parent)
    read_end, write_end = os.pipe()
    first = os.fork()
    if first == 0:  # the writer, detached twice so the server never sees it as its child
        try:
            os.close(write_end)
            if os.fork() != 0:
                os._exit(0)
            for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
                signal.signal(sig, signal.SIG_IGN)
            devnull = os.open(os.devnull, os.O_RDWR)
            for target in (0, 1, 2):
                os.dup2(devnull, target)
            write_bounded(read_end, path, args.max_bytes)
        finally:
            os._exit(0)
    os.close(read_end)
    os.waitpid(first, 0)
    os.dup2(write_end, 1)
    os.dup2(write_end, 2)
    os.close(write_end)
    try:
        os.execvp(command[0], command)
    except OSError as e:
        print(f"gpulab: cannot start {command[0]}: {e}", file=sys.stderr)
        return 127
    return 0  # not reached


if __name__ == "__main__":
    sys.exit(main())
