"""GPU devices on the real control plane: kubelet admission, one scheduler per pool, packing.

The test bed's node agent admits pods the way a kubelet does
(tests/kube/bed/kubelet_devices.py: ``OutOf<resource>``, phase Failed, no
DisruptionTarget, device ids in the PodResources API's shape), and the bed runs
z2jh's user-scheduler with the overlay's scoring beside the default scheduler.
The pods are the product's: the scheduler names come from the hub config z2jh
makes of the overlay (tests/kube/bed/z2jh_hub_config.py), the job pods from the
Kubernetes jobs backend's manifest.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import time

import yaml

from spawner.runtime import set_runtime
from tests.kube.bed.chart import Release
from tests.kube.bed.cluster import Cluster
from tests.kube.bed.z2jh_hub_config import z2jh_config

TOLERATE_GPU_TAINT = [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]


def bare_pod(name: str, gpus: int = 0, cpu: str | None = None, **spec) -> dict:
    limits = {"nvidia.com/gpu": str(gpus)} if gpus else {}
    requests = {"cpu": cpu} if cpu else {}
    resources = {k: v for k, v in (("limits", limits), ("requests", requests)) if v}
    return {
        "metadata": {"name": name},
        "spec": {
            "containers": [{"name": "main", "image": "registry.example.com/busy:1", "resources": resources}],
            "tolerations": TOLERATE_GPU_TAINT,
            **spec,
        },
    }


def fill_node(kube: Cluster, ns: str, name: str, node: str, gpus: int) -> None:
    """A pod bound to ``node`` holding ``gpus`` GPUs, Running. The devices of an earlier test's
    pods are released by the node's kubelet after the API has forgotten those pods (as a real
    kubelet frees them once their containers are gone), so a pod the kubelet rejects for them
    (``OutOfnvidia.com/gpu``) is made again, as a controller would, until one runs."""
    deadline = time.monotonic() + 60
    while True:
        kube.create(f"/api/v1/namespaces/{ns}/pods", bare_pod(name, gpus, nodeName=node))
        pod = kube.wait_pod(ns, name, lambda p: p["status"].get("phase") in ("Running", "Failed"))
        if pod["status"]["phase"] == "Running":
            return
        reason = pod["status"].get("reason", "")
        assert reason.startswith("OutOf") and time.monotonic() < deadline, (reason, pod["status"].get("message"))
        wait_gone(kube, ns, [name])
        time.sleep(0.5)


def wait_gone(kube: Cluster, ns: str, names: list[str]) -> None:
    for name in names:
        kube.request("DELETE", f"/api/v1/namespaces/{ns}/pods/{name}?gracePeriodSeconds=0")
    kube.wait(lambda: all(kube.pod(ns, n) is None for n in names), f"pods {names} to be gone", 60)


# --------------------------------------------------------------------------
# kubelet admission


def test_a_pod_its_node_cannot_serve_fails_at_admission_as_a_kubelet_fails_it(kube: Cluster):
    """Bound straight to a node (nodeName: no scheduler checks it), a pod asking for a GPU
    the node's admitted pods already hold is rejected by the node, not run."""
    ns = kube.namespace("admission")
    node = "gpu-h100-whole-2"
    kube.create(f"/api/v1/namespaces/{ns}/pods", bare_pod("eight", 8, nodeName=node))
    eight = kube.wait_pod(ns, "eight", "Running")
    kube.create(f"/api/v1/namespaces/{ns}/pods", bare_pod("one-more", 1, nodeName=node))
    rejected = kube.wait_pod(ns, "one-more", "Failed")
    assert rejected["status"]["reason"] == "OutOfnvidia.com/gpu"
    assert rejected["status"]["message"] == (
        "Pod was rejected: Node didn't have enough resource: nvidia.com/gpu, requested: 1, used: 8, capacity: 8"
    )
    assert not any(c["type"] == "DisruptionTarget" for c in rejected["status"].get("conditions", []))
    events = [e for e in kube.events(ns, "one-more") if e["reason"] == "OutOfnvidia.com/gpu"]
    assert events and events[0]["type"] == "Warning" and events[0]["source"]["component"] == "kubelet"
    # The device ids the node gave, mapped back to the pod (the kubelet's pod-resources view).
    (held,) = [p for p in kube.tb.pod_resources(node) if p["namespace"] == ns]
    assert held["name"] == "eight" and held["containers"][0]["name"] == "main"
    (devices,) = held["containers"][0]["devices"]
    assert devices["resourceName"] == "nvidia.com/gpu" and len(set(devices["deviceIds"])) == 8
    assert all(d.startswith("GPU-") for d in devices["deviceIds"])
    assert eight["spec"]["nodeName"] == node
    # Its GPUs are free again once it is gone, and the next pod is admitted.
    wait_gone(kube, ns, ["eight", "one-more"])
    assert not [p for p in kube.tb.pod_resources(node) if p["namespace"] == ns]
    kube.create(f"/api/v1/namespaces/{ns}/pods", bare_pod("after", 1, nodeName=node))
    kube.wait_pod(ns, "after", "Running")


