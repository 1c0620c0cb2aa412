"""The pure part of notebook jobs (spawner/core/jobspec.py): validation, the Job manifest, Job states."""

from __future__ import annotations

import json

import kubernetes_validate
import pytest
from hypothesis import given
from hypothesis import strategies as st

from spawner.core import jobspec
from spawner.core.jobspec import JobSpecError
from spawner.core.priority import BATCH, TRAINING
from tests.support import REPO
from tests.support.job_requests import CATALOG, request


def test_job_classes_map_to_priority_classes():
    assert jobspec.priority_for("batch") is BATCH and BATCH.may_burst
    assert jobspec.priority_for("training") is TRAINING and not TRAINING.may_burst
    for bad in ("production", "development", "", None, ["batch"]):
        with pytest.raises(JobSpecError):
            jobspec.priority_for(bad)


@pytest.mark.parametrize(
    "path, expected",
    [
        ("a.ipynb", "a.ipynb"),
        ("./exp/b.ipynb", "exp/b.ipynb"),
        ("exp//c.ipynb", "exp/c.ipynb"),
    ],
)
def test_notebook_paths_are_normalised(path, expected):
    assert jobspec.validate_notebook_path(path) == expected


@pytest.mark.parametrize(
    "path",
    [
        "../a.ipynb",
        "x/../../a.ipynb",
        "x/..",
        "/etc/a.ipynb",
        "~root/a.ipynb",
        "",
        " ",
        ".",
        "a.py",
        "a\x00.ipynb",
        "a\n.ipynb",
        "a\\..\\b.ipynb",
        5,
        None,
        "a" * 2000 + ".ipynb",
    ],
)
def test_notebook_paths_that_escape_are_refused(path):
    with pytest.raises(JobSpecError):
        jobspec.validate_notebook_path(path)


@given(st.text(max_size=60))
def test_no_accepted_path_escapes_the_home(path):
    try:
        out = jobspec.validate_notebook_path(path)
    except JobSpecError:
        return
    assert not out.startswith("/") and ".." not in out.split("/") and out.endswith(".ipynb")


def test_parameters_are_bounded_identifiers():
    assert jobspec.validate_parameters({"x": 1, "lr": 0.1, "tags": ["a"]}, 1024) == {"x": 1, "lr": 0.1, "tags": ["a"]}
    assert jobspec.validate_parameters(None, 10) == {}
    with pytest.raises(JobSpecError) as e:
        jobspec.validate_parameters({"x": "y" * 100}, 50)
    assert e.value.status == 413
    for bad in ({"1x": 1}, {"a b": 1}, {"class": 1}, [1], "x=1"):
        with pytest.raises(JobSpecError):
            jobspec.validate_parameters(bad, 1024)


def test_names_time_limits_and_outputs():
    assert jobspec.validate_name(None, "exp/My Notebook.ipynb") == "My-Notebook"
    assert jobspec.validate_name("LR sweep #3", "a.ipynb") == "LR-sweep-3"
    assert jobspec.validate_name("../../etc/passwd", "a.ipynb") == "etc-passwd"
    for bad in ("---", "//", "x" * 64, 3, ["a"]):
        with pytest.raises(JobSpecError):
            jobspec.validate_name(bad, "a.ipynb")
    assert jobspec.validate_time_limit(None, 60, 100) == 60
    for bad in (0, -1, 101, 1.5, True, "10"):
        with pytest.raises(JobSpecError):
            jobspec.validate_time_limit(bad, 60, 100)
    assert jobspec.output_paths("exp/train.ipynb", "train", "20260101-000000-7") == (
        "exp/runs/train-20260101-000000-7.ipynb",
        "exp/runs/train-20260101-000000-7.log",
    )
    assert jobspec.output_paths("t.ipynb", "t", "s") == ("runs/t-s.ipynb", "runs/t-s.log")


def test_state_machine():
    assert jobspec.may_transition("queued", "running")
    assert jobspec.may_transition("running", "preempted") and jobspec.may_transition("preempted", "queued")
    for final in jobspec.FINAL_STATES:
        assert not any(jobspec.may_transition(final, s) for s in jobspec.STATES)


