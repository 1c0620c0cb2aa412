"""Notebook jobs on the single-server backend, end to end over HTTP.

A real JupyterHub (tests/support/hub.py) runs real papermill processes on a
declared inventory of ONE GPU, so that a training job has to preempt a batch
job to run.
"""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import pytest

from tests.support.hub import RunningHub
from tests.support.jobs import get_job, submit, user_token, wait_state, write_notebook, write_parameterised_notebook

CATALOG = """
inventory:
  - {model: H100-80GB, count: 1, memory_mib: 81559}
profiles:
  - {slug: h100-1, display_name: "1 × H100", gpus: 1, gpu_model: H100-80GB}
  - {slug: h100-half, display_name: "0.5 × H100", gpus: 0.5, gpu_model: H100-80GB}
  - {slug: h100-2, display_name: "2 × H100", gpus: 2, gpu_model: H100-80GB}
  - {slug: cpu, display_name: "CPU", gpus: 0}
teams:
  - {name: vision, users: [alice, bob], guarantee: 2, burst: 3, allowed_profiles: [h100-1, h100-half, h100-2, cpu]}
  - {name: small, users: [carol], guarantee: 0, burst: 1, allowed_profiles: [h100-1, cpu]}
"""

EXTRA = """
c.GPULabJobs.poll_interval = 0.3
c.GPULabJobs.stop_grace_seconds = 3
"""


@pytest.fixture(scope="module")
def hub(start_hub):
    h = start_hub(CATALOG, extra_config=EXTRA)
    for user in ("alice", "bob", "carol"):
        h.give(user, write_notebook(h.home(user) / "exp" / "calc.ipynb"))
    return h


@pytest.fixture(scope="module")
def tokens(hub):
    return {u: user_token(hub, u) for u in ("alice", "bob", "carol")}


def home(hub: RunningHub, user: str) -> Path:
    return hub.home(user)


def job_holdings(hub: RunningHub) -> list[dict]:
    return [w for w in hub.holdings() if w["kind"] == "job"]


def all_jobs(hub: RunningHub) -> list[dict]:
    r = hub.api("GET", "/gpulab/jobs")
    assert r.status_code == 200, r.text
    return r.json()["jobs"]


