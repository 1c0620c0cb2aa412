"""Reads below a home (no symlink followed, no blocking, bounded), process identity, and the
mediator client's deadline. Real files, FIFOs, sockets and processes; no hub.

The attacks through a hub, as real users' accounts, are in tests/integration/test_redteam.py.
"""

from __future__ import annotations

import asyncio
import os
import pwd
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from spawner.local import home_files
from spawner.local.home_files import read_beneath, write_new_file
from spawner.local.mediator_client import AccountMediator, MediatorBusy, MediatorError, MediatorTimeout
from spawner.local.processes import process_alive, signal_group, signal_process, start_time


@pytest.fixture
def home(tmp_path: Path) -> Path:
    h = tmp_path / "home"
    (h / "exp" / "runs").mkdir(parents=True)
    (h / "exp" / "runs" / "job.log").write_bytes(b"line 1\nline 2\n")
    (tmp_path / "secret").write_text("the hub's secret")
    return h


def test_a_regular_file_is_read_from_an_offset_up_to_a_limit(home: Path):
    log = str(home / "exp" / "runs" / "job.log")
    assert read_beneath(str(home), log, 0, 100) == home_files.Found("ok", b"line 1\nline 2\n", 14)
    assert read_beneath(str(home), log, 7, 4) == home_files.Found("ok", b"line", 14)
    assert read_beneath(str(home), log, 10**15, 10) == home_files.Found("ok", b"", 14)  # past the end: nothing
    assert read_beneath(str(home), log, 0, 0) == home_files.Found("ok", b"", 14)  # a check only


@pytest.mark.parametrize("where", ["last", "middle", "home's child"])
def test_no_symlink_is_followed_anywhere_below_the_home(home: Path, tmp_path: Path, where: str):
    secret = tmp_path / "secret"
    if where == "last":
        (home / "exp" / "runs" / "job.log").unlink()
        (home / "exp" / "runs" / "job.log").symlink_to(secret)
        path = home / "exp" / "runs" / "job.log"
    elif where == "middle":
        (home / "exp" / "link").symlink_to(tmp_path)
        path = home / "exp" / "link" / "secret"
    else:
        (home / "up").symlink_to(tmp_path)
        path = home / "up" / "secret"
    found = read_beneath(str(home), str(path), 0, 100)
    assert found.state == "symlink" and found.data == b""
    # Even a symlink that stays inside the home is refused: nothing below the home is followed.
    (home / "inside").symlink_to(home / "exp")
    assert read_beneath(str(home), str(home / "inside" / "runs" / "job.log"), 0, 100).state == "symlink"


def test_a_fifo_is_refused_without_blocking(home: Path):
    fifo = home / "exp" / "runs" / "pipe.log"
    os.mkfifo(fifo)
    started = time.monotonic()
    assert read_beneath(str(home), str(fifo), 0, 100).state == "not-a-file"
    assert time.monotonic() - started < 5  # an open without O_NONBLOCK would wait for a writer forever


def test_a_socket_a_folder_and_a_device_are_not_files(home: Path):
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(str(home / "exp" / "sock"))
    try:
        assert read_beneath(str(home), str(home / "exp" / "sock"), 0, 10).state == "not-a-file"
    finally:
        sock.close()
    assert read_beneath(str(home), str(home / "exp" / "runs"), 0, 10).state == "not-a-file"
    assert read_beneath(str(home / "exp"), str(home / "exp" / "runs" / "job.log" / "x"), 0, 10).state == "not-a-file"
    assert read_beneath("/dev", "/dev/null", 0, 10).state == "not-a-file"


def test_a_sparse_file_over_the_cap_is_refused_before_any_read(home: Path):
    big = home / "exp" / "runs" / "out.ipynb"
    with open(big, "wb") as f:
        f.truncate(1 << 40)  # 1 TiB, no block of it written
    found = read_beneath(str(home), str(big), 0, 1 << 20, max_size=32 << 20)
    assert (found.state, found.size, found.data) == ("too-large", 1 << 40, b"")