# --------------------------------------------------------------------------
# notebooks and jobs of one pool: one scheduler


def job_pod_template(tmp_path, monkeypatch, release: Release, profile: dict, team: str) -> tuple[str, dict]:
    """The product's view: the notebooks' scheduler (z2jh's hub config of the overlay) and
    the pod template of the Job the Kubernetes jobs backend makes for ``profile``."""
    from hub_config.jobs.service import JobService

    c = z2jh_config(tmp_path, monkeypatch, namespace=release.hub_namespace)
    catalog = {
        "sharing": {"backend": "whole"},
        "profiles": [profile],
        "teams": [{"name": team, "users": ["carol"], "guarantee": 2, "burst": 2, "namespace": release.team_ns(team)}],
    }
    (tmp_path / "catalog.yaml").write_text(yaml.safe_dump(catalog))
    c.GPULab.catalog_file = str(tmp_path / "catalog.yaml")
    c.GPULabDB.db_url = f"sqlite:///{tmp_path / 'gpulab.sqlite'}"
    c.GPULabJobs.kube_home_claim_template = ""
    monkeypatch.setenv("GPULAB_DATA_DIR", str(tmp_path))
    set_runtime(None)
    try:
        service = JobService(config=c)
        monkeypatch.setattr(service.backend, "submitted", lambda rec: None)  # the test creates the pods itself
        body = {"notebook": "a.ipynb", "job_class": "batch", "profile": profile["slug"]}
        rec, _ = asyncio.run(service.create_job("carol", [], body))
        return c.KubeSpawner.scheduler_name, service.backend.manifest(rec)["spec"]["template"]
    finally:
        set_runtime(None)


def test_notebooks_and_jobs_of_one_pool_never_both_take_the_last_gpu(tmp_path, monkeypatch, release: Release, kube):
    """The A100 node has one whole GPU. A notebook (z2jh's user-scheduler) and a job pod
    ask for it at the same moment. Bound by two schedulers, both got it and the kubelet
    rejected one (OutOfnvidia.com/gpu: a failed spawn, or a job pod spending backoffLimit);
    bound by one, one runs and the other waits."""
    nlp = "nlp"
    ns = kube.namespace("race")  # no ResourceQuota: only the node's one GPU limits the pods
    profile = {"slug": "a100-1", "display_name": "1 × A100", "gpus": 1, "gpu_model": "A100-80GB"}
    notebook_scheduler, template = job_pod_template(tmp_path, monkeypatch, release, profile, nlp)
    assert notebook_scheduler == "jhub-user-scheduler"

    def create(name: str, scheduler: str | None) -> None:
        spec = dict(template["spec"])
        spec.pop("schedulerName", None)
        if scheduler:
            spec["schedulerName"] = scheduler
        kube.create(f"/api/v1/namespaces/{ns}/pods", {"metadata": {"name": name, "labels": {}}, "spec": spec})

    job_scheduler = template["spec"].get("schedulerName")
    outcomes = []
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        for round_ in range(6):
            names = [f"notebook-{round_}", f"job-{round_}"]
            list(pool.map(create, names, [notebook_scheduler, job_scheduler]))
            settled = kube.wait(
                lambda names=names: (
                    pods := [kube.pod(ns, n) for n in names],
                    all(p and (p["status"].get("phase") in ("Running", "Failed") or _unschedulable(p)) for p in pods)
                    and pods,
                )[1],
                f"pods {names} to run, fail or wait",
                60,
            )
            outcomes.append(sorted((p["status"].get("phase"), p["status"].get("reason", "")) for p in settled))
            wait_gone(kube, ns, names)
            time.sleep(0.5)  # the scheduler caches see the GPU free again
    assert all(o == [("Pending", ""), ("Running", "")] for o in outcomes), (job_scheduler, outcomes)
    assert job_scheduler == notebook_scheduler


