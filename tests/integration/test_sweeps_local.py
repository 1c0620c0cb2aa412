"""Parameter sweeps on the single-server backend, end to end over HTTP with real runs.

A real JupyterHub (tests/support/hub.py) on a declared inventory of one GPU: a sweep is
submitted in one request; its runs are real papermill notebooks and Python scripts run as
their owner, each admitted on its own by the ledger within the sweep's cap, each writing
metrics with ``gpulab_run.log_metrics``, read back into the sweep with its best run.
"""

from __future__ import annotations

import json
import time

import pytest

from tests.support.hub import RunningHub
from tests.support.jobs import FINAL, get_job, user_token, write_parameterised_notebook

CATALOG = """
inventory:
  - {model: H100-80GB, count: 1, memory_mib: 81559}
profiles:
  - {slug: h100-half, display_name: "0.5 × H100", gpus: 0.5, gpu_model: H100-80GB}
  - {slug: cpu, display_name: "CPU", gpus: 0}
teams:
  - {name: vision, users: [alice, bob], guarantee: 2, burst: 2, allowed_profiles: [h100-half, cpu]}
  - {name: small, users: [carol], guarantee: 0, burst: 1, allowed_profiles: [h100-half, cpu]}
"""
MAX_RUNS = 120
EXTRA = f"""
c.GPULabJobs.poll_interval = 0.3
c.GPULabJobs.stop_grace_seconds = 2
c.GPULabJobs.max_running_jobs_per_user = 0
c.GPULabSweeps.max_runs = {MAX_RUNS}
c.GPULabSweeps.max_parallel = 4
c.GPULabSweeps.metrics_interval = 0.5
"""

#: A notebook that trains nothing but reports a loss computed from its parameters.
NOTEBOOK_BODY = (
    "import time\n"
    "from gpulab_run import log_metrics\n"
    "time.sleep(sleep_seconds)\n"
    "loss = (lr - 0.0003) ** 2 * 1e6 + seed\n"
    "log_metrics(loss=loss, lr_seen=lr)\n"
    "print('loss', loss)"
)
SCRIPT = """\
import argparse, json, os, sys
from gpulab_run import log_metrics, parameters
p = argparse.ArgumentParser()
p.add_argument("--epochs", type=int)
p.add_argument("--lr", type=float)
p.add_argument("--opt")
a = p.parse_args()
print("argv", json.dumps(sys.argv[1:]), "parameters", json.dumps(parameters()), flush=True)
log_metrics(accuracy=1 - a.lr * 100, epochs=a.epochs)
"""


@pytest.fixture(scope="module")
def hub(start_hub):
    h = start_hub(CATALOG, extra_config=EXTRA)
    for user in ("alice", "bob", "carol"):
        h.give(
            user,
            write_parameterised_notebook(
                h.home(user) / "exp" / "train.ipynb", "lr = 0.001\nseed = 0\nsleep_seconds = 0", NOTEBOOK_BODY
            ),
        )
        script = h.home(user) / "exp" / "train.py"
        script.write_text(SCRIPT)
        h.give(user, script)
    return h


@pytest.fixture(scope="module")
def tokens(hub):
    return {u: user_token(hub, u) for u in ("alice", "bob", "carol")}


def submit_sweep(hub: RunningHub, token: str, status: int = 201, **body) -> dict:
    r = hub.api("POST", "/gpulab/sweeps", token=token, data=json.dumps(body))
    assert r.status_code == status, (r.status_code, r.text)
    return r.json()


def get_sweep(hub: RunningHub, sweep_id: int, token: str) -> dict:
    r = hub.api("GET", f"/gpulab/sweeps/{sweep_id}", token=token)
    assert r.status_code == 200, r.text
    return r.json()


def wait_sweep(hub: RunningHub, sweep_id: int, token: str, timeout: float = 120, watch=None) -> dict:
    deadline = time.monotonic() + timeout
    sweep: dict = {}
    while time.monotonic() < deadline:
        sweep = get_sweep(hub, sweep_id, token)
        if watch is not None:
            watch(sweep)
        if sweep["state"] != "active" and all(r["state"] in FINAL for r in sweep["runs"]):
            return sweep
        time.sleep(0.2)
    raise AssertionError(f"sweep {sweep_id} never ended: {json.dumps(sweep, indent=1)}\n{hub.log_tail(40)}")