@pytest.mark.parametrize(
    "path", ["/etc/passwd", "relative", "{home}/../secret", "{home}/exp/./runs/job.log", "{home}//exp", "{home}"]
)
def test_paths_not_plainly_below_the_home_are_outside(home: Path, path: str):
    assert read_beneath(str(home), path.format(home=home), 0, 10).state == "outside"


def test_a_missing_file_or_home_is_absent(home: Path, tmp_path: Path):
    assert read_beneath(str(home), str(home / "nope"), 0, 10).state == "absent"
    missing = tmp_path / "nobody-home"
    found = read_beneath(str(missing), str(missing / "x"), 0, 10)
    assert found.state == "absent" and found.detail == str(missing)


def test_a_new_file_is_written_only_where_nothing_is(home: Path, tmp_path: Path):
    marker = str(home / ".gpulab" / "hub")
    assert write_new_file(str(home), marker, b"hub A\n") is True
    assert write_new_file(str(home), marker, b"hub B\n") is False
    assert Path(marker).read_bytes() == b"hub A\n"
    assert (home / ".gpulab").stat().st_mode & 0o777 == 0o700
    (home / "elsewhere").symlink_to(tmp_path)
    with pytest.raises(home_files.Beneath) as refused:
        write_new_file(str(home), str(home / "elsewhere" / "planted"), b"x")
    assert refused.value.state == "symlink" and not (tmp_path / "planted").exists()


def test_a_new_file_is_never_seen_half_written_by_a_racing_claim(home: Path, tmp_path: Path):
    """Two spawns of one user claim the home at once (the mediator's ``prepare_home``): each
    writes its hub's marker if none is there, then reads what is. A reader must see one
    writer's whole line, never an empty file that another writer has created but not yet
    filled (seen in CI: "belongs to another gpulab hub ()")."""
    import threading

    marker = str(home / ".gpulab" / "hub")
    for round_ in range(30):
        if Path(marker).exists():
            Path(marker).unlink()
        seen: list[bytes] = []
        start = threading.Barrier(8)

        def claim(n: int, start: threading.Barrier, seen: list[bytes]) -> None:
            start.wait()
            write_new_file(str(home), marker, f"hub {n} {'x' * 4000}\n".encode())
            seen.append(read_beneath(str(home), marker, 0, 8192, 8192).data)

        threads = [threading.Thread(target=claim, args=(n, start, seen)) for n in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert len(set(seen)) == 1 and seen[0].startswith(b"hub ") and seen[0].endswith(b"\n"), (round_, seen)
    # no temporary file is left beside it
    assert sorted(p.name for p in (home / ".gpulab").iterdir()) == ["hub"]


def test_a_notebook_is_kept_in_a_new_file_and_nothing_crosses_a_symlink(home: Path, tmp_path: Path):
    """A job's own copy of its notebook: a regular file below the home, up to the cap, into a
    new file; a symlinked source, target folder or existing target is refused, nothing written."""
    source = home / "exp" / "train.ipynb"
    source.write_bytes(b'{"cells": []}')
    target = home / "exp" / "runs" / "train-1.input.ipynb"
    found, created = home_files.copy_to_new_file(str(home), str(source), str(target), 1024)
    assert (found.state, created) == ("ok", True) and target.read_bytes() == b'{"cells": []}'
    assert target.stat().st_mode & 0o777 == 0o600
    found, created = home_files.copy_to_new_file(str(home), str(source), str(target), 1024)
    assert (found.state, created) == ("ok", False)  # never written into
    found, _ = home_files.copy_to_new_file(str(home), str(source), str(home / "exp" / "big.ipynb"), 4)
    assert found.state == "too-large" and not (home / "exp" / "big.ipynb").exists()
    (home / "exp" / "link.ipynb").symlink_to(tmp_path / "secret")
    found, _ = home_files.copy_to_new_file(str(home), str(home / "exp" / "link.ipynb"), str(home / "x.ipynb"), 1024)
    assert found.state == "symlink" and not (home / "x.ipynb").exists()
    (home / "out").symlink_to(tmp_path)
    found, created = home_files.copy_to_new_file(str(home), str(source), str(home / "out" / "planted"), 1024)
    assert (found.state, created) == ("symlink", False) and not (tmp_path / "planted").exists()


# -- process identity ------------------------------------------------------------------------


def test_a_process_is_its_pid_uid_and_start_time():
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True)
    try:
        started = start_time(proc.pid)
        assert started is not None and process_alive(proc.pid, os.getuid(), started)
        assert not process_alive(proc.pid, os.getuid(), started + 1)  # a later process with that number
        assert not process_alive(proc.pid, os.getuid() + 1, started)  # another account's
        assert not signal_process(proc.pid, os.getuid(), started + 1, 15)
        assert not signal_group(proc.pid, os.getuid(), started + 1, 15)
        assert proc.poll() is None  # neither reached it
        assert signal_group(proc.pid, os.getuid(), started, 15)
        proc.wait(10)
    finally:
        proc.kill()
        proc.wait()
    assert not process_alive(proc.pid) and start_time(proc.pid) is None