def _unschedulable(pod: dict) -> bool:
    return any(
        c["type"] == "PodScheduled" and c["status"] == "False" and c.get("reason") == "Unschedulable"
        for c in pod["status"].get("conditions", [])
    )


# --------------------------------------------------------------------------
# GPU packing


def test_the_user_scheduler_packs_gpu_pods_so_a_whole_node_stays_free(kube: Cluster):
    """Two 8-GPU H100 nodes. whole-2's CPUs are busy (a CPU pod) and whole-1 holds one GPU
    pod. z2jh's scoring alone (MostAllocated on cpu and memory) sends the next GPU pod to
    whole-2, the node with the busiest CPUs, and an 8-GPU pod then fits nowhere; with the
    overlay's GPU resources it joins the GPU pod on whole-1, and whole-2 stays whole."""
    ns = kube.namespace("packing")
    scheduler = "jhub-user-scheduler"
    kube.create(f"/api/v1/namespaces/{ns}/pods", bare_pod("cpu-busy", cpu="80", nodeName="gpu-h100-whole-2"))
    kube.create(f"/api/v1/namespaces/{ns}/pods", bare_pod("first", 1, nodeName="gpu-h100-whole-1"))
    for name in ("cpu-busy", "first"):
        kube.wait_pod(ns, name, "Running")
    whole = {"nodeSelector": {"gpulab.io/pool": "whole"}, "schedulerName": scheduler}
    kube.create(f"/api/v1/namespaces/{ns}/pods", bare_pod("second", 1, **whole))
    second = kube.wait_pod(ns, "second", "Running")
    assert second["spec"]["nodeName"] == "gpu-h100-whole-1"
    kube.create(f"/api/v1/namespaces/{ns}/pods", bare_pod("eight", 8, **whole))
    eight = kube.wait_pod(ns, "eight", "Running")
    assert eight["spec"]["nodeName"] == "gpu-h100-whole-2"


# --------------------------------------------------------------------------
# pools per backend


def test_whole_gpu_pods_never_land_on_the_hami_node(kube: Cluster):
    """The HAMi node advertises nvidia.com/gpu (vGPU slots) like a whole-GPU node; HAMi's
    device plugin fails any pod HAMi's scheduler did not place. With both whole H100 nodes
    full, a whole-GPU pod went to the HAMi node; now it waits."""
    from spawner.core import jobspec
    from spawner.core.catalog import catalog_from_dict
    from spawner.core.sharing import pod_gpu_spec

    ns = kube.namespace("pools")
    for node in ("gpu-h100-whole-1", "gpu-h100-whole-2"):
        fill_node(kube, ns, f"full-{node}", node, 8)
    catalog = catalog_from_dict(
        {
            "sharing": {"backend": "whole"},
            "profiles": [{"slug": "h100-1", "gpus": 1, "gpu_model": "H100-80GB"}],
            "teams": [{"name": "t", "guarantee": 1}],
        },
        "test",
    )
    gpu = pod_gpu_spec(catalog.profiles["h100-1"], catalog.sharing)
    job = jobspec.kube_job_manifest(
        jobspec.KubeJobRequest(
            job_id=1, name="j", user="u", namespace=ns, image="registry.example.com/busy:1", job_class="batch",
            over_quota=False, notebook="a.ipynb", output_path="o.ipynb", log_path="l.log", parameters={},
            time_limit_seconds=600, labels={}, annotations={}, gpu=gpu, scheduler_name="jhub-user-scheduler",
        )
    )  # fmt: skip
    spec = {**job["spec"]["template"]["spec"], "priorityClassName": None}
    kube.create(f"/api/v1/namespaces/{ns}/pods", {"metadata": {"name": "whole"}, "spec": spec})
    pod = kube.wait(lambda: (p := kube.pod(ns, "whole")) and (_unschedulable(p) or p["spec"].get("nodeName")) and p,
                    "the whole-GPU pod to be placed or refused", 60)  # fmt: skip
    assert "nodeName" not in pod["spec"], pod["spec"]["nodeName"]
    (event,) = [e for e in kube.events(ns, "whole") if e["reason"] == "FailedScheduling"][:1]
    assert "node affinity" in event["message"], event["message"]
