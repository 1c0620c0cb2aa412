"""The informers (spawner/kube/informer.py) on the real test bed: list once, then watch.

Counted by the API server's audit log (the hub ServiceAccount's requests) and
by the informers' own counters.
"""

from __future__ import annotations

import asyncio

from kubespawner import KubeSpawner

from spawner.core import labels as gl
from spawner.kube.informer import GPUPodInformer
from spawner.kube.ledger import POD_INFORMER, workload_from_pod
from tests.support.kube_spawner import ClusterView, spawner_config, spawner_for

pytestmark = __import__("pytest").mark.kube


def labelled_pod(name: str, milli: int = 0) -> dict:
    return {
        "metadata": {
            "name": name,
            "labels": {gl.GPU_MILLI: str(milli), gl.TEAM: "vision", gl.USER: "x", gl.KIND: "notebook"},
        },
        "spec": {"containers": [{"name": "c", "image": "busybox", "command": ["sleep", "inf"]}]},
    }


async def wait_for(check, what: str, timeout: float = 20) -> None:
    for _ in range(int(timeout / 0.05)):
        if check():
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


async def test_informer_lists_once_and_resumes_its_watch(api: ClusterView):
    """Watches end (here after 1-2 s) and resume from the last version: no list again.
    Changes made between two watches are still seen, from the version the last one ended at."""
    ns = api.release.team_ns("vision")
    spawner = spawner_for(spawner_config(api.release), "alice", {})
    informer = GPUPodInformer(parent=spawner, namespace=ns, omit_namespace=False, watch_timeout_seconds=1)
    informer.derive = workload_from_pod
    offset = api.kube.tb.audit_offset()
    await informer.start()
    try:
        api.create("pods", ns, labelled_pod("informed-a", 500))
        await wait_for(lambda: f"{ns}/informed-a" in informer.pods, "the new pod in the informer")
        assert [w.milli for w in informer.workloads().values()] == [500]
        await wait_for(lambda: informer.watches >= 4, "four watch requests", timeout=30)
        api.delete("pods", ns, "informed-a", grace=0)
        await wait_for(lambda: f"{ns}/informed-a" not in informer.pods, "the deleted pod gone from the informer")
        assert informer.lists == 1
        assert informer.workloads() == {}
    finally:
        await informer.stop()
    events = api.kube.tb.audit_events(offset, api.username)
    lists = [e for e in events if e["verb"] == "list" and e["objectRef"].get("resource") == "pods"]
    assert len(lists) == 1, [e["requestURI"] for e in lists]
    assert informer.watch_task is None


async def test_spawner_watches_pods_once_per_namespace(api: ClusterView):
    """KubeSpawner's pod reflector is the ledger's informer: one pod watch per namespace."""
    s = spawner_for(spawner_config(api.release), "alice", {"team": "vision", "profile": "cpu"})
    await s.start()
    try:
        keys = set(KubeSpawner.reflectors)
        ns = api.release.team_ns("vision")
        assert (POD_INFORMER, ns) in keys and ("events", ns) in keys
        assert not any(kind == "pods" for kind, _ in keys), keys
        assert s.pod_reflector is KubeSpawner.reflectors[(POD_INFORMER, ns)]
        assert f"{ns}/{s.pod_name}" in s.pod_reflector.pods
        assert await s.poll() is None
    finally:
        await s.stop()
    assert await s.poll() == 1


async def test_a_server_from_before_gpulab_is_not_forgotten(api: ClusterView):
    """A pod plain KubeSpawner started (no gpulab labels, so not in the informer) is read
    directly by poll: the hub keeps the server while its pod runs, and forgets it after."""
    ns = api.release.team_ns("vision")
    s = spawner_for(spawner_config(api.release), "legacy", {})
    s.load_state({"pod_name": "jupyter-legacy", "namespace": ns})
    api.create(
        "pods",
        ns,
        {
            "metadata": {"name": "jupyter-legacy", "labels": {"component": "singleuser-server"}},
            "spec": {"containers": [{"name": "notebook", "image": "busybox", "command": ["sleep", "inf"]}]},
        },
    )
    api.kube.wait_pod(ns, "jupyter-legacy", "Running")
    assert await s.poll() is None
    assert f"{ns}/jupyter-legacy" not in s.pod_reflector.pods
    api.delete("pods", ns, "jupyter-legacy", grace=0)
    api.kube.wait(lambda: api.get("pods", ns, "jupyter-legacy") is None, "the legacy pod gone")
    assert await s.poll() == 1
