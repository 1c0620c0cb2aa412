"""Notebook jobs on the Kubernetes backend, against the API-server stand-in over real HTTP.

A real hub (tests/hub_harness.py) with ``c.GPULabJobs.backend = "kubernetes"``
talks to tests/kube_api_server.py through KubeSpawner's own
``kubernetes_asyncio`` client. No Job controller runs there: the test plays
the controller (and Kueue) by patching the Job's spec and status, the way
they would, and checks that the hub's API follows.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time

import kubernetes_validate
import pytest
import requests

from spawner.labels import kueue_local_queue, label_value
from tests.hub_harness import REPO, RunningHub, free_port
from tests.jobs_fixtures import submit, user_token, wait_state

pytestmark = pytest.mark.integration

NS = "team-vision"
CATALOG = f"""
sharing:
  backend: timeslice
  timeslice: {{replicas: 2}}
profiles:
  - {{slug: h100-half, display_name: "0.5 × H100", gpus: 0.5, gpu_model: H100-80GB}}
  - {{slug: h100-1, display_name: "1 × H100", gpus: 1, gpu_model: H100-80GB,
      images: [{{slug: torch, display_name: PyTorch, image: "example.org/torch-notebook:2.4"}}],
      tolerations: [{{key: dedicated, operator: Equal, value: ml, effect: NoSchedule}}],
      node_affinity_required: [{{matchExpressions: [{{key: topology.kubernetes.io/zone, operator: In,
                                                     values: [zone-a]}}]}}]}}
teams:
  - {{name: vision, users: [alice, bob], guarantee: 1, burst: 2, namespace: {NS},
      allowed_profiles: [h100-half, h100-1]}}
