"""What a job runs (spawner/core/jobprogram.py): notebook or script, its arguments, its nodes,
and the command a single-server script job runs (python, or torchrun over N GPUs)."""

from __future__ import annotations

import json

import pytest

from spawner.core import jobprogram
from spawner.core.catalog import catalog_from_dict
from spawner.core.jobspec import JobSpecError, Submission
from spawner.core.policy import resolve_request

CATALOG = catalog_from_dict(
    {
        "profiles": [
            {"slug": "h100-8", "display_name": "8 × H100", "gpus": 8, "gpu_model": "H100-80GB"},
            {"slug": "half", "display_name": "0.5 × H100", "gpus": 0.5, "gpu_model": "H100-80GB"},
        ],
        "teams": [{"name": "vision", "users": ["alice"], "guarantee": 16, "burst": 24}],
    },
    "test",
)
LIMITS = {"max_parameters_bytes": 4096, "default_time_limit": 3600, "max_time_limit": 86400, "max_nodes": 4}


def from_json(body: dict) -> Submission:
    return Submission.from_json(body, lambda o: resolve_request(CATALOG, "alice", [], dict(o)), **LIMITS)


def test_a_script_submission_with_args_and_nodes_round_trips():
    body = {
        "script": "exp/train.py",
        "args": ["--epochs", "3"],
        "job_class": "training",
        "profile": "h100-8",
        "nodes": 2,
    }
    sub = from_json(body)
    assert (sub.kind, sub.notebook, sub.args, sub.nodes, sub.name) == (
        "script",
        "exp/train.py",
        ("--epochs", "3"),
        2,
        "train",
    )
    assert sub.to_json()["script"] == "exp/train.py" and "notebook" not in sub.to_json()
    assert from_json(json.loads(json.dumps(sub.to_json()))) == sub


@pytest.mark.parametrize(
    "body, words",
    [
        ({"script": "a.py", "notebook": "a.ipynb"}, "exactly one of notebook"),
        ({"script": ""}, "exactly one of notebook"),
        ({"script": "a.ipynb"}, "a .ipynb file is submitted as notebook"),
        ({"script": "../a.py"}, "must not contain '..'"),
        ({"script": "a.py", "args": "--x 1"}, "list of strings"),
        ({"script": "a.py", "args": [1]}, "must be a string, not int"),
        ({"script": "a.py", "args": ["a\0b"]}, "NUL"),
        ({"script": "a.py", "args": ["x" * 3000, "y" * 3000]}, "the limit is 4096"),
        ({"script": "a.py", "parameters": {"x": 1}}, "give a script its args"),
        ({"notebook": "a.ipynb", "args": ["-x"]}, "a notebook takes parameters"),
        ({"script": "a.py", "nodes": 2, "job_class": "batch"}, "only a training job"),
        ({"notebook": "a.ipynb", "nodes": 2}, "a notebook runs as one process"),
        ({"script": "a.py", "nodes": 2, "profile": "half"}, "whole GPUs on each; this profile holds 0.5"),
        ({"script": "a.py", "nodes": 5}, "between 1 and 4"),
        ({"script": "a.py", "nodes": 1.5}, "whole number"),
    ],
)
def test_bad_programs_are_refused_with_what_to_fix(body, words):
    with pytest.raises(JobSpecError, match=words):
        from_json({"job_class": "training", "profile": "h100-8", **body})


def test_the_total_of_a_multi_node_job_in_words():
    assert jobprogram.total_words(2, 8000, "H100") == "2 × 8 H100 = 16 GPUs"
    assert jobprogram.total_words(1, 500, "") == "1 × 0.5 = 0.5 GPUs"


def test_a_script_runs_as_python_on_one_gpu_and_under_torchrun_on_several():
    assert jobprogram.processes_per_node(0) == jobprogram.processes_per_node(500) == 1
    assert jobprogram.processes_per_node(2000) == 2 and jobprogram.processes_per_node(2500) == 2
    assert jobprogram.script_argv("/py", ["torchrun"], "t.py", ["--a", "b c"], 1) == ["/py", "t.py", "--a", "b c"]
    assert jobprogram.script_argv("/py", ["torchrun"], "t.py", ["--a"], 4) == [
        "torchrun",
        "--standalone",
        "--nnodes=1",
        "--nproc_per_node=4",
        "t.py",
        "--a",
    ]


