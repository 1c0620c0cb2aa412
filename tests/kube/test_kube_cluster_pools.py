"""GPU pools and departments on the real control plane: the chart's Kueue ResourceFlavors per pool
and Cohorts per department, applied to the test bed's real Kueue, admitting and refusing real
``batch/v1`` Jobs.

The chart is rendered by the real ``helm`` under a release name of its own (its cluster-scoped
Kueue objects carry it, beside the session's release) with two pools (H100 and L40S, told apart
by GPU feature discovery's ``nvidia.com/gpu.product``, as the test bed's nodes carry it) and a
department over two teams; its ResourceFlavors, Cohort, ClusterQueues and LocalQueues are
created as helm would create them. Kueue admits a Job by unsuspending it and records on its
Workload the flavor it assigned; a Job it cannot admit stays suspended with a Workload whose
``QuotaReserved`` condition is False (kueue.sigs.k8s.io/docs/concepts/workload).
"""

from __future__ import annotations

import time
from typing import Any

import yaml

from tests.kube.bed.cluster import Cluster
from tests.support.helm import CHART, helm

H100 = {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}
L40S = {"nvidia.com/gpu.product": "NVIDIA-L40S"}
KUEUE = "/apis/kueue.x-k8s.io/v1beta2"


def values(namespaces: dict[str, str]) -> dict[str, Any]:
    return {
        "kueue": {"enabled": True},
        "gpulab": {
            "pools": [
                {"name": "h100", "gpu_model": "H100-80GB", "node_labels": H100},
                {"name": "l40s", "gpu_model": "L40S-48GB", "node_labels": L40S},
            ],
            # research may hold 3 GPUs of a pool: 2 its teams are guaranteed, 1 borrowed from ops.
            "departments": [{"name": "research", "guarantee": 2, "burst": 3}],
            "profiles": [
                {"slug": "h100-1", "gpus": 1, "gpu_model": "H100-80GB"},
                {"slug": "l40s-1", "gpus": 1, "gpu_model": "L40S-48GB"},
            ],
            "teams": [
                {
                    "name": "vision",
                    "guarantee": 1,
                    "burst": 4,
                    "department": "research",
                    "pools": {"h100": {"guarantee": 1, "burst": 2}},
                    "namespace": namespaces["vision"],
                },
                {"name": "nlp", "guarantee": 1, "burst": 4, "department": "research", "namespace": namespaces["nlp"]},
                {"name": "ops", "guarantee": 4, "burst": 4, "namespace": namespaces["ops"]},
            ],
        },
    }


def apply_kueue_objects(
    kube: Cluster, release: str, namespaces: dict[str, str], chart_values: dict[str, Any] | None = None
) -> list[dict]:
    f = kube.tmp_path / "values.yaml"
    f.write_text(yaml.safe_dump(chart_values or values(namespaces)))
    out = helm("template", release, str(CHART), "--namespace", next(iter(namespaces.values())), "-f", str(f)).stdout
    docs = [d for d in yaml.safe_load_all(out) if d and d["apiVersion"].startswith("kueue.x-k8s.io/")]
    order = {"ResourceFlavor": 0, "Cohort": 1, "ClusterQueue": 2, "LocalQueue": 3}
    docs.sort(key=lambda d: order[d["kind"]])
    for d in docs:
        plural = d["kind"].lower() + "s"
        ns = d["metadata"].get("namespace")
        if ns:
            kube.create(f"{KUEUE}/namespaces/{ns}/{plural}", d)
        else:
            kube.cluster_object(f"{KUEUE}/{plural}", d)
    for cq in (d for d in docs if d["kind"] == "ClusterQueue"):
        name = cq["metadata"]["name"]
        kube.wait(
            lambda name=name: any(
                c["type"] == "Active" and c["status"] == "True"
                for c in kube.get(f"{KUEUE}/clusterqueues/{name}").get("status", {}).get("conditions", [])
            ),
            f"ClusterQueue {name} active",
            60,
        )
    return docs