def test_manifest_without_kueue_validates_strictly():
    job = jobspec.kube_job_manifest(request("h100-2"))
    kubernetes_validate.validate(job, kubernetes_validate.latest_version(), strict=True)
    spec = job["spec"]
    assert "suspend" not in spec and "kueue.x-k8s.io/queue-name" not in job["metadata"]["labels"]
    pod = spec["template"]["spec"]
    assert pod["priorityClassName"] == "gpulab-training"
    res = pod["containers"][0]["resources"]
    assert res["limits"]["nvidia.com/gpu"] == "2" and res["limits"]["cpu"] == "8"
    assert res["requests"]["memory"] == str(CATALOG.profile("h100-2").mem_guarantee)
    env = {e["name"]: e["value"] for e in pod["containers"][0]["env"]}
    # Parameters travel as data in the environment; the shell script never interpolates them.
    assert json.loads(env["GPULAB_PARAMETERS"])["name"] == 'it\'s "quoted"; rm -rf /'
    assert "GPULAB_PARAMETERS" not in jobspec.PAPERMILL_SCRIPT.replace('"$GPULAB_PARAMETERS"', "")


def test_manifest_mig_fraction_over_quota_with_kueue_validates():
    job = jobspec.kube_job_manifest(request("mig-3g", job_class="batch", over_quota=True, kueue_queue="nlp"))
    kubernetes_validate.validate(job, kubernetes_validate.latest_version(), strict=True)
    assert job["spec"]["suspend"] is True
    assert job["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "nlp"
    pod = job["spec"]["template"]["spec"]
    assert pod["priorityClassName"] == "gpulab-over-quota"
    assert any(k.startswith("nvidia.com/mig-") for k in pod["containers"][0]["resources"]["limits"])


def test_job_pods_name_the_priority_classes_of_the_release_the_catalog_gives():
    """The chart names its PriorityClasses after its release and tells the hub through the
    catalog's priority_class_names; a job of a "staging" release names staging's classes."""
    names = {c: f"staging-{c}" for c in ("production", "training", "development", "batch", "over-quota")}
    pod = jobspec.kube_job_manifest(request("h100-2", priority_class_names=names))["spec"]["template"]["spec"]
    assert pod["priorityClassName"] == "staging-training"
    borrowed = request("mig-3g", job_class="batch", over_quota=True, priority_class_names=names)
    assert jobspec.kube_job_manifest(borrowed)["spec"]["template"]["spec"]["priorityClassName"] == "staging-over-quota"


def test_gpu_jobs_get_a_memory_backed_dev_shm_and_cpu_jobs_none():
    """A container runtime gives /dev/shm 64 MiB; PyTorch's DataLoader workers need more."""
    pod = jobspec.kube_job_manifest(request("h100-2"))["spec"]["template"]["spec"]
    [container] = pod["containers"]
    assert {"name": "gpulab-shm", "emptyDir": {"medium": "Memory"}} in pod["volumes"]
    assert {"name": "gpulab-shm", "mountPath": "/dev/shm"} in container["volumeMounts"]
    assert {"name": "home", "mountPath": "/home/jovyan"} in container["volumeMounts"]  # the home stays
    cpu = jobspec.kube_job_manifest(request("h100-2", gpu=None, home_claim=""))["spec"]["template"]["spec"]
    assert "volumes" not in cpu and "volumeMounts" not in cpu["containers"][0]


def test_dev_shm_an_admin_mounted_already_is_left_as_it_is():
    from spawner.core.sharing import with_shm

    own = [{"name": "shm", "emptyDir": {"medium": "Memory", "sizeLimit": "8Gi"}}]
    mounts = [{"name": "shm", "mountPath": "/dev/shm/"}]
    assert with_shm(own, mounts) == (own, mounts)
    # KubeSpawner also takes volumes and mounts as dicts keyed by name (merged by key).
    volumes, by_name = with_shm({"home": {"name": "home"}}, {"home": {"name": "home", "mountPath": "/home/jovyan"}})
    assert set(volumes) == set(by_name) == {"home", "gpulab-shm"}
    assert by_name["gpulab-shm"]["mountPath"] == "/dev/shm"


@pytest.mark.parametrize(
    "job, state",
    [
        ({"spec": {"suspend": True}, "status": {}}, "queued"),
        ({"spec": {}, "status": {}}, "queued"),
        ({"spec": {}, "status": {"active": 1}}, "running"),
        ({"spec": {}, "status": {"failed": 1}}, "preempted"),
        ({"spec": {}, "status": {"conditions": [{"type": "Complete", "status": "True"}]}}, "succeeded"),
        (
            {
                "spec": {},
                "status": {
                    "conditions": [
                        {
                            "type": "Failed",
                            "status": "True",
                            "reason": "BackoffLimitExceeded",
                            "message": "Job has reached the specified backoff limit",
                        }
                    ]
                },
            },
            "failed",
        ),
        (
            {
                "spec": {},
                "status": {"conditions": [{"type": "Failed", "status": "True", "reason": "DeadlineExceeded"}]},
            },
            "timed-out",
        ),
        ({"spec": {}, "status": {"conditions": [{"type": "Failed", "status": "False"}], "active": 1}}, "running"),
    ],
)
def test_kube_job_states(job, state):
    assert jobspec.kube_job_state(job)[0] == state


def test_openapi_document_lists_every_endpoint():
    import re

    import yaml

    from hub_config.api import jobs, sweeps

    doc = yaml.safe_load((REPO / "docs" / "jobs-openapi.yaml").read_text())
    documented = set(doc["paths"])
    served = {
        re.sub(r"\(\[\^/\]\+\)", "{id}", pattern).replace("/api/gpulab", "")
        for pattern, _ in [*jobs.handlers, *sweeps.handlers]
    }
    assert documented == served


# -- a submission, the contract between the jobs API, the service and each backend -----


def test_a_submission_round_trips_through_json_and_refuses_what_it_refused_before():
    from spawner.core.jobspec import Submission
    from spawner.core.policy import resolve_request

    def resolve(options):
        return resolve_request(CATALOG, "carol", [], dict(options))

    limits = {"max_parameters_bytes": 4096, "default_time_limit": 3600, "max_time_limit": 86400}
    body = {"notebook": "exp/train.ipynb", "job_class": "training", "profile": "h100-2", "parameters": {"lr": 0.1}}
    sub = Submission.from_json(body, resolve, **limits)
    assert (sub.request.team.name, sub.request.profile.slug, sub.name, sub.time_limit_seconds) == (
        "nlp",
        "h100-2",
        "train",
        3600,
    )
    assert sub.priority.name == jobspec.priority_for("training").name
    again = Submission.from_json(json.loads(json.dumps(sub.to_json())), resolve, **limits)
    assert again == sub
    for bad, words in [
        ({**body, "job_class": "urgent"}, "job_class must be one of"),
        ({**body, "notebook": "../x.ipynb"}, "notebook path must not contain"),
        ({**body, "time_limit_seconds": 10**9}, "time_limit_seconds must be between 1 and 86400"),
        ({**body, "parameters": ["x"]}, "parameters must be a JSON object"),
    ]:
        with pytest.raises(jobspec.JobSpecError, match=words):
            Submission.from_json(bad, resolve, **limits)


def test_openapi_request_and_job_schemas_match_what_the_service_takes_and_answers():
    import yaml

    from hub_config.jobs.models import JobRecord
    from hub_config.jobs.service import SUBMIT_KEYS

    schemas = yaml.safe_load((REPO / "docs" / "jobs-openapi.yaml").read_text())["components"]["schemas"]
    assert set(schemas["JobRequest"]["properties"]) == SUBMIT_KEYS
    rec = JobRecord(id=1, notebook="a.py", kind="script", args_json="[]", parameters_json="{}", history_json="[]")
    assert set(schemas["Job"]["properties"]) == set(rec.to_json())


# -- scripts and the checkpoint contract on Kubernetes ---------------------------------------


def test_a_script_job_is_a_validated_job_whose_arguments_no_shell_parses():
    tricky = ("--name", 'it\'s "quoted"; rm -rf /', "$(id)")
    req = request(
        "h100-2",
        kind="script",
        notebook="exp/train.py",
        output_path="",
        args=tricky,
        checkpoint_path="exp/runs/train-1.checkpoints",
        termination_grace_seconds=45,
    )
    job = jobspec.kube_job_manifest(req)
    kubernetes_validate.validate(job, kubernetes_validate.latest_version(), strict=True)
    pod = job["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert container["name"] == "script"
    assert container["command"] == ["/bin/sh", "-c", jobspec.SCRIPT_SHELL, "gpulab-job", *tricky]
    env = {e["name"]: e["value"] for e in container["env"]}
    assert env["GPULAB_SCRIPT"] == "exp/train.py" and env["GPULAB_NPROC"] == "2"  # torchrun over the pod's 2 GPUs
    assert env["GPULAB_CHECKPOINT_DIR"] == "/home/jovyan/exp/runs/train-1.checkpoints"
    assert "GPULAB_NOTEBOOK" not in env and "GPULAB_PARAMETERS" not in env
    assert pod["terminationGracePeriodSeconds"] == 45
    rule = job["spec"]["podFailurePolicy"]["rules"][0]
    assert rule["onExitCodes"]["containerName"] == "script"
