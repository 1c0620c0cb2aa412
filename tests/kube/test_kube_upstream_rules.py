"""GPUKubeSpawner and the Kubernetes conventions it must follow, at the manifest level.

On the real test bed (the ``api`` fixture of tests/kube/test_kube_spawner.py): the
pod bodies the spawner sends (from the API server's audit log, or the
manifest KubeSpawner would send where no scheduler of the test bed would take
the pod), checked against the upstream rule each point comes from
(KubeSpawner's names, HAMi's webhook, z2jh's hub URL). The scheduling
consequences, homes in two team namespaces included, run in
tests/kube/test_kube_cluster_rules.py.
"""

from __future__ import annotations

import asyncio

import kubernetes_validate
import pytest
from tornado.web import HTTPError

from spawner.kube import expand_user_template, qualified_hub_connect_url
from spawner.runtime import get_runtime
from tests.support.catalogs import KUBE_SPAWNER
from tests.support.kube_spawner import K8S_VERSION, spawner_config, spawner_for

ODD_NAMES = ["alice", "jo_smith", "a.b@x.com", "Ünïcode Üser", "x" * 80, "-lead-", "UPPER", "1234"]


@pytest.mark.parametrize("name", ODD_NAMES)
async def test_job_home_claim_is_the_claim_kubespawner_names(api, name):
    """The jobs backend's claim name is KubeSpawner's own pvc_name for every user name."""
    s = spawner_for(spawner_config(api.release), name, {})
    for template in ("claim-{user_server}", "claim-{username}{servername}", "home-{username}"):
        s.pvc_name_template = template
        assert expand_user_template(template, name) == s._expand_user_properties(template)
    assert kubernetes_validate.validate(
        {
            "apiVersion": "v1",
            "kind": "PersistentVolumeClaim",
            "metadata": {"name": expand_user_template("claim-{user_server}", name)},
            "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}},
        },
        K8S_VERSION,
        strict=True,
    )


def test_job_home_claim_template_with_an_unknown_field_says_so():
    with pytest.raises(ValueError, match=r"uses a field gpulab cannot fill for jobs.*\{user_server\}"):
        expand_user_template("claim-{userid}", "alice")


def test_hub_url_for_servers_in_team_namespaces():
    # z2jh: c.JupyterHub.hub_connect_url = "http://hub:8081", resolvable only in the hub's namespace.
    assert qualified_hub_connect_url("http://hub:8081", "jhub") == "http://hub.jhub.svc.cluster.local:8081"
    assert qualified_hub_connect_url("http://hub:8081/", "jhub", "corp.local") == "http://hub.jhub.svc.corp.local:8081/"
    for kept in ("http://hub.jhub.svc:8081", "http://10.0.0.7:8081", "http://[fd00::1]:8081"):
        assert qualified_hub_connect_url(kept, "jhub") == kept


async def test_hami_pod_names_hamis_scheduler_over_z2jhs_user_scheduler(api):
    catalog = {**KUBE_SPAWNER, "sharing": {"backend": "hami"}}
    config = spawner_config(api.release, catalog)
    config.KubeSpawner.scheduler_name = "jhub-user-scheduler"  # what z2jh sets with its user-scheduler
    s = spawner_for(config, "bob", {"team": "vision", "profile": "h100-half"})
    # The manifest KubeSpawner sends (HAMi's scheduler does not run in the test bed).
    await s.load_user_options()
    pod = s.api.api_client.sanitize_for_serialization(await s.get_pod_manifest())
    # HAMi's webhook skips pods that already name a non-default scheduler
    # (pkg/scheduler/webhook.go): the pod must name HAMi's.
    assert pod["spec"]["schedulerName"] == "hami-scheduler"
    s._release_reservation()