def job(kube: Cluster, ns: str, team: str, name: str, gpus: int, selector: dict[str, str]) -> None:
    kube.create(
        f"/apis/batch/v1/namespaces/{ns}/jobs",
        {
            "metadata": {"name": name, "labels": {"kueue.x-k8s.io/queue-name": f"gpulab-{team}"}},
            "spec": {
                "suspend": True,
                "backoffLimit": 0,
                "template": {
                    "spec": {
                        "restartPolicy": "Never",
                        "nodeSelector": selector,
                        "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
                        "containers": [
                            {
                                "name": "main",
                                "image": "busybox",
                                "command": ["sleep", "3600"],
                                "resources": {
                                    "requests": {"cpu": "100m", "memory": "64Mi", "nvidia.com/gpu": str(gpus)},
                                    "limits": {"nvidia.com/gpu": str(gpus)},
                                },
                            }
                        ],
                    }
                },
            },
        },
    )


def workload_of(kube: Cluster, ns: str, job_name: str) -> dict:
    def find() -> dict | None:
        for w in kube.get(f"{KUEUE}/namespaces/{ns}/workloads")["items"]:
            if any(o["name"] == job_name for o in w["metadata"].get("ownerReferences", [])):
                return w
        return None

    return kube.wait(find, f"the Workload of Job {ns}/{job_name}", 30)


def condition(w: dict, kind: str) -> dict | None:
    return next((c for c in w.get("status", {}).get("conditions", []) if c["type"] == kind), None)


def admitted_flavor(kube: Cluster, ns: str, job_name: str) -> str:
    def done() -> str | None:
        w = workload_of(kube, ns, job_name)
        c = condition(w, "Admitted")
        if c is None or c["status"] != "True":
            return None
        (podset,) = w["status"]["admission"]["podSetAssignments"]
        return podset["flavors"]["nvidia.com/gpu"]

    flavor = kube.wait(done, f"Kueue to admit {ns}/{job_name}", 60)
    # Kueue records the admission on the Workload first and its job reconciler unsuspends
    # the Job in a later reconcile, so the Job is read until it follows, not at once.
    kube.wait(
        lambda: kube.get(f"/apis/batch/v1/namespaces/{ns}/jobs/{job_name}")["spec"]["suspend"] is False,
        f"Kueue to unsuspend the admitted Job {ns}/{job_name}",
        30,
    )
    return flavor


def refused(kube: Cluster, ns: str, job_name: str) -> str:
    """Kueue's own words for a Job it keeps suspended for lack of quota."""

    def pending() -> str | None:
        c = condition(workload_of(kube, ns, job_name), "QuotaReserved")
        return c["message"] if c is not None and c["status"] == "False" and c.get("message") else None

    message = kube.wait(pending, f"Kueue to hold {ns}/{job_name} pending", 60)
    # and it stays so: give Kueue a few scheduling cycles
    time.sleep(3)
    w = workload_of(kube, ns, job_name)
    assert (condition(w, "Admitted") or {}).get("status") != "True", w["status"]
    assert kube.get(f"/apis/batch/v1/namespaces/{ns}/jobs/{job_name}")["spec"]["suspend"] is True
    return message


