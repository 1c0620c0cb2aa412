"""The Kubernetes rules gpulab must follow, on the real control plane (scripts/kube-testbed).

Each test here failed before its fix: the real kube-scheduler, the Job
controller, the PersistentVolume binder and RBAC are what decide, not a
stand-in. The spawners come from tests/support/kube_spawner.py and the hub
identity (bound by the chart's Roles) from tests/kube/conftest.py.
"""

from __future__ import annotations

import asyncio
import subprocess
import time

import pytest
import yaml
from kubespawner import KubeSpawner

from spawner.core import jobspec
from spawner.core.catalog import catalog_from_dict
from spawner.core.sharing import pod_gpu_spec
from spawner.kube.spawner import GPUKubeSpawner
from spawner.runtime import get_runtime, set_runtime
from tests.kube.bed.chart import Release, helm, team_values
from tests.kube.bed.cluster import Cluster
from tests.kube.bed.testbed import TestbedError
from tests.support import REPO
from tests.support.helm import CHART, device_plugin_advertises
from tests.support.kube_spawner import chart_config, chart_team, spawner_for

# --------------------------------------------------------------------------
# poll() and spawns when one team namespace cannot be read


async def test_poll_survives_a_team_namespace_the_hub_cannot_list(hub_identity: Release, kube: Cluster):
    """A namespace without the hub's Role (or not created yet) must not make every
    poll raise: JupyterHub would forget running servers whose pods keep their GPUs."""
    release = hub_identity
    vision, nlp = chart_team(release, "vision"), chart_team(release, "nlp")
    config = chart_config(release)
    a = spawner_for(config, "alice", {"team": vision, "profile": "h100-half"})
    await a.start()
    nlp_ns = release.team_ns(nlp)
    binding = kube.get(f"/apis/rbac.authorization.k8s.io/v1/namespaces/{nlp_ns}/rolebindings/gpulab-hub")
    kube.request("DELETE", f"/apis/rbac.authorization.k8s.io/v1/namespaces/{nlp_ns}/rolebindings/gpulab-hub")
    try:
        # A hub restart: fresh reflectors and ledger, the saved state of alice's server.
        await KubeSpawner._stop_all_reflectors()
        set_runtime(None)
        GPUKubeSpawner._failed_namespaces.clear()
        fresh = spawner_for(config, "alice", {"team": vision, "profile": "h100-half"})
        fresh.load_state(a.get_state())
        assert await fresh.poll() is None, "alice's server runs: poll must say so"
        assert get_runtime().ledger.get(fresh.workload_key).state == "running"
        # A spawn in the unreadable namespace is refused with the reason; nothing is created.
        c = spawner_for(config, "carol", {"team": nlp, "profile": "h100-half"})
        with pytest.raises(Exception) as refused:
            await c.start()
        message = getattr(refused.value, "jupyterhub_message", "")
        assert refused.value.status_code == 503 and f"namespace {nlp_ns}" in message, message
        assert kube.pods(nlp_ns) == []
        # Another team's spawn goes on.
        b = spawner_for(config, "bob", {"team": vision, "profile": "h100-half"})
        await b.start()
        await b.stop()
    finally:
        binding = {k: binding[k] for k in ("metadata", "roleRef", "subjects")}
        binding["metadata"] = {"name": "gpulab-hub", "labels": binding["metadata"].get("labels", {})}
        kube.create(f"/apis/rbac.authorization.k8s.io/v1/namespaces/{nlp_ns}/rolebindings", binding)
        GPUKubeSpawner._failed_namespaces.clear()  # no waiting for the retry pause in the next tests
    await fresh.stop()


# --------------------------------------------------------------------------
# a user in two teams: a home per team namespace


