"""Notebook jobs on the real control plane: the real Job controller and scheduler.

A real hub configured as Zero to JupyterHub configures it with gpulab's overlay
(``c.GPULabJobs.backend_class = "hub_config.jobs.backends.kube.KubeJobBackend"``) creates ``batch/v1``
Jobs as the chart-bound hub ServiceAccount. The real Job controller makes the
pods, the real scheduler binds (and preempts) them, and the node agent plays
the kubelet; a test ends a pod's container the way the notebook runner would
(exit code) or evicts it through the Eviction API.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator

import pytest
import yaml

from tests.kube.bed.chart import Release
from tests.kube.bed.cluster import Cluster
from tests.kube.bed.z2jh_hub_config import bed_hub
from tests.support.hub import RunningHub
from tests.support.jobs import get_job, submit, user_token, wait_state
from tests.support.kube_spawner import chart_team

A100_SELECTOR = {"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB"}


def jobs_hub_for(
    release: Release, workdir, guarantee: float, extra: str = "", homes: bool = False, site_extra: dict | None = None
) -> RunningHub:
    """A hub running notebook jobs on the cluster as the chart-bound hub ServiceAccount,
    configured as Zero to JupyterHub configures it (tests/kube/bed/z2jh_hub_config.py): job
    pods go to z2jh's user-scheduler, like the servers."""
    nlp = chart_team(release, "nlp")
    catalog = {
        "sharing": {"backend": "whole"},
        "profiles": [{"slug": "a100-1", "display_name": "1 × A100", "gpus": 1, "gpu_model": "A100-80GB"}],
        "teams": [
            {"name": nlp, "users": ["carol"], "guarantee": guarantee, "burst": 2, "namespace": release.team_ns(nlp)}
        ],
    }
    # The overlay's extraConfig sets the Kubernetes backend; the rest is the test's values.
    jobs = {"poll_interval": 0.3, "kube_image": "quay.io/jupyter/scipy-notebook:2024-10-07"}
    site: dict = {"hub": {"config": {"GPULabJobs": jobs}}}
    if homes:  # z2jh's default storage: a claim per user (the bed has no provisioner: it stays Pending)
        site["singleuser"] = {
            "storage": {"type": "dynamic", "capacity": "2Gi", "dynamic": {"storageClass": "gpulab-bed-homes"}}
        }
    else:
        jobs["kube_home_claim_template"] = ""
    for key, value in (site_extra or {}).items():
        site[key] = {**site.get(key, {}), **value}
    return bed_hub(workdir, release.hub_namespace, release.hub_kubeconfig, yaml.safe_dump(catalog), site, extra)


def member_token(hub: RunningHub, user: str) -> str:
    """A token of ``user``, created in the hub first: z2jh's hub knows a user once they
    log in (or an admin adds them), not from the catalog."""
    r = hub.api("POST", f"/users/{user}")
    assert r.status_code in (201, 409), r.text
    return user_token(hub, user)


@pytest.fixture(scope="module")
def jobs_hub(gpulab_release: Release, tmp_path_factory) -> Iterator[RunningHub]:
    # nlp's guarantee is half a GPU, so a 1-GPU batch job borrows (runs over quota).
    hub = jobs_hub_for(gpulab_release, tmp_path_factory.mktemp("jobs-kube"), guarantee=0.5)
    hub.start()
    yield hub
    hub.close()


@pytest.fixture
def carol(jobs_hub: RunningHub, release: Release) -> str:
    return member_token(jobs_hub, "carol")


def job_pods(kube: Cluster, ns: str, job_id: int) -> list[dict]:
    return kube.pods(ns, f"job-name=gpulab-job-{job_id}")


def running_pod(kube: Cluster, ns: str, job_id: int, exclude: set[str] = frozenset()) -> dict:
    try:
        return kube.wait(
            lambda: next(
                (
                    p
                    for p in job_pods(kube, ns, job_id)
                    if p["metadata"]["name"] not in exclude
                    and p["status"].get("phase") == "Running"
                    and not p["metadata"].get("deletionTimestamp")
                ),
                None,
            ),
            f"a Running pod of job {job_id}",
            60,
        )
    except AssertionError as e:  # say why: the Job's conditions and what happened to its pods
        job = kube.maybe_get(f"/apis/batch/v1/namespaces/{ns}/jobs/gpulab-job-{job_id}") or {}
        events = [
            f"{ev['involvedObject']['name']}: {ev['reason']}: {ev['message']}"
            for name in [f"gpulab-job-{job_id}", *(p["metadata"]["name"] for p in job_pods(kube, ns, job_id))]
            for ev in kube.events(ns, name)
        ]
        raise AssertionError(f"{e}; Job status {job.get('status')}; events {events}") from None