def test_kueue_admits_per_pool_flavor_and_bounds_a_department(kube: Cluster):
    namespaces = {t: kube.namespace(f"pools-{t}") for t in ("vision", "nlp", "ops")}
    release = f"pools-{kube.suffix}"
    docs = apply_kueue_objects(kube, release, namespaces)
    assert {d["metadata"]["name"] for d in docs if d["kind"] == "ResourceFlavor"} == {
        f"{release}-cpu",
        f"{release}-pool-h100",
        f"{release}-pool-l40s",
    }
    (cohort,) = [d for d in docs if d["kind"] == "Cohort"]
    assert kube.get(f"{KUEUE}/cohorts/{cohort['metadata']['name']}")["spec"]["parentName"] == release
    vision, nlp = namespaces["vision"], namespaces["nlp"]

    # vision may hold 2 H100 (its pool quota: 1 guaranteed + 1 borrowed from the department)
    job(kube, vision, "vision", "h100-two", 2, H100)
    assert admitted_flavor(kube, vision, "h100-two") == f"{release}-pool-h100"
    # a third H100 is past vision's H100 quota, though its total (4) has room
    job(kube, vision, "vision", "h100-third", 1, H100)
    words = refused(kube, vision, "h100-third")
    assert f"insufficient unused quota for nvidia.com/gpu in flavor {release}-pool-h100, 1 more needed" in words
    assert f"flavor {release}-pool-l40s doesn't match node affinity" in words, words
    # the L40S pool is counted apart: vision's total still admits one there
    job(kube, vision, "vision", "l40s-one", 1, L40S)
    assert admitted_flavor(kube, vision, "l40s-one") == f"{release}-pool-l40s"

    # nlp's first H100 is in its guarantee: research now holds 3 H100, its burst
    job(kube, nlp, "nlp", "h100-one", 1, H100)
    assert admitted_flavor(kube, nlp, "h100-one") == f"{release}-pool-h100"
    # a second would be within nlp's own burst (4) and ops leaves 4 H100 idle, but research is full
    job(kube, nlp, "nlp", "h100-two", 1, H100)
    words = refused(kube, nlp, "h100-two")
    assert f"insufficient unused quota for nvidia.com/gpu in flavor {release}-pool-h100, 1 more needed" in words
    # outside the department, ops takes its own H100 quota: the cluster had idle H100 quota
    job(kube, namespaces["ops"], "ops", "h100-ops", 2, H100)
    assert admitted_flavor(kube, namespaces["ops"], "h100-ops") == f"{release}-pool-h100"
    # when vision frees its two H100, the department has room again and Kueue admits nlp's Job
    kube.request("DELETE", f"/apis/batch/v1/namespaces/{vision}/jobs/h100-two?propagationPolicy=Background")
    assert admitted_flavor(kube, nlp, "h100-two") == f"{release}-pool-h100"


# -- fair sharing: weights between borrowers, reclaim from the furthest over its share ---------


def fair_share_values(namespaces: dict[str, str]) -> dict[str, Any]:
    """A department of 4 GPUs: audio is guaranteed all 4 and lends them; nlp (weight 1) and
    vision (weight 3) are guaranteed none and may borrow all 4."""
    teams = [
        {"name": "audio", "guarantee": 4, "burst": 4},
        {"name": "nlp", "guarantee": 0, "burst": 4, "fair_share_weight": 1},
        {"name": "vision", "guarantee": 0, "burst": 4, "fair_share_weight": 3},
    ]
    return {
        "kueue": {"enabled": True},
        "gpulab": {
            "departments": [{"name": "research", "guarantee": 4, "burst": 4}],
            "profiles": [{"slug": "gpu-1", "gpus": 1}],
            "teams": [{**t, "department": "research", "namespace": namespaces[t["name"]]} for t in teams],
        },
    }


def admitted(kube: Cluster, ns: str) -> set[str]:
    """The Jobs of ``ns`` whose Workload Kueue admits now."""
    out = set()
    for w in kube.get(f"{KUEUE}/namespaces/{ns}/workloads")["items"]:
        if (condition(w, "Admitted") or {}).get("status") == "True":
            out.update(o["name"] for o in w["metadata"].get("ownerReferences", []))
    return out


def settled(kube: Cluster, namespaces: dict[str, str], want: dict[str, int]) -> dict[str, int]:
    """Wait until Kueue admits ``want`` Jobs per team, then check it stays so a few cycles."""
    counts = lambda: {t: len(admitted(kube, namespaces[t])) for t in want}  # noqa: E731
    kube.wait(lambda: counts() == want, f"Kueue to admit {want} (admits {counts()})", 60)
    time.sleep(3)
    return counts()