async def test_a_user_in_two_teams_gets_a_home_in_each_team_namespace(hub_identity: Release, kube: Cluster):
    """KubeSpawner saves pvc_name and skips creating the claim once it exists; a claim
    is namespaced, so alice's server in team nlp waited for a claim only team vision had."""
    release = hub_identity
    vision, nlp = chart_team(release, "vision"), chart_team(release, "nlp")
    storage_class = f"gpulab-homes-{kube.suffix}"
    for i in range(2):  # static volumes for the binder: no provisioner in the test bed
        kube.cluster_object(
            "/api/v1/persistentvolumes",
            {
                "metadata": {"name": f"home-{kube.suffix}-{i}"},
                "spec": {
                    "capacity": {"storage": "10Gi"},
                    "accessModes": ["ReadWriteOnce"],
                    "storageClassName": storage_class,
                    "hostPath": {"path": f"/tmp/gpulab-home-{i}"},
                    "persistentVolumeReclaimPolicy": "Delete",
                },
            },
        )
    config = chart_config(release)
    config.KubeSpawner.storage_pvc_ensure = True
    config.KubeSpawner.storage_class = storage_class
    config.KubeSpawner.storage_capacity = "10Gi"
    config.KubeSpawner.volumes = [{"name": "home", "persistentVolumeClaim": {"claimName": "{pvc_name}"}}]
    config.KubeSpawner.volume_mounts = [{"name": "home", "mountPath": "/home/jovyan"}]
    config.KubeSpawner.start_timeout = 45
    a = spawner_for(config, "alice", {"team": vision, "profile": "h100-1"})
    await a.start()
    await a.stop()
    a.clear_state()
    state = a.get_state()
    assert state["pvc_name"] == "claim-alice"
    b = spawner_for(config, "alice", {"team": nlp, "profile": "h100-1"})
    b.load_state(state)
    await b.start()  # before: Pending on "persistentvolumeclaim claim-alice not found" until start_timeout
    nlp_ns = release.team_ns(nlp)
    pod = kube.pod(nlp_ns, b.pod_name)
    assert pod["status"]["phase"] == "Running"
    claim = kube.get(f"/api/v1/namespaces/{nlp_ns}/persistentvolumeclaims/claim-alice")
    assert claim["status"]["phase"] == "Bound"
    await b.stop()


# --------------------------------------------------------------------------
# time-slicing: two node pools from the chart's per-node device-plugin configs


async def test_time_sliced_and_whole_gpu_pools_coexist(hub_identity: Release, kube: Cluster):
    """With renameByDefault on every node, nodes offer only nvidia.com/gpu.shared and a
    1-GPU profile never schedules. The chart renders one config per pool, selected by
    the node label nvidia.com/device-plugin.config; the test bed's nodes advertise what
    the device plugin would with the config their label names."""
    release = hub_identity
    cm = kube.get("/api/v1/namespaces/gpu-operator/configmaps/gpulab-time-slicing")
    pools = {key: device_plugin_advertises(text)[0] for key, text in cm["data"].items()}
    nodes = kube.get("/api/v1/nodes")["items"]
    for node in nodes:
        key = node["metadata"]["labels"].get("nvidia.com/device-plugin.config")
        if key in pools:
            gpu = {r for r in node["status"]["allocatable"] if r.startswith("nvidia.com/")}
            assert gpu == pools[key], f"node {node['metadata']['name']} ({key}) advertises {gpu}"
    assert {n["metadata"]["labels"].get("nvidia.com/device-plugin.config") for n in nodes} >= set(pools)
    # The spawner's default: one replica per pod (failRequestsGreaterThanOne), whole GPUs apart.
    sharing = {"backend": "timeslice", "timeslice": {"replicas": 4}}
    profiles = [
        {"slug": "quarter", "display_name": "0.25 × H100", "gpus": 0.25, "gpu_model": "H100-80GB"},
        {"slug": "one", "display_name": "1 × H100", "gpus": 1, "gpu_model": "H100-80GB"},
    ]
    nlp = chart_team(release, "nlp")
    config = chart_config(release, sharing=sharing, profiles=profiles)
    placed = {}
    for slug in ("quarter", "one"):
        s = spawner_for(config, "carol", {"team": nlp, "profile": slug})
        await s.start()
        pod = kube.pod(release.team_ns(nlp), s.pod_name)
        node = next(n for n in nodes if n["metadata"]["name"] == pod["spec"]["nodeName"])
        placed[slug] = node["metadata"]["labels"]["nvidia.com/device-plugin.config"]
        await s.stop()
    assert placed == {"quarter": cm["metadata"]["annotations"]["gpulab.io/node-label"].split("=")[1], "one": "whole"}


# --------------------------------------------------------------------------
# priority across teams