def k8s_job(kube: Cluster, ns: str, job_id: int) -> dict:
    """The Job object (the hub creates it just after answering the submission)."""
    return kube.wait(
        lambda: kube.maybe_get(f"/apis/batch/v1/namespaces/{ns}/jobs/gpulab-job-{job_id}"),
        f"Job gpulab-job-{job_id}",
        30,
    )


def test_a_job_runs_to_succeeded_by_the_job_controller(jobs_hub, release, kube, carol):
    ns = release.team_ns(chart_team(release, "nlp"))
    job = submit(jobs_hub, carol, notebook="exp/calc.ipynb", job_class="batch", profile="a100-1")
    pod = running_pod(kube, ns, job["id"])
    assert pod["spec"]["nodeName"] == "gpu-a100-mig"  # the only node with a whole A100
    assert pod["spec"]["schedulerName"] == "jhub-user-scheduler"  # the servers' scheduler, from z2jh's config
    running = wait_state(jobs_hub, job["id"], "running", timeout=30)
    assert running["started_at"]
    kube.finish_pod(ns, pod["metadata"]["name"], 0)
    done = wait_state(jobs_hub, job["id"], "succeeded", timeout=60)
    assert [h["state"] for h in done["history"]] == ["queued", "running", "succeeded"]
    obj = k8s_job(kube, ns, job["id"])
    assert any(c["type"] == "Complete" and c["status"] == "True" for c in obj["status"]["conditions"])
    assert [w for w in jobs_hub.holdings() if w["kind"] == "job"] == []


def test_an_evicted_pod_is_rerun_and_not_counted_as_a_failure(jobs_hub, release, kube, carol):
    ns = release.team_ns(chart_team(release, "nlp"))
    job = submit(jobs_hub, carol, notebook="exp/calc.ipynb", job_class="batch", profile="a100-1")
    first = running_pod(kube, ns, job["id"])
    wait_state(jobs_hub, job["id"], "running", timeout=30)
    kube.evict_pod(ns, first["metadata"]["name"])
    # The Job controller matches the DisruptionTarget condition the API server set
    # (podFailurePolicy action Ignore): a new pod, and no failure counted.
    second = running_pod(kube, ns, job["id"], exclude={first["metadata"]["name"]})
    obj = k8s_job(kube, ns, job["id"])
    assert int(obj["status"].get("failed") or 0) == 0, obj["status"]
    kube.finish_pod(ns, second["metadata"]["name"], 0)
    done = wait_state(jobs_hub, job["id"], "succeeded", timeout=60)
    assert "failed" not in [h["state"] for h in done["history"]]


