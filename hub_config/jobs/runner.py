"""The single-server job runner: ``python -m hub_config.jobs.runner``.

Runs one job in the hub's Python environment (the same one the user's JupyterLab
runs in) and writes its exit status to a file, so that the hub can tell success from
failure even for a run it re-adopted after a restart (a re-adopted process is not the
hub's child; its exit code is otherwise lost):

- a notebook with papermill, its parameters from ``GPULAB_JOB_PARAMETERS`` (JSON);
- a script with its arguments from ``GPULAB_JOB_ARGS`` (a JSON list: no shell parses
  them), as ``python script args`` or, over ``--nproc`` GPUs, as ``torchrun
  --nproc_per_node=N`` (the launcher in ``GPULAB_TORCHRUN``, a JSON list).

The checkpoint contract: the job gets ``GPULAB_CHECKPOINT_DIR`` (made here, below the
home, never through a symlink: a path that leads out of the home fails the job) and
``GPULAB_ATTEMPT``. A SIGTERM (cancel, preemption, time limit) is passed on to every
process of the job (:mod:`hub_config.jobs.process_tree`: the runner is their subreaper,
so a kernel or a daemon in a session of its own is reached too), which then has
``--grace`` seconds to save a checkpoint before the rest is killed; papermill saves the
output notebook as far as it ran. The runner exits only when no process of the job is
left.

It runs as the job's owner (when the hub switches users) and creates the output
folder, the log, the checkpoint folder and the exit-status file (``~/.gpulab/jobs/``)
itself, so all of them belong to the owner; the hub reads them as the owner.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import subprocess
import sys
import traceback
from pathlib import Path
from typing import Any

from hub_config.jobs.process_tree import JobProcesses
from spawner.core.jobprogram import NOTEBOOK, SCRIPT, script_argv
from spawner.local import home_files


class Terminated(KeyboardInterrupt):
    """A SIGTERM arrived: the job is being stopped. A ``KeyboardInterrupt`` so that it leaves
    papermill's event loop (asyncio re-raises only those) and papermill saves the output."""


def write_status(path: str, status: dict) -> None:
    """Write this attempt's exit status (never through a symlink), its folder made here when missing."""
    Path(path).parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(json.dumps(status))


def open_log(path: str, attempt: int) -> None:
    """Send this process's stdout and stderr (and the job's) to the job's log."""
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW, 0o600)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    if attempt > 1:
        print(f"\n--- gpulab: attempt {attempt} ---", flush=True)


def make_checkpoint_dir(home: str, path: str) -> None:
    """The checkpoint folder, ``0700``, every component below the home made or opened unfollowed:
    a symlink anywhere on the way is refused (:class:`spawner.local.home_files.Beneath`)."""
    fd = home_files.open_dir(home, home_files.parts_below(home, path), create=True)
    os.close(fd)


def run_notebook(args: argparse.Namespace) -> dict[str, Any]:
    parameters = json.loads(os.environ.get("GPULAB_JOB_PARAMETERS", "{}"))
    print(f"gpulab: running {args.input} -> {args.output} with parameters {json.dumps(parameters)}", flush=True)
    try:
        import papermill

        Path(args.output).parent.mkdir(parents=True, exist_ok=True)
        papermill.execute_notebook(
            args.input, args.output, parameters=parameters, cwd=args.cwd, log_output=True, progress_bar=False
        )
    except Terminated:
        print("gpulab: stopped (SIGTERM); the output notebook holds what ran so far", flush=True)
        return {"returncode": 128 + signal.SIGTERM, "error": "stopped by SIGTERM", "kind": NOTEBOOK}
    except Exception as e:
        traceback.print_exc(file=sys.stdout)
        first = str(e).strip().splitlines()
        message = f"{type(e).__name__}: {first[-1] if first else ''}"[:500]
        print(f"gpulab: failed: {message}", flush=True)
        return {"returncode": 1, "error": message, "kind": NOTEBOOK}
    print("gpulab: notebook ran to the end", flush=True)
    return {"returncode": 0, "kind": NOTEBOOK}


