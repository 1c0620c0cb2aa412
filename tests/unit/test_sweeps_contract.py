"""The contracts around sweeps: the OpenAPI schemas match what the service takes and answers, a
sweep run's job on Kubernetes gets its metrics file and parameters in its environment (manifest
level: the kube backend builds runs' Jobs like any job's), and a run's job body."""

from __future__ import annotations

import json
from types import SimpleNamespace

import yaml

from hub_config.jobs.models import JobRecord
from hub_config.jobs.service import SUBMIT_KEYS
from hub_config.jobs.sweep_models import SweepRecord, SweepRunRecord
from hub_config.jobs.sweeps import ADMITTED, SweepScheduler, run_body, run_name
from spawner.core import jobspec, sweeps
from tests.support import REPO
from tests.support.job_requests import request

SCHEMAS = yaml.safe_load((REPO / "docs" / "jobs-openapi.yaml").read_text())["components"]["schemas"]


def test_the_sweep_request_schema_is_a_job_request_and_the_sweep_keys():
    extra = SCHEMAS["SweepRequest"]["allOf"][1]["properties"]
    assert set(extra) == sweeps.SWEEP_KEYS and not (set(extra) & SUBMIT_KEYS)


def test_the_sweep_and_run_schemas_match_what_the_service_answers():
    scheduler = SweepScheduler(SimpleNamespace(config=None, db=None, backend=SimpleNamespace(sees_homes=True)))
    sweep = SweepRecord(
        id=1,
        name="lr",
        user="alice",
        team="vision",
        job_json=json.dumps({"notebook": "a.ipynb", "job_class": "batch", "profile": "cpu"}),
        groups_json="[]",
        grid_json='{"lr": [0.1]}',
        max_parallel=1,
        objective_json='{"metric": "loss", "direction": "min"}',
        state="active",
        reason="",
    )
    run = SweepRunRecord(
        sweep_id=1,
        index=0,
        parameters_json='{"lr": 0.1}',
        state=ADMITTED,
        reason="",
        job_id=7,
        metrics_json='{"loss": 1}',
    )
    job = JobRecord(id=7, state="running", reason="", output_path="a/runs/x.ipynb", log_path="a/runs/x.log", attempts=1)
    out = scheduler._json(sweep, [run], {7: job}, True)
    assert set(SCHEMAS["Sweep"]["properties"]) - {"script"} == set(out)
    assert set(SCHEMAS["SweepRun"]["properties"]) == set(out["runs"][0])
    assert out["best_run"] == 0 and out["runs"][0]["best"] and out["runs"][0]["state"] == "running"


def test_a_run_on_kubernetes_gets_its_metrics_file_and_parameters_in_its_environment():
    for kind, path in ((jobspec.NOTEBOOK, "exp/train.ipynb"), (jobspec.SCRIPT, "exp/train.py")):
        req = request("h100-2", kind=kind, notebook=path, parameters={"lr": 0.0001}, log_path="exp/runs/lr-r0-1.log")
        container = jobspec.kube_job_manifest(req)["spec"]["template"]["spec"]["containers"][0]
        env = {e["name"]: e["value"] for e in container["env"]}
        assert env["GPULAB_METRICS_FILE"] == "/home/jovyan/exp/runs/lr-r0-1.metrics.json"
        assert json.loads(env["GPULAB_JOB_PARAMETERS"]) == {"lr": 0.0001}


def test_a_runs_job_body():
    notebook = {"notebook": "a.ipynb", "parameters": {"epochs": 3, "lr": 1}, "name": "lr"}
    assert run_body(notebook, jobspec.NOTEBOOK, {"lr": 0.1}, 4) == {
        "notebook": "a.ipynb",
        "parameters": {"epochs": 3, "lr": 0.1},
        "name": "lr-r4",
    }
    script = {"script": "t.py", "args": ["--epochs", "3"], "name": "t"}
    assert run_body(script, jobspec.SCRIPT, {"lr": 0.1, "amp": False}, 0)["args"] == [
        "--epochs",
        "3",
        "--lr",
        "0.1",
        "--amp",
        "false",
    ]
    long = "x" * 63
    assert run_name(long, 123) == "x" * 58 + "-r123" and len(run_name(long, 123)) == jobspec.MAX_NAME_LEN
