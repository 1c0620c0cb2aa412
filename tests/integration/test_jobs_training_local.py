"""Training jobs on one server, end to end over HTTP with real processes: scripts with arguments,
torchrun over the job's GPUs, every process of a job ended by a preemption or a time limit, and
the checkpoint contract (GPULAB_CHECKPOINT_DIR, GPULAB_ATTEMPT, SIGTERM and its grace) with a job
preempted mid-way that resumes from its checkpoint.

A real JupyterHub (tests/support/hub.py) on a declared inventory of two GPUs; the jobs run as
their owners' accounts. torch cannot be installed within the test machines' limits, so the
launcher is tests/support/torchrun_standin.py, which imitates torchrun's documented launch
(its docstring cites the page).
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import sys
import time
from pathlib import Path

import pytest

from tests.support import REPO
from tests.support.hub import RunningHub
from tests.support.jobs import get_job, submit, user_token, wait_state, write_parameterised_notebook

TORCHRUN = REPO / "tests" / "support" / "torchrun_standin.py"
CATALOG = """
inventory:
  - {model: H100-80GB, count: 2, memory_mib: 81559}
profiles:
  - {slug: h100-1, display_name: "1 × H100", gpus: 1, gpu_model: H100-80GB}
  - {slug: h100-2, display_name: "2 × H100", gpus: 2, gpu_model: H100-80GB}
  - {slug: h100-half, display_name: "0.5 × H100", gpus: 0.5, gpu_model: H100-80GB}
  - {slug: cpu, display_name: "CPU", gpus: 0}
teams:
  - {name: vision, users: [alice, bob], guarantee: 4, burst: 6, allowed_profiles: [h100-1, h100-2, h100-half, cpu]}
"""
GRACE = 3
EXTRA = f"""
c.GPULabJobs.poll_interval = 0.3
c.GPULabJobs.stop_grace_seconds = {GRACE}
c.GPULabJobs.max_running_jobs_per_user = 0
c.GPULabJobs.torchrun_command = [{sys.executable!r}, {str(TORCHRUN)!r}]
"""

#: Prints its arguments and the launch's variables, one line per process.
ARGS_SCRIPT = """\
import json, os, sys
keys = ("GPULAB_ATTEMPT", "GPULAB_CHECKPOINT_DIR", "CUDA_VISIBLE_DEVICES", "RANK", "LOCAL_RANK", "WORLD_SIZE")
print("launch", json.dumps({"argv": sys.argv[1:], **{k: os.environ.get(k) for k in keys}}), flush=True)
"""

#: Starts processes that leave its process group and session (as kernels and daemons do), writes
#: every pid to the checkpoint folder, then runs until it is stopped.
TREE_SCRIPT = """\
import os, subprocess, sys, time
pids = os.path.join(os.environ["GPULAB_CHECKPOINT_DIR"], "pids")
loop = "import time\\nwhile True: time.sleep(0.1)"
own_session = subprocess.Popen([sys.executable, "-c", loop], start_new_session=True)
plain = subprocess.Popen([sys.executable, "-c", loop])
if os.fork() == 0:  # a daemon: fork, setsid, fork again, the middle one exits (its parent is gone)
    os.setsid()
    if os.fork() == 0:
        with open(pids, "a") as f:
            f.write(f"{os.getpid()}\\n")
        while True:
            time.sleep(0.1)
    os._exit(0)
with open(pids, "a") as f:
    f.write(f"{os.getpid()}\\n{own_session.pid}\\n{plain.pid}\\n")
print("tree started", flush=True)
while True:
    time.sleep(0.1)
"""

#: The checkpoint contract as docs/jobs.md shows it, plus what the test reads: each step it
#: finishes, and where each attempt began.
RESUME_SCRIPT = """\
import json, os, signal, sys, time

ckpt = os.path.join(os.environ["GPULAB_CHECKPOINT_DIR"], "state.json")
state = json.load(open(ckpt)) if os.path.exists(ckpt) else {"step": 0}
def save(*_):
    with open(ckpt + ".tmp", "w") as f:
        json.dump(state, f)
    os.replace(ckpt + ".tmp", ckpt)
signal.signal(signal.SIGTERM, lambda *_: (save(), sys.exit(143)))