def gpu_pod(name: str, priority_class: str, team_label: str) -> dict:
    """A 1-GPU pod on the test bed's single-GPU node, as gpulab labels its work."""
    return {
        "metadata": {"name": name, "labels": {"gpulab.io/team": team_label}},
        "spec": {
            "priorityClassName": priority_class,
            "nodeSelector": {"gpulab.io/pool": "mig"},
            "terminationGracePeriodSeconds": 0,
            "containers": [{"name": "work", "image": "busybox", "resources": {"limits": {"nvidia.com/gpu": "1"}}}],
        },
    }


def preempted(kube: Cluster, ns: str, name: str) -> bool:
    pod = kube.pod(ns, name)
    return (
        pod is None
        or pod["metadata"].get("deletionTimestamp") is not None
        or any(c["type"] == "DisruptionTarget" and c["status"] == "True" for c in pod["status"].get("conditions", []))
    )


async def assert_waits_without_evicting(
    kube: Cluster, waiting: tuple[str, str], running: tuple[str, str], what: str
) -> None:
    """The scheduler tries the ``waiting`` pod, finds no node and no victim it may evict: the
    pod stays Pending and the ``running`` one is not preempted."""
    kube.wait(
        lambda: any(e["reason"] == "FailedScheduling" for e in kube.events(*waiting)),
        f"the scheduler to have tried {waiting[1]}",
        60,
    )
    await asyncio.sleep(5)
    assert not preempted(kube, *running), f"{what} was preempted by {waiting[1]}"
    assert kube.pod(*waiting)["status"]["phase"] == "Pending"


async def test_a_teams_guarantee_holds_against_other_teams_only_borrowed_work_is_preempted(
    hub_identity: Release, kube: Cluster
):
    """The kube-scheduler preempts by priority value alone, across namespaces. Team B's
    in-quota batch job must survive team A's in-quota training; B's over-quota work not."""
    release = hub_identity
    vision, nlp = chart_team(release, "vision"), chart_team(release, "nlp")
    a_ns, b_ns = release.team_ns(vision), release.team_ns(nlp)
    kube.create(f"/api/v1/namespaces/{b_ns}/pods", gpu_pod("b-batch", "gpulab-batch", nlp))
    kube.wait_pod(b_ns, "b-batch", "Running", 60)
    kube.create(f"/api/v1/namespaces/{a_ns}/pods", gpu_pod("a-training", "gpulab-training", vision))
    await assert_waits_without_evicting(kube, (a_ns, "a-training"), (b_ns, "b-batch"), "team B's in-quota batch job")
    # Team B's work above its guarantee runs in gpulab-over-quota: team A takes the GPU back.
    kube.request("DELETE", f"/api/v1/namespaces/{a_ns}/pods/a-training?gracePeriodSeconds=0")
    kube.request("DELETE", f"/api/v1/namespaces/{b_ns}/pods/b-batch?gracePeriodSeconds=0")
    kube.wait(lambda: not kube.pods(b_ns) and not kube.pods(a_ns), "the pods to be gone", 60)
    kube.create(f"/api/v1/namespaces/{b_ns}/pods", gpu_pod("b-borrowed", "gpulab-over-quota", nlp))
    kube.wait_pod(b_ns, "b-borrowed", "Running", 60)
    kube.create(f"/api/v1/namespaces/{a_ns}/pods", gpu_pod("a-notebook", "gpulab-development", vision))
    kube.wait(lambda: preempted(kube, b_ns, "b-borrowed"), "team B's borrowed pod to be preempted", 60)
    kube.wait_pod(a_ns, "a-notebook", "Running", 90)


# --------------------------------------------------------------------------
# Job podFailurePolicy, by the real Job controller


def cpu_job(release: Release, ns: str, job_id: int) -> dict:
    catalog = catalog_from_dict(
        {"profiles": [{"slug": "cpu", "display_name": "CPU", "gpus": 0}], "teams": [{"name": "t", "guarantee": 1}]}
    )
    gpu = pod_gpu_spec(catalog.profiles["cpu"], {})
    req = jobspec.KubeJobRequest(
        job_id=job_id,
        name="calc",
        user="alice",
        namespace=ns,
        image="busybox",
        job_class="batch",
        over_quota=False,
        notebook="calc.ipynb",
        output_path="runs/calc-1.ipynb",
        log_path="runs/calc-1.log",
        parameters={},
        time_limit_seconds=600,
        labels={"gpulab.io/team": "t"},
        annotations={},
        gpu=gpu,
        cpu_guarantee=0.1,
    )
    return jobspec.kube_job_manifest(req)


