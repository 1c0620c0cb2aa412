"""A job-log read as the owner (through the mediator) versus the hub's own read, same run.

The JupyterLab sidebar polls a running job's log (``GET /hub/api/gpulab/jobs/<id>/logs``),
so each poll is one read of up to 256 KiB of a file in the owner's home. Measured on
one real log file in a real account's home (made for the run, removed after):

* ``open as the hub`` -- what a root hub did before: ``open`` + ``seek`` + ``read``
  with its own rights (and following symlinks);
* ``read_beneath in the hub`` -- the walk a hub without accounts does now
  (:func:`spawner.local.home_files.read_beneath`: ``openat`` per component, ``fstat``);
* ``mediator as the account`` -- what a root hub does now: ``gpulab-launch`` started
  switched to the account (:class:`spawner.local.mediator_client.AccountMediator`);
* ``mediator through sudo`` (``--sudo``) -- what a hub that is not root does: the same
  program through ``sudo -n -u``, timed by a process of a non-root hub account with the
  drop-in ``gpulab sudoers`` prints (installed for the run: use
  ``flock /tmp/gpulab-sudo-tests.lock``).

Reads alternate between the ways, one at a time, so drift on a shared machine hits
all of them. Needs root (it makes the accounts).

    .venv/bin/python benchmarks/log_read.py --reads 200 [--sudo]
    .venv/bin/python benchmarks/log_read.py --smoke
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import ROOT, percentile, table, write_result  # noqa: E402

from spawner.local.accounts import delete_account, ensure_account  # noqa: E402
from spawner.local.home_files import read_beneath  # noqa: E402
from spawner.local.mediator_client import AccountMediator  # noqa: E402
from spawner.local.sudo import SudoLauncher, sudoers_rule, useradd_argv  # noqa: E402

MEDIATOR = str(Path(sys.executable).with_name("gpulab-launch"))
CHUNK = 256 * 1024


def open_as_hub(path: str) -> bytes:
    with open(path, "rb") as f:
        f.seek(0)
        return f.read(CHUNK)


async def timed_reads(ways: dict, reads: int) -> dict[str, list[float]]:
    times: dict[str, list[float]] = {name: [] for name in ways}
    for _ in range(reads):
        for name, read in ways.items():
            t = time.perf_counter()
            data = await read()
            times[name].append(time.perf_counter() - t)
            assert len(data) > 0, name
    return times


def as_hub_child(args: argparse.Namespace) -> int:
    """``--as-hub``: the non-root hub account times reads through sudo and prints them."""
    client = SudoLauncher(MEDIATOR, timeout=30)

    async def through_sudo() -> bytes:
        return (await client.read(args.account, args.path, 0, CHUNK)).data

    print(json.dumps(asyncio.run(timed_reads({"mediator through sudo": through_sudo}, args.reads))))
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--reads", type=int, default=200)
    parser.add_argument("--smoke", action="store_true", help="10 reads of each way")
    parser.add_argument("--sudo", action="store_true", help="also through sudo (installs a drop-in for the run)")
    parser.add_argument("--log-bytes", type=int, default=64 * 1024, help="size of the log read")
    parser.add_argument("--out", help="folder for the JSON result (default: benchmarks/results)")
    parser.add_argument("--as-hub", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--account", help=argparse.SUPPRESS)
    parser.add_argument("--path", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.as_hub:
        return as_hub_child(args)
    if os.geteuid() != 0:
        print("log_read needs root: it makes a user's account for the run", file=sys.stderr)
        return 2
    reads = 10 if args.smoke else args.reads
    tag = secrets.token_hex(3)
    root = Path(tempfile.mkdtemp(prefix=f"gpulab-bench-{tag}-", dir="/tmp"))
    os.chmod(root, 0o755)
    group, hub_name, user = f"gbsu{tag}-users", f"gbhub{tag}", f"gbsu{tag}-alice"
    dropin = Path(f"/etc/sudoers.d/gpulab-bench-{tag}")
    try:
        if args.sudo:
            subprocess.run(["groupadd", group], check=True, capture_output=True)
            subprocess.run(useradd_argv(user, root, "/bin/bash", group), check=True, capture_output=True)
        account = ensure_account(user, root)
        log = account.home / "exp" / "runs" / "job.log"
        log.parent.mkdir(parents=True)
        log.write_bytes(b"x" * (args.log_bytes - 1) + b"\n")
        for p in (log, log.parent, log.parent.parent):
            os.chown(p, account.uid, account.gid)
        client = AccountMediator(MEDIATOR, timeout=30)

        async def hub_open() -> bytes:
            return open_as_hub(str(log))

        async def beneath() -> bytes:
            return read_beneath(str(account.home), str(log), 0, CHUNK).data

        async def as_account() -> bytes:
            return (await client.read(user, str(log), 0, CHUNK)).data

        ways = {"open as the hub": hub_open, "read_beneath in the hub": beneath, "mediator as the account": as_account}
        times = asyncio.run(timed_reads(ways, reads))
        if args.sudo:
            hub = ensure_account(hub_name, root)
            staged = root / "rule"
            staged.write_text(sudoers_rule(hub_name, MEDIATOR, group=group, prefix=f"gbsu{tag}-", home_root=str(root)))
            subprocess.run(["visudo", "-cf", str(staged)], check=True, capture_output=True)
            shutil.copyfile(staged, dropin)
            os.chmod(dropin, 0o440)
            out = subprocess.run(
                [sys.executable, __file__, "--as-hub", "--reads", str(reads), "--account", user, "--path", str(log)],
                capture_output=True,
                text=True,
                timeout=600,
                cwd="/",
                user=hub.uid,
                group=hub.gid,
                extra_groups=[],
                env={"PATH": os.environ["PATH"], "HOME": str(hub.home)},
            )
            if out.returncode != 0:
                raise SystemExit(f"the reads through sudo failed: {out.stderr[-2000:]}")
            times.update(json.loads(out.stdout))
    finally:
        dropin.unlink(missing_ok=True)
        for name in (user, hub_name):
            delete_account(name)
        subprocess.run(["groupdel", group], capture_output=True)
        shutil.rmtree(root, ignore_errors=True)
    base = sorted(times["open as the hub"])
    rows = {}
    for name, values in times.items():
        s = sorted(values)
        rows[name] = {
            "reads": len(s),
            "p50_ms": percentile(s, 50) * 1000,
            "p90_ms": percentile(s, 90) * 1000,
            "p99_ms": percentile(s, 99) * 1000,
            "p50_vs_open_as_the_hub": percentile(s, 50) / percentile(base, 50),
        }
    print(
        table(
            ["way", "reads", "p50 ms", "p90 ms", "p99 ms", "p50 / open as the hub"],
            [
                [n, r["reads"], r["p50_ms"], r["p90_ms"], r["p99_ms"], r["p50_vs_open_as_the_hub"]]
                for n, r in rows.items()
            ],
            title=f"one read of a {args.log_bytes // 1024} KiB job log",
        )
    )
    path = write_result(
        "log_read",
        {"parameters": {"reads": reads, "log_bytes": args.log_bytes, "sudo": args.sudo}, "rows": rows},
        args.out,
    )
    print(f"\nwritten to {path.relative_to(ROOT) if path.is_relative_to(ROOT) else path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