def test_kueue_fair_sharing_splits_idle_capacity_by_weight_and_reclaims_from_the_furthest_over(kube: Cluster):
    """The bed's Kueue runs with fairSharing (tests/kube/bed/kueue.py), the chart renders each
    team's fair_share_weight as its ClusterQueue's fairSharing.weight. Kueue's fair sharing
    (kueue.sigs.k8s.io/docs/concepts/fair_sharing) admits, among queues competing for a
    cohort's capacity, the workload whose queue has the lowest dominant resource share
    (borrowed / lendable / weight) after admission, and preempts for reclaim from the queue
    with the highest share first."""
    namespaces = {t: kube.namespace(f"fair-{t}") for t in ("audio", "nlp", "vision")}
    release = f"fair-{kube.suffix}"
    docs = apply_kueue_objects(kube, release, namespaces, fair_share_values(namespaces))
    weights = {
        d["metadata"]["labels"]["gpulab.io/team"]: (d["spec"].get("fairSharing") or {}).get("weight")
        for d in docs
        if d["kind"] == "ClusterQueue"
    }
    assert weights == {"audio": None, "nlp": "1", "vision": "3"}
    audio, nlp, vision = (namespaces[t] for t in ("audio", "nlp", "vision"))

    # audio holds its whole guarantee; nlp and vision each queue four 1-GPU Jobs behind it
    job(kube, audio, "audio", "all-four", 4, {})
    admitted_flavor(kube, audio, "all-four")
    for team in ("nlp", "vision"):
        for i in range(4):
            job(kube, namespaces[team], team, f"{team}-{i}", 1, {})
    for team in ("nlp", "vision"):
        refused(kube, namespaces[team], f"{team}-0")
    # audio's 4 GPUs fall idle at once: the borrowers share them 1 : 3, by weight (first-come
    # would have given them to whichever queue Kueue looked at first)
    kube.request("DELETE", f"/apis/batch/v1/namespaces/{audio}/jobs/all-four?propagationPolicy=Background")
    assert settled(kube, namespaces, {"nlp": 1, "vision": 3}) == {"nlp": 1, "vision": 3}

    # Shares apart: the still-queued Jobs go, vision frees one GPU, and nlp takes it
    # (nlp 2 GPUs at weight 1: share 2; vision 2 at weight 3: share 2/3).
    for team in ("nlp", "vision"):
        for name in {f"{team}-{i}" for i in range(4)} - admitted(kube, namespaces[team]):
            kube.request(
                "DELETE", f"/apis/batch/v1/namespaces/{namespaces[team]}/jobs/{name}?propagationPolicy=Background"
            )
    (gone, *_) = sorted(admitted(kube, vision))
    kube.request("DELETE", f"/apis/batch/v1/namespaces/{vision}/jobs/{gone}?propagationPolicy=Background")
    job(kube, nlp, "nlp", "nlp-late", 1, {})
    assert settled(kube, namespaces, {"nlp": 2, "vision": 2}) == {"nlp": 2, "vision": 2}
    vision_jobs = admitted(kube, vision)

    # audio reclaims one GPU of its guarantee: Kueue preempts from nlp, furthest over its share
    job(kube, audio, "audio", "one", 1, {})
    admitted_flavor(kube, audio, "one")
    assert len(admitted(kube, nlp)) == 1
    assert admitted(kube, vision) == vision_jobs  # vision, below its share, keeps all it had
    evicted = [
        c
        for w in kube.get(f"{KUEUE}/namespaces/{nlp}/workloads")["items"]
        for c in [condition(w, "Evicted")]
        if c is not None and c["status"] == "True"
    ]
    assert evicted and evicted[0]["reason"] == "Preempted", evicted