# -- the mediator client ----------------------------------------------------------------------

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="switching to another account needs root (CI runs as root)")


class StoppedMediator(AccountMediator):
    """Stands in for a mediator its account stopped (SIGSTOP): a program that stops itself.

    It runs as the account, exactly as :class:`AccountMediator` runs the real one; only the
    program differs, so the deadline, the kill and the per-account cap are the real ones.
    """

    def command(self, account: str) -> tuple[list[str], dict]:
        _, extra = super().command(account)
        return [sys.executable, "-c", "import os, signal; os.kill(os.getpid(), signal.SIGSTOP)"], extra


@needs_root
def test_a_stopped_mediator_is_killed_at_the_deadline_and_others_are_refused_at_once():
    account = pwd.getpwnam("nobody").pw_name

    async def scenario() -> None:
        client = StoppedMediator("unused", timeout=1.0, max_pending=2)
        started = time.monotonic()
        calls = [asyncio.create_task(client.call(account, {"action": "read"})) for _ in range(2)]
        await asyncio.sleep(0.3)
        with pytest.raises(MediatorBusy, match="2 earlier requests as nobody are still unanswered"):
            await client.call(account, {"action": "read"})
        for call in calls:
            with pytest.raises(MediatorTimeout, match="did not answer within 1 s"):
                await call
        assert time.monotonic() - started < 30
        # Nothing of the stopped processes is left, and the account may be asked again.
        leftovers = subprocess.run(["pgrep", "-u", account, "-f", "signal.SIGSTOP"], capture_output=True, text=True)
        assert leftovers.stdout.strip() == ""
        with pytest.raises(MediatorTimeout):
            await client.call(account, {"action": "read"})

    asyncio.run(scenario())


@needs_root
def test_the_real_mediator_reads_as_the_account_and_its_answer_is_checked(tmp_path: Path):
    account = pwd.getpwnam("nobody")
    mediator = str(Path(sys.executable).with_name("gpulab-launch"))

    async def scenario() -> None:
        client = AccountMediator(mediator, timeout=30)
        found = await client.read(account.pw_name, f"{account.pw_dir}/x", 0, 10)
        assert found.state in ("absent", "denied")  # nobody's home does not exist
        with pytest.raises(MediatorError, match="refused nothing-such"):
            await client.call(account.pw_name, {"action": "nothing-such"})
        with pytest.raises(MediatorError, match="the mediator never runs as root"):
            await client.call("root", {"action": "read"})

    asyncio.run(scenario())
