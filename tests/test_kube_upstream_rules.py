"""GPUKubeSpawner and the Kubernetes conventions it must follow, at the manifest level.

Against the API-server stand-in (tests/kube_api_server.py): the pod and PVC
bodies the spawner sends, checked against the upstream rule each point comes
from (KubeSpawner's names and state, HAMi's webhook, z2jh's hub URL). The
scheduling consequences run on the real control plane in
tests/test_kube_cluster_rules.py.
"""

from __future__ import annotations

import kubernetes_validate
import pytest
from tornado.web import HTTPError

from spawner.kube import expand_user_template, qualified_hub_connect_url
from tests.test_kube_spawner import (  # noqa: F401 - the api fixture
    CATALOG,
    K8S_VERSION,
    api,
    created_pods,
    make_config,
    spawner_for,
)

ODD_NAMES = ["alice", "jo_smith", "a.b@x.com", "Ünïcode Üser", "x" * 80, "-lead-", "UPPER", "1234"]


@pytest.mark.parametrize("name", ODD_NAMES)
async def test_job_home_claim_is_the_claim_kubespawner_names(api, name):
    """The jobs backend's claim name is KubeSpawner's own pvc_name for every user name."""
    s = spawner_for(api, name, {})
    for template in ("claim-{user_server}", "claim-{username}{servername}", "home-{username}"):
        s.pvc_name_template = template
        assert expand_user_template(template, name) == s._expand_user_properties(template)
    assert kubernetes_validate.validate(
        {"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {
            "name": expand_user_template("claim-{user_server}", name)},
         "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}}},
        K8S_VERSION, strict=True)


def test_job_home_claim_template_with_an_unknown_field_says_so():
    with pytest.raises(ValueError, match=r"uses a field gpulab cannot fill for jobs.*\{user_server\}"):
        expand_user_template("claim-{userid}", "alice")


def test_hub_url_for_servers_in_team_namespaces():
    # z2jh: c.JupyterHub.hub_connect_url = "http://hub:8081", resolvable only in the hub's namespace.
    assert qualified_hub_connect_url("http://hub:8081", "jhub") == "http://hub.jhub.svc.cluster.local:8081"
    assert qualified_hub_connect_url("http://hub:8081/", "jhub", "corp.local") == \
        "http://hub.jhub.svc.corp.local:8081/"
    for kept in ("http://hub.jhub.svc:8081", "http://10.0.0.7:8081", "http://[fd00::1]:8081"):
        assert qualified_hub_connect_url(kept, "jhub") == kept


def pvc_names(api, namespace: str) -> list[str]:
    return sorted(p["metadata"]["name"] for p in api.list("persistentvolumeclaims", namespace))


def claim_of(pod: dict) -> str | None:
    for v in pod["spec"].get("volumes", []):
        if "persistentVolumeClaim" in v:
            return v["persistentVolumeClaim"]["claimName"]
    return None


async def test_a_user_in_two_teams_gets_a_home_in_each_team_namespace(api):
    """KubeSpawner remembers pvc_name once the claim exists and skips creating it;
    a claim is namespaced, so a spawn in team B must create B's own."""
    config = make_config(api)
    config.KubeSpawner.storage_pvc_ensure = True
    config.KubeSpawner.storage_capacity = "10Gi"
    config.KubeSpawner.volumes = [{"name": "home", "persistentVolumeClaim": {"claimName": "{pvc_name}"}}]
    config.KubeSpawner.volume_mounts = [{"name": "home", "mountPath": "/home/jovyan"}]
    a = spawner_for(api, "alice", {"team": "vision", "profile": "h100-1"}, config=config)
    await a.start()
    assert pvc_names(api, "team-vision") == ["claim-alice"]
    await a.stop()
    a.clear_state()
    state = a.get_state()  # what the hub stores after the server stopped
    assert state["pvc_name"] == "claim-alice" and state["gpulab_pvc_namespace"] == "team-vision"

    # The same user's server, later, in team nlp (a new spawner from the saved state, as after a restart).
    b = spawner_for(api, "alice", {"team": "nlp", "profile": "h100-1"}, config=config)
    b.load_state(state)
    await b.start()
    [pod] = created_pods(api, "team-nlp")
    assert pvc_names(api, "team-nlp") == ["claim-alice"]
    assert claim_of(pod) == "claim-alice"  # and it exists in the pod's own namespace
    assert b.get_state()["gpulab_pvc_namespace"] == "team-nlp"
    await b.stop()
    # Back in team vision: its claim is still there and is reused, not created again.
    b.clear_state()
    c = spawner_for(api, "alice", {"team": "vision", "profile": "h100-1"}, config=config)
    c.load_state(b.get_state())
    creates = api.count("create", "persistentvolumeclaims")
    await c.start()
    assert api.count("create", "persistentvolumeclaims") == creates + 1  # tried; 409 AlreadyExists is fine
    assert pvc_names(api, "team-vision") == ["claim-alice"]
    await c.stop()