def test_over_quota_batch_work_is_preempted_by_the_scheduler_and_waits(jobs_hub, release, kube, carol):
    ns = release.team_ns(chart_team(release, "nlp"))
    other = release.team_ns(chart_team(release, "vision"))
    job = submit(jobs_hub, carol, notebook="exp/calc.ipynb", job_class="batch", profile="a100-1")
    assert job["over_quota"] is True  # 1 GPU above nlp's 0.5 guarantee
    victim = running_pod(kube, ns, job["id"])
    assert victim["spec"]["priorityClassName"] == "gpulab-over-quota"
    wait_state(jobs_hub, job["id"], "running", timeout=30)
    # Another team's in-quota notebook needs that A100.
    kube.create(
        f"/api/v1/namespaces/{other}/pods",
        {
            "metadata": {"name": "guaranteed-notebook"},
            "spec": {
                "priorityClassName": "gpulab-development",
                "nodeSelector": A100_SELECTOR,
                "containers": [
                    {
                        "name": "notebook",
                        "image": "quay.io/jupyter/base-notebook:2024-10-07",
                        "resources": {"limits": {"nvidia.com/gpu": "1"}},
                    }
                ],
            },
        },
    )
    kube.wait_pod(other, "guaranteed-notebook", "Running", 60)
    assert kube.pod(other, "guaranteed-notebook")["spec"]["nodeName"] == "gpu-a100-mig"
    # The scheduler preempted the borrowed batch pod; the Job made a new one, which waits.
    kube.wait(lambda: kube.pod(ns, victim["metadata"]["name"]) is None, "the preempted pod to go", 60)
    waiting = wait_state(jobs_hub, job["id"], "queued", timeout=60)
    assert "waiting" in waiting["reason"]
    pending = kube.wait(
        lambda: [p for p in job_pods(kube, ns, job["id"]) if p["status"].get("phase") == "Pending"],
        "the replacement pod",
        30,
    )
    assert int(k8s_job(kube, ns, job["id"])["status"].get("failed") or 0) == 0
    # A Job counts a Pending pod as active: the hub must not call that running.
    kube.wait(lambda: int(k8s_job(kube, ns, job["id"])["status"].get("active") or 0) == 1, "active 1", 30)
    time.sleep(1.5)  # several of the hub's 0.3 s polls
    still = jobs_hub.api("GET", f"/gpulab/jobs/{job['id']}", token=carol).json()
    assert still["state"] == "queued" and pending, still
    # When the GPU frees up, the batch work runs again and finishes.
    kube.request("DELETE", f"/api/v1/namespaces/{other}/pods/guaranteed-notebook")
    again = running_pod(kube, ns, job["id"])
    wait_state(jobs_hub, job["id"], "running", timeout=60)
    kube.finish_pod(ns, again["metadata"]["name"], 0)
    done = wait_state(jobs_hub, job["id"], "succeeded", timeout=60)
    states = [h["state"] for h in done["history"]]
    assert states[:2] == ["queued", "running"] and states[-1] == "succeeded" and "failed" not in states
    assert json.dumps(done)  # the record stays serialisable end to end


@pytest.fixture(scope="module")
def kueue_hub(gpulab_release: Release, tmp_path_factory) -> Iterator[RunningHub]:
    """A hub whose jobs go through the team's Kueue LocalQueue (the chart's `gpulab-<team>`,
    which is also the jobs service's default queue name)."""
    hub = jobs_hub_for(
        gpulab_release, tmp_path_factory.mktemp("jobs-kueue"), guarantee=1, extra="c.GPULabJobs.kueue_enabled = True\n"
    )
    hub.start()
    yield hub
    hub.close()


