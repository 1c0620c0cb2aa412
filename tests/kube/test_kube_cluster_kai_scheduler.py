"""GPUKubeSpawner's ``kai`` sharing backend on the real KAI scheduler.

KAI v0.20.1's six components run against the test bed's API server
(tests/kube/bed/kai_scheduler.py) beside the default and z2jh's schedulers, with the
gpulab chart's KAI Queues applied as ``helm install`` applies them, and the node agent
playing the kubelet of KAI's fake GPU node (``gpu-l40s-kai``, 2 GPUs) and of the
reservation pods KAI's binder creates. The spawners are built as in
test_kube_cluster_spawner.py and act as the hub's ServiceAccount.
"""

from __future__ import annotations

import asyncio
import copy
import json
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest
import yaml

from spawner.runtime import get_runtime
from tests.kube.bed.chart import Release
from tests.kube.bed.cluster import Cluster, collection_path
from tests.kube.bed.kai_scheduler import QUEUE_LABEL_KEY, RESERVATION, SCHEDULER_NAME, Kai
from tests.kube.bed.node_agent import CONTAINER_ENV_FILE, KAI_RESERVED_GPU_ANNOTATION
from tests.kube.bed.testbed import TestbedError
from tests.support.helm import CHART, helm
from tests.support.kube_spawner import chart_config, chart_team, spawner_for

KAI_NODE = "gpu-l40s-kai"
#: The label KAI's binder puts on a fraction and on the reservation pod that holds its GPU
#: (NVIDIA/KAI-Scheduler v0.20.1 pkg/common/constants: GPUGroup).
GPU_GROUP_LABEL = "runai-gpu-group"
#: Profiles for KAI's pool: the node's own model, pinned by its pool label.
KAI_PROFILES = [
    {"slug": "l40s-half", "display_name": "0.5 × L40S", "gpus": 0.5, "gpu_model": "L40S", "sharing": "kai"},
    {"slug": "l40s-1", "display_name": "1 × L40S", "gpus": 1, "gpu_model": "L40S", "sharing": "kai"},
]
KAI_SHARING = {"node_selector": {"L40S": {"gpulab.io/pool": "kai"}}}


@dataclass
class KaiChart:
    """What the gpulab chart renders for the release with KAI's profiles added to its values."""

    #: The KAI Queues, by the team each is for (the parent queue under ``""``).
    queues: dict[str, dict[str, Any]]
    #: The catalog the chart hands the hub (its ConfigMap): the queue names the pods give.
    catalog: dict[str, Any]