def counts(hub: RunningHub) -> tuple[int, int]:
    """(sweeps, jobs) recorded, everyone's: what a refusal must leave as it was."""
    sweeps = hub.api("GET", "/gpulab/sweeps").json()["sweeps"]
    jobs = hub.api("GET", "/gpulab/jobs").json()["jobs"]
    return len(sweeps), len(jobs)


def test_a_notebook_grid_runs_every_combination_within_its_cap_with_metrics_and_the_best_run(hub, tokens):
    sweep = submit_sweep(
        hub,
        tokens["alice"],
        notebook="exp/train.ipynb",
        profile="h100-half",
        name="lr sweep",
        parameters={"sleep_seconds": 1},
        grid={"lr": [1e-4, 3e-4, 1e-3], "seed": [0, 1]},
        max_parallel=2,
        objective={"metric": "loss", "direction": "min"},
    )
    assert sweep["runs_total"] == 6 and sweep["state"] == "active" and sweep["job_class"] == "batch"
    assert [r["parameters"] for r in sweep["runs"]][:2] == [{"lr": 1e-4, "seed": 0}, {"lr": 1e-4, "seed": 1}]
    assert sweep["grid"] == {"lr": [1e-4, 3e-4, 1e-3], "seed": [0, 1]} and sweep["max_parallel"] == 2
    most = [0]

    def watch(s: dict) -> None:  # the cap, as the API shows it at every poll
        holding = [r for r in s["runs"] if r["state"] in ("queued", "running", "preempted")]
        most[0] = max(most[0], len(holding))
        assert len(holding) <= 2, s["runs"]

    done = wait_sweep(hub, sweep["id"], tokens["alice"], watch=watch)
    assert done["state"] == "done" and done["counts"] == {"succeeded": 6}, done
    assert most[0] == 2  # the cap was reached, never passed
    by_params = {(r["parameters"]["lr"], r["parameters"]["seed"]): r for r in done["runs"]}
    for (lr, seed), run in by_params.items():
        assert run["metrics"]["loss"] == pytest.approx((lr - 0.0003) ** 2 * 1e6 + seed)
        assert run["metrics"]["lr_seen"] == lr
    best = by_params[(3e-4, 0)]
    assert done["best_run"] == best["index"] and best["best"] and sum(r["best"] for r in done["runs"]) == 1
    assert done["metric_names"] == ["loss", "lr_seen"] and done["parameter_names"] == ["lr", "seed"]
    # Each run is a job of its own: its output notebook holds the injected parameters.
    job = get_job(hub, best["job_id"], tokens["alice"])
    assert job["name"] == "lr-sweep-r2" and job["parameters"] == {"sleep_seconds": 1, "lr": 3e-4, "seed": 0}
    r = hub.api("GET", f"/gpulab/jobs/{best['job_id']}/output", token=tokens["alice"])
    assert r.status_code == 200
    injected = [c for c in r.json()["cells"] if "injected-parameters" in c["metadata"].get("tags", [])]
    assert "lr = 0.0003" in "".join(injected[0]["source"])
    assert (hub.home("alice") / best["output_path"]).is_file()


def test_runs_burst_as_preemptible_work_and_wait_for_the_ledger_otherwise(hub, tokens):
    """carol's team has no guarantee and a burst of 1 GPU: the ledger admits two 0.5-GPU runs
    over quota (preemptible), and the others wait with its reason, whatever max_parallel says."""
    sweep = submit_sweep(
        hub,
        tokens["carol"],
        notebook="exp/train.ipynb",
        profile="h100-half",
        parameters={"sleep_seconds": 3},
        runs=[{"lr": 1e-4}, {"lr": 2e-4}, {"lr": 3e-4}, {"lr": 4e-4}],
        max_parallel=4,
    )
    seen_waiting_reason = []

    def watch(s: dict) -> None:
        holding = [r for r in s["runs"] if r["state"] in ("queued", "running", "preempted")]
        assert len(holding) <= 2, s["runs"]
        seen_waiting_reason.extend(r["reason"] for r in s["runs"] if r["state"] == "waiting")

    done = wait_sweep(hub, sweep["id"], tokens["carol"], watch=watch)
    assert done["counts"] == {"succeeded": 4}, done
    assert any(reason.startswith("waiting for a share:") for reason in seen_waiting_reason), seen_waiting_reason
    for run in done["runs"]:
        job = get_job(hub, run["job_id"], tokens["carol"])
        assert job["over_quota"] and job["job_class"] == "batch"
        assert "admitted over quota (preemptible)" in job["history"][0]["reason"]