def job_pods(kube: Cluster, ns: str, job_id: int) -> list[dict]:
    return kube.pods(ns, f"batch.kubernetes.io/job-name={jobspec.kube_job_name(job_id)}")


def condition(job: dict, kind: str) -> dict | None:
    return next(
        (c for c in job.get("status", {}).get("conditions", []) if c["type"] == kind and c["status"] == "True"), None
    )


async def test_a_notebook_that_raised_fails_the_job_at_once_a_preempted_one_runs_again(
    hub_identity: Release, kube: Cluster
):
    release = hub_identity
    ns = release.team_ns(chart_team(release, "vision"))
    jobs = f"/apis/batch/v1/namespaces/{ns}/jobs"
    kube.create(jobs, cpu_job(release, ns, 7001))
    (pod,) = kube.wait(lambda: job_pods(kube, ns, 7001), "the Job's pod", 60)
    kube.finish_pod(ns, pod["metadata"]["name"], 1)  # papermill: the notebook raised
    job = kube.wait(lambda: condition(j := kube.get(f"{jobs}/gpulab-job-7001"), "Failed") and j, "the Job to fail", 60)
    assert condition(job, "Failed")["reason"] == "PodFailurePolicy"
    time.sleep(2)
    assert len(job_pods(kube, ns, 7001)) == 1, "no second run of a notebook that raised"
    # Evicted (preemption, drain): DisruptionTarget, ignored: the Job makes a new pod, backoff untouched.
    kube.create(jobs, cpu_job(release, ns, 7002))
    (pod,) = kube.wait(lambda: job_pods(kube, ns, 7002), "the Job's pod", 60)
    kube.wait_pod(ns, pod["metadata"]["name"], "Running", 60)
    first = pod["metadata"]["name"]
    kube.evict_pod(ns, first)
    # The node ends the evicted pod (exit 137, DisruptionTarget) and deletes it; the Job
    # controller ignores that failure and runs the notebook again in a new pod.
    (again,) = kube.wait(
        lambda: [p for p in job_pods(kube, ns, 7002) if p["metadata"]["name"] != first],
        "a new pod after the eviction",
        90,
    )
    kube.wait_pod(ns, again["metadata"]["name"], "Running", 60)
    job = kube.get(f"{jobs}/gpulab-job-7002")
    assert not condition(job, "Failed") and job["status"].get("failed", 0) == 0, job["status"]


# --------------------------------------------------------------------------
# Kueue: a CPU-only job gets no GPU flavor