@pytest.fixture(scope="module")
def kai_chart(
    kai_scheduler: Kai, gpulab_release: Release, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[KaiChart]:
    """The session release's values with KAI's profiles (what an admin adds), rendered by the
    real chart; its KAI Queues applied to the cluster as ``helm install`` applies them."""
    gpulab = copy.deepcopy(gpulab_release.values["gpulab"])
    gpulab["profiles"] = [*gpulab["profiles"], *KAI_PROFILES]
    gpulab["sharing"] = {**gpulab.get("sharing", {}), "kai": KAI_SHARING}
    values_file = tmp_path_factory.mktemp("kai-values") / "values.yaml"
    values_file.write_text(yaml.safe_dump({**gpulab_release.values, "gpulab": gpulab}))
    out = helm(
        "template", gpulab_release.name, str(CHART), "--namespace", gpulab_release.hub_namespace,
        "-f", str(values_file),
    ).stdout  # fmt: skip
    docs = [d for d in yaml.safe_load_all(out) if d]
    queues = [d for d in docs if d["kind"] == "Queue"]
    (catalog_map,) = [d for d in docs if d["kind"] == "ConfigMap" and "catalog.yaml" in d.get("data", {})]
    # The hub's read access to KAI's queues, which the chart grants when KAI is in use.
    queue_rbac = [
        d for d in docs if d["kind"] in ("ClusterRole", "ClusterRoleBinding") and "kai-queue" in d["metadata"]["name"]
    ]
    c = gpulab_release.cluster
    for q in queues:
        c.create("/apis/scheduling.run.ai/v2/queues", q)
    for obj in queue_rbac:
        c.create(collection_path(obj), obj)
    yield KaiChart(
        {q["metadata"].get("labels", {}).get("gpulab.io/team", ""): q for q in queues},
        yaml.safe_load(catalog_map["data"]["catalog.yaml"]),
    )
    for q in reversed(queues):
        c.request("DELETE", f"/apis/scheduling.run.ai/v2/queues/{q['metadata']['name']}")
    for obj in queue_rbac:
        c.request("DELETE", f"{collection_path(obj)}/{obj['metadata']['name']}")


@pytest.fixture
def kai_release(hub_identity: Release, kai_chart: KaiChart, kube: Cluster) -> Iterator[Release]:
    """The hub's identity with KAI running; KAI's reservation pods gone after the test."""
    yield hub_identity
    hub_identity.clean_team_namespaces()
    kube.wait(lambda: not kube.pods(RESERVATION["namespace"]), "KAI's reservation pods to be gone", 60)


def kai_config(release: Release, chart: KaiChart, **traits: Any):
    """The hub's config with the catalog the chart renders for it."""
    config = chart_config(release, profiles=chart.catalog["profiles"], sharing=chart.catalog["sharing"])
    for name, value in traits.items():
        setattr(config.KubeSpawner, name, value)
    return config


def pod_group(kube: Cluster, pod: dict[str, Any]) -> dict[str, Any]:
    """The PodGroup KAI's pod grouper made for a pod (it names the pod group on the pod)."""
    ns = pod["metadata"]["namespace"]

    def found() -> dict[str, Any] | None:
        p = kube.pod(ns, pod["metadata"]["name"]) or {}
        name = (p.get("metadata", {}).get("annotations") or {}).get("pod-group-name")
        return kube.maybe_get(f"/apis/scheduling.run.ai/v2alpha2/namespaces/{ns}/podgroups/{name}") if name else None

    return kube.wait(found, f"the PodGroup of {ns}/{pod['metadata']['name']}", 30)


def queue_gpus(kube: Cluster, name: str) -> float:
    """The GPUs KAI's queue controller counts as allocated to queue ``name`` (its status)."""
    allocated = (kube.get(f"/apis/scheduling.run.ai/v2/queues/{name}").get("status") or {}).get("allocated") or {}
    value = str(allocated.get("nvidia.com/gpu", "0"))
    return int(value[:-1]) / 1000 if value.endswith("m") else float(value)


async def until(check: Callable[[], Any], what: str, timeout: float) -> Any:
    """``check()`` once it is truthy, waiting without blocking the spawners' event loop."""
    deadline = time.monotonic() + timeout
    while not (result := check()):
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")
        await asyncio.sleep(0.5)
    return result


def container_environment(kube: Cluster, pod: dict[str, Any]) -> dict[str, str]:
    """The environment the pod's container started with, as the node agent recorded it."""
    home = kube.tb.state_dir / "pods" / pod["metadata"]["namespace"] / pod["metadata"]["name"]
    return json.loads((home / CONTAINER_ENV_FILE).read_text())


async def test_the_charts_queues_are_kais_and_a_teams_server_runs_in_its_teams_queue(
    kai_release: Release, kube: Cluster, kai_chart: KaiChart
):
    release = kai_release
    vision = chart_team(release, "vision")
    queue = kai_chart.queues[vision]
    # KAI's queue webhook admitted the chart's queues; it refuses one without resources.
    with pytest.raises(TestbedError, match="resources must be specified"):
        kube.create("/apis/scheduling.run.ai/v2/queues", {"apiVersion": "scheduling.run.ai/v2", "kind": "Queue"}
                    | {"metadata": {"name": f"no-resources-{kube.suffix}"}, "spec": {}})  # fmt: skip
    # The parent queue and one per team, each as the chart's values give its quota and limit.
    assert set(kai_chart.queues) == {"", *release.teams}
    assert queue["spec"]["parentQueue"] == kai_chart.queues[""]["metadata"]["name"]
    assert queue["spec"]["resources"]["gpu"]["quota"] == 2 and queue["spec"]["resources"]["gpu"]["limit"] == 3
    s = spawner_for(kai_config(release, kai_chart), "alice", {"team": vision, "profile": "l40s-half"})
    await s.start()
    pod = kube.pod(release.team_ns(vision), s.pod_name)
    assert pod["spec"]["schedulerName"] == SCHEDULER_NAME and pod["spec"]["nodeName"] == KAI_NODE
    assert pod["metadata"]["labels"][QUEUE_LABEL_KEY] == queue["metadata"]["name"]
    # KAI's pod grouper put the pod in the chart's queue, and KAI's scheduler counts it there.
    group = pod_group(kube, pod)
    assert group["spec"]["queue"] == queue["metadata"]["name"]
    assert group["spec"]["priorityClassName"] == pod["spec"]["priorityClassName"]
    name = queue["metadata"]["name"]
    kube.wait(lambda: queue_gpus(kube, name) == 0.5, f"queue {name} to count the 0.5 GPU", 30)
    await s.stop()


async def test_two_half_gpu_fractions_share_the_gpu_that_kais_reservation_pod_holds(
    kai_release: Release, kube: Cluster, kai_chart: KaiChart
):
    release = kai_release
    vision = chart_team(release, "vision")
    ns = release.team_ns(vision)
    config = kai_config(release, kai_chart)
    spawners = [spawner_for(config, user, {"team": vision, "profile": "l40s-half"}) for user in ("alice", "bob")]
    for s in spawners:
        await s.start()
    pods = [kube.pod(ns, s.pod_name) for s in spawners]
    assert {p["spec"]["nodeName"] for p in pods} == {KAI_NODE}
    assert all(p["metadata"]["annotations"]["gpu-fraction"] == "0.5" for p in pods)
    assert all("nvidia.com/gpu" not in p["spec"]["containers"][0]["resources"].get("limits", {}) for p in pods)
    groups = {p["metadata"]["labels"][GPU_GROUP_LABEL] for p in pods}
    assert len(groups) == 1, groups  # one GPU for both
    (group,) = groups
    # KAI's binder reserved that GPU with one pod of its own, which the kubelet gave one GPU.
    (reservation,) = kube.pods(RESERVATION["namespace"], f"{GPU_GROUP_LABEL}={group}")
    assert reservation["metadata"]["name"].startswith(f"gpu-reservation-{KAI_NODE}-")
    assert reservation["spec"]["nodeName"] == KAI_NODE and reservation["status"]["phase"] == "Running"
    gpu = reservation["metadata"]["annotations"][KAI_RESERVED_GPU_ANNOTATION]
    held = {
        d["resourceName"]: d["deviceIds"]
        for p in release.cluster.tb.pod_resources(KAI_NODE)
        if p["name"] == reservation["metadata"]["name"]
        for c in p["containers"]
        for d in c["devices"]
    }
    assert held == {"nvidia.com/gpu": [gpu]}
    for pod in pods:
        # KAI's admission webhook pointed the container's NVIDIA_VISIBLE_DEVICES at the
        # ConfigMap KAI's binder filled with the reserved GPU; the container starts with it.
        (ref,) = [
            e["valueFrom"]["configMapKeyRef"]
            for e in pod["spec"]["containers"][0]["env"]
            if e["name"] == "NVIDIA_VISIBLE_DEVICES"
        ]
        data = kube.get(f"/api/v1/namespaces/{ns}/configmaps/{ref['name']}")["data"]
        assert data[ref["key"]] == gpu and float(data["GPU_PORTION"]) == 0.5
        env = container_environment(kube, pod)
        assert env["NVIDIA_VISIBLE_DEVICES"] == gpu and float(env["GPU_PORTION"]) == 0.5
    for s in spawners:
        await s.stop()
    # The last fraction gone, KAI's binder deletes the reservation pod and frees the GPU.
    kube.wait(lambda: not kube.pods(RESERVATION["namespace"]), "the reservation pod to be deleted", 60)


async def test_over_quota_work_is_reclaimed_when_another_queue_needs_its_quota(
    kai_release: Release, kube: Cluster, kai_chart: KaiChart
):
    release = kai_release
    nlp, vision = chart_team(release, "nlp"), chart_team(release, "vision")
    config = kai_config(release, kai_chart)
    # Team nlp (guarantee 1, burst 2) fills KAI's 2-GPU node: 1 GPU in quota, 1 borrowed.
    carol = spawner_for(config, "carol", {"team": nlp, "profile": "l40s-1"})
    await carol.start()
    alice = spawner_for(config, "alice", {"team": nlp, "profile": "l40s-1"})
    await alice.start()
    in_quota, borrowed = (kube.pod(release.team_ns(nlp), s.pod_name) for s in (carol, alice))
    assert borrowed["metadata"]["labels"]["gpulab.io/quota"] == "over-quota"
    assert borrowed["spec"]["priority"] < 100 <= in_quota["spec"]["priority"]  # KAI's non-preemptible threshold
    borrowed_group = pod_group(kube, borrowed)["metadata"]["name"]
    # Team vision (guarantee 2) asks for a GPU it is guaranteed: KAI reclaims the borrowed one.
    bob = spawner_for(config, "bob", {"team": vision, "profile": "l40s-1"})
    await bob.start()
    claimed = kube.pod(release.team_ns(vision), bob.pod_name)
    assert claimed["spec"]["nodeName"] == KAI_NODE and claimed["status"]["phase"] == "Running"
    kube.wait(lambda: kube.pod(release.team_ns(nlp), alice.pod_name) is None, "the borrowed pod to be gone", 60)
    assert kube.pod(release.team_ns(nlp), carol.pod_name)["status"]["phase"] == "Running"
    # The hub's poll sees the reclaimed server gone; JupyterHub then stops it (its poll
    # callback, app.py user_stopped), which frees its share in the ledger.
    assert await alice.poll() is not None
    assert await carol.poll() is None
    await alice.stop()
    assert get_runtime().ledger.get(alice.workload_key) is None
    # KAI records the eviction on the pod group, naming the action.
    evictions = [e for e in kube.events(release.team_ns(nlp), borrowed_group) if e["reason"] == "Evict"]
    assert evictions, kube.events(release.team_ns(nlp), borrowed_group)
    for s in (bob, carol):
        await s.stop()


async def test_kais_unschedulable_event_reads_as_gpulabs_sentence(
    kai_release: Release, kube: Cluster, kai_chart: KaiChart
):
    release = kai_release
    crowd, vision = chart_team(release, "crowd"), chart_team(release, "vision")
    config = kai_config(release, kai_chart)
    # Team crowd holds both GPUs of KAI's node within its guarantee: nothing there is reclaimable.
    holders = [
        spawner_for(config, f"crowd{i}", {"team": crowd, "profile": "l40s-1"}, groups=("crowd",)) for i in range(2)
    ]
    for s in holders:
        await s.start()
    waiting = spawner_for(
        kai_config(release, kai_chart, start_timeout=600), "bob", {"team": vision, "profile": "l40s-1"}
    )
    start = asyncio.ensure_future(waiting.start())
    waiting._start_future = start
    ns = release.team_ns(vision)
    kai_events = await until(
        lambda: [e for e in kube.events(ns, waiting.pod_name) if e["reason"] == "Unschedulable"],
        "KAI's Unschedulable event on bob's pod",
        60,
    )
    assert kai_events[0]["source"].get("component") == SCHEDULER_NAME, kai_events[0]
    raw = [e["message"] for e in kai_events]
    messages: list[str] = []

    async def read_progress() -> None:
        async for event in waiting.progress():
            messages.append(event.get("message", ""))
            if any("KAI" in m for m in messages):
                return

    try:
        await asyncio.wait_for(read_progress(), 30)
    except asyncio.TimeoutError:
        pass
    words = next((m for m in messages if "KAI" in m), None)
    assert words is not None, (messages, raw)
    # KAI weighed every node of the bed and found the L40S node's GPUs all held.
    nodes = len(kube.get("/api/v1/nodes")["items"])
    assert words.startswith(
        f"Waiting for 1 × L40S: KAI's scheduler found no node with enough free resources (of {nodes} nodes: "
    ), (words, raw)
    assert "nodes without enough free GPUs" in words and words.endswith(
        "The server starts as soon as one frees up, or a node is added."
    ), (words, raw)
    pod = kube.pod(release.team_ns(vision), waiting.pod_name)
    assert pod["status"]["phase"] == "Pending" and "nodeName" not in pod["spec"]
    start.cancel()
    await waiting.stop()
    for s in holders:
        await s.stop()


async def test_a_server_whose_kai_queue_does_not_exist_is_refused_before_any_pod(
    kai_release: Release, kube: Cluster, kai_chart: KaiChart
):
    """KAI's scheduler skips a pod group whose queue does not exist without a word
    (pkg/scheduler/cache/cluster_info/cluster_info.go), so such a server would wait until
    its start timeout. A hub whose catalog names other queues than the chart made (here
    the bare team name) is told so before a pod is created (the other tests start the same
    server with the chart's names)."""
    release = kai_release
    vision = chart_team(release, "vision")
    ns = release.team_ns(vision)
    config = kai_config(release, kai_chart)
    config.GPULab.sharing = {**config.GPULab.sharing, "kai": {**config.GPULab.sharing["kai"], "queue": "{team}"}}
    s = spawner_for(config, "alice", {"team": vision, "profile": "l40s-half"})
    with pytest.raises(Exception) as refused:
        await s.start()
    assert getattr(refused.value, "jupyterhub_message", "") == (
        f"The KAI scheduler has no queue {vision!r}, so it would never place this server. Ask an admin: the "
        f"hub's catalog names team {vision}'s queue {vision!r} (sharing.kai.queue '{{team}}'), which the "
        f"gpulab chart did not create."
    )
    assert kube.pods(ns) == []
    assert get_runtime().ledger.get(s.workload_key) is None
