"""Shared pieces of the jobs tests: a tiny parameterised notebook and API helpers."""

from __future__ import annotations

import json
import time
from pathlib import Path

import nbformat

from tests.support.hub import RunningHub

FINAL = {"succeeded", "failed", "cancelled", "timed-out"}


def write_parameterised_notebook(path: Path, parameters: str, body: str) -> Path:
    """A real notebook at ``path``: a ``parameters``-tagged cell, then one cell of ``body``."""
    nb = nbformat.v4.new_notebook()
    params = nbformat.v4.new_code_cell(parameters)
    params.metadata["tags"] = ["parameters"]
    nb.cells = [params, nbformat.v4.new_code_cell(body)]
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    path.parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(nb, str(path))
    return path


def write_notebook(path: Path) -> Path:
    """A real notebook: a ``parameters``-tagged cell, then a computation that uses it."""
    return write_parameterised_notebook(
        path,
        "x = 2\nsleep_seconds = 0",
        "import os, time\n"
        "for _ in range(int(sleep_seconds * 10)):\n"
        "    time.sleep(0.1)\n"
        "result = x * 21\n"
        "print('result', result, 'gpus', os.environ.get('CUDA_VISIBLE_DEVICES'))",
    )


def user_token(hub: RunningHub, user: str, scopes: list[str] | None = None) -> str:
    body: dict = {"note": "jobs test"}
    if scopes is not None:
        body["scopes"] = scopes
    r = hub.api("POST", f"/users/{user}/tokens", data=json.dumps(body))
    assert r.status_code == 201, r.text
    return r.json()["token"]


def submit(hub: RunningHub, token: str, **body) -> dict:
    r = hub.api("POST", "/gpulab/jobs", token=token, data=json.dumps(body))
    assert r.status_code == 201, (r.status_code, r.text)
    return r.json()


def get_job(hub: RunningHub, job_id: int, token: str | None = None) -> dict:
    r = hub.api("GET", f"/gpulab/jobs/{job_id}", token=token)
    assert r.status_code == 200, r.text
    return r.json()


def wait_state(
    hub: RunningHub, job_id: int, states: set[str] | str, timeout: float = 90, token: str | None = None
) -> dict:
    want = {states} if isinstance(states, str) else set(states)
    deadline = time.monotonic() + timeout
    job: dict = {}
    while time.monotonic() < deadline:
        job = get_job(hub, job_id, token)
        if job["state"] in want:
            return job
        if job["state"] in FINAL and not (want & FINAL):
            break
        time.sleep(0.2)
    raise AssertionError(f"job {job_id} never reached {want}: {json.dumps(job, indent=1)}\n{hub.log_tail(40)}")


def kill_job_runners(hub: RunningHub) -> None:
    """Stop papermill runners a failed test may have left (they outlive the hub by design)."""
    import os
    import signal
    import sqlite3

    path = hub.state_dir / "gpulab.sqlite"
    if not path.exists():
        return
    db = sqlite3.connect(path)
    try:
        rows = db.execute(
            "select pid from gpulab_jobs where pid is not null and state in ('running', 'preempted')"
        ).fetchall()
    except sqlite3.Error:
        rows = []
    finally:
        db.close()
    for (pid,) in rows:
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        if b"hub_config.jobs.runner" in cmd:
            try:
                os.killpg(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
