"""GPUKubeSpawner on the real control plane (scripts/kube-testbed).

The spawners run in this process, built as KubeSpawner's own tests build
them, and talk to the real kube-apiserver with the hub ServiceAccount's
token, bound only by the Roles the gpulab chart installed (tests/kube/bed/chart.py).
The real kube-scheduler places the pods on the fake GPU nodes of
tests/kube/bed/nodes.yaml, the real quota controller keeps the chart's
ResourceQuotas, and the node agent plays the kubelet.
"""

from __future__ import annotations

import asyncio

import pytest
from kubespawner import KubeSpawner

from spawner.runtime import get_runtime, set_runtime
from tests.kube.bed.chart import Release
from tests.kube.bed.cluster import Cluster
from tests.kube.bed.testbed import pod_ip_prefix
from tests.support.kube_spawner import GPU_TOLERATION, chart_config, chart_team, spawner_for


async def test_start_poll_stop_on_a_time_sliced_node(hub_identity: Release, kube: Cluster):
    release = hub_identity
    vision = chart_team(release, "vision")
    ns = release.team_ns(vision)
    s = spawner_for(chart_config(release), "alice", {"team": vision, "profile": "h100-half"})
    url = await s.start()
    assert url.startswith("http://" + pod_ip_prefix(release.cluster.tb.state_dir))
    pod = kube.pod(ns, s.pod_name)
    assert pod["spec"]["nodeName"] == "gpu-h100-timeslice"  # the only node with nvidia.com/gpu.shared
    limits = pod["spec"]["containers"][0]["resources"]["limits"]
    assert limits["nvidia.com/gpu.shared"] == "2"
    assert pod["spec"]["priorityClassName"] == "gpulab-development"
    assert pod["spec"]["priority"] == 10000  # the Priority admission plugin resolved the chart's class
    assert await s.poll() is None
    assert get_runtime().ledger.get(s.workload_key).state == "running"
    quota = kube.get(f"/api/v1/namespaces/{ns}/resourcequotas/gpulab-gpus")
    kube.wait(
        lambda: (
            kube.get(f"/api/v1/namespaces/{ns}/resourcequotas/gpulab-gpus")["status"]["used"].get(
                "requests.nvidia.com/gpu.shared"
            )
            == "2"
        ),
        "the quota controller to count the pod",
        30,
    )
    assert quota["spec"]["hard"]["requests.nvidia.com/gpu.shared"] == "12"  # burst 3 GPUs × 4 replicas
    await s.stop()
    kube.wait(lambda: kube.pod(ns, s.pod_name) is None, "the pod to be deleted", 30)
    assert await s.poll() is not None
    assert get_runtime().ledger.get(s.workload_key) is None


async def test_100_concurrent_spawns_guarantee_4_burst_6(hub_identity: Release, kube: Cluster):
    release = hub_identity
    crowd = chart_team(release, "crowd")
    ns = release.team_ns(crowd)
    config = chart_config(release)
    spawners = [
        spawner_for(config, f"user{i:03d}", {"team": crowd, "profile": "h100-half"}, groups=("crowd",))
        for i in range(100)
    ]
    results = await asyncio.gather(*(s.start() for s in spawners), return_exceptions=True)
    started = [s for s, r in zip(spawners, results, strict=True) if isinstance(r, str)]
    refused = [r for r in results if not isinstance(r, str)]
    assert len(started) == 12, [str(r) for r in refused[:3]]
    assert len(refused) == 88
    assert {getattr(r, "jupyterhub_message", str(r)) for r in refused} == {
        f"team {crowd} holds 6 of its 6 GPU burst limit; this request needs 0.5"
    }
    pods = kube.pods(ns)
    assert len(pods) == 12
    over = [p for p in pods if p["metadata"]["labels"].get("gpulab.io/quota") == "over-quota"]
    assert len(over) == 4 and all(p["spec"]["priorityClassName"] == "gpulab-over-quota" for p in over)
    # The chart's ResourceQuota (burst 6 GPUs = 24 time-slices) was never crossed.
    used = kube.wait(
        lambda: (
            kube.get(f"/api/v1/namespaces/{ns}/resourcequotas/gpulab-gpus")["status"]["used"].get(
                "requests.nvidia.com/gpu.shared"
            )
            == "24"
            and True
        ),
        "quota usage 24",
        30,
    )
    assert used
    await asyncio.gather(*(s.stop() for s in started))