def run_script_shell(home, *args, env=None):
    """The Kubernetes script container's command, run by a real /bin/sh in a folder of ours."""
    import os
    import subprocess

    from spawner.core.jobspec import SCRIPT_SHELL

    base = {
        "PATH": f"{home / 'bin'}:{os.environ['PATH']}",
        "GPULAB_HOME": str(home),
        "GPULAB_SCRIPT": "exp/train.py",
        "GPULAB_LOG": "exp/runs/train-1.log",
        "GPULAB_CHECKPOINT_DIR": str(home / "exp/runs/train-1.checkpoints"),
        **(env or {}),
    }
    return subprocess.run(["/bin/sh", "-c", SCRIPT_SHELL, "gpulab-job", *args], env=base, timeout=60, check=False)


def test_the_kubernetes_script_shell_runs_the_script_in_its_folder_and_counts_attempts(tmp_path):
    import sys

    (tmp_path / "exp").mkdir()
    (tmp_path / "bin").mkdir()
    python = tmp_path / "bin" / "python"  # the image's python, here the test's
    python.symlink_to(sys.executable)
    (tmp_path / "exp" / "train.py").write_text(
        "import json, os, sys\nprint(json.dumps([sys.argv[1:], os.getcwd(), os.environ['GPULAB_ATTEMPT']]))\n"
    )
    tricky = ["--name", "a b; $(touch pwned)", "*"]
    for attempt in ("1", "2"):
        assert run_script_shell(tmp_path, *tricky).returncode == 0
        last = (tmp_path / "exp/runs/train-1.log").read_text().splitlines()[-1]
        assert json.loads(last) == [tricky, str(tmp_path / "exp"), attempt]
    assert not list(tmp_path.rglob("pwned"))
    # The attempt counter reads only digits back from the user's file.
    (tmp_path / "exp/runs/train-1.checkpoints/.attempts").write_text("$(touch x)7;")
    assert run_script_shell(tmp_path).returncode == 0
    assert json.loads((tmp_path / "exp/runs/train-1.log").read_text().splitlines()[-1])[2] == "8"
    assert not list(tmp_path.rglob("x"))
    # Over two GPUs the pod runs torchrun (here a stand-in that records its command line).
    torchrun = tmp_path / "bin" / "torchrun"
    torchrun.write_text(f'#!/bin/sh\necho torchrun "$@" > {tmp_path / "torchrun.args"}\n')
    torchrun.chmod(0o755)
    assert run_script_shell(tmp_path, "--lr", "0.1", env={"GPULAB_NPROC": "2"}).returncode == 0
    assert (tmp_path / "torchrun.args").read_text().split() == [
        "torchrun",
        "--standalone",
        "--nnodes=1",
        "--nproc_per_node=2",
        "train.py",
        "--lr",
        "0.1",
    ]


def test_each_node_of_a_gang_writes_its_own_log_and_rank_0_the_jobs(tmp_path):
    import sys

    from spawner.core.jobprogram import rank_log_path

    (tmp_path / "exp").mkdir()
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "python").symlink_to(sys.executable)
    (tmp_path / "exp" / "train.py").write_text("import os\nprint('node', os.environ.get('PET_NODE_RANK'))\n")
    for rank in ("0", "2"):
        assert run_script_shell(tmp_path, env={"PET_NODE_RANK": rank}).returncode == 0
        log = tmp_path / rank_log_path("exp/runs/train-1.log", int(rank))
        assert log.read_text().strip() == f"node {rank}"
    assert rank_log_path("exp/runs/train-1.log", 0) == "exp/runs/train-1.log"
    assert rank_log_path("exp/runs/train-1.log", 2) == "exp/runs/train-1.rank-2.log"
    # A rank that is not a number never names a file.
    assert run_script_shell(tmp_path, env={"PET_NODE_RANK": "../../x"}).returncode == 1
    assert not list(tmp_path.rglob("*x.log"))