def test_a_script_sweep_gets_its_parameters_as_arguments_and_in_the_environment(hub, tokens):
    sweep = submit_sweep(
        hub,
        tokens["bob"],
        script="exp/train.py",
        args=["--epochs", "2"],
        profile="cpu",
        runs=[{"lr": 0.001, "opt": "adam"}, {"lr": 0.0001, "opt": "sgd"}],
        objective={"metric": "accuracy", "direction": "max"},
    )
    done = wait_sweep(hub, sweep["id"], tokens["bob"])
    assert done["counts"] == {"succeeded": 2}, done
    first = done["runs"][1]
    log = hub.api("GET", f"/gpulab/jobs/{first['job_id']}/logs", token=tokens["bob"]).json()["text"]
    assert 'argv ["--epochs", "2", "--lr", "0.0001", "--opt", "sgd"]' in log, log
    assert 'parameters {"lr": 0.0001, "opt": "sgd"}' in log, log
    assert first["metrics"] == {"accuracy": pytest.approx(0.99), "epochs": 2}
    assert done["best_run"] == 1


def test_cancel_cancels_every_run_not_finished(hub, tokens):
    sweep = submit_sweep(
        hub,
        tokens["alice"],
        notebook="exp/train.ipynb",
        profile="cpu",
        parameters={"sleep_seconds": 120},
        grid={"lr": [1e-4, 2e-4, 3e-4]},
        max_parallel=1,
    )
    deadline = time.monotonic() + 60
    while get_sweep(hub, sweep["id"], tokens["alice"])["runs"][0]["state"] != "running":
        assert time.monotonic() < deadline
        time.sleep(0.2)
    # Another user can neither see nor cancel it (404, as if it did not exist).
    assert hub.api("POST", f"/gpulab/sweeps/{sweep['id']}/cancel", token=tokens["bob"]).status_code == 404
    r = hub.api("POST", f"/gpulab/sweeps/{sweep['id']}/cancel", token=tokens["alice"])
    assert r.status_code == 200, r.text
    assert r.json()["state"] == "cancelled" and "cancelled by alice" in r.json()["reason"]
    done = wait_sweep(hub, sweep["id"], tokens["alice"], timeout=30)
    assert [run["state"] for run in done["runs"]] == ["cancelled"] * 3
    assert done["runs"][0]["job_id"] is not None and done["runs"][1]["job_id"] is None
    assert "before it was admitted" in done["runs"][2]["reason"]
    assert get_job(hub, done["runs"][0]["job_id"], tokens["alice"])["state"] == "cancelled"
    again = hub.api("POST", f"/gpulab/sweeps/{sweep['id']}/cancel", token=tokens["alice"])
    assert again.status_code == 409 and "already cancelled" in again.text


def test_a_100_run_sweep_is_one_request(hub, tokens):
    sweep = submit_sweep(
        hub,
        tokens["bob"],
        notebook="exp/train.ipynb",
        profile="cpu",
        parameters={"sleep_seconds": 60},
        grid={"lr": [i * 1e-5 for i in range(1, 26)], "seed": [0, 1, 2, 3]},
        max_parallel=1,
        idempotency_key="hundred",
    )
    assert sweep["runs_total"] == 100 and len(sweep["runs"]) == 100
    assert len({json.dumps(r["parameters"], sort_keys=True) for r in sweep["runs"]}) == 100
    again = submit_sweep(
        hub,
        tokens["bob"],
        status=200,
        notebook="exp/train.ipynb",
        profile="cpu",
        grid={"a": [1]},
        idempotency_key="hundred",
    )
    assert again["id"] == sweep["id"]  # the same key answers the sweep it made, and makes nothing
    listed = hub.api("GET", "/gpulab/sweeps", token=tokens["bob"]).json()["sweeps"]
    assert [s["id"] for s in listed if s["id"] == sweep["id"]] and "runs" not in listed[0]
    assert hub.api("POST", f"/gpulab/sweeps/{sweep['id']}/cancel", token=tokens["bob"]).status_code == 200
    wait_sweep(hub, sweep["id"], tokens["bob"], timeout=60)


