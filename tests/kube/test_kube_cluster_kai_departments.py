"""Departments as KAI parent queues on the real KAI scheduler (v0.20.1, tests/kube/bed/kai_scheduler.py).

The chart, rendered by the real ``helm`` under a release name of its own, turns a department
into a KAI Queue between the release's parent queue and its teams' queues (quota = its
guarantee, limit = its burst). Its Queues are created as ``helm install`` creates them, and
pods of KAI's scheduler name the teams' queues (``kai.scheduler/queue``) on the test bed's
KAI node (``gpu-l40s-kai``, 2 GPUs). KAI places a team's pod within its department's limit
and leaves the next one of the same department pending, though the node has a free GPU that
a team outside the department then gets.
"""

from __future__ import annotations

import time
from typing import Any

import yaml

from tests.kube.bed.cluster import Cluster
from tests.kube.bed.kai_scheduler import QUEUE_LABEL_KEY, SCHEDULER_NAME, Kai
from tests.support.helm import CHART, helm

KAI_NODE_SELECTOR = {"gpulab.io/pool": "kai"}
QUEUES = "/apis/scheduling.run.ai/v2/queues"


def values() -> dict[str, Any]:
    return {
        "kai": {"queues": True},
        "gpulab": {
            "sharing": {"backend": "kai", "kai": {"node_selector": {"L40S": KAI_NODE_SELECTOR}}},
            "departments": [{"name": "research", "guarantee": 1, "burst": 1}],
            "profiles": [{"slug": "l40s-1", "gpus": 1, "gpu_model": "L40S"}],
            "teams": [
                {"name": "vision", "guarantee": 1, "burst": 2, "department": "research", "fair_share_weight": 2},
                {"name": "nlp", "guarantee": 0, "burst": 2, "department": "research"},
                # like nlp, nothing guaranteed and a burst of 2, but in no department
                {"name": "ops", "guarantee": 0, "burst": 2},
            ],
        },
    }


def gpu_pod(kube: Cluster, ns: str, name: str, queue: str) -> None:
    kube.create(
        f"/api/v1/namespaces/{ns}/pods",
        {
            "metadata": {"name": name, "labels": {QUEUE_LABEL_KEY: queue}},
            "spec": {
                "schedulerName": SCHEDULER_NAME,
                "nodeSelector": KAI_NODE_SELECTOR,
                "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
                "containers": [
                    {
                        "name": "main",
                        "image": "busybox",
                        "command": ["sleep", "3600"],
                        "resources": {"requests": {"nvidia.com/gpu": "1"}, "limits": {"nvidia.com/gpu": "1"}},
                    }
                ],
            },
        },
    )


def bound(kube: Cluster, ns: str, name: str) -> str:
    return kube.wait(lambda: (kube.pod(ns, name) or {}).get("spec", {}).get("nodeName"), f"KAI to bind {name}", 90)


def test_a_department_queue_bounds_its_teams_on_kai(kai_scheduler: Kai, kube: Cluster):
    release = f"kaipools-{kube.suffix}"
    f = kube.tmp_path / "values.yaml"
    f.write_text(yaml.safe_dump(values()))
    out = helm("template", release, str(CHART), "--namespace", "default", "-f", str(f)).stdout
    queues = {d["metadata"]["name"]: d for d in yaml.safe_load_all(out) if d and d["kind"] == "Queue"}
    dept = f"{release}-department-research"
    assert queues[dept]["spec"]["parentQueue"] == release
    assert queues[dept]["spec"]["resources"]["gpu"] == {"quota": 1, "limit": 1, "overQuotaWeight": 1}
    assert queues[f"{release}-vision"]["spec"]["parentQueue"] == dept
    assert queues[f"{release}-vision"]["spec"]["resources"]["gpu"]["overQuotaWeight"] == 2
    assert queues[f"{release}-ops"]["spec"]["parentQueue"] == release
    for name in (release, dept, f"{release}-vision", f"{release}-nlp", f"{release}-ops"):  # parents first
        kube.cluster_object(QUEUES, queues[name])
    ns = kube.namespace("kai-departments")

    gpu_pod(kube, ns, "vision-1", f"{release}-vision")
    assert bound(kube, ns, "vision-1") == "gpu-l40s-kai"
    # nlp may borrow up to 2 on its own, but its department's limit is 1, which vision holds
    gpu_pod(kube, ns, "nlp-1", f"{release}-nlp")
    time.sleep(10)  # several of KAI's scheduling cycles (1 s each in the bed)
    assert not (kube.pod(ns, "nlp-1") or {}).get("spec", {}).get("nodeName"), kube.pod(ns, "nlp-1")
    # the node's second GPU was free all along: ops, which like nlp may only borrow, gets it
    gpu_pod(kube, ns, "ops-1", f"{release}-ops")
    assert bound(kube, ns, "ops-1") == "gpu-l40s-kai"
    assert not (kube.pod(ns, "nlp-1") or {}).get("spec", {}).get("nodeName")
    # when vision's pod ends, the department has room and KAI binds nlp's
    kube.request("DELETE", f"/api/v1/namespaces/{ns}/pods/vision-1?gracePeriodSeconds=0")
    kube.request("DELETE", f"/api/v1/namespaces/{ns}/pods/ops-1?gracePeriodSeconds=0")
    assert bound(kube, ns, "nlp-1") == "gpu-l40s-kai"