def wait_no_job_holdings(hub: RunningHub, timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    while job_holdings(hub) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert job_holdings(hub) == []


def test_job_runs_papermill_with_parameters(hub, tokens):
    calc = home(hub, "alice") / "exp" / "calc.ipynb"
    original = calc.read_bytes()
    job = submit(
        hub,
        tokens["alice"],
        notebook="exp/calc.ipynb",
        job_class="batch",
        profile="h100-half",
        parameters={"x": 5},
        time_limit_seconds=300,
        name="calc",
    )
    assert job["state"] == "queued" and job["team"] == "vision" and job["gpu_milli"] == 500
    assert job["output_path"].startswith("exp/runs/calc-") and job["output_path"].endswith(".ipynb")
    done = wait_state(hub, job["id"], {"succeeded", "failed"}, token=tokens["alice"])
    assert done["state"] == "succeeded", done
    assert [h["state"] for h in done["history"]] == ["queued", "running", "succeeded"]
    assert done["started_at"] and done["finished_at"]

    r = hub.api("GET", f"/gpulab/jobs/{job['id']}/output", token=tokens["alice"])
    assert r.status_code == 200, r.text
    nb = r.json()
    injected = [c for c in nb["cells"] if "injected-parameters" in c["metadata"].get("tags", [])]
    assert injected and "x = 5" in "".join(injected[0]["source"])
    outputs = "".join("".join(o.get("text", "")) for c in nb["cells"] for o in c.get("outputs", []))
    assert "result 105 gpus 0" in outputs  # computed from the injected x, on the packer's device 0
    # Written beside the input, which is untouched.
    assert (home(hub, "alice") / done["output_path"]).is_file()
    assert calc.read_bytes() == original
    logs = hub.api("GET", f"/gpulab/jobs/{job['id']}/logs", token=tokens["alice"]).json()
    assert logs["complete"] and "result 105" in logs["text"] and logs["offset"] == len(logs["text"].encode())
    tail = hub.api(
        "GET", f"/gpulab/jobs/{job['id']}/logs", token=tokens["alice"], params={"offset": logs["offset"]}
    ).json()
    assert tail["text"] == "" and tail["complete"]
    wait_no_job_holdings(hub)


def test_cancel_stops_the_process_and_frees_the_gpu(hub, tokens):
    job = submit(
        hub,
        tokens["alice"],
        notebook="exp/calc.ipynb",
        job_class="batch",
        profile="h100-1",
        parameters={"sleep_seconds": 120},
    )
    running = wait_state(hub, job["id"], "running", token=tokens["alice"])
    assert [w["key"] for w in job_holdings(hub)] == [f"job:{job['id']}"]
    time.sleep(3)  # let papermill start its kernel, so the whole group has to stop
    r = hub.api("POST", f"/gpulab/jobs/{job['id']}/cancel", token=tokens["alice"])
    assert r.status_code == 200, r.text
    assert r.json()["state"] == "cancelled" and "cancelled by alice" in r.json()["reason"]
    wait_no_job_holdings(hub)
    assert running["state"] == "running"
    # Cancelling again is refused, and changes nothing.
    r = hub.api("POST", f"/gpulab/jobs/{job['id']}/cancel", token=tokens["alice"])
    assert r.status_code == 409
    assert get_job(hub, job["id"])["state"] == "cancelled"


def test_training_preempts_batch_which_requeues_and_finishes(hub, tokens):
    batch = submit(
        hub,
        tokens["alice"],
        notebook="exp/calc.ipynb",
        job_class="batch",
        profile="h100-1",
        parameters={"x": 1, "sleep_seconds": 8},
        name="sweep",
    )
    wait_state(hub, batch["id"], "running", token=tokens["alice"])
    training = submit(
        hub,
        tokens["bob"],
        notebook="exp/calc.ipynb",
        job_class="training",
        profile="h100-1",
        parameters={"x": 3},
        name="train",
    )
    assert training["over_quota"] is False
    wait_state(hub, batch["id"], {"preempted", "queued"}, timeout=30)
    done = wait_state(hub, training["id"], "succeeded", timeout=90)
    assert done["state"] == "succeeded"
    final = wait_state(hub, batch["id"], "succeeded", timeout=120)
    states = [h["state"] for h in final["history"]]
    assert states == ["queued", "running", "preempted", "queued", "running", "succeeded"], final["history"]
    assert f"preempted by training job {training['id']}" in final["history"][2]["reason"]
    assert final["attempts"] == 2
    # The training job ran while the batch job was off the GPU.
    t_run = next(h["at"] for h in done["history"] if h["state"] == "running")
    b_requeue = final["history"][3]["at"]
    b_rerun = final["history"][4]["at"]
    assert final["history"][2]["at"] <= t_run and b_rerun >= done["finished_at"] >= b_requeue
    out = hub.api("GET", f"/gpulab/jobs/{batch['id']}/output", token=tokens["alice"]).json()
    assert "result 21" in json.dumps(out)
    wait_no_job_holdings(hub)


def test_training_is_never_admitted_over_quota_and_batch_bursts(hub, tokens):
    before = all_jobs(hub)
    r = hub.api(
        "POST",
        "/gpulab/jobs",
        token=tokens["carol"],
        data=json.dumps({"notebook": "exp/calc.ipynb", "job_class": "training", "profile": "h100-1"}),
    )
    assert r.status_code == 403, r.text
    assert "never admitted over quota" in r.json()["message"]
    assert all_jobs(hub) == before and job_holdings(hub) == []
    job = submit(hub, tokens["carol"], notebook="exp/calc.ipynb", job_class="batch", profile="h100-1")
    assert job["over_quota"] is True
    done = wait_state(hub, job["id"], "succeeded", token=tokens["carol"])
    assert "over quota" in done["history"][0]["reason"]


def test_time_limit_times_out(hub, tokens):
    job = submit(
        hub,
        tokens["alice"],
        notebook="exp/calc.ipynb",
        job_class="batch",
        profile="cpu",
        parameters={"sleep_seconds": 120},
        time_limit_seconds=3,
    )
    done = wait_state(hub, job["id"], "timed-out", timeout=60)
    assert "time limit of 3 s" in done["reason"]


def test_rerun_and_idempotency(hub, tokens):
    first = submit(
        hub,
        tokens["bob"],
        notebook="exp/calc.ipynb",
        job_class="batch",
        profile="cpu",
        parameters={"x": 4},
        idempotency_key="k-1",
    )
    again = hub.api(
        "POST",
        "/gpulab/jobs",
        token=tokens["bob"],
        data=json.dumps(
            {"notebook": "exp/calc.ipynb", "job_class": "batch", "profile": "cpu", "idempotency_key": "k-1"}
        ),
    )
    assert again.status_code == 200 and again.json()["id"] == first["id"]
    wait_state(hub, first["id"], "succeeded")
    r = hub.api("POST", f"/gpulab/jobs/{first['id']}/rerun", token=tokens["bob"])
    assert r.status_code == 201, r.text
    second = r.json()
    assert second["id"] != first["id"] and second["rerun_of"] == first["id"]
    assert second["parameters"] == {"x": 4} and second["output_path"] != first["output_path"]
    wait_state(hub, second["id"], "succeeded")


def test_rerun_runs_the_notebook_as_submitted_and_current_runs_it_as_it_is_now(hub, tokens):
    """The job keeps its notebook as submitted (written as its owner, beside its output); a
    notebook edited after submit changes neither what the job ran nor what Re-run runs."""
    path = home(hub, "bob") / "exp" / "versions.ipynb"
    hub.give("bob", write_parameterised_notebook(path, "x = 1", "print('version one', x)"))
    first = submit(hub, tokens["bob"], notebook="exp/versions.ipynb", job_class="batch", profile="cpu")
    kept = home(hub, "bob") / first["input_path"]
    assert first["input_path"] == first["output_path"].removesuffix(".ipynb") + ".input.ipynb"
    write_parameterised_notebook(path, "x = 2", "print('version two', x)")  # edited after submit
    hub.give("bob", path)
    done = wait_state(hub, first["id"], {"succeeded", "failed"}, token=tokens["bob"])
    assert done["state"] == "succeeded", done
    account = hub.account("bob")
    if account is not None:  # made by the owner, never by the hub: the job's outputs' rules
        assert kept.stat().st_uid == account.uid
    assert kept.stat().st_mode & 0o777 == 0o600
    assert "version one" in kept.read_text() and "version two" not in kept.read_text()

    def ran(job: dict) -> str:
        r = hub.api("GET", f"/gpulab/jobs/{job['id']}/output", token=tokens["bob"])
        assert r.status_code == 200, r.text
        return "".join("".join(o.get("text", "")) for c in r.json()["cells"] for o in c.get("outputs", []))

    assert "version one 1" in ran(done)
    r = hub.api("POST", f"/gpulab/jobs/{first['id']}/rerun", token=tokens["bob"])  # default: as it ran
    assert r.status_code == 201, r.text
    again = wait_state(hub, r.json()["id"], {"succeeded", "failed"}, token=tokens["bob"])
    assert again["rerun_of"] == first["id"] and "version one 1" in ran(again)
    # A re-run of the re-run runs the same content again: each job keeps its own copy.
    assert "version one" in (home(hub, "bob") / again["input_path"]).read_text()
    r = hub.api(
        "POST", f"/gpulab/jobs/{first['id']}/rerun", token=tokens["bob"], data=json.dumps({"notebook": "current"})
    )
    assert r.status_code == 201, r.text
    current = wait_state(hub, r.json()["id"], {"succeeded", "failed"}, token=tokens["bob"])
    assert current["rerun_of"] is None and "version two 2" in ran(current)


@pytest.mark.parametrize(
    "body,status,text",
    [
        ({"notebook": "yesterday"}, 400, "notebook must be one of kept, current"),
        ({"notebook": ["kept"]}, 400, "notebook must be one of"),
        ({"notebook": "kept", "profile": "h100-2"}, 400, "a re-run takes only 'notebook'"),
        ({"notebook": "x" * 2000}, 413, ""),
    ],
)
def test_bad_rerun_bodies_get_4xx_and_change_nothing(hub, tokens, body, status, text):
    job = next(j for j in all_jobs(hub) if j["user"] == "bob" and j["state"] == "succeeded")
    before = len(all_jobs(hub))
    r = hub.api("POST", f"/gpulab/jobs/{job['id']}/rerun", token=tokens["bob"], data=json.dumps(body))
    assert r.status_code == status, r.text
    assert text in r.text
    assert len(all_jobs(hub)) == before


def test_a_notebook_larger_than_the_hub_keeps_is_a_413_and_nothing_is_recorded(hub, tokens):
    huge = home(hub, "bob") / "exp" / "huge.ipynb"
    with open(huge, "wb") as f:
        f.truncate(40 << 20)  # sparse: its size is checked on the open file, nothing is read
    hub.give("bob", huge)
    before = len(all_jobs(hub))
    r = hub.api(
        "POST",
        "/gpulab/jobs",
        token=tokens["bob"],
        data=json.dumps({"notebook": "exp/huge.ipynb", "job_class": "batch", "profile": "cpu"}),
    )
    assert r.status_code == 413 and "c.GPULabJobs.max_notebook_bytes" in r.text, r.text
    assert len(all_jobs(hub)) == before and job_holdings(hub) == []
    assert not any(p.name.startswith("huge-") for p in (home(hub, "bob") / "exp" / "runs").iterdir())


def test_rerun_of_a_job_whose_kept_notebook_is_gone_or_tampered_is_refused(hub, tokens):
    """The kept copy is the owner's file: deleted, it is a 404 that names the other choice;
    replaced by a symlink (to another user's notebook), a 403; nothing is submitted either way."""
    job = next(j for j in all_jobs(hub) if j["user"] == "bob" and j["state"] == "succeeded" and j["rerun_of"] is None)
    kept = home(hub, "bob") / job["input_path"]
    kept.unlink()
    before = len(all_jobs(hub))
    r = hub.api("POST", f"/gpulab/jobs/{job['id']}/rerun", token=tokens["bob"])
    assert r.status_code == 404 and "re-run with the current notebook" in r.text, r.text
    kept.symlink_to(home(hub, "alice") / "exp" / "calc.ipynb")
    r = hub.api("POST", f"/gpulab/jobs/{job['id']}/rerun", token=tokens["bob"])
    assert r.status_code == 403 and "symlink" in r.text, r.text
    assert len(all_jobs(hub)) == before
    r = hub.api("POST", "/gpulab/jobs/99999999/rerun", token=tokens["bob"])
    assert r.status_code == 404, r.text
    r = hub.api("POST", "/gpulab/jobs/1%2F..%2F2/rerun", token=tokens["bob"])
    assert 400 <= r.status_code < 500, r.text
    assert len(all_jobs(hub)) == before


# -- security ------------------------------------------------------------------


def test_other_users_jobs_are_invisible(hub, tokens):
    mine = [j for j in all_jobs(hub) if j["user"] == "alice"]
    assert mine
    job_id = mine[0]["id"]
    state = mine[0]["state"]
    for method, path in (("GET", ""), ("POST", "/cancel"), ("GET", "/logs"), ("GET", "/output"), ("POST", "/rerun")):
        r = hub.api(method, f"/gpulab/jobs/{job_id}{path}", token=tokens["bob"])
        assert r.status_code == 404, (method, path, r.status_code, r.text)
    listed = hub.api("GET", "/gpulab/jobs", token=tokens["bob"]).json()["jobs"]
    assert listed and all(j["user"] == "bob" for j in listed)
    r = hub.api("GET", "/gpulab/jobs", token=tokens["bob"], params={"user": "alice"})
    assert r.status_code == 403
    assert get_job(hub, job_id)["state"] == state
    # An admin sees everyone's, filterable.
    everyone = hub.api("GET", "/gpulab/jobs").json()["jobs"]
    assert {j["user"] for j in everyone} >= {"alice", "bob"}
    only = hub.api("GET", "/gpulab/jobs", params={"user": "alice", "state": "succeeded"}).json()["jobs"]
    assert only and all(j["user"] == "alice" and j["state"] == "succeeded" for j in only)


@pytest.mark.parametrize(
    "notebook, status",
    [
        ("../bob/exp/calc.ipynb", 400),
        ("exp/../../bob/exp/calc.ipynb", 400),
        ("/etc/passwd.ipynb", 400),
        ("~bob/exp/calc.ipynb", 400),
        ("exp/missing.ipynb", 404),
        ("exp/calc.txt", 400),
        ("link-out/calc.ipynb", 403),
        ("exp/escape.ipynb", 403),
        ("x" * 5000 + ".ipynb", 400),
    ],
)
def test_paths_escaping_home_are_refused(hub, tokens, notebook, status):
    outside = hub.workdir / "outside"
    write_notebook(outside / "calc.ipynb")
    alice_home = home(hub, "alice")
    if not (alice_home / "link-out").exists():
        os.symlink(outside, alice_home / "link-out")
        os.symlink(outside / "calc.ipynb", alice_home / "exp" / "escape.ipynb")
    before, held = all_jobs(hub), job_holdings(hub)
    r = hub.api(
        "POST",
        "/gpulab/jobs",
        token=tokens["alice"],
        data=json.dumps({"notebook": notebook, "job_class": "batch", "profile": "cpu"}),
    )
    assert r.status_code == status, r.text
    assert all_jobs(hub) == before and job_holdings(hub) == held


@pytest.mark.parametrize(
    "body, status",
    [
        (b"not json", 400),
        (b"[1, 2]", 400),
        (b"", 400),
        (
            json.dumps(
                {
                    "notebook": "exp/calc.ipynb",
                    "job_class": "batch",
                    "profile": "cpu",
                    "parameters": {"blob": "x" * 40000},
                }
            ).encode(),
            413,
        ),
        (
            json.dumps(
                {"notebook": "exp/calc.ipynb", "job_class": "batch", "profile": "cpu", "parameters": {"x": "y" * 70000}}
            ).encode(),
            413,
        ),
        (
            json.dumps(
                {
                    "notebook": "exp/calc.ipynb",
                    "job_class": "batch",
                    "profile": "cpu",
                    "parameters": {"not an identifier": 1},
                }
            ).encode(),
            400,
        ),
        (json.dumps({"notebook": "exp/calc.ipynb", "job_class": "production", "profile": "cpu"}).encode(), 400),
        (
            json.dumps(
                {"notebook": "exp/calc.ipynb", "job_class": "batch", "profile": "cpu", "gpu_milli": 8000}
            ).encode(),
            400,
        ),
        (
            json.dumps(
                {"notebook": "exp/calc.ipynb", "job_class": "batch", "profile": "cpu", "time_limit_seconds": -5}
            ).encode(),
            400,
        ),
        (
            json.dumps(
                {"notebook": "exp/calc.ipynb", "job_class": "batch", "profile": "h100-2", "team": "small"}
            ).encode(),
            403,
        ),
        (json.dumps({"notebook": "exp/calc.ipynb", "job_class": "batch", "profile": "h100-2"}).encode(), 409),
    ],
)
def test_bad_bodies_get_4xx_and_change_nothing(hub, tokens, body, status):
    before, held = all_jobs(hub), job_holdings(hub)
    r = hub.api("POST", "/gpulab/jobs", token=tokens["alice"], data=body)
    assert r.status_code == status, r.text
    assert r.json()["message"]
    assert all_jobs(hub) == before and job_holdings(hub) == held


def test_token_without_jobs_scope_gets_403(hub, tokens):
    weak = user_token(hub, "alice", scopes=["read:users:name!user"])
    before = all_jobs(hub)
    job_id = before[0]["id"]
    for method, path, data in (
        ("GET", "/gpulab/jobs", None),
        ("GET", f"/gpulab/jobs/{job_id}", None),
        ("POST", "/gpulab/jobs", json.dumps({"notebook": "exp/calc.ipynb", "job_class": "batch", "profile": "cpu"})),
        ("POST", f"/gpulab/jobs/{job_id}/cancel", None),
    ):
        r = hub.api(method, path, token=weak, data=data)
        assert r.status_code == 403, (method, path, r.status_code, r.text)
    assert all_jobs(hub) == before


# -- restarts ------------------------------------------------------------------------


def test_hub_restart_readopts_running_and_queued_jobs(hub, tokens):
    running = submit(
        hub,
        tokens["alice"],
        notebook="exp/calc.ipynb",
        job_class="batch",
        profile="h100-1",
        # Long enough to outlive the hub's restart on a loaded machine (seen: > 8 s under load 9).
        parameters={"x": 7, "sleep_seconds": 30},
        name="long",
    )
    wait_state(hub, running["id"], "running")
    queued = submit(
        hub,
        tokens["bob"],
        notebook="exp/calc.ipynb",
        job_class="batch",
        profile="h100-1",
        parameters={"x": 8},
        name="waits",
    )
    time.sleep(1)
    assert get_job(hub, queued["id"])["state"] == "queued"
    hub.restart()
    held = sorted(w["key"] for w in job_holdings(hub))
    assert held == sorted([f"job:{running['id']}", f"job:{queued['id']}"])
    assert get_job(hub, running["id"])["state"] == "running"
    done = wait_state(hub, running["id"], "succeeded", timeout=90)
    assert [h["state"] for h in done["history"]] == ["queued", "running", "succeeded"]
    wait_state(hub, queued["id"], "succeeded", timeout=60)
    wait_no_job_holdings(hub)


def test_job_whose_process_died_with_the_hub_is_failed_with_a_reason(hub, tokens):
    job = submit(
        hub,
        tokens["alice"],
        notebook="exp/calc.ipynb",
        job_class="batch",
        profile="cpu",
        parameters={"sleep_seconds": 60},
        name="doomed",
    )
    wait_state(hub, job["id"], "running")
    time.sleep(1)
    hub.stop()
    # The runner outlives the hub (own session); kill it while the hub is down.
    import sqlite3

    db = sqlite3.connect(hub.state_dir / "gpulab.sqlite")
    pid = db.execute("select pid from gpulab_jobs where id = ?", (job["id"],)).fetchone()[0]
    db.close()
    os.killpg(pid, signal.SIGKILL)
    time.sleep(0.5)
    hub.start()
    done = wait_state(hub, job["id"], "failed", timeout=30)
    assert "hub restarted" in done["reason"]
    wait_no_job_holdings(hub)