def test_kueue_admits_a_cpu_only_job_without_the_gpu_flavor(hub_identity: Release, kube: Cluster):
    """Kueue writes the node labels of every flavor it assigns into the pods. With CPU
    and memory in the GPU flavor's resource group, a CPU-only job got the GPU flavor
    (and its GPU node labels); the chart gives CPU and memory a flavor of their own."""
    from spawner.core.labels import kueue_local_queue

    release = hub_identity
    name = chart_team(release, "vision")
    ns = release.team_ns(name)
    values = yaml.safe_load((REPO / "helm" / "gpulab" / "values.yaml").read_text())["kueue"]
    body = cpu_job(release, ns, 7003)
    body["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] = kueue_local_queue(name)
    body["spec"]["suspend"] = True
    kube.create(f"/apis/batch/v1/namespaces/{ns}/jobs", body)

    def admitted() -> dict | None:
        for w in kube.get(f"/apis/kueue.x-k8s.io/v1beta2/namespaces/{ns}/workloads")["items"]:
            mine = any(o["name"] == "gpulab-job-7003" for o in w["metadata"].get("ownerReferences", []))
            if mine and condition(w, "Admitted"):
                return w
        return None

    workload = kube.wait(admitted, "Kueue to admit the CPU-only Job", 60)
    (assignment,) = workload["status"]["admission"]["podSetAssignments"]
    # An unnamed flavor is the release's: <release>-cpu.
    cpu_flavor = values["cpuFlavor"]["name"] or f"{release.name}-cpu"
    assert set(assignment["flavors"].values()) == {cpu_flavor}, assignment["flavors"]


# --------------------------------------------------------------------------
# Pod Security admission


def test_job_pods_pass_the_restricted_pod_security_standard(release: Release, kube: Cluster):
    """The API server's PodSecurity admission (on by default in kube-apiserver) judges the
    job's pod for real: the chart's team namespaces enforce "baseline" and warn and audit at
    "restricted"; a namespace an admin sets to enforce "restricted" admits gpulab's job pod,
    and refuses with a 403 the pod the job command made before (no seccomp profile, root
    not ruled out, capabilities kept)."""
    team_ns = next(iter(release.teams.values()))
    labels = kube.get(f"/api/v1/namespaces/{team_ns}")["metadata"]["labels"]
    assert labels["pod-security.kubernetes.io/enforce"] == "baseline"
    assert labels["pod-security.kubernetes.io/warn"] == labels["pod-security.kubernetes.io/audit"] == "restricted"
    ns = kube.namespace(
        "psa-restricted",
        {"pod-security.kubernetes.io/enforce": "restricted", "pod-security.kubernetes.io/enforce-version": "latest"},
    )
    template = cpu_job(release, ns, 9101)["spec"]["template"]
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "job-9101", **template["metadata"]}}
    pod["spec"] = template["spec"]
    kube.create(f"/api/v1/namespaces/{ns}/pods?dryRun=All", pod)  # admitted (and not stored)
    before = yaml.safe_load(yaml.safe_dump(pod))
    before["spec"]["securityContext"] = {"runAsUser": 1000, "fsGroup": 100}
    before["spec"]["containers"][0]["securityContext"] = {"allowPrivilegeEscalation": False}
    with pytest.raises(TestbedError) as refused:
        kube.create(f"/api/v1/namespaces/{ns}/pods?dryRun=All", before)
    message = str(refused.value)
    assert "-> 403" in message and "violates PodSecurity" in message and "restricted:latest" in message, message
    for rule in ("capabilities.drop", "runAsNonRoot", "seccompProfile"):
        assert rule in message, (rule, message)


# --------------------------------------------------------------------------
# Day two: helm upgrade


def test_an_upgrade_that_changes_a_priority_class_is_refused_before_anything_changes(release: Release, tmp_path):
    """A PriorityClass's value and preemptionPolicy are immutable: the real helm upgrade
    (``--dry-run=server``, which runs the chart's lookup against the bed's API server) that
    switches ``priorityClasses.otherTenants`` is refused with a sentence that says what to do,
    and the cluster's class is unchanged; the same upgrade with the choice as it is goes
    through."""
    tb = release.cluster.tb

    def upgrade(other_tenants: str) -> subprocess.CompletedProcess:
        values = tmp_path / "upgrade.yaml"
        values.write_text(
            yaml.safe_dump({**release.values, "priorityClasses": {"create": True, "otherTenants": other_tenants}})
        )
        args = ["upgrade", release.name, str(CHART), "--namespace", release.hub_namespace, "-f", str(values)]
        return helm(tb, *args, "--dry-run=server", check=False)

    refused = upgrade("protect")
    assert refused.returncode != 0
    assert "gpulab: PriorityClass gpulab-production exists with value 10000 and preemptionPolicy" in refused.stderr
    assert "(priorityClasses.otherTenants: protect)" in refused.stderr, refused.stderr
    assert "kubectl delete priorityclass gpulab-production" in refused.stderr, refused.stderr
    assert release.cluster.get("/apis/scheduling.k8s.io/v1/priorityclasses/gpulab-production")["value"] == 10000
    same = upgrade("preempt")
    assert same.returncode == 0, same.stderr


def other_tenant_pod(name: str) -> dict:
    """A pod of another tenant of the cluster: no PriorityClass (priority 0), one whole GPU
    on the bed's single-GPU node, as :func:`gpu_pod` asks for it."""
    pod = gpu_pod(name, "", "none")
    del pod["spec"]["priorityClassName"]
    pod["metadata"]["labels"] = {}
    return pod