async def test_gpu_servers_get_a_memory_backed_dev_shm_and_cpu_servers_none(api):
    """A container runtime gives /dev/shm 64 MiB; PyTorch's DataLoader workers die there
    ("bus error"). z2jh's own volumes (the home) stay; an admin's /dev/shm is kept as it is."""
    config = spawner_config(api.release)
    config.KubeSpawner.volumes = [{"name": "home", "persistentVolumeClaim": {"claimName": "claim-{username}"}}]
    config.KubeSpawner.volume_mounts = [{"name": "home", "mountPath": "/home/jovyan"}]

    async def manifest(user: str, profile: str) -> dict:
        s = spawner_for(config, user, {"team": "vision", "profile": profile})
        await s.load_user_options()
        try:
            return s.api.api_client.sanitize_for_serialization(await s.get_pod_manifest())
        finally:
            s._release_reservation()

    gpu = (await manifest("bob", "h100-half"))["spec"]
    assert {"name": "gpulab-shm", "emptyDir": {"medium": "Memory"}} in gpu["volumes"]
    mounts = gpu["containers"][0]["volumeMounts"]
    assert {"name": "gpulab-shm", "mountPath": "/dev/shm"} in mounts
    assert {"name": "home", "mountPath": "/home/jovyan"} in mounts
    cpu = (await manifest("alice", "cpu"))["spec"]
    assert all(v["name"] != "gpulab-shm" for v in cpu["volumes"])
    # The next spawn starts from the configured volumes again, not the last one's.
    again = (await manifest("bob", "h100-half"))["spec"]
    assert [v["name"] for v in again["volumes"]].count("gpulab-shm") == 1
    config.KubeSpawner.volumes = [*config.KubeSpawner.volumes, {"name": "shm", "emptyDir": {"medium": "Memory"}}]
    config.KubeSpawner.volume_mounts = [*config.KubeSpawner.volume_mounts, {"name": "shm", "mountPath": "/dev/shm"}]
    own = (await manifest("bob", "h100-half"))["spec"]
    assert [m["mountPath"] for m in own["containers"][0]["volumeMounts"]].count("/dev/shm") == 1


async def test_hami_refuses_a_privileged_init_container_before_anything_is_created(api):
    catalog = {**KUBE_SPAWNER, "sharing": {"backend": "hami"}}
    config = spawner_config(api.release, catalog)
    # z2jh's singleuser.cloudMetadata.blockWithIptables=true adds this init container.
    config.KubeSpawner.init_containers = [
        {
            "name": "block-cloud-metadata",
            "image": "quay.io/jupyterhub/k8s-network-tools:4.0.0",
            "command": ["iptables", "-A", "OUTPUT", "-d", "169.254.169.254", "-j", "DROP"],
            "securityContext": {"privileged": True, "runAsUser": 0, "capabilities": {"add": ["NET_ADMIN"]}},
        }
    ]
    s = spawner_for(config, "bob", {"team": "vision", "profile": "h100-half"})
    with pytest.raises(HTTPError) as e:
        await s.start()
    assert e.value.status_code == 500
    assert "block-cloud-metadata" in e.value.jupyterhub_message
    assert "singleuser.cloudMetadata.blockWithIptables=false" in e.value.jupyterhub_message
    await s.stop()
    assert api.count("create") == 0
    # A whole-GPU profile under another backend is not HAMi's business: gpulab lets the pod
    # go, and the API server's Pod Security admission (the chart's team namespaces enforce
    # "baseline") refuses the privileged init container, in words that say what to change.
    other = spawner_for(config, "bob", {"team": "vision", "profile": "h100-2-whole"})
    with pytest.raises(HTTPError) as e:
        await other.start()
    assert e.value.status_code == 403 and e.value.reason == "pod-security"
    message = e.value.jupyterhub_message
    assert "Pod Security admission refused the server" in message and "baseline" in message, message
    assert "singleuser.cloudMetadata.blockWithIptables=false" in message
    await other.stop()
    assert get_runtime().ledger.get("notebook:bob/") is None


