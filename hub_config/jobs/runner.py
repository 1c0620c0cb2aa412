"""The single-server job runner: ``python -m hub_config.jobs.runner``.

Runs one notebook with papermill in the hub's Python environment (the same
one the user's JupyterLab runs in) and writes its exit status to a file, so
that the hub can tell success from failure even for a run it re-adopted after
a restart (a re-adopted process is not the hub's child; its exit code is
otherwise lost). A SIGTERM (cancel, preemption, time limit) ends the runner
and its kernel without a status file: the hub recorded why before it sent it.

Parameters come as JSON in ``GPULAB_JOB_PARAMETERS``, never through a shell.

It runs as the job's owner (when the hub switches users) and creates the
output folder, the log and the exit-status file (``~/.gpulab/jobs/``) itself,
so all of them belong to the owner; the hub reads them as the owner.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import traceback
from pathlib import Path


def write_status(path: str, status: dict) -> None:
    """Write this attempt's exit status (never through a symlink), its folder made here when missing."""
    Path(path).parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(json.dumps(status))


def open_log(path: str, attempt: int) -> None:
    """Send this process's stdout and stderr (and papermill's) to the job's log."""
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW, 0o600)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    if attempt > 1:
        print(f"\n--- gpulab: attempt {attempt} ---", flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Run one gpulab notebook job with papermill.")
    parser.add_argument("--input", required=True)
    parser.add_argument("--output", required=True)
    parser.add_argument("--cwd", required=True)
    parser.add_argument("--status", required=True)
    parser.add_argument("--log", help="append stdout and stderr to this file (created if missing)")
    parser.add_argument("--attempt", type=int, default=1)
    args = parser.parse_args(argv)
    # A status file an earlier run with this job id and attempt left must not be read as this run's.
    Path(args.status).unlink(missing_ok=True)
    if args.log:
        try:
            open_log(args.log, args.attempt)
        except OSError as e:
            write_status(args.status, {"returncode": 1, "error": f"cannot open the job's log {args.log}: {e}"})
            return 1
    logging.basicConfig(level=logging.INFO, stream=sys.stdout, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    parameters = json.loads(os.environ.get("GPULAB_JOB_PARAMETERS", "{}"))
    print(f"gpulab: running {args.input} -> {args.output} with parameters {json.dumps(parameters)}", flush=True)
    print(
        f"gpulab: CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES', '')!r} "
        f"GPULAB_GPU_FRACTION={os.environ.get('GPULAB_GPU_FRACTION', '')}",
        flush=True,
    )
    try:
        import papermill

        Path(args.output).parent.mkdir(parents=True, exist_ok=True)
        papermill.execute_notebook(
            args.input, args.output, parameters=parameters, cwd=args.cwd, log_output=True, progress_bar=False
        )
    except Exception as e:
        traceback.print_exc(file=sys.stdout)
        first = str(e).strip().splitlines()
        message = f"{type(e).__name__}: {first[-1] if first else ''}"[:500]
        write_status(args.status, {"returncode": 1, "error": message})
        print(f"gpulab: failed: {message}", flush=True)
        return 1
    write_status(args.status, {"returncode": 0})
    print("gpulab: notebook ran to the end", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