def test_kueue_admits_a_suspended_job_from_the_teams_local_queue(kueue_hub, release, kube):
    nlp = chart_team(release, "nlp")
    ns = release.team_ns(nlp)
    token = member_token(kueue_hub, "carol")
    # The chart made the LocalQueue and its ClusterQueue; Kueue reports them active.
    lq = kube.get(f"/apis/kueue.x-k8s.io/v1beta2/namespaces/{ns}/localqueues/gpulab-{nlp}")
    assert lq["spec"]["clusterQueue"]
    # Written by helm in Kueue's v1beta2 API (v1beta1 is deprecated; its `cohort` is `cohortName`).
    cq = kube.get(f"/apis/kueue.x-k8s.io/v1beta2/clusterqueues/{lq['spec']['clusterQueue']}")
    assert cq["spec"]["cohortName"] == "gpulab"
    for obj in (lq, cq):
        versions = {f["apiVersion"] for f in obj["metadata"]["managedFields"] if f["manager"] == "helm"}
        assert versions == {"kueue.x-k8s.io/v1beta2"}, versions
    job = submit(kueue_hub, token, notebook="exp/calc.ipynb", job_class="batch", profile="a100-1")
    obj = k8s_job(kube, ns, job["id"])
    assert obj["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == f"gpulab-{nlp}"
    # Kueue made a Workload for it, admitted it and unsuspended the Job.
    kube.wait(lambda: k8s_job(kube, ns, job["id"])["spec"]["suspend"] is False, "Kueue to admit the Job", 60)
    workloads = kube.get(f"/apis/kueue.x-k8s.io/v1beta2/namespaces/{ns}/workloads")["items"]
    mine = [
        w
        for w in workloads
        if any(o["name"] == f"gpulab-job-{job['id']}" for o in w["metadata"].get("ownerReferences", []))
    ]
    assert mine and any(c["type"] == "Admitted" and c["status"] == "True" for c in mine[0]["status"]["conditions"])
    pod = running_pod(kube, ns, job["id"])
    wait_state(kueue_hub, job["id"], "running", timeout=30)
    kube.finish_pod(ns, pod["metadata"]["name"], 0)
    done = wait_state(kueue_hub, job["id"], "succeeded", timeout=60)
    assert [h["state"] for h in done["history"]] == ["queued", "running", "succeeded"]


def test_the_job_the_hub_creates_is_accepted_and_carries_gpu_priority_and_labels(jobs_hub, release, kube, carol):
    ns = release.team_ns(chart_team(release, "nlp"))
    job = submit(
        jobs_hub,
        carol,
        notebook="exp/calc.ipynb",
        job_class="batch",
        profile="a100-1",
        parameters={"x": 5, "lr": 0.01},
        time_limit_seconds=7200,
        name="sweep",
    )
    assert job["backend"] == "kubernetes" and job["gpu_milli"] == 1000
    obj = k8s_job(kube, ns, job["id"])  # the real API server validated and stored it
    md, spec = obj["metadata"], obj["spec"]
    assert md["labels"]["gpulab.io/kind"] == "job" and md["labels"]["gpulab.io/gpu-milli"] == "1000"
    assert md["annotations"]["gpulab.io/workload-key"] == f"job:{job['id']}"
    assert spec["activeDeadlineSeconds"] == 7200
    assert spec["podFailurePolicy"]["rules"] == [
        {"action": "FailJob", "onExitCodes": {"containerName": "papermill", "operator": "In", "values": [1]}},
        {"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}]},
    ]
    pod = spec["template"]["spec"]
    # As z2jh's single-user pods (uid 1000, fsGroup 100 unless c.KubeSpawner says otherwise),
    # within the "restricted" Pod Security Standard.
    assert pod["securityContext"] == {
        "runAsUser": 1000,
        "runAsNonRoot": True,
        "fsGroup": 100,
        "seccompProfile": {"type": "RuntimeDefault"},
    }
    assert pod["automountServiceAccountToken"] is False
    assert pod["restartPolicy"] == "Never" and pod["nodeSelector"] == A100_SELECTOR
    c = pod["containers"][0]
    assert c["resources"]["limits"]["nvidia.com/gpu"] == "1"
    env = {e["name"]: e.get("value") for e in c["env"]}
    assert json.loads(env["GPULAB_PARAMETERS"]) == {"x": 5, "lr": 0.01}
    running_pod(kube, ns, job["id"])  # scheduled and started by the real controllers


def test_a_job_gets_the_volumes_scheduling_and_pod_config_z2jh_gives_the_servers(release, kube, tmp_path):
    """Z2jh's singleuser.storage.extraVolumes / extraVolumeMounts, singleuser.extraTolerations,
    singleuser.nodeSelector, scheduling.userPods.nodeAffinity.matchNodePurpose: require and
    singleuser.extraPodConfig reach a job's pod as they reach the servers (through the z2jh
    loader into c.KubeSpawner), except the fields a Job owns (restartPolicy). The required
    node purpose holds the pod until a node carries it, as it would a server."""
    site = {
        "singleuser": {
            "storage": {
                "extraVolumes": [{"name": "scratch-{username}", "emptyDir": {"sizeLimit": "1Gi"}}],
                "extraVolumeMounts": [{"name": "scratch-{username}", "mountPath": "/scratch"}],
            },
            "extraTolerations": [{"key": "dedicated", "operator": "Equal", "value": "ml", "effect": "NoSchedule"}],
            "nodeSelector": {"gpulab.io/pool": "mig"},
            "extraPodConfig": {"dnsConfig": {"options": [{"name": "ndots", "value": "2"}]}, "restartPolicy": "Always"},
        },
        "scheduling": {"userPods": {"nodeAffinity": {"matchNodePurpose": "require"}}},
    }
    hub = jobs_hub_for(release, tmp_path, guarantee=1, site_extra=site)
    hub.start()
    node = "/api/v1/nodes/gpu-a100-mig"
    try:
        token = member_token(hub, "carol")
        ns = release.team_ns(chart_team(release, "nlp"))
        job = submit(hub, token, notebook="exp/calc.ipynb", job_class="batch", profile="a100-1")
        pod = k8s_job(kube, ns, job["id"])["spec"]["template"]["spec"]
        assert {"name": "scratch-carol", "emptyDir": {"sizeLimit": "1Gi"}} in pod["volumes"]
        assert {"name": "scratch-carol", "mountPath": "/scratch"} in pod["containers"][0]["volumeMounts"]
        assert {"key": "dedicated", "operator": "Equal", "value": "ml", "effect": "NoSchedule"} in pod["tolerations"]
        assert pod["nodeSelector"] == {"gpulab.io/pool": "mig", **A100_SELECTOR}
        [term] = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
        assert {"key": "hub.jupyter.org/node-purpose", "operator": "In", "values": ["user"]} in term["matchExpressions"]
        assert pod["dnsConfig"] == {"options": [{"name": "ndots", "value": "2"}]}
        assert pod["restartPolicy"] == "Never", "a Job's pod must not restart in place"
        # No node is a user node yet: the scheduler holds the pod, as it would a server.
        kube.wait(
            lambda: any(
                e["reason"] == "FailedScheduling"
                for p in job_pods(kube, ns, job["id"])
                for e in kube.events(ns, p["metadata"]["name"])
            ),
            "the scheduler to have refused the job's pod for its node purpose",
            60,
        )
        kube.patch(node, {"metadata": {"labels": {"hub.jupyter.org/node-purpose": "user"}}})
        assert running_pod(kube, ns, job["id"])["spec"]["nodeName"] == "gpu-a100-mig"
    finally:
        kube.patch(node, {"metadata": {"labels": {"hub.jupyter.org/node-purpose": None}}})
        hub.close()


def test_the_time_limit_is_the_job_controllers_deadline(jobs_hub, release, kube, carol):
    ns = release.team_ns(chart_team(release, "nlp"))
    job = submit(jobs_hub, carol, notebook="exp/calc.ipynb", job_class="batch", profile="a100-1", time_limit_seconds=60)
    running_pod(kube, ns, job["id"])
    # Shorten the deadline the hub set, so the real Job controller enforces it within the test.
    kube.patch(f"/apis/batch/v1/namespaces/{ns}/jobs/gpulab-job-{job['id']}", {"spec": {"activeDeadlineSeconds": 2}})
    done = wait_state(jobs_hub, job["id"], "timed-out", timeout=60)
    assert "deadline" in done["reason"].lower()
    kube.wait(
        lambda: not [p for p in job_pods(kube, ns, job["id"]) if p["status"].get("phase") == "Running"],
        "the controller to stop the pod",
        60,
    )


def test_training_over_the_guarantee_is_refused_before_any_job(jobs_hub, release, kube, carol):
    ns = release.team_ns(chart_team(release, "nlp"))
    offset = kube.tb.audit_offset()
    r = jobs_hub.api(
        "POST",
        "/gpulab/jobs",
        token=carol,
        data=json.dumps({"notebook": "exp/calc.ipynb", "job_class": "training", "profile": "a100-1"}),
    )
    assert r.status_code == 403 and "never admitted over quota" in r.json()["message"], r.text
    creates = [
        e
        for e in kube.tb.audit_events(offset, f"system:serviceaccount:{release.hub_namespace}:hub")
        if e["verb"] == "create" and e["objectRef"]["resource"] == "jobs"
    ]
    assert creates == [] and kube.get(f"/apis/batch/v1/namespaces/{ns}/jobs")["items"] == []


def test_cancel_deletes_the_job_and_its_pod(jobs_hub, release, kube, carol):
    ns = release.team_ns(chart_team(release, "nlp"))
    job = submit(jobs_hub, carol, notebook="exp/calc.ipynb", job_class="batch", profile="a100-1")
    running_pod(kube, ns, job["id"])
    r = jobs_hub.api("POST", f"/gpulab/jobs/{job['id']}/cancel", token=carol)
    assert r.status_code == 200 and r.json()["state"] == "cancelled", r.text
    kube.wait(
        lambda: kube.maybe_get(f"/apis/batch/v1/namespaces/{ns}/jobs/gpulab-job-{job['id']}") is None,
        "the Job to be deleted",
        30,
    )
    kube.wait(lambda: not job_pods(kube, ns, job["id"]), "the garbage collector to delete its pod", 60)


def test_a_job_deleted_behind_the_hubs_back_fails_with_a_reason(jobs_hub, release, kube, carol):
    ns = release.team_ns(chart_team(release, "nlp"))
    job = submit(jobs_hub, carol, notebook="exp/calc.ipynb", job_class="batch", profile="a100-1")
    running_pod(kube, ns, job["id"])
    wait_state(jobs_hub, job["id"], "running", timeout=30)
    kube.request("DELETE", f"/apis/batch/v1/namespaces/{ns}/jobs/gpulab-job-{job['id']}?propagationPolicy=Background")
    done = wait_state(jobs_hub, job["id"], "failed", timeout=30)
    assert "disappeared" in done["reason"]


def test_a_job_that_finished_while_the_hub_was_down_is_read_back(jobs_hub, release, kube, carol):
    ns = release.team_ns(chart_team(release, "nlp"))
    job = submit(jobs_hub, carol, notebook="exp/calc.ipynb", job_class="batch", profile="a100-1")
    pod = running_pod(kube, ns, job["id"])
    wait_state(jobs_hub, job["id"], "running", timeout=30)
    jobs_hub.stop()
    kube.finish_pod(ns, pod["metadata"]["name"], 0)
    kube.wait(
        lambda: any(
            c["type"] == "Complete" for c in k8s_job(kube, ns, job["id"]).get("status", {}).get("conditions", [])
        ),
        "Complete",
        60,
    )
    jobs_hub.start()
    done = wait_state(jobs_hub, job["id"], "succeeded", timeout=60)
    assert [h["state"] for h in done["history"]] == ["queued", "running", "succeeded"]
    assert f"job:{job['id']}" not in {w["key"] for w in jobs_hub.holdings()}


def test_logs_need_the_home_mounted_on_the_hub(jobs_hub, carol):
    jobs = jobs_hub.api("GET", "/gpulab/jobs", token=carol).json()["jobs"]
    r = jobs_hub.api("GET", f"/gpulab/jobs/{jobs[0]['id']}/logs", token=carol)
    assert r.status_code == 409 and "mount" in r.json()["message"]


def test_a_user_who_never_started_a_server_gets_the_home_claim_kubespawner_would_make(
    gpulab_release: Release, kube: Cluster, tmp_path
):
    """Under z2jh's dynamic storage the home claim of a user appears at the first spawn;
    a job submitted before any spawn in the team namespace creates the same claim (the
    name, size, class and access mode z2jh gives KubeSpawner), and the Job's pod mounts it.
    (The bed has no storage provisioner: the claim stays Pending, and so does the pod.)"""
    release = gpulab_release
    ns = release.team_ns(chart_team(release, "nlp"))
    hub = jobs_hub_for(release, tmp_path / "hub", guarantee=1, homes=True)
    hub.start()
    try:
        token = member_token(hub, "carol")
        claim = f"/api/v1/namespaces/{ns}/persistentvolumeclaims/claim-carol"
        assert kube.maybe_get(claim) is None  # carol never started a server here
        job = submit(hub, token, notebook="exp/calc.ipynb", job_class="batch", profile="a100-1")
        pvc = kube.wait(lambda: kube.maybe_get(claim), "carol's home claim", 30)
        assert pvc["spec"]["resources"]["requests"]["storage"] == "2Gi"
        assert pvc["spec"]["storageClassName"] == "gpulab-bed-homes"
        assert pvc["spec"]["accessModes"] == ["ReadWriteOnce"]
        pod_spec = k8s_job(kube, ns, job["id"])["spec"]["template"]["spec"]
        assert {"name": "home", "persistentVolumeClaim": {"claimName": "claim-carol"}} in pod_spec["volumes"]
        assert get_job(hub, job["id"])["state"] in ("queued", "running")
        hub.api("POST", f"/gpulab/jobs/{job['id']}/cancel", token=token)
        wait_state(hub, job["id"], "cancelled")
    finally:
        hub.close()
        kube.request("DELETE", f"/api/v1/namespaces/{ns}/persistentvolumeclaims/claim-carol")
