"""A single-server job runner: what it is started with (its environment, its command line)
and what its exit-status file says (:func:`outcome_from_status`).

The runner is ``python -m hub_config.jobs.runner`` (papermill), started by the local
backend (``local.py``) as the job's owner, directly or through the mediator.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from hub_config.jobs.models import JobRecord
from spawner.core import jobspec
from spawner.core.env import gpu_env
from spawner.core.jobprogram import processes_per_node
from spawner.core.packer import GPUDevice
from spawner.core.sweeps import metrics_path
from spawner.local import home_files

#: The module the runner runs as.
RUNNER_MODULE = "hub_config.jobs.runner"
#: Largest exit-status file read (the runner writes a few hundred bytes).
MAX_STATUS_BYTES = 64 * 1024


def runner_env(
    rec: JobRecord,
    shares: Sequence[Sequence[int]],
    devices: Mapping[int, GPUDevice],
    home: Path,
    account: Any,
    env_keep: Iterable[str],
    launcher: Sequence[str] = ("torchrun",),
) -> dict[str, str]:
    """The runner's environment: the kept hub variables, the GPU share's, the job's own and,
    for a job run as its owner's ``account``, who it runs as. (``GPULAB_ATTEMPT`` and
    ``GPULAB_CHECKPOINT_DIR`` are the runner's to set: it makes the folder.)"""
    env = {k: os.environ[k] for k in env_keep if k in os.environ}
    env.update(gpu_env(rec.team, rec.profile, rec.gpu_milli, rec.over_quota, shares, devices))
    env.update(
        {
            "HOME": str(home),
            "GPULAB_JOB_ID": str(rec.id),
            "GPULAB_JOB_CLASS": rec.job_class,
            "GPULAB_JOB_PARAMETERS": json.dumps(rec.parameters),
            "GPULAB_JOB_ARGS": json.dumps(rec.args),
            # What the job reports (gpulab_run.log_metrics writes it; a sweep reads it back).
            "GPULAB_METRICS_FILE": str(home / metrics_path(rec.log_path)),
            "GPULAB_TORCHRUN": json.dumps(list(launcher)),
            # A batch job is always preemptible here, whatever its quota.
            "GPULAB_PREEMPTIBLE": "1" if rec.job_class == "batch" or rec.over_quota else "0",
            "PYTHONUNBUFFERED": "1",
        }
    )
    if account is not None:
        env.update({"USER": account.name, "LOGNAME": account.name, "SHELL": account.shell})
    return env


def runner_argv(prefix: Sequence[str], files: Mapping[str, str], attempt: int, run: Mapping[str, Any]) -> list[str]:
    """The runner's command line (after ``prefix``, the confinement's: systemd-run and the like);
    ``run``: :func:`run_options`."""
    return [
        *prefix,
        sys.executable,
        "-m",
        RUNNER_MODULE,
        *(a for k, v in files.items() if v for a in (f"--{k}", v)),
        "--attempt",
        str(attempt),
        *(a for k, v in run.items() for a in (f"--{k}", str(v))),
    ]


def run_options(rec: JobRecord, grace: float) -> dict[str, Any]:
    """How the runner runs the job: its kind, its grace after SIGTERM, a script's processes
    (one per whole GPU of the job: torchrun's ``--nproc_per_node``)."""
    return {"kind": rec.kind, "grace": float(grace), "nproc": processes_per_node(rec.gpu_milli // max(1, rec.nodes))}


def outcome_from_status(found: home_files.Found, gone_reason: str) -> tuple[str, str]:
    """``(final state, reason)`` from what an exit-status file holds, whatever its owner put there."""
    if found.state == home_files.ABSENT or (found.state == home_files.OK and not found.data.strip()):
        return jobspec.FAILED, gone_reason  # the runner never finished
    if found.state != home_files.OK:
        what = {
            home_files.TOO_LARGE: f"{found.size} bytes, more than the runner ever writes",
            home_files.SYMLINK: "a symlink",
            home_files.NOT_A_FILE: "not a regular file",
        }.get(found.state, found.state)
        return jobspec.FAILED, f"its exit-status file could not be used ({what}): the job's outcome is unknown"
    try:
        status = json.loads(found.data)
    except (ValueError, RecursionError):
        status = None
    code = status.get("returncode") if isinstance(status, dict) else None
    if not isinstance(code, int) or isinstance(code, bool):
        return jobspec.FAILED, "its exit-status file is not the runner's (malformed): the job's outcome is unknown"
    kind = status.get("kind") if isinstance(status, dict) else None
    if code == 0:
        return (
            jobspec.SUCCEEDED,
            "the script ran to the end" if kind == jobspec.SCRIPT else "the notebook ran to the end",
        )
    error = status.get("error") if isinstance(status, dict) else None
    if isinstance(error, str) and error.strip():
        return jobspec.FAILED, "".join(c if c.isprintable() else " " for c in error)[:500]
    return jobspec.FAILED, f"{'the script' if kind == jobspec.SCRIPT else 'papermill'} exited with {code}"