async def test_profile_tolerations_affinity_and_start_timeout(api):
    profiles = [
        *KUBE_SPAWNER["profiles"],
        {
            "slug": "h100-zone",
            "display_name": "1 × H100 in zone a",
            "gpus": 1,
            "gpu_model": "H100-80GB",
            "tolerations": [{"key": "dedicated", "operator": "Equal", "value": "ml", "effect": "NoSchedule"}],
            "node_affinity_required": [
                {"matchExpressions": [{"key": "topology.kubernetes.io/zone", "operator": "In", "values": ["zone-a"]}]}
            ],
            "node_affinity_preferred": [
                {
                    "weight": 10,
                    "preference": {
                        "matchExpressions": [{"key": "gpulab.io/pool", "operator": "In", "values": ["whole"]}]
                    },
                }
            ],
            "start_timeout": "15m",
        },
    ]
    teams = [
        {**KUBE_SPAWNER["teams"][0], "allowed_profiles": [*KUBE_SPAWNER["teams"][0]["allowed_profiles"], "h100-zone"]},
        *KUBE_SPAWNER["teams"][1:],
    ]
    config = spawner_config(api.release, {**KUBE_SPAWNER, "profiles": profiles, "teams": teams})
    s = spawner_for(config, "bob", {"team": "vision", "profile": "h100-zone"})
    future = asyncio.ensure_future(s.start())
    await asyncio.sleep(0)
    assert s.start_timeout == 900  # set before JupyterHub reads it, right after start()
    # No node of the test bed is in zone-a: the pod waits; what matters is what was sent.
    for _ in range(200):
        if api.created_pods():
            break
        await asyncio.sleep(0.1)
    future.cancel()
    [pod] = api.created_pods()
    assert kubernetes_validate.validate(pod, K8S_VERSION, strict=True)
    spec = pod["spec"]
    assert {"key": "dedicated", "operator": "Equal", "value": "ml", "effect": "NoSchedule"} in spec["tolerations"]
    # GPU nodes are tainted nvidia.com/gpu (GKE; the test bed's nodes too).
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in spec["tolerations"]
    na = spec["affinity"]["nodeAffinity"]
    assert na["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"][0]["matchExpressions"][0][
        "values"
    ] == ["zone-a"]
    assert na["preferredDuringSchedulingIgnoredDuringExecution"][0]["weight"] == 10
    await s.stop()
    # The stop frees the share itself, whether or not the start saw its cancellation.
    assert get_runtime().ledger.get("notebook:bob/") is None
    # The next spawn of another profile starts from the configured values again.
    t = spawner_for(config, "bob", {"team": "vision", "profile": "cpu"})
    t.load_state(s.get_state())
    future = asyncio.ensure_future(t.start())
    await asyncio.sleep(0)
    assert t.start_timeout == 20
    # What was sent is what matters (the start itself need not finish within its 20 s on
    # a loaded machine).
    for _ in range(200):
        if len(api.created_pods()) > 1:
            break
        await asyncio.sleep(0.1)
    assert len(api.created_pods()) == 2, "the cpu spawn sent no pod"
    cpu_pod = api.created_pods()[-1]
    assert "affinity" not in cpu_pod["spec"]
    # Only the configured tolerations (c.KubeSpawner.tolerations), not the zone profile's.
    assert cpu_pod["spec"].get("tolerations", []) == list(config.KubeSpawner.tolerations)
    future.cancel()
    await t.stop()


async def test_stop_during_a_start_ends_the_start_and_frees_its_share_at_once(api):
    """JupyterHub stops a server whose start is still waiting (the user cancels on the
    progress page, or the start timed out) without cancelling the start: the stop deletes
    the pod, frees the share at once, and the start ends instead of waiting for a pod
    that is gone while still holding quota."""
    nowhere = [
        {"matchExpressions": [{"key": "topology.kubernetes.io/zone", "operator": "In", "values": ["zone-none"]}]}
    ]
    profiles = [
        *KUBE_SPAWNER["profiles"],
        {
            "slug": "h100-nowhere",
            "display_name": "1 × H100",
            "gpus": 1,
            "gpu_model": "H100-80GB",
            "node_affinity_required": nowhere,
        },
    ]
    teams = [
        {
            **KUBE_SPAWNER["teams"][0],
            "allowed_profiles": [*KUBE_SPAWNER["teams"][0]["allowed_profiles"], "h100-nowhere"],
        },
        *KUBE_SPAWNER["teams"][1:],
    ]
    config = spawner_config(api.release, {**KUBE_SPAWNER, "profiles": profiles, "teams": teams})
    s = spawner_for(config, "alice", {"team": "vision", "profile": "h100-nowhere"})
    start = s.start()
    for _ in range(200):  # the pod is created; no node matches, so it stays pending
        if any(p["metadata"]["name"] == s.pod_name for p in api.created_pods()):
            break
        await asyncio.sleep(0.1)
    assert get_runtime().ledger.get("notebook:alice/") is not None
    await s.stop()
    assert get_runtime().ledger.get("notebook:alice/") is None
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(start, 10)
    assert get_runtime().ledger.get("notebook:alice/") is None