"""

EXTRA = """
c.GPULabJobs.backend = "kubernetes"
c.GPULabJobs.poll_interval = 0.3
c.GPULabJobs.kueue_enabled = True
c.GPULabJobs.kube_image = "example.org/scipy-notebook:2024"
# What z2jh sets for its single-user pods (singleuser.uid, fsGid, image.pullSecrets).
c.KubeSpawner.uid = 1000
c.KubeSpawner.fs_gid = 100
c.KubeSpawner.image_pull_secrets = ["image-pull-secret"]
"""


@pytest.fixture(scope="module")
def kube(tmp_path_factory):
    port = free_port()
    log = open(tmp_path_factory.mktemp("kube") / "standin.log", "wb")
    proc = subprocess.Popen([sys.executable, "-m", "tests.kube_api_server", "--port", str(port)],
                            cwd=REPO, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 20
    while True:
        try:
            requests.get(url + "/version", timeout=1)
            break
        except requests.RequestException:
            if time.monotonic() > deadline or proc.poll() is not None:
                raise RuntimeError("the API-server stand-in did not start")
            time.sleep(0.2)
    yield url
    proc.terminate()
    proc.wait(10)


@pytest.fixture(scope="module")
def hub(tmp_path_factory, kube):
    work = tmp_path_factory.mktemp("jobs-kube")
    kubeconfig = work / "kubeconfig"
    kubeconfig.write_text(json.dumps({
        "apiVersion": "v1", "kind": "Config", "current-context": "standin",
        "clusters": [{"name": "standin", "cluster": {"server": kube}}],
        "users": [{"name": "standin", "user": {"token": "test"}}],
        "contexts": [{"name": "standin", "context": {"cluster": "standin", "user": "standin"}}],
    }))
    h = RunningHub(work, CATALOG, extra_config=EXTRA, env={"KUBECONFIG": str(kubeconfig)})
    h.start()
    yield h
    h.close()


@pytest.fixture(scope="module")
def alice(hub):
    return user_token(hub, "alice")


def k8s_job(kube: str, job_id: int, timeout: float = 20) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        r = requests.get(f"{kube}/apis/batch/v1/namespaces/{NS}/jobs/gpulab-job-{job_id}", timeout=5)
        if r.status_code == 200:
            return r.json()
        time.sleep(0.2)
    raise AssertionError(f"Job gpulab-job-{job_id} never appeared")


def patch_job(kube: str, job_id: int, patch: dict, status: bool = False) -> None:
    url = f"{kube}/apis/batch/v1/namespaces/{NS}/jobs/gpulab-job-{job_id}" + ("/status" if status else "")
    r = requests.patch(url, data=json.dumps(patch), timeout=5,
                       headers={"Content-Type": "application/merge-patch+json"})
    assert r.status_code == 200, r.text


def job_holdings(hub: RunningHub) -> list[dict]:
    return [w for w in hub.holdings() if w["kind"] == "job"]


def test_job_manifest_validates_and_carries_gpu_priority_labels_and_queue(hub, kube, alice):
    job = submit(hub, alice, notebook="exp/calc.ipynb", job_class="batch", profile="h100-half",
                 parameters={"x": 5, "lr": 0.01}, time_limit_seconds=7200, name="sweep")
    assert job["backend"] == "kubernetes" and job["state"] == "queued" and job["gpu_milli"] == 500
    obj = k8s_job(kube, job["id"])
    manifest = {k: v for k, v in obj.items() if k != "status"}
    kubernetes_validate.validate(manifest, kubernetes_validate.latest_version(), strict=True)

    md, spec = obj["metadata"], obj["spec"]
    assert md["namespace"] == NS
    assert md["labels"]["gpulab.io/team"] == "vision" and md["labels"]["gpulab.io/kind"] == "job"
    assert md["labels"]["gpulab.io/gpu-milli"] == "500" and md["labels"]["gpulab.io/quota"] == "in-quota"
    assert md["annotations"]["gpulab.io/workload-key"] == f"job:{job['id']}"
    # The LocalQueue the Helm chart creates in the team namespace (one name, spawner/labels.py).
    assert md["labels"]["kueue.x-k8s.io/queue-name"] == kueue_local_queue("vision") == "gpulab-vision"
    assert spec["suspend"] is True
    assert spec["activeDeadlineSeconds"] == 7200 and spec["ttlSecondsAfterFinished"] == 86400
    # A notebook that raised fails the Job at once; preemption requeues it.
    assert spec["podFailurePolicy"]["rules"] == [
        {"action": "FailJob", "onExitCodes": {"containerName": "papermill", "operator": "In", "values": [1]}},
        {"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}]}]
    pod = spec["template"]["spec"]
    assert pod["priorityClassName"] == "gpulab-batch" and pod["restartPolicy"] == "Never"
    # As z2jh's single-user pod; no API token, the registry secret.
    assert pod["securityContext"] == {"runAsUser": 1000, "fsGroup": 100}
    assert pod["automountServiceAccountToken"] is False
    assert pod["imagePullSecrets"] == [{"name": "image-pull-secret"}]
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in pod["tolerations"]
    c = pod["containers"][0]
    assert c["securityContext"] == {"allowPrivilegeEscalation": False}
    # 0.5 GPU on a 2-replica time-sliced cluster: one slice, by the spawner's sharing code.
    assert c["resources"]["limits"]["nvidia.com/gpu.shared"] == "1"
    assert c["image"] == "example.org/scipy-notebook:2024"
    env = {e["name"]: e["value"] for e in c["env"]}
    assert json.loads(env["GPULAB_PARAMETERS"]) == {"x": 5, "lr": 0.01}
    assert env["GPULAB_OUTPUT"] == job["output_path"] and env["GPULAB_NOTEBOOK"] == "exp/calc.ipynb"
    assert pod["volumes"][0]["persistentVolumeClaim"]["claimName"] == "claim-alice"
    assert spec["template"]["metadata"]["labels"]["gpulab.io/workload"] == label_value(f"job:{job['id']}")
    assert spec["template"]["metadata"]["annotations"]["gpulab.io/workload-key"] == f"job:{job['id']}"
    assert pod["nodeSelector"] == {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}


def test_cluster_status_changes_show_up_in_the_api(hub, kube, alice):
    job = submit(hub, alice, notebook="exp/calc.ipynb", job_class="training", profile="h100-half")
    obj = k8s_job(kube, job["id"])
    assert obj["spec"]["template"]["spec"]["priorityClassName"] == "gpulab-training"
    held = {w["key"]: w for w in job_holdings(hub)}
    assert held[f"job:{job['id']}"]["state"] == "reserved"
    # Kueue admits it (unsuspends); the Job controller starts a pod.
    patch_job(kube, job["id"], {"spec": {"suspend": False}})
    patch_job(kube, job["id"], {"status": {"active": 1, "ready": 1, "startTime": "2026-01-01T00:00:00Z"}}, True)
    running = wait_state(hub, job["id"], "running", timeout=20)
    assert {w["key"]: w for w in job_holdings(hub)}[f"job:{job['id']}"]["state"] == "running"
    # Kueue evicts it (suspends again): preempted, then queued.
    patch_job(kube, job["id"], {"spec": {"suspend": True}})
    patch_job(kube, job["id"], {"status": {"active": 0}}, True)
    wait_state(hub, job["id"], "queued", timeout=20)
    patch_job(kube, job["id"], {"spec": {"suspend": False}})
    patch_job(kube, job["id"], {"status": {"active": 1}}, True)
    wait_state(hub, job["id"], "running", timeout=20)
    patch_job(kube, job["id"], {"status": {"active": 0, "succeeded": 1, "conditions": [
        {"type": "Complete", "status": "True", "reason": "CompletionsReached"}]}}, True)
    done = wait_state(hub, job["id"], "succeeded", timeout=20)
    assert [h["state"] for h in done["history"]] == [
        "queued", "running", "preempted", "queued", "running", "succeeded"]
    assert running["started_at"] and done["finished_at"]
    assert f"job:{job['id']}" not in {w["key"] for w in job_holdings(hub)}


def test_deadline_exceeded_is_timed_out(hub, kube, alice):
    job = submit(hub, alice, notebook="exp/calc.ipynb", job_class="batch", profile="h100-half",
                 time_limit_seconds=60)
    k8s_job(kube, job["id"])
    patch_job(kube, job["id"], {"status": {"failed": 1, "conditions": [
        {"type": "Failed", "status": "True", "reason": "DeadlineExceeded",
         "message": "Job was active longer than specified deadline"}]}}, True)
    done = wait_state(hub, job["id"], "timed-out", timeout=20)
    assert "longer than specified deadline" in done["reason"]


def test_training_over_guarantee_is_refused_with_the_reason(hub, kube, alice):
    # The first test's batch job still holds 0.5 of vision's 1-GPU guarantee.
    before = requests.get(f"{kube}/apis/batch/v1/namespaces/{NS}/jobs", timeout=5).json()["items"]
    r = hub.api("POST", "/gpulab/jobs", token=alice, data=json.dumps(
        {"notebook": "exp/calc.ipynb", "job_class": "training", "profile": "h100-1"}))
    assert r.status_code == 403, r.text
    assert "never admitted over quota" in r.json()["message"]
    after = requests.get(f"{kube}/apis/batch/v1/namespaces/{NS}/jobs", timeout=5).json()["items"]
    assert len(after) == len(before)
    # The same request as batch may burst: admitted over quota, in the over-quota priority class.
    job = submit(hub, alice, notebook="exp/calc.ipynb", job_class="batch", profile="h100-1", image="torch")
    obj = k8s_job(kube, job["id"])
    assert job["over_quota"] is True
    assert obj["spec"]["template"]["spec"]["priorityClassName"] == "gpulab-over-quota"
    assert obj["metadata"]["labels"]["gpulab.io/quota"] == "over-quota"
    assert obj["spec"]["template"]["spec"]["containers"][0]["image"] == "example.org/torch-notebook:2.4"
    # The profile's tolerations and node affinity, beside the GPU taint's toleration.
    pod = obj["spec"]["template"]["spec"]
    assert pod["tolerations"] == [
        {"key": "dedicated", "operator": "Equal", "value": "ml", "effect": "NoSchedule"},
        {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
    assert pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"] == {
        "nodeSelectorTerms": [{"matchExpressions": [
            {"key": "topology.kubernetes.io/zone", "operator": "In", "values": ["zone-a"]}]}]}
    kubernetes_validate.validate({k: v for k, v in obj.items() if k != "status"},
                                 kubernetes_validate.latest_version(), strict=True)


def test_cancel_deletes_the_job(hub, kube, alice):
    job = submit(hub, alice, notebook="exp/calc.ipynb", job_class="batch", profile="h100-half")
    k8s_job(kube, job["id"])
    r = hub.api("POST", f"/gpulab/jobs/{job['id']}/cancel", token=alice)
    assert r.status_code == 200 and r.json()["state"] == "cancelled", r.text
    r = requests.get(f"{kube}/apis/batch/v1/namespaces/{NS}/jobs/gpulab-job-{job['id']}", timeout=5)
    assert r.status_code == 404


def test_job_deleted_behind_our_back_fails_with_a_reason(hub, kube, alice):
    job = submit(hub, alice, notebook="exp/calc.ipynb", job_class="batch", profile="h100-half")
    k8s_job(kube, job["id"])
    patch_job(kube, job["id"], {"spec": {"suspend": False}})
    patch_job(kube, job["id"], {"status": {"active": 1}}, True)
    wait_state(hub, job["id"], "running", timeout=20)
    requests.delete(f"{kube}/apis/batch/v1/namespaces/{NS}/jobs/gpulab-job-{job['id']}", timeout=5)
    done = wait_state(hub, job["id"], "failed", timeout=20)
    assert "disappeared" in done["reason"]


def test_job_finished_while_the_hub_was_down_is_read_back_from_the_cluster(hub, kube, alice):
    job = submit(hub, alice, notebook="exp/calc.ipynb", job_class="batch", profile="h100-half")
    k8s_job(kube, job["id"])
    patch_job(kube, job["id"], {"spec": {"suspend": False}})
    patch_job(kube, job["id"], {"status": {"active": 1}}, True)
    wait_state(hub, job["id"], "running", timeout=20)
    hub.stop()
    patch_job(kube, job["id"], {"status": {"active": 0, "succeeded": 1, "conditions": [
        {"type": "Complete", "status": "True"}]}}, True)
    hub.start()
    # Counted again from the database at start, then settled by the Job object.
    done = wait_state(hub, job["id"], "succeeded", timeout=30)
    assert [h["state"] for h in done["history"]] == ["queued", "running", "succeeded"]
    assert f"job:{job['id']}" not in {w["key"] for w in job_holdings(hub)}


def test_logs_need_the_home_mounted_on_the_hub(hub, alice):
    jobs = hub.api("GET", "/gpulab/jobs", token=alice).json()["jobs"]
    r = hub.api("GET", f"/gpulab/jobs/{jobs[0]['id']}/logs", token=alice)
    assert r.status_code == 409 and "mount" in r.json()["message"]


def test_a_job_kueue_suspends_stays_in_the_ledger(tmp_path, monkeypatch):
    """Kueue evicts a running Job by suspending it: its pods go, so a ledger
    rebuilt from pods drops it, but the job is queued again and still holds its share."""
    from traitlets.config import Config

    from hub_config.jobs.service import JobService
    from spawner import jobspec

    monkeypatch.setenv("GPULAB_DATA_DIR", str(tmp_path))
    (tmp_path / "catalog.yaml").write_text(CATALOG)
    c = Config()
    c.GPULab.catalog_file = str(tmp_path / "catalog.yaml")
    c.GPULabDB.db_url = f"sqlite:///{tmp_path / 'gpulab.sqlite'}"
    c.GPULabJobs.backend = "kubernetes"
    c.GPULabJobs.kueue_enabled = True
    service = JobService(config=c)
    monkeypatch.setattr(service.backend, "submitted", lambda rec: None)  # no cluster here
    rec, _ = service.submit("alice", [], {"notebook": "exp/calc.ipynb", "job_class": "batch",
                                          "profile": "h100-half"})
    key = jobspec.workload_key(rec.id)
    service.transition(rec.id, jobspec.QUEUED, "", kube_namespace=NS, kube_name=f"gpulab-job-{rec.id}")
    service.transition(rec.id, jobspec.RUNNING)
    ledger = service.runtime.ledger
    assert ledger.get(key).state == "running"
    ledger.rebuild([], keep_reserved=True)  # the spawner's rebuild from pods: the pod is gone
    assert ledger.get(key) is None
    rec = service.get(rec.id)
    service.backend._apply(rec, {"spec": {"suspend": True}, "status": {}})
    w = ledger.get(key)
    assert w is not None and w.state == "reserved" and w.milli == 500 and w.team == "vision"


@pytest.mark.parametrize("user,claim", [
    # KubeSpawner 7's safe slugs (what GPUKubeSpawner named the claim); the old
    # label escaping gave "claim-jo_smith" (an invalid DNS name: 422) and another claim.
    ("alice", "claim-alice"), ("jo_smith", "claim-jo-smith---515893c9"), ("a.b@x.com", "claim-a-b-x-com---464a0cfb"),
])
def test_the_job_mounts_the_home_claim_kubespawner_named(tmp_path, monkeypatch, user, claim):
    from traitlets.config import Config

    from hub_config.jobs.service import JobService
    from spawner.kube import expand_user_template

    monkeypatch.setenv("GPULAB_DATA_DIR", str(tmp_path))
    (tmp_path / "catalog.yaml").write_text(CATALOG)
    c = Config()
    c.GPULab.catalog_file = str(tmp_path / "catalog.yaml")
    c.GPULabDB.db_url = f"sqlite:///{tmp_path / 'gpulab.sqlite'}"
    c.GPULabJobs.backend = "kubernetes"
    backend = JobService(config=c).backend
    assert backend.home_claim(user) == claim == expand_user_template("claim-{user_server}", user)
    c.KubeSpawner.pvc_name_template = "home-{username}"  # z2jh: singleuser.storage.dynamic.pvcNameTemplate
    assert JobService(config=c).backend.home_claim(user) == expand_user_template("home-{username}", user)