BAD = [
    ({"notebook": "exp/train.ipynb", "profile": "cpu", "grid": {}}, 400, "grid is empty"),
    ({"notebook": "exp/train.ipynb", "profile": "cpu", "grid": {"lr": []}}, 400, "lr has no values"),
    ({"notebook": "exp/train.ipynb", "profile": "cpu", "grid": {"lr": [[1]]}}, 400, "not a list"),
    ({"notebook": "exp/train.ipynb", "profile": "cpu", "grid": {"lr": [{"a": 1}]}}, 400, "not dict"),
    ({"notebook": "exp/train.ipynb", "profile": "cpu", "runs": [{"lr": None}]}, 400, "not null"),
    (
        {"notebook": "exp/train.ipynb", "profile": "cpu", "grid": {"a": list(range(11)), "b": list(range(11))}},
        413,
        f"makes 121 runs; a sweep has at most {MAX_RUNS} (c.GPULabSweeps.max_runs)",
    ),
    ({"notebook": "exp/train.ipynb", "profile": "cpu", "grid": {"a": [1]}, "max_parallel": 5}, 400, "from 1 to 4"),
    ({"notebook": "exp/missing.ipynb", "profile": "cpu", "grid": {"a": [1]}}, 404, "does not exist"),
    ({"notebook": "../x.ipynb", "profile": "cpu", "grid": {"a": [1]}}, 400, "must not contain '..'"),
    ({"notebook": "exp/train.ipynb", "profile": "h100-80", "grid": {"a": [1]}}, 400, "profile"),
    ({"notebook": "exp/train.ipynb", "profile": "cpu", "grid": {"a": [1]}, "gpus": 8}, 400, "unknown field(s): gpus"),
    ({"notebook": "exp/train.ipynb", "profile": "cpu", "job_class": "urgent", "grid": {"a": [1]}}, 400, "job_class"),
    (
        {
            "notebook": "exp/train.ipynb",
            "profile": "cpu",
            "grid": {"a": [1]},
            "objective": {"metric": "l", "direction": "up"},
        },
        400,
        "'min' or 'max'",
    ),
    ({"notebook": "exp/train.ipynb", "profile": "cpu", "grid": {"a": [1]}, "runs": [{"a": 1}]}, 400, "exactly one"),
]


@pytest.mark.parametrize(("body", "status", "words"), BAD)
def test_refusals_are_clear_and_change_nothing(hub, tokens, body, status, words):
    before = counts(hub)
    r = hub.api("POST", "/gpulab/sweeps", token=tokens["alice"], data=json.dumps(body))
    assert r.status_code == status, r.text
    assert words in r.json()["message"], r.text
    assert counts(hub) == before


def test_oversized_malformed_and_tampered_requests_are_refused(hub, tokens):
    before = counts(hub)
    huge = {"notebook": "exp/train.ipynb", "profile": "cpu", "runs": [{"s": "x" * 250, "i": i} for i in range(1100)]}
    r = hub.api("POST", "/gpulab/sweeps", token=tokens["alice"], data=json.dumps(huge))
    assert r.status_code == 413 and "larger than" in r.text
    for data in ("not json", "[1, 2]", '{"grid": {"a": [NaN]}}'):
        r = hub.api("POST", "/gpulab/sweeps", token=tokens["alice"], data=data)
        assert r.status_code == 400, (data, r.text)
    for bad_id in ("1x", "²", "-1", "99999999999999999", "%2e%2e"):
        assert hub.api("GET", f"/gpulab/sweeps/{bad_id}", token=tokens["alice"]).status_code == 404, bad_id
        assert hub.api("POST", f"/gpulab/sweeps/{bad_id}/cancel", token=tokens["alice"]).status_code == 404
    # A service token cannot submit for a user; bob cannot list alice's sweeps.
    assert hub.api("POST", "/gpulab/sweeps", data=json.dumps({"grid": {"a": [1]}})).status_code == 400
    r = hub.api("GET", "/gpulab/sweeps", token=tokens["bob"], params={"user": "alice"})
    assert r.status_code == 403
    assert counts(hub) == before


def test_another_users_sweep_answers_404_as_a_missing_one(hub, tokens):
    sweep = submit_sweep(
        hub, tokens["alice"], notebook="exp/train.ipynb", profile="cpu", grid={"lr": [0.1]}, max_parallel=1
    )
    mine = hub.api("GET", f"/gpulab/sweeps/{sweep['id']}", token=tokens["bob"])
    missing = hub.api("GET", "/gpulab/sweeps/999999", token=tokens["bob"])
    assert mine.status_code == missing.status_code == 404
    assert mine.json()["message"].replace(str(sweep["id"]), "N") == missing.json()["message"].replace("999999", "N")
    assert all(s["user"] == "bob" for s in hub.api("GET", "/gpulab/sweeps", token=tokens["bob"]).json()["sweeps"])
    wait_sweep(hub, sweep["id"], tokens["alice"])
