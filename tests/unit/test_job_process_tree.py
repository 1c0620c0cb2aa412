"""The single-server job runner ends every process of its job (hub_config/jobs/process_tree.py),
run for real: a script whose children leave its process group and session (as kernels and
daemons do), stopped by a SIGTERM to the runner's group as the hub sends it, or left behind
when the script ends; and the checkpoint folder the runner makes (never through a symlink)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

TREE = """\
import os, subprocess, sys, time
pids = os.path.join(os.environ["GPULAB_CHECKPOINT_DIR"], "pids")
loop = "import time\\nwhile True: time.sleep(0.1)"
own_session = subprocess.Popen([sys.executable, "-c", loop], start_new_session=True)
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        with open(pids, "a") as f:
            f.write(f"{os.getpid()}\\n")
        while True:
            time.sleep(0.1)
    os._exit(0)
with open(pids, "a") as f:
    f.write(f"{os.getpid()}\\n{own_session.pid}\\n")
if sys.argv[1] == "stay":
    while True:
        time.sleep(0.1)
"""


def alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def start_runner(home: Path, mode: str, grace: float = 2.0) -> tuple[subprocess.Popen, Path]:
    script = home / "tree.py"
    script.write_text(TREE)
    checkpoint = home / "runs" / "tree-1.checkpoints"
    env = {**os.environ, "HOME": str(home), "GPULAB_JOB_ARGS": json.dumps([mode])}
    argv = [sys.executable, "-m", "hub_config.jobs.runner", "--kind", "script", "--input", str(script)]
    argv += ["--cwd", str(home), "--status", str(home / "status.json"), "--log", str(home / "job.log")]
    argv += ["--checkpoint", str(checkpoint), "--grace", str(grace)]
    return subprocess.Popen(argv, env=env, start_new_session=True), checkpoint


def wait_pids(path: Path, n: int) -> list[int]:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if path.exists() and len(lines := path.read_text().split()) >= n:
            return [int(p) for p in lines]
        time.sleep(0.05)
    raise AssertionError(f"{path} never listed {n} processes")


def test_a_sigterm_to_the_runners_group_ends_processes_that_left_it(tmp_path):
    runner, checkpoint = start_runner(tmp_path, "stay")
    pids = wait_pids(checkpoint / "pids", 3)
    assert all(alive(p) for p in pids)
    os.killpg(runner.pid, signal.SIGTERM)  # what the hub sends: the group, which two of them left
    assert runner.wait(timeout=30) == 1
    assert not [p for p in pids if alive(p)]
    status = json.loads((tmp_path / "status.json").read_text())
    assert status["error"] == "stopped by SIGTERM"


def test_what_a_finished_script_left_running_is_ended_with_it(tmp_path):
    runner, checkpoint = start_runner(tmp_path, "leave")
    assert runner.wait(timeout=30) == 0
    pids = wait_pids(checkpoint / "pids", 3)
    assert not [p for p in pids if alive(p)]
    assert json.loads((tmp_path / "status.json").read_text()) == {"returncode": 0, "kind": "script"}


def test_a_symlink_for_the_checkpoint_folder_fails_the_job_and_writes_nothing_through_it(tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    home = tmp_path / "home"
    (home / "runs").mkdir(parents=True)
    (home / "runs" / "tree-1.checkpoints").symlink_to(outside)
    runner, _ = start_runner(home, "leave")
    assert runner.wait(timeout=30) == 1
    status = json.loads((home / "status.json").read_text())
    assert "goes through a symlink" in status["error"], status
    assert list(outside.iterdir()) == []