async def test_hami_pod_names_hamis_scheduler_over_z2jhs_user_scheduler(api):
    catalog = {**CATALOG, "sharing": {"backend": "hami"}}
    config = make_config(api, catalog)
    config.KubeSpawner.scheduler_name = "jhub-user-scheduler"  # what z2jh sets with its user-scheduler
    s = spawner_for(api, "bob", {"team": "vision", "profile": "h100-half"}, config=config)
    await s.start()
    [pod] = created_pods(api)
    # HAMi's webhook skips pods that already name a non-default scheduler
    # (pkg/scheduler/webhook.go): the pod must name HAMi's.
    assert pod["spec"]["schedulerName"] == "hami-scheduler"
    await s.stop()


async def test_hami_refuses_a_privileged_init_container_before_anything_is_created(api):
    catalog = {**CATALOG, "sharing": {"backend": "hami"}}
    config = make_config(api, catalog)
    # z2jh's singleuser.cloudMetadata.blockWithIptables=true adds this init container.
    config.KubeSpawner.init_containers = [{
        "name": "block-cloud-metadata", "image": "quay.io/jupyterhub/k8s-network-tools:4.0.0",
        "command": ["iptables", "-A", "OUTPUT", "-d", "169.254.169.254", "-j", "DROP"],
        "securityContext": {"privileged": True, "runAsUser": 0, "capabilities": {"add": ["NET_ADMIN"]}}}]
    s = spawner_for(api, "bob", {"team": "vision", "profile": "h100-half"}, config=config)
    with pytest.raises(HTTPError) as e:
        await s.start()
    assert e.value.status_code == 500
    assert "block-cloud-metadata" in e.value.jupyterhub_message
    assert "singleuser.cloudMetadata.blockWithIptables=false" in e.value.jupyterhub_message
    await s.stop()
    assert api.count("create") == 0
    # A whole-GPU profile under another backend is not HAMi's business.
    other = spawner_for(api, "bob", {"team": "vision", "profile": "h100-2-whole"}, config=config)
    await other.start()
    await other.stop()


async def test_profile_tolerations_affinity_and_start_timeout(api):
    profiles = [*CATALOG["profiles"], {
        "slug": "h100-zone", "display_name": "1 × H100 in zone a", "gpus": 1, "gpu_model": "H100-80GB",
        "tolerations": [{"key": "dedicated", "operator": "Equal", "value": "ml", "effect": "NoSchedule"}],
        "node_affinity_required": [{"matchExpressions": [
            {"key": "topology.kubernetes.io/zone", "operator": "In", "values": ["zone-a"]}]}],
        "node_affinity_preferred": [{"weight": 10, "preference": {"matchExpressions": [
            {"key": "gpulab.io/pool", "operator": "In", "values": ["whole"]}]}}],
        "start_timeout": "15m"}]
    teams = [{**CATALOG["teams"][0], "allowed_profiles": [*CATALOG["teams"][0]["allowed_profiles"], "h100-zone"]},
             *CATALOG["teams"][1:]]
    config = make_config(api, {**CATALOG, "profiles": profiles, "teams": teams})
    s = spawner_for(api, "bob", {"team": "vision", "profile": "h100-zone"}, config=config)
    future = s.start()
    assert s.start_timeout == 900  # set before JupyterHub reads it, right after start()
    await future
    [pod] = created_pods(api)
    assert kubernetes_validate.validate(pod, K8S_VERSION, strict=True)
    spec = pod["spec"]
    assert {"key": "dedicated", "operator": "Equal", "value": "ml", "effect": "NoSchedule"} in spec["tolerations"]
    # GPU nodes are tainted nvidia.com/gpu (GKE; the test bed's nodes too).
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in spec["tolerations"]
    na = spec["affinity"]["nodeAffinity"]
    assert na["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"][0]["matchExpressions"][0][
        "values"] == ["zone-a"]
    assert na["preferredDuringSchedulingIgnoredDuringExecution"][0]["weight"] == 10
    await s.stop()
    # The next spawn of another profile starts from the configured values again.
    t = spawner_for(api, "bob", {"team": "vision", "profile": "cpu"}, config=config)
    t.load_state(s.get_state())
    future = t.start()
    assert t.start_timeout == 20
    await future
    cpu_pod = created_pods(api)[-1]
    assert "affinity" not in cpu_pod["spec"] and "tolerations" not in cpu_pod["spec"]
    await t.stop()
