"""A multi-node training job as Kubeflow Trainer's TrainJob and as a JobSet (spawner/kube/training.py),
checked against the engines' own CRD schemas at the versions the test bed builds (Trainer v2.2.0,
JobSet v0.11.1, read from their Go modules: tests/support/engines.py), with no field the API
server would prune, and against the torch ClusterTrainingRuntime Trainer ships.

The engines run them on the test bed (tests/kube/test_kube_cluster_training.py); here the
manifests and the reading of the engines' status are checked without a cluster."""

from __future__ import annotations

import re

import jsonschema
import pytest
import yaml

from spawner.core import jobspec
from spawner.core.catalog import catalog_from_dict
from spawner.core.labels import workload_annotations, workload_labels
from spawner.core.ledger import Workload
from spawner.core.sharing import pod_gpu_spec
from spawner.kube import training
from tests.support.engines import (
    JOBSET_MODULE,
    TRAINER_MODULE,
    built_version,
    crd_schema,
    release_file,
    unknown_fields,
)

TRAINER = built_version("build-trainer.sh", "GPULAB_TRAINER_VERSION")
JOBSET = built_version("build-jobset.sh", "GPULAB_JOBSET_VERSION")
CATALOG = catalog_from_dict(
    {
        "profiles": [{"slug": "h100-8", "display_name": "8 × H100", "gpus": 8, "gpu_model": "H100-80GB"}],
        "teams": [{"name": "vision", "users": ["alice"], "guarantee": 16, "burst": 16, "namespace": "team-vision"}],
    },
    "test",
)
ARGS = ("--epochs", "3", "a b; $(id)")


def request(nodes: int = 2) -> jobspec.KubeJobRequest:
    profile = CATALOG.profile("h100-8")
    gpu = pod_gpu_spec(profile, CATALOG.sharing, CATALOG.teams["vision"])
    w = Workload("job:7", "vision", "alice", nodes * gpu.effective_milli, "h100-8", "job", False, members=nodes)
    return jobspec.KubeJobRequest(
        job_id=7,
        name="train",
        user="alice",
        namespace="team-vision",
        image="example.org/torch:1",
        job_class="training",
        over_quota=False,
        notebook="exp/train.py",
        kind="script",
        args=ARGS,
        output_path="",
        log_path="exp/runs/train-1.log",
        checkpoint_path="exp/runs/train-1.checkpoints",
        parameters={},
        time_limit_seconds=7200,
        labels=workload_labels(w),
        annotations=workload_annotations(w),
        gpu=gpu,
        home_claim="claim-alice",
        kueue_queue="gpulab-vision",
        termination_grace_seconds=60,
    )


def check_against_crd(obj: dict, module: str, version: str, path: str) -> None:
    schema = crd_schema(module, version, path, obj["apiVersion"].split("/")[1])
    jsonschema.validate(obj, schema)
    assert unknown_fields(obj, schema) == []


@pytest.fixture(scope="module")
def torch_runtime() -> dict:
    return yaml.safe_load(
        release_file(TRAINER_MODULE, TRAINER, "manifests/base/runtimes/torch_distributed.yaml").read_text()
    )