async def test_the_api_servers_own_quota_refusal_reads_as_a_sentence(hub_identity: Release, kube: Cluster):
    release = hub_identity
    vision = chart_team(release, "vision")
    ns = release.team_ns(vision)
    # Someone else's pod, not labelled by gpulab, holds 11 of the 12 time-slices of the quota.
    kube.create(
        f"/api/v1/namespaces/{ns}/pods",
        {
            "metadata": {"name": "outsider"},
            "spec": {
                "tolerations": [GPU_TOLERATION],
                "containers": [
                    {"name": "x", "image": "busybox", "resources": {"limits": {"nvidia.com/gpu.shared": "11"}}}
                ],
            },
        },
    )
    kube.wait(
        lambda: (
            kube.get(f"/api/v1/namespaces/{ns}/resourcequotas/gpulab-gpus")["status"]["used"].get(
                "requests.nvidia.com/gpu.shared"
            )
            == "11"
        ),
        "quota usage 11",
        30,
    )
    before = kube.request_counts().get(("POST", "pods", ""), 0)
    s = spawner_for(chart_config(release), "bob", {"team": vision, "profile": "h100-half"})
    with pytest.raises(Exception) as refused:
        await s.start()
    message = getattr(refused.value, "jupyterhub_message", "")
    assert message.startswith(
        f"The cluster refused the server: namespace {ns} is at its ResourceQuota 'gpulab-gpus'"
    ), message
    assert "Stop another server in your team or ask an admin to raise the quota." in message
    assert [p["metadata"]["name"] for p in kube.pods(ns)] == ["outsider"]
    assert get_runtime().ledger.get(s.workload_key) is None
    # One create reached the API server, and it refused it.
    assert kube.request_counts().get(("POST", "pods", ""), 0) - before >= 1


async def test_a_new_hub_process_rebuilds_the_ledger_from_labelled_pods(hub_identity: Release, kube: Cluster):
    release = hub_identity
    vision, nlp = chart_team(release, "vision"), chart_team(release, "nlp")
    config = chart_config(release)
    a = spawner_for(config, "alice", {"team": vision, "profile": "h100-half"})
    c = spawner_for(config, "carol", {"team": nlp, "profile": "h100-1"})
    await a.start()
    await c.start()
    before = {(w.key, w.team, w.milli, w.state) for w in get_runtime().ledger.workloads()}
    # A hub restart: new process state, no reflectors, an empty ledger.
    await KubeSpawner._stop_all_reflectors()
    set_runtime(None)
    fresh = spawner_for(config, "alice", {"team": vision, "profile": "h100-half"})
    fresh.load_state(a.get_state())
    assert await fresh.poll() is None
    after = {(w.key, w.team, w.milli, w.state) for w in get_runtime().ledger.workloads()}
    assert after == before and len(after) == 2
    await a.stop()
    await c.stop()


BACKENDS = [
    # (sharing config, profile, the node whose resources it needs)
    (
        {"backend": "timeslice", "timeslice": {"resource": "nvidia.com/gpu.shared", "replicas": 4}},
        {"slug": "p", "display_name": "0.25 × H100", "gpus": 0.25, "gpu_model": "H100-80GB"},
        {"gpu-h100-timeslice"},
    ),
    (
        {"backend": "whole"},
        {"slug": "p", "display_name": "1 × H100", "gpus": 1, "gpu_model": "H100-80GB"},
        {"gpu-h100-whole-1", "gpu-h100-whole-2"},  # never the HAMi node (spawner/core/gpu_pools.py)
    ),
    (
        {"backend": "mig"},
        {"slug": "p", "display_name": "0.5 × A100", "gpus": 0.5, "gpu_model": "A100-80GB"},
        {"gpu-a100-mig"},
    ),
]


@pytest.mark.parametrize("sharing,profile,nodes", BACKENDS, ids=[b[0]["backend"] for b in BACKENDS])
async def test_each_backend_lands_on_a_node_that_offers_its_resource(
    hub_identity: Release, kube: Cluster, sharing, profile, nodes
):
    release = hub_identity
    nlp = chart_team(release, "nlp")
    config = chart_config(release, sharing=sharing, profiles=[profile])
    s = spawner_for(config, "carol", {"team": nlp, "profile": "p"})
    await s.start()
    pod = kube.pod(release.team_ns(nlp), s.pod_name)
    assert pod["spec"]["nodeName"] in nodes, pod["spec"]
    assert pod["status"]["phase"] == "Running"
    await s.stop()


async def test_a_profile_no_node_offers_stays_pending_with_the_reason_in_words(hub_identity: Release, kube: Cluster):
    release = hub_identity
    nlp = chart_team(release, "nlp")
    ns = release.team_ns(nlp)
    profile = {"slug": "h200", "display_name": "0.5 × H200", "gpus": 0.5, "gpu_model": "H200-141GB"}
    config = chart_config(release, sharing={"backend": "mig"}, profiles=[profile])
    config.KubeSpawner.start_timeout = 600
    s = spawner_for(config, "carol", {"team": nlp, "profile": "h200"})
    start = asyncio.ensure_future(s.start())
    s._start_future = start
    messages = []

    async def read_progress():
        async for event in s.progress():
            messages.append(event.get("message", ""))
            if any("running now offers" in m for m in messages):
                return

    await asyncio.wait_for(read_progress(), 60)
    words = next(m for m in messages if "running now offers" in m)
    assert words.startswith(
        "None of the 7 nodes running now offers 0.5 × H200 (7 nodes with another GPU model or pool)"
    ), words
    pod = kube.pod(ns, s.pod_name)
    assert pod["status"]["phase"] == "Pending" and "nodeName" not in pod["spec"]
    start.cancel()
    await s.stop()
