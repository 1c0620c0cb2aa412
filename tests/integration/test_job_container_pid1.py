"""The Kubernetes job container's command as its PID 1, with real papermill and a real kernel.

A Job's ``command`` replaces the image's entrypoint (docker-stacks' ``tini``), so what
gpulab runs is the container's PID 1. The kernel delivers to the init of a PID namespace
only the signals it has a handler for, from inside the namespace and from its ancestors
alike; only SIGKILL and SIGSTOP are forced from an ancestor (pid_namespaces(7), "The
namespace init process"). The kubelet's SIGTERM (a cancel, a preemption, a node drain)
comes from the host's namespace, as it does here: the command runs as PID 1 of a new PID
namespace (``unshare --pid --fork``, the same kernel rule a container runtime relies on)
and the test sends SIGTERM from outside it.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from spawner.core.jobspec import PAPERMILL_SCRIPT
from tests.support.jobs import write_parameterised_notebook

#: What the job command was before: papermill exec'd as PID 1, with no SIGTERM handler.
EXEC_AS_PID1 = (
    'cd "$GPULAB_HOME"; mkdir -p "$(dirname "$GPULAB_OUTPUT")"; '
    'exec papermill "$GPULAB_NOTEBOOK" "$GPULAB_OUTPUT" -y "$GPULAB_PARAMETERS" '
    '--log-output --no-progress-bar --cwd "$(dirname "$GPULAB_NOTEBOOK")" > "$GPULAB_LOG" 2>&1'
)


def start_as_pid1(home: Path, script: str) -> tuple[subprocess.Popen, int]:
    """``/bin/sh -c script`` as PID 1 of a new PID namespace; ``(unshare, host pid of PID 1)``."""
    if os.geteuid() != 0 or not shutil.which("unshare"):
        pytest.fail("needs root and util-linux's unshare to make a PID namespace (CI runs as root)")
    write_parameterised_notebook(
        home / "exp" / "train.ipynb", "steps = 600", "import time\nfor _ in range(steps):\n    time.sleep(0.1)"
    )
    env = {
        **os.environ,
        "PATH": f"{Path(sys.executable).parent}:{os.environ.get('PATH', '/usr/bin:/bin')}",
        "GPULAB_HOME": str(home),
        "GPULAB_NOTEBOOK": "exp/train.ipynb",
        "GPULAB_OUTPUT": "exp/runs/train-1.ipynb",
        "GPULAB_LOG": "exp/runs/train-1.log",
        "GPULAB_PARAMETERS": json.dumps({"steps": 600}),
    }
    proc = subprocess.Popen(
        ["unshare", "--pid", "--fork", "--kill-child", "--", "/bin/sh", "-c", script],
        env=env,
        start_new_session=True,
    )
    children = Path(f"/proc/{proc.pid}/task/{proc.pid}/children")
    log = home / "exp" / "runs" / "train-1.log"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        pid1 = children.read_text().split() if children.exists() else []
        if pid1 and log.exists() and "Executing Cell 2" in log.read_text(errors="replace"):
            return proc, int(pid1[0])  # papermill runs the long cell: the kernel is up
        if proc.poll() is not None:
            pytest.fail(f"the command ended before the notebook ran (status {proc.returncode})")
        time.sleep(0.2)
    os.killpg(proc.pid, signal.SIGKILL)
    pytest.fail(f"papermill did not reach the notebook's second cell: {log.read_text(errors='replace')[-2000:]}")


def test_exec_papermill_as_pid1_ignores_sigterm_the_premise(tmp_path):
    """Why the command changed: papermill exec'd as PID 1 ignores SIGTERM from outside its
    namespace and would run on until the kubelet's SIGKILL after the grace period."""
    proc, pid1 = start_as_pid1(tmp_path, EXEC_AS_PID1)
    try:
        os.kill(pid1, signal.SIGTERM)
        with pytest.raises(subprocess.TimeoutExpired):
            proc.wait(5)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)


def test_job_command_as_pid1_ends_papermill_and_its_kernel_at_sigterm(tmp_path):
    """gpulab's job command as PID 1 forwards SIGTERM to papermill: the command ends with
    papermill's status (killed by SIGTERM: 143, which the Job's podFailurePolicy does not
    count as the notebook's failure), and nothing of the job is left running."""
    proc, pid1 = start_as_pid1(tmp_path, PAPERMILL_SCRIPT)
    try:
        os.kill(pid1, signal.SIGTERM)
        status = proc.wait(60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)
    assert status == 128 + signal.SIGTERM, status
    assert not Path(f"/proc/{pid1}").exists()  # the namespace's init is gone, with all in it


def test_job_command_keeps_the_notebook_once_and_runs_the_kept_copy(tmp_path):
    """The Kubernetes job's command copies its notebook to the job's own file (the single
    server's hub does the same at submit) and runs that copy; a retried pod finds the copy and
    runs the same content, whatever the notebook holds by then; a Re-run's pod copies from the
    earlier job's kept copy."""
    notebook = tmp_path / "exp" / "calc.ipynb"
    write_parameterised_notebook(notebook, "x = 1", "print('version one', x)")
    env = {
        **os.environ,
        "PATH": f"{Path(sys.executable).parent}:{os.environ.get('PATH', '/usr/bin:/bin')}",
        "GPULAB_HOME": str(tmp_path),
        "GPULAB_NOTEBOOK": "exp/calc.ipynb",
        "GPULAB_INPUT": "exp/runs/calc-1.input.ipynb",
        "GPULAB_KEEP_FROM": "exp/calc.ipynb",
        "GPULAB_OUTPUT": "exp/runs/calc-1.ipynb",
        "GPULAB_LOG": "exp/runs/calc-1.log",
        "GPULAB_PARAMETERS": "{}",
    }

    def run(**changes: str) -> str:
        e = {**env, **changes}
        subprocess.run(["/bin/sh", "-c", PAPERMILL_SCRIPT], env=e, check=True, timeout=120)
        return (tmp_path / e["GPULAB_OUTPUT"]).read_text()

    assert "version one" in run()
    write_parameterised_notebook(notebook, "x = 2", "print('version two', x)")  # edited since
    assert "version one" in run()  # a retried pod: the kept copy, not the edited notebook
    rerun = run(
        GPULAB_INPUT="exp/runs/calc-2.input.ipynb",
        GPULAB_KEEP_FROM="exp/runs/calc-1.input.ipynb",
        GPULAB_OUTPUT="exp/runs/calc-2.ipynb",
        GPULAB_LOG="exp/runs/calc-2.log",
    )
    assert "version one" in rerun and "version two" not in rerun
    fresh = run(
        GPULAB_INPUT="exp/runs/calc-3.input.ipynb", GPULAB_OUTPUT="exp/runs/calc-3.ipynb", GPULAB_LOG="exp/runs/c3.log"
    )
    assert "version two" in fresh
    gone = subprocess.run(
        ["/bin/sh", "-c", PAPERMILL_SCRIPT],
        env={**env, "GPULAB_INPUT": "exp/runs/x.input.ipynb", "GPULAB_KEEP_FROM": "exp/runs/gone.input.ipynb"},
        timeout=60,
    )
    assert gone.returncode == 1 and "gone.input.ipynb" in (tmp_path / "exp/runs/calc-1.log").read_text()