def test_trainjob_fits_trainers_crd_and_patches_what_the_torch_runtime_has(torch_runtime):
    tj = training.trainjob_manifest(request(2), 2)
    check_against_crd(tj, TRAINER_MODULE, TRAINER, "manifests/base/crds/trainer.kubeflow.org_trainjobs.yaml")
    spec = tj["spec"]
    # The runtime it names is the one Trainer ships, and what it patches exists there.
    assert torch_runtime["kind"] == spec["runtimeRef"]["kind"] == "ClusterTrainingRuntime"
    assert torch_runtime["metadata"]["name"] == spec["runtimeRef"]["name"] == "torch-distributed"
    (rjob,) = torch_runtime["spec"]["template"]["spec"]["replicatedJobs"]
    (patched,) = spec["runtimePatches"][0]["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"]
    assert rjob["name"] == patched["name"] == "node"
    runtime_container = rjob["template"]["spec"]["template"]["spec"]["containers"][0]["name"]
    assert [c["name"] for c in patched["template"]["spec"]["template"]["spec"]["containers"]] == [runtime_container]
    # The whole gang: 2 nodes of 8 GPUs, one process per GPU, suspended for Kueue.
    trainer = spec["trainer"]
    assert (trainer["numNodes"], trainer["numProcPerNode"]) == (2, 8)
    assert trainer["resourcesPerNode"]["limits"]["nvidia.com/gpu"] == "8"
    assert spec["suspend"] is True and tj["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "gpulab-vision"
    assert tj["metadata"]["labels"]["gpulab.io/job-id"] == "7"
    # The script's arguments are the shell's positional parameters; torchrun reads Trainer's PET_*.
    assert trainer["command"] == ["/bin/sh", "-c", jobspec.SCRIPT_SHELL, "gpulab-job", *ARGS]
    env = {e["name"]: e.get("value") for e in trainer["env"]}
    assert env["GPULAB_NODES"] == "2" and env["GPULAB_CHECKPOINT_DIR"].endswith("exp/runs/train-1.checkpoints")
    pod = patched["template"]["spec"]["template"]
    assert pod["metadata"]["labels"]["gpulab.io/job-id"] == "7"
    assert pod["spec"]["volumes"][0]["persistentVolumeClaim"]["claimName"] == "claim-alice"


def test_jobset_fits_jobsets_crd_sets_torchruns_environment_and_restarts_the_gang_whole():
    js = training.jobset_manifest(request(4), 4)
    check_against_crd(js, JOBSET_MODULE, JOBSET, "config/components/crd/bases/jobset.x-k8s.io_jobsets.yaml")
    spec = js["spec"]
    (rjob,) = spec["replicatedJobs"]
    assert (rjob["name"], rjob["replicas"]) == ("node", 4) and spec["suspend"] is True
    job = rjob["template"]["spec"]
    assert (job["parallelism"], job["completions"], job["backoffLimit"]) == (1, 1, 0)
    assert job["activeDeadlineSeconds"] == 7200
    pod = job["template"]["spec"]
    assert pod["terminationGracePeriodSeconds"] == 60 and pod["priorityClassName"] == "gpulab-training"
    env = {e["name"]: e for e in pod["containers"][0]["env"]}
    assert env["PET_NNODES"]["value"] == "4" and env["PET_NPROC_PER_NODE"]["value"] == "8"
    assert (
        env["PET_MASTER_ADDR"]["value"]
        == "gpulab-job-7-node-0-0.gpulab-job-7"
        == (f"{js['metadata']['name']}-node-0-0.{spec['network']['subdomain']}")
    )
    assert (
        env["PET_NODE_RANK"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.labels['jobset.sigs.k8s.io/job-index']"
    )
    rules = {r["name"]: r for r in spec["failurePolicy"]["rules"]}
    # JobSet v0.11.1's webhook refuses other names (pkg/webhooks/jobset_webhook.go, ruleNameFmt).
    assert all(re.fullmatch(r"[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?", name) for name in rules), rules
    assert rules["TheScriptRaised"]["action"] == "FailJobSet"
    assert rules["PreemptedOrDrained"]["action"] == "RestartJobSetAndIgnoreMaxRestarts"
    assert rules["TimeLimit"]["onJobFailureReasons"] == ["DeadlineExceeded"]
    # The message patterns match what the Job controller writes for the pod failure policy's rules
    # (k8s.io/kubernetes pkg/controller/job/pod_failure_policy.go).

    raised = "Container script for pod team-vision/p-0 failed with exit code 1 matching FailJob rule at index 0"
    drained = "Pod team-vision/p-0 has condition DisruptionTarget matching FailJob rule at index 1"
    assert re.search(rules["TheScriptRaised"]["onJobFailureMessagePatterns"][0], raised)
    assert not re.search(rules["TheScriptRaised"]["onJobFailureMessagePatterns"][0], drained)
    assert re.search(rules["PreemptedOrDrained"]["onJobFailureMessagePatterns"][0], drained)


def test_the_strict_check_finds_a_field_the_api_server_would_prune():
    tj = training.trainjob_manifest(request(2), 2)
    tj["spec"]["trainer"]["numGPUs"] = 16
    schema = crd_schema(TRAINER_MODULE, TRAINER, "manifests/base/crds/trainer.kubeflow.org_trainjobs.yaml", "v1alpha1")
    assert unknown_fields(tj, schema) == [".spec.trainer.numGPUs"]


def test_the_charts_runtime_keeps_trainers_torch_runtime_and_adds_gpulabs_failure_policy(torch_runtime):
    """The chart's ClusterTrainingRuntime is Trainer's torch one (its ML policy, its replicated
    job and container names, which the TrainJob's patch names) plus the failure policy."""
    from hub_config.jobs.settings import GPULabJobs
    from tests.support.helm import CHART, helm

    def runtimes(release: str) -> list[dict]:
        rendered = helm("template", release, str(CHART), "--set", "training.enabled=true").stdout
        return [d for d in yaml.safe_load_all(rendered) if d and d["kind"] == "ClusterTrainingRuntime"]

    # Cluster-scoped, so named after the release (two releases share a cluster); release
    # gpulab's is the hub's default.
    (ours,) = runtimes("gpulab")
    assert ours["metadata"]["name"] == GPULabJobs().kube_training_runtime == "gpulab-torch-distributed"
    assert [r["metadata"]["name"] for r in runtimes("staging")] == ["staging-torch-distributed"]
    assert ours["spec"]["mlPolicy"] == torch_runtime["spec"]["mlPolicy"]
    (node,) = ours["spec"]["template"]["spec"]["replicatedJobs"]
    (theirs,) = torch_runtime["spec"]["template"]["spec"]["replicatedJobs"]
    assert node["name"] == theirs["name"] == training.NODE
    assert node["template"]["metadata"] == theirs["template"]["metadata"]
    assert [c["name"] for c in node["template"]["spec"]["template"]["spec"]["containers"]] == [training.NODE]
    assert node["template"]["spec"]["template"]["spec"]["restartPolicy"] == "Never"  # a podFailurePolicy needs it
    rules = {r["name"]: r for r in ours["spec"]["template"]["spec"]["failurePolicy"]["rules"]}
    assert rules["PreemptedOrDrained"]["action"] == "RestartJobSetAndIgnoreMaxRestarts"
    assert all(re.fullmatch(r"[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?", name) for name in rules), rules
    off = helm("template", "x", str(CHART)).stdout
    assert "ClusterTrainingRuntime" not in off


def _gang(status: dict, suspend: bool = False) -> dict:
    return {"kind": "TrainJob", "spec": {"suspend": suspend}, "status": status}


def test_a_gang_runs_only_while_every_node_runs():
    # Trainer: one Job of numNodes pods, ready once all of them run (Trainer v2.2.0 JobStatus).
    assert training.gang_state(_gang({"jobsStatus": [{"name": "node", "ready": 1, "active": 1}]}), 2)[0] == (
        jobspec.RUNNING
    )
    state, reason = training.gang_state(_gang({"jobsStatus": [{"name": "node", "ready": 0, "active": 1}]}), 2)
    assert (
        state == jobspec.QUEUED and reason == "admitted: waiting for all 2 nodes of the gang to be placed and started"
    )
    # gpulab's JobSet: a Job per node; one of two ready is not running.
    half = {"kind": "JobSet", "status": {"replicatedJobsStatus": [{"name": "node", "ready": 1, "active": 2}]}}
    assert training.gang_state(half, 2)[0] == jobspec.QUEUED
    whole = {"kind": "JobSet", "status": {"replicatedJobsStatus": [{"name": "node", "ready": 2, "active": 2}]}}
    assert training.gang_state(whole, 2)[0] == jobspec.RUNNING
    assert training.gang_state({"kind": "JobSet", "status": {}}, 2)[0] == jobspec.QUEUED


def test_a_suspended_gang_is_queued_with_kueues_words():
    workload = {
        "status": {
            "conditions": [
                {"type": "QuotaReserved", "status": "False", "reason": "Pending", "message": "insufficient quota"}
            ]
        }
    }
    state, reason = training.gang_state(_gang({}, suspend=True), 3, training.workload_admission(workload))
    assert state == jobspec.QUEUED
    assert reason == "waiting for Kueue to admit the whole gang (3 nodes at once): insufficient quota"
    assert training.workload_admission({"status": {"conditions": [{"type": "QuotaReserved", "status": "True"}]}}) == ""


def test_a_finished_gang_reads_as_succeeded_failed_or_timed_out():
    done = {"conditions": [{"type": "Complete", "status": "True"}]}
    assert training.gang_state(_gang(done), 2)[0] == jobspec.SUCCEEDED
    assert training.gang_state({"status": {"conditions": [{"type": "Completed", "status": "True"}]}}, 2)[0] == (
        jobspec.SUCCEEDED
    )
    failed = {"conditions": [{"type": "Failed", "status": "True", "reason": "FailedJobs", "message": "boom"}]}
    assert training.gang_state(_gang(failed), 2) == (jobspec.FAILED, "boom")
    late = {"conditions": [{"type": "Failed", "status": "True", "reason": "DeadlineExceeded", "message": "late"}]}
    assert training.gang_state(_gang(late), 2)[0] == jobspec.TIMED_OUT
    assert training.restarts({"status": {"restarts": 2}}) == 2 and training.restarts({}) == 0


def test_each_node_of_a_gang_is_on_its_own_node():
    req = request()
    for body in (training.trainjob_manifest(req, 2), training.jobset_manifest(req, 2)):
        text = str(body)
        assert "podAntiAffinity" in text and "kubernetes.io/hostname" in text