async def test_a_second_release_shares_the_cluster_and_protects_other_tenants(
    release: Release, kube: Cluster, tmp_path
):
    """Two releases (production "gpulab" and a staging one) install into one cluster: every
    cluster-scoped object of the second carries its release's name, so helm finds nothing
    owned by the other release. The staging release chose ``priorityClasses.otherTenants:
    protect``: its in-quota notebook waits beside another tenant's priority-0 pod on a full
    GPU, while the production release's in-quota notebook (``preempt``, the default) evicts it
    (the kube-scheduler's rule: only pods of strictly lower priority are preempted)."""
    tb = release.cluster.tb
    staging = f"staging-{kube.suffix}"
    values = team_values(kube.suffix)
    for team in values["gpulab"]["teams"]:
        del team["namespace"]  # the release's own: staging-<suffix>-<team>
    values["priorityClasses"] = {"create": True, "otherTenants": "protect"}
    hub_ns = kube.namespace("staging-hub")
    values_file = tmp_path / f"{staging}-values.yaml"
    values_file.write_text(yaml.safe_dump(values))
    teams = [f"{staging}-{t['name']}" for t in values["gpulab"]["teams"]]
    kube.namespaces.extend(teams)  # helm uninstall keeps them (resource-policy: keep)
    install = ["install", staging, str(CHART), "--namespace", hub_ns, "-f", str(values_file)]
    # The device plugin's time-slicing ConfigMap exists once per cluster: the second
    # release is told, before anything is applied, to leave it to the first.
    refused = helm(tb, *install, "--dry-run=server", check=False)
    assert refused.returncode != 0
    assert 'belongs to release "gpulab"' in refused.stderr and "timeSlicing.create: false" in refused.stderr, (
        refused.stderr
    )
    values["timeSlicing"] = {"create": False}
    values_file.write_text(yaml.safe_dump(values))
    try:
        helm(tb, *install, "--wait")
        classes = {
            pc["metadata"]["name"]: pc["value"]
            for pc in kube.get("/apis/scheduling.k8s.io/v1/priorityclasses")["items"]
            if pc["metadata"]["name"].startswith(staging)
        }
        assert classes == {
            f"{staging}-production": 0,
            f"{staging}-training": 0,
            f"{staging}-development": 0,
            f"{staging}-batch": 0,
            f"{staging}-over-quota": -50,
        }
        assert kube.get("/apis/scheduling.k8s.io/v1/priorityclasses/gpulab-development")["value"] == 10000
        queues = {q["metadata"]["name"] for q in kube.get("/apis/kueue.x-k8s.io/v1beta2/clusterqueues")["items"]}
        assert {f"{staging}-vision", f"{staging}-nlp", f"{staging}-crowd"} <= queues
        assert {"gpulab-vision", "gpulab-nlp"} <= queues, "the production release's queues are untouched"
        # The staging hub learns its own names from the catalog its release rendered.
        cm = kube.get(f"/api/v1/namespaces/{hub_ns}/configmaps/gpulab-catalog")
        catalog = yaml.safe_load(cm["data"]["catalog.yaml"])
        assert catalog["priority_class_names"]["development"] == f"{staging}-development"

        other_ns = kube.namespace("other-tenant")
        kube.create(f"/api/v1/namespaces/{other_ns}/pods", other_tenant_pod("theirs"))
        kube.wait_pod(other_ns, "theirs", "Running", 60)
        vision_staging = f"{staging}-vision"
        kube.create(
            f"/api/v1/namespaces/{vision_staging}/pods", gpu_pod("staging-nb", f"{staging}-development", "vision")
        )
        await assert_waits_without_evicting(
            kube, (vision_staging, "staging-nb"), (other_ns, "theirs"), "protect: another tenant's pod"
        )
        kube.request("DELETE", f"/api/v1/namespaces/{vision_staging}/pods/staging-nb?gracePeriodSeconds=0")
        vision = chart_team(release, "vision")
        prod_ns = release.team_ns(vision)
        kube.create(f"/api/v1/namespaces/{prod_ns}/pods", gpu_pod("prod-nb", "gpulab-development", vision))
        kube.wait(lambda: preempted(kube, other_ns, "theirs"), "preempt: the other tenant's pod to be evicted", 60)
        kube.wait_pod(prod_ns, "prod-nb", "Running", 90)
    finally:
        helm(tb, "uninstall", staging, "--namespace", hub_ns, "--wait", check=False)