steps = int(sys.argv[1])
print(f"attempt {os.environ['GPULAB_ATTEMPT']} starts at step {state['step']}", flush=True)
for step in range(state["step"], steps):
    time.sleep(0.2)  # the work of one step
    with open(os.path.join(os.environ["GPULAB_CHECKPOINT_DIR"], "done"), "a") as f:
        f.write(f"{os.environ['GPULAB_ATTEMPT']} {step}\\n")
    state["step"] = step + 1
    save()
print("finished", state, flush=True)
"""


def put(hub: RunningHub, user: str, rel: str, text: str) -> Path:
    path = hub.home(user) / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return hub.give(user, path)


@pytest.fixture(scope="module")
def hub(start_hub):
    h = start_hub(CATALOG, extra_config=EXTRA)
    for user in ("alice", "bob"):
        put(h, user, "exp/args.py", ARGS_SCRIPT)
        put(h, user, "exp/tree.py", TREE_SCRIPT)
        put(h, user, "exp/resume.py", RESUME_SCRIPT)
        put(h, user, "exp/sleep.py", "import sys, time\ntime.sleep(float(sys.argv[1]))\n")
        h.give(
            user,
            write_parameterised_notebook(
                h.home(user) / "exp" / "slow.ipynb",
                "seconds = 60",
                "print('first cell done', flush=True)\nimport time\ntime.sleep(seconds)\nprint('never printed')",
            ),
        )
    return h


@pytest.fixture(scope="module")
def tokens(hub):
    return {u: user_token(hub, u) for u in ("alice", "bob")}


def log_of(hub: RunningHub, job: dict, token: str) -> str:
    r = hub.api("GET", f"/gpulab/jobs/{job['id']}/logs", token=token)
    assert r.status_code == 200, r.text
    return r.json()["text"]


def launches(log: str) -> list[dict]:
    return [json.loads(line.split(" ", 1)[1]) for line in log.splitlines() if line.startswith("launch ")]


def alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def wait_for_file(path: Path, lines: int, timeout: float = 30) -> list[str]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists() and len(got := path.read_text().split()) >= lines:
            return got
        time.sleep(0.1)
    raise AssertionError(f"{path} never had {lines} lines")


def wait_free(hub: RunningHub, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while [w for w in hub.holdings() if w["kind"] == "job"] and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not [w for w in hub.holdings() if w["kind"] == "job"], hub.holdings()


# -- scripts and torchrun -------------------------------------------------------------


def test_script_job_runs_with_its_arguments_and_the_contract_variables(hub, tokens):
    job = submit(
        hub,
        tokens["alice"],
        script="exp/args.py",
        args=["--epochs", "3", "a b; $(x)"],
        job_class="batch",
        profile="h100-half",
    )
    assert job["kind"] == "script" and job["script"] == job["notebook"] == "exp/args.py"
    assert job["args"] == ["--epochs", "3", "a b; $(x)"] and job["nodes"] == 1 and job["output_path"] == ""
    assert job["checkpoint_path"].startswith("exp/runs/args-") and job["checkpoint_path"].endswith(".checkpoints")
    done = wait_state(hub, job["id"], {"succeeded", "failed"}, token=tokens["alice"])
    assert done["state"] == "succeeded" and done["reason"] == "the script ran to the end", done
    (launch,) = launches(log_of(hub, job, tokens["alice"]))
    # The arguments arrive as given: no shell split or expanded them.
    assert launch["argv"] == ["--epochs", "3", "a b; $(x)"]
    assert launch["GPULAB_ATTEMPT"] == "1" and launch["RANK"] is None  # one process: no torchrun
    assert launch["GPULAB_CHECKPOINT_DIR"] == str(hub.home("alice") / job["checkpoint_path"])
    assert (hub.home("alice") / job["checkpoint_path"]).is_dir()
    r = hub.api("GET", f"/gpulab/jobs/{job['id']}/output", token=tokens["alice"])
    assert r.status_code == 404 and "script" in r.json()["message"], r.text
    wait_free(hub)


def test_script_over_two_gpus_runs_torchrun_one_process_per_gpu(hub, tokens):
    job = submit(
        hub, tokens["alice"], script="exp/args.py", args=["--lr", "0.1"], job_class="training", profile="h100-2"
    )
    done = wait_state(hub, job["id"], {"succeeded", "failed"}, token=tokens["alice"])
    assert done["state"] == "succeeded", done
    log = log_of(hub, job, tokens["alice"])
    assert "--nproc_per_node=2" in log and str(TORCHRUN) in log
    ranks = sorted(launches(log), key=lambda x: x["RANK"])
    assert [(x["RANK"], x["LOCAL_RANK"], x["WORLD_SIZE"]) for x in ranks] == [("0", "0", "2"), ("1", "1", "2")]
    # Each worker sees both of the job's GPUs (torchrun leaves picking one by LOCAL_RANK to the script).
    assert all(x["argv"] == ["--lr", "0.1"] for x in ranks)
    assert all(sorted(x["CUDA_VISIBLE_DEVICES"].split(",")) == ["0", "1"] for x in ranks), ranks
    wait_free(hub)


def test_notebook_over_two_gpus_is_one_process_that_sees_both(hub, tokens):
    nb = write_parameterised_notebook(
        hub.home("alice") / "exp" / "gpus.ipynb",
        "x = 0",
        "import os\nprint('devices', os.environ.get('CUDA_VISIBLE_DEVICES'), 'rank', os.environ.get('RANK'))",
    )
    hub.give("alice", nb)
    job = submit(hub, tokens["alice"], notebook="exp/gpus.ipynb", job_class="training", profile="h100-2")
    done = wait_state(hub, job["id"], {"succeeded", "failed"}, token=tokens["alice"])
    assert done["state"] == "succeeded", done
    log = log_of(hub, job, tokens["alice"])
    assert ("devices 0,1 rank None" in log or "devices 1,0 rank None" in log) and "nproc_per_node" not in log
    wait_free(hub)


# -- every process of a job ends --------------------------------------------------------


def tree_pids(hub: RunningHub, job: dict) -> list[int]:
    got = wait_for_file(hub.home(job["user"]) / job["checkpoint_path"] / "pids", 4)
    pids = [int(p) for p in got]
    assert all(alive(p) for p in pids), "the script's processes should all run before the stop"
    return pids


def assert_all_gone(pids: list[int], timeout: float = 10) -> None:
    deadline = time.monotonic() + timeout
    while any(alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not [p for p in pids if alive(p)], "processes of the job outlived it"


def test_time_limit_ends_every_process_of_the_job(hub, tokens):
    job = submit(hub, tokens["alice"], script="exp/tree.py", job_class="batch", profile="cpu", time_limit_seconds=4)
    pids = tree_pids(hub, job)
    done = wait_state(hub, job["id"], "timed-out", timeout=60)
    assert "time limit of 4 s" in done["reason"]
    assert_all_gone(pids, timeout=GRACE + 8)


def test_preemption_ends_every_process_of_the_job(hub, tokens):
    victim = submit(hub, tokens["alice"], script="exp/tree.py", job_class="batch", profile="h100-2", name="victim")
    pids = tree_pids(hub, victim)
    training = submit(hub, tokens["bob"], script="exp/sleep.py", args=["1"], job_class="training", profile="h100-1")
    wait_state(hub, victim["id"], {"preempted", "queued"}, timeout=30)
    assert_all_gone(pids, timeout=GRACE + 8)
    wait_state(hub, training["id"], "succeeded", timeout=60)
    # Requeued, it starts again (a new tree); cancel ends that one too.
    wait_state(hub, victim["id"], "running", timeout=60)
    again = [p for p in tree_pids_after(hub, victim, len(pids)) if p not in pids]
    r = hub.api("POST", f"/gpulab/jobs/{victim['id']}/cancel", token=tokens["alice"])
    assert r.status_code == 200, r.text
    assert_all_gone(again, timeout=GRACE + 8)
    wait_free(hub)


def tree_pids_after(hub: RunningHub, job: dict, before: int) -> list[int]:
    return [int(p) for p in wait_for_file(hub.home(job["user"]) / job["checkpoint_path"] / "pids", before + 4)]


# -- the checkpoint contract -------------------------------------------------------------


def test_a_preempted_job_resumes_from_its_checkpoint(hub, tokens):
    steps = 40
    job = submit(
        hub,
        tokens["alice"],
        script="exp/resume.py",
        args=[str(steps)],
        job_class="batch",
        profile="h100-1",  # one process (on two GPUs torchrun would start two)
        name="resume",
    )
    folder = hub.home("alice") / job["checkpoint_path"]
    before = [line for line in wait_for_file(folder / "done", 2 * 8)]  # 8 steps done in attempt 1
    # Both GPUs: the batch job's is needed too.
    training = submit(hub, tokens["bob"], script="exp/sleep.py", args=["2"], job_class="training", profile="h100-2")
    wait_state(hub, job["id"], {"preempted", "queued"}, timeout=30)
    saved = json.loads((folder / "state.json").read_text())["step"]
    assert saved >= len(before) // 2
    wait_state(hub, training["id"], "succeeded", timeout=60)
    done = wait_state(hub, job["id"], {"succeeded", "failed"}, timeout=120)
    assert done["state"] == "succeeded", done
    assert [h["state"] for h in done["history"]] == ["queued", "running", "preempted", "queued", "running", "succeeded"]
    assert done["attempts"] == 2
    log = log_of(hub, job, tokens["alice"])
    assert "attempt 1 starts at step 0" in log
    # The second attempt began where the first one's checkpoint left off, not at step 0.
    assert f"attempt 2 starts at step {saved}" in log, log
    pairs = [tuple(map(int, line.split())) for line in (folder / "done").read_text().splitlines()]
    assert [s for _, s in pairs] == list(range(steps))  # every step once: none done twice
    assert {a for a, s in pairs if s < saved} == {1} and {a for a, s in pairs if s >= saved} == {2}
    wait_free(hub)


def test_cancel_saves_the_partial_output_notebook(hub, tokens):
    job = submit(hub, tokens["alice"], notebook="exp/slow.ipynb", job_class="batch", profile="cpu")
    wait_state(hub, job["id"], "running")
    deadline = time.monotonic() + 60
    while "first cell done" not in log_of(hub, job, tokens["alice"]) and time.monotonic() < deadline:
        time.sleep(0.2)
    r = hub.api("POST", f"/gpulab/jobs/{job['id']}/cancel", token=tokens["alice"])
    assert r.status_code == 200, r.text
    wait_free(hub, timeout=GRACE + 10)  # the runner is gone: it wrote what it had
    nb = json.loads((hub.home("alice") / job["output_path"]).read_text())
    outputs = "".join("".join(o.get("text", "")) for c in nb["cells"] for o in c.get("outputs", []))
    assert "first cell done" in outputs and "never printed" not in outputs
    # The runner's last line may follow the hub's release of the GPU (the hub frees it when it
    # has seen the job end): read the log until the runner's own word on the stop is there.
    deadline = time.monotonic() + GRACE + 10
    while "stopped (SIGTERM)" not in log_of(hub, job, tokens["alice"]) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert "stopped (SIGTERM)" in log_of(hub, job, tokens["alice"])
    wait_free(hub)


def test_a_symlink_in_place_of_the_checkpoint_folder_touches_nothing_outside_the_home(hub, tokens):
    """Alice puts a symlink where her queued job's checkpoint folder will be, to a folder of
    hers outside her home: the runner refuses it (never follows it), the job fails saying so."""
    blocker = submit(hub, tokens["bob"], script="exp/sleep.py", args=["60"], job_class="batch", profile="h100-2")
    wait_state(hub, blocker["id"], "running")
    job = submit(hub, tokens["alice"], script="exp/args.py", job_class="batch", profile="h100-1", name="planted")
    assert get_job(hub, job["id"])["state"] == "queued"
    outside = Path("/var/tmp") / f"gpulab-outside-{secrets.token_hex(4)}"
    outside.mkdir()
    account = hub.account("alice")
    try:
        if account is not None:
            os.chown(outside, account.uid, account.gid)
        link = hub.home("alice") / job["checkpoint_path"]
        link.parent.mkdir(parents=True, exist_ok=True)
        hub.give("alice", link.parent)
        link.symlink_to(outside)
        if account is not None:
            os.chown(link, account.uid, account.gid, follow_symlinks=False)
        hub.api("POST", f"/gpulab/jobs/{blocker['id']}/cancel", token=tokens["bob"])
        done = wait_state(hub, job["id"], {"succeeded", "failed"}, timeout=60)
        assert done["state"] == "failed" and "symlink" in done["reason"], done
        assert list(outside.iterdir()) == []
        assert link.is_symlink()
    finally:
        shutil.rmtree(outside, ignore_errors=True)
    wait_free(hub)


# -- bad input -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "body, status, words",
    [
        ({"script": "exp/args.py", "notebook": "exp/slow.ipynb"}, 400, "exactly one of notebook"),
        ({}, 400, "exactly one of notebook"),
        ({"script": "exp/slow.ipynb"}, 400, "a .ipynb file is submitted as notebook"),
        ({"notebook": "exp/args.py"}, 400, "a .py file is submitted as script"),
        ({"script": "../bob/exp/args.py"}, 400, "must not contain '..'"),
        ({"script": "/etc/passwd.py"}, 400, "not absolute"),
        ({"script": "exp/missing.py"}, 404, "does not exist"),
        ({"script": "exp/args.py", "args": "--epochs 3"}, 400, "list of strings"),
        ({"script": "exp/args.py", "args": ["--epochs", 3]}, 400, "must be a string"),
        ({"script": "exp/args.py", "args": ["x\u0000y"]}, 400, "NUL"),
        ({"script": "exp/args.py", "args": ["a"] * 300}, 413, "at most 256"),
        ({"script": "exp/args.py", "args": ["x" * 5000]}, 413, "longer than"),
        ({"script": "exp/args.py", "parameters": {"x": 1}}, 400, "give a script its args"),
        ({"notebook": "exp/slow.ipynb", "args": ["--x"]}, 400, "a notebook takes parameters"),
        ({"script": "exp/args.py", "job_class": "training", "profile": "h100-1", "nodes": 2}, 409, "one node"),
        ({"script": "exp/args.py", "nodes": 2}, 400, "only a training job"),
        ({"notebook": "exp/slow.ipynb", "job_class": "training", "profile": "h100-1", "nodes": 2}, 400, "a notebook"),
        ({"script": "exp/args.py", "job_class": "training", "profile": "h100-half", "nodes": 2}, 400, "whole GPUs"),
        ({"script": "exp/args.py", "nodes": 0}, 400, "between 1 and"),
        ({"script": "exp/args.py", "nodes": 99}, 400, "between 1 and"),
        ({"script": "exp/args.py", "nodes": "2"}, 400, "whole number"),
        ({"script": "exp/args.py", "nodes": True}, 400, "whole number"),
    ],
)
def test_bad_script_and_nodes_requests_get_4xx_and_change_nothing(hub, tokens, body, status, words):
    body = {"job_class": "batch", "profile": "cpu", **body}
    before = hub.api("GET", "/gpulab/jobs").json()["jobs"]
    held = hub.holdings()
    r = hub.api("POST", "/gpulab/jobs", token=tokens["alice"], data=json.dumps(body))
    assert r.status_code == status, r.text
    assert words in r.json()["message"], r.json()["message"]
    assert hub.api("GET", "/gpulab/jobs").json()["jobs"] == before and hub.holdings() == held


def test_a_script_through_a_symlink_is_refused(hub, tokens):
    outside = hub.workdir / "outside.py"
    outside.write_text("print('outside')\n")
    link = hub.home("alice") / "exp" / "link.py"
    if not link.is_symlink():
        link.symlink_to(outside)
    before = hub.api("GET", "/gpulab/jobs").json()["jobs"]
    r = hub.api(
        "POST",
        "/gpulab/jobs",
        token=tokens["alice"],
        data=json.dumps({"script": "exp/link.py", "job_class": "batch", "profile": "cpu"}),
    )
    assert r.status_code == 403 and "symlink" in r.json()["message"], r.text
    assert hub.api("GET", "/gpulab/jobs").json()["jobs"] == before


def test_rerun_of_a_script_job_keeps_its_arguments(hub, tokens):
    first = submit(hub, tokens["bob"], script="exp/args.py", args=["--seed", "7"], job_class="batch", profile="cpu")
    wait_state(hub, first["id"], "succeeded")
    r = hub.api("POST", f"/gpulab/jobs/{first['id']}/rerun", token=tokens["bob"])
    assert r.status_code == 201, r.text
    second = r.json()
    assert second["kind"] == "script" and second["args"] == ["--seed", "7"] and second["rerun_of"] == first["id"]
    assert second["checkpoint_path"] != first["checkpoint_path"]
    done = wait_state(hub, second["id"], "succeeded")
    assert launches(log_of(hub, done, tokens["bob"]))[0]["argv"] == ["--seed", "7"]