def run_script(args: argparse.Namespace, processes: JobProcesses) -> dict[str, Any]:
    script_args = json.loads(os.environ.get("GPULAB_JOB_ARGS", "[]"))
    launcher = json.loads(os.environ.get("GPULAB_TORCHRUN", '["torchrun"]'))
    beside = Path(sys.executable).with_name("torchrun")
    if launcher == ["torchrun"] and beside.exists():  # torch's own, in the environment the job runs in
        launcher = [str(beside)]
    argv = script_argv(sys.executable, launcher, args.input, script_args, args.nproc)
    print(f"gpulab: running {json.dumps(argv)}", flush=True)
    try:
        # In the runner's process group: the hub's SIGTERM to the group reaches it directly.
        proc = subprocess.Popen(argv, cwd=args.cwd, stdin=subprocess.DEVNULL)
    except OSError as e:
        return {"returncode": 127, "error": f"cannot start {argv[0]}: {e.strerror}", "kind": SCRIPT}
    processes.keep.add(proc.pid)
    while True:
        try:
            code = proc.wait()
            break
        except Terminated:  # the grace runs in its own thread; wait for the script to end
            continue
    name = Path(args.input).name
    if processes.stopping.is_set():
        print(f"gpulab: stopped (SIGTERM); {name} exited with {code}", flush=True)
        return {"returncode": 128 + signal.SIGTERM, "error": "stopped by SIGTERM", "kind": SCRIPT}
    if code == 0:
        print(f"gpulab: {name} ran to the end", flush=True)
        return {"returncode": 0, "kind": SCRIPT}
    how = f"was ended by signal {-code}" if code < 0 else f"exited with status {code}"
    print(f"gpulab: failed: {name} {how}", flush=True)
    return {"returncode": code if code > 0 else 128 - code, "error": f"{name} {how}", "kind": SCRIPT}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Run one gpulab job: a notebook with papermill, or a script.")
    parser.add_argument("--input", required=True)
    parser.add_argument("--output", default="", help="the output notebook (notebooks only)")
    parser.add_argument("--cwd", required=True)
    parser.add_argument("--status", required=True)
    parser.add_argument("--log", help="append stdout and stderr to this file (created if missing)")
    parser.add_argument("--attempt", type=int, default=1)
    parser.add_argument("--kind", choices=(NOTEBOOK, SCRIPT), default=NOTEBOOK)
    parser.add_argument("--checkpoint", default="", help="the job's checkpoint folder (made below $HOME)")
    parser.add_argument("--grace", type=float, default=10.0, help="seconds between SIGTERM and SIGKILL")
    parser.add_argument("--nproc", type=int, default=1, help="a script's processes: torchrun's --nproc_per_node")
    args = parser.parse_args(argv)
    # A status file an earlier run with this job id and attempt left must not be read as this run's.
    Path(args.status).unlink(missing_ok=True)
    processes = JobProcesses(args.grace)

    def on_sigterm(signum: int, frame: Any) -> None:
        if processes.stopping.is_set():  # the grace is running already
            return
        # The hub signalled the runner's group: pass it on to what left the group (a kernel, a daemon).
        processes.stop(own_group_signalled=True)
        raise Terminated()

    signal.signal(signal.SIGTERM, on_sigterm)
    try:
        status = run(args, processes)
    except Terminated:  # before the job itself started
        status = {"returncode": 128 + signal.SIGTERM, "error": "stopped by SIGTERM", "kind": args.kind}
    try:
        processes.finish()  # nothing of the job outlives the runner
    except Terminated:
        processes.finish()
    write_status(args.status, status)
    return 0 if status["returncode"] == 0 else 1


def run(args: argparse.Namespace, processes: JobProcesses) -> dict[str, Any]:
    if args.log:
        try:
            open_log(args.log, args.attempt)
        except OSError as e:
            return {"returncode": 1, "error": f"cannot open the job's log {args.log}: {e}"}
    logging.basicConfig(level=logging.INFO, stream=sys.stdout, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    os.environ["GPULAB_ATTEMPT"] = str(args.attempt)
    if args.checkpoint:
        home = os.environ.get("HOME", "")
        try:
            make_checkpoint_dir(home, args.checkpoint)
        except home_files.Beneath as e:
            why = {home_files.SYMLINK: "goes through a symlink", home_files.OUTSIDE: "is not below your home"}
            message = f"the checkpoint folder {args.checkpoint} {why.get(e.state, e.state)} ({e.detail}): not used"
            print(f"gpulab: failed: {message}", flush=True)
            return {"returncode": 1, "error": message, "kind": args.kind}
        os.environ["GPULAB_CHECKPOINT_DIR"] = args.checkpoint
    print(
        f"gpulab: attempt {args.attempt}, checkpoints in {os.environ.get('GPULAB_CHECKPOINT_DIR', '(none)')}, "
        f"CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES', '')!r} "
        f"GPULAB_GPU_FRACTION={os.environ.get('GPULAB_GPU_FRACTION', '')}",
        flush=True,
    )
    if args.kind == SCRIPT:
        return run_script(args, processes)
    return run_notebook(args)


if __name__ == "__main__":
    sys.exit(main())
