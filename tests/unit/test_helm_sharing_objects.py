"""The chart's objects for GPU sharing, queueing and team isolation.

The real ``helm`` binary renders the chart (tests/unit/test_helm_chart.py's
helpers); each object is checked against the upstream convention it follows:
the NVIDIA device plugin's per-node configs, Kueue's flavors and queues,
KAI's Queue objects, z2jh's single-user NetworkPolicy and pull secret.
"""

from __future__ import annotations

import json
import math
from fractions import Fraction

import pytest
import yaml

from spawner.core import labels, sharing
from tests.support import REPO
from tests.support.helm import (
    NAMESPACE,
    QUANTITY,
    catalog_of,
    chart_values,
    device_plugin_advertises,
    helm,
    of_kind,
    quota_in,
    render,
    team_namespace,
    template_args,
)


def test_time_slicing_configmap(tmp_path):
    docs = render("timeslice")
    catalog = catalog_of(docs)
    values = chart_values()["timeSlicing"]
    (cm,) = [d for d in of_kind(docs, "ConfigMap") if d["metadata"]["name"] == "gpulab-time-slicing"]
    assert cm["metadata"]["namespace"] == "gpu-operator"
    # Two node pools: whole GPUs (the ClusterPolicy default) and time-shared nodes.
    assert set(cm["data"]) == {values["wholeConfig"], values["sharedConfig"]}
    cfg = yaml.safe_load(cm["data"][values["sharedConfig"]])
    ts = cfg["sharing"]["timeSlicing"]
    assert ts["resources"] == [{"name": "nvidia.com/gpu", "replicas": catalog.sharing["timeslice"]["replicas"]}]
    assert ts["renameByDefault"] is (catalog.sharing["timeslice"]["resource"] == "nvidia.com/gpu.shared")
    # NVIDIA's recommendation, and the spawner's default.
    assert ts["failRequestsGreaterThanOne"] is True
    pools = {name: device_plugin_advertises(text) for name, text in cm["data"].items()}
    # Every profile asks for something one pool advertises, within what that pool hands to one pod.
    for p in catalog.profiles.values():
        if not p.is_gpu:
            continue
        spec = sharing.pod_gpu_spec(p, catalog.sharing)
        ((resource, amount),) = spec.limits.items()
        fits = [name for name, (res, one) in pools.items() if resource in res and not (one and int(amount) > 1)]
        assert fits, f"profile {p.slug} asks for {amount} {resource}: no node pool advertises it"
    for variant in ("default", "mig", "hami"):
        assert not any(d["metadata"]["name"] == "gpulab-time-slicing" for d in render(variant))
    # A profile's own `sharing: timeslice` on a whole-GPU cluster needs it too.
    values = tmp_path / "values.yaml"
    values.write_text(
        "gpulab:\n  profiles:\n    - {slug: h100-half, gpus: 0.5, gpu_model: H100-80GB, "
        "sharing: timeslice}\n  teams:\n    - {name: vision, guarantee: 1}\n"
    )
    docs = [d for d in yaml.safe_load_all(helm(*template_args([values])).stdout) if d]
    assert any(d["metadata"]["name"] == "gpulab-time-slicing" for d in docs)
    assert quota_in(docs, "gpulab-vision") == {"requests.nvidia.com/gpu.shared": "4"}


def test_gpu_operator_values_point_its_device_plugin_at_the_charts_configs():
    """The GPU operator's chart renders ClusterPolicy spec.devicePlugin.config from its values
    devicePlugin.config.name and .default (gpu-operator deployments/gpu-operator/templates/
    clusterpolicy.yaml), and its next helm upgrade overwrites any kubectl patch: so the
    time-slicing configs are named there, and they must be the gpulab chart's ConfigMap,
    with whole GPUs by default, in the namespace the operator is installed into."""
    operator = yaml.safe_load((REPO / "helm" / "values-gpu-operator.yaml").read_text())
    ts = chart_values()["timeSlicing"]
    [cm] = [d for d in of_kind(render("timeslice"), "ConfigMap") if ts["wholeConfig"] in d.get("data", {})]
    assert operator["devicePlugin"]["config"] == {"name": cm["metadata"]["name"], "default": ts["wholeConfig"]}
    assert ts["wholeConfig"] in cm["data"] and ts["sharedConfig"] in cm["data"]
    assert cm["metadata"]["namespace"] == "gpu-operator"  # the install command's --namespace
    for doc in ("docs/install-kubernetes.md", "docs/kubernetes.md", "helm/gpulab/values.yaml"):
        assert "kubectl patch clusterpolic" not in (REPO / doc).read_text(), f"{doc} still patches the ClusterPolicy"


@pytest.mark.parametrize("variant", ["kueue", "no-namespaces"])
def test_kueue_objects(variant):
    docs = render(variant)
    catalog = catalog_of(docs)
    values = chart_values()["kueue"]
    assert not of_kind(render("default"), "ClusterQueue"), "Kueue is off by default"
    flavors = {f["metadata"]["name"]: f for f in of_kind(docs, "ResourceFlavor")}
    # Unnamed flavors are the release's (helm template's release here: "gpulab").
    cpu_flavor_name = values["cpuFlavor"]["name"] or "gpulab-cpu"
    gpu_flavor_name = "h100" if variant == "kueue" else (values["flavor"]["name"] or "gpulab-gpu")
    assert set(flavors) == {cpu_flavor_name, gpu_flavor_name}
    for flavor in flavors.values():
        assert flavor["apiVersion"] == "kueue.x-k8s.io/v1beta2" and "namespace" not in flavor["metadata"]
        assert isinstance(flavor["spec"], dict)
        assert all(isinstance(v, str) for v in (flavor["spec"].get("nodeLabels") or {}).values())
    # Kueue injects the node labels of every flavor it assigns: CPU and memory
    # get a flavor of their own, without the GPU nodes' labels.
    assert not flavors[cpu_flavor_name]["spec"].get("nodeLabels")
    if variant == "kueue":
        assert flavors["h100"]["spec"]["nodeLabels"] == {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}
    cqs = {d["metadata"]["name"]: d for d in of_kind(docs, "ClusterQueue")}
    lqs = of_kind(docs, "LocalQueue")
    assert set(cqs) == {f"gpulab-{t}" for t in catalog.teams}
    assert len({cq["spec"]["cohortName"] for cq in cqs.values()}) == 1, "all teams in one cohort"
    for team in catalog.teams.values():
        ns = team_namespace(team)
        cq = cqs[f"gpulab-{team.name}"]
        assert cq["apiVersion"] == "kueue.x-k8s.io/v1beta2" and "namespace" not in cq["metadata"]
        spec = cq["spec"]
        assert set(spec) == {"cohortName", "namespaceSelector", "queueingStrategy", "resourceGroups", "preemption"}
        assert spec["namespaceSelector"] == {"matchLabels": {"kubernetes.io/metadata.name": ns}}
        assert spec["queueingStrategy"] in ("BestEffortFIFO", "StrictFIFO")
        # Borrowed capacity is reclaimed; in-quota work never preempts another queue's.
        assert spec["preemption"] == {"reclaimWithinCohort": "Any", "withinClusterQueue": "LowerPriority"}
        cpu_group, gpu_group = spec["resourceGroups"]
        assert cpu_group["coveredResources"] == ["cpu", "memory"]
        assert [f["name"] for f in cpu_group["flavors"]] == [cpu_flavor_name]
        (fl,) = gpu_group["flavors"]
        assert fl["name"] == gpu_flavor_name
        assert "cpu" not in gpu_group["coveredResources"]
        for group in (cpu_group, gpu_group):
            for f in group["flavors"]:
                assert [r["name"] for r in f["resources"]] == group["coveredResources"], "same resources, same order"
        hard = quota_in(docs, ns) if variant == "kueue" else None
        for r in fl["resources"]:
            assert set(r) <= {"name", "nominalQuota", "borrowingLimit", "lendingLimit"}
            assert all(QUANTITY.match(str(r[k])) for k in r if k != "name"), r
            nominal, borrow = int(r["nominalQuota"]), int(r["borrowingLimit"])
            assert nominal == math.ceil(team.guarantee_milli / 1000)  # whole GPUs in these variants
            assert nominal + borrow == math.ceil(team.burst_milli / 1000)
            if hard is not None:
                assert int(hard[f"requests.{r['name']}"]) == nominal + borrow, "Kueue and quota agree"
        # The jobs backend labels its Jobs with this name (one source: spawner/core/labels.py).
        (lq,) = [q for q in lqs if q["metadata"]["name"] == labels.kueue_local_queue(team.name)]
        assert lq["apiVersion"] == "kueue.x-k8s.io/v1beta2"
        assert lq["metadata"]["namespace"] == ns
        assert lq["spec"] == {"clusterQueue": cq["metadata"]["name"]}
    from hub_config.jobs.settings import GPULabJobs

    assert GPULabJobs().kueue_queue_template.format(team="x") == labels.kueue_local_queue("x")


def kueue_node_labels(flavors: dict, cq: dict, requests: set[str]) -> dict:
    """The node labels Kueue puts on a workload's pods: those of the flavor it
    assigns in each resource group the workload requests something from."""
    out: dict = {}
    for group in cq["spec"]["resourceGroups"]:
        if requests & set(group["coveredResources"]):
            out.update(flavors[group["flavors"][0]["name"]]["spec"].get("nodeLabels") or {})
    return out


def test_kueue_gives_cpu_only_jobs_no_gpu_node_labels():
    docs = render("kueue")
    flavors = {f["metadata"]["name"]: f for f in of_kind(docs, "ResourceFlavor")}
    cq = of_kind(docs, "ClusterQueue")[0]
    assert kueue_node_labels(flavors, cq, {"cpu", "memory"}) == {}
    assert kueue_node_labels(flavors, cq, {"cpu", "memory", "nvidia.com/gpu"}) == {
        "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"
    }


def test_kai_queues_per_team():
    docs = render("hami")  # one profile there uses sharing: kai
    catalog = catalog_of(docs)
    queues = {q["metadata"]["name"]: q for q in of_kind(docs, "Queue")}
    assert not of_kind(render("default"), "Queue"), "only when the kai backend is in use"
    parent = chart_values()["kai"]["parentQueue"] or "gpulab"  # empty = the release's name
    assert queues[parent]["apiVersion"] == "scheduling.run.ai/v2" and "parentQueue" not in queues[parent]["spec"]
    for team in catalog.teams.values():
        # The queue the spawner's pods name (sharing.kai_queue), quota = guarantee, limit = burst.
        name = sharing.kai_queue(team, catalog.sharing.get("kai") or {})
        q = queues[name]
        assert q["apiVersion"] == "scheduling.run.ai/v2" and "namespace" not in q["metadata"]
        assert q["spec"]["parentQueue"] == parent
        gpu = q["spec"]["resources"]["gpu"]
        assert Fraction(str(gpu["quota"])) == Fraction(team.guarantee_milli, 1000)
        assert Fraction(str(gpu["limit"])) == Fraction(team.burst_milli, 1000)
        assert q["spec"]["resources"]["cpu"] == {"quota": -1, "limit": -1, "overQuotaWeight": 1}


def test_team_namespaces_get_z2jhs_single_user_network_policy():
    docs = render("default")
    catalog = catalog_of(docs)
    policies = {d["metadata"]["namespace"]: d for d in of_kind(docs, "NetworkPolicy")}
    assert set(policies) == {team_namespace(t) for t in catalog.teams.values()}
    for np in policies.values():
        spec = np["spec"]
        assert spec["podSelector"] == {} and spec["policyTypes"] == ["Ingress", "Egress"]
        # Ingress: only z2jh's hub and proxy (network-access-singleuser), from the hub's namespace.
        (ingress,) = spec["ingress"]
        (peer,) = ingress["from"]
        assert peer == {
            "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": NAMESPACE}},
            "podSelector": {"matchLabels": {"hub.jupyter.org/network-access-singleuser": "true"}},
        }
        assert ingress["ports"] == [{"port": 8888}]
        egress = spec["egress"]
        assert egress[0]["ports"] == [{"port": 8081}]
        # z2jh 4 labels its hub pod app.kubernetes.io/component=hub beside the legacy
        # app/component it plans to drop; nameOverride changes app, not this one.
        assert egress[0]["to"][0]["podSelector"]["matchLabels"] == {"app.kubernetes.io/component": "hub"}
        dns = egress[1]
        assert dns["ports"] == [{"port": 53, "protocol": "UDP"}, {"port": 53, "protocol": "TCP"}]
        # Exactly z2jh's single-user DNS peers with its default egressAllowRules
        # (templates/_helpers-netpol.tpl): the metadata server's port 53 (GKE, Cloud DNS) too.
        assert dns["to"] == [
            {"ipBlock": {"cidr": "169.254.169.254/32"}},
            {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "kube-system"}}},
            {"ipBlock": {"cidr": "10.0.0.0/8"}},
            {"ipBlock": {"cidr": "172.16.0.0/12"}},
            {"ipBlock": {"cidr": "192.168.0.0/16"}},
        ]
        (internet,) = [
            r for r in egress if any(p.get("ipBlock", {}).get("cidr") == "0.0.0.0/0" for p in r.get("to", []))
        ]
        assert set(internet["to"][0]["ipBlock"]["except"]) == {
            "10.0.0.0/8",
            "172.16.0.0/12",
            "192.168.0.0/16",
            "169.254.169.254/32",
        }
    assert not of_kind(render("no-namespaces"), "NetworkPolicy"), "z2jh's own policy covers its namespace"


def _z2jh_hub_pod(name_override: str = "jupyterhub") -> dict:
    """The labels z2jh 4.1 gives its hub pod (jupyterhub.matchLabelsLegacyAndModern plus
    the hub's network-access labels), release jhub."""
    return {
        "component": "hub",
        "app": name_override,
        "release": "jhub",
        "app.kubernetes.io/component": "hub",
        "app.kubernetes.io/name": name_override,
        "app.kubernetes.io/instance": "jhub",
        "hub.jupyter.org/network-access-proxy-api": "true",
        "hub.jupyter.org/network-access-proxy-http": "true",
        "hub.jupyter.org/network-access-singleuser": "true",
    }


@pytest.mark.parametrize("name_override", ["jupyterhub", "lab"])
def test_team_namespace_policy_truth_table(name_override):
    """Who may talk to a server in a team namespace, and where it may go, by the chart's
    policy and NetworkPolicy semantics (tests/support/network_policy_semantics.py: no CNI here).
    Before: DNS at the cloud metadata server (GKE with Cloud DNS) was refused, so servers
    could not resolve the hub; and with z2jh's nameOverride the hub was unreachable."""
    from tests.support.network_policy_semantics import Endpoint, allowed

    docs = render("default")
    policies = of_kind(docs, "NetworkPolicy")
    team_ns = policies[0]["metadata"]["namespace"]

    def ns_labels(name: str) -> dict:
        return {"kubernetes.io/metadata.name": name}

    def pod(ns: str, ip: str, **labels: str) -> Endpoint:
        return Endpoint(ip=ip, namespace=ns, labels=labels, namespace_labels=ns_labels(ns))

    server = pod(team_ns, "10.8.0.5", component="singleuser-server", **{"hub.jupyter.org/network-access-hub": "true"})
    hub = Endpoint("10.8.1.2", NAMESPACE, _z2jh_hub_pod(name_override), ns_labels(NAMESPACE))
    proxy = pod(NAMESPACE, "10.8.1.3", component="proxy", **{"hub.jupyter.org/network-access-singleuser": "true"})
    stranger = pod(NAMESPACE, "10.8.1.4", component="other")
    other_team = pod("gpulab-elsewhere", "10.8.2.9", component="singleuser-server")
    kube_dns = pod("kube-system", "10.8.9.10", **{"k8s-app": "kube-dns"})
    metadata = Endpoint("169.254.169.254")
    table = [
        ("proxy -> server:8888", allowed(policies, proxy, server, 8888), True),
        ("hub -> server:8888", allowed(policies, hub, server, 8888), True),
        ("an unlabelled pod of the hub's namespace -> server", allowed(policies, stranger, server, 8888), False),
        ("another namespace's pod -> server", allowed(policies, other_team, server, 8888), False),
        ("server -> hub:8081", allowed(policies, server, hub, 8081), True),
        ("server -> the hub namespace's other pods:8081", allowed(policies, server, stranger, 8081), False),
        ("server -> kube-dns:53/UDP", allowed(policies, server, kube_dns, 53, "UDP"), True),
        ("server -> metadata:53/UDP (GKE Cloud DNS)", allowed(policies, server, metadata, 53, "UDP"), True),
        ("server -> metadata:53/TCP", allowed(policies, server, metadata, 53), True),
        ("server -> metadata:80", allowed(policies, server, metadata, 80), False),
        ("server -> the internet:443", allowed(policies, server, Endpoint("8.8.8.8"), 443), True),
        ("server -> a private address:5432", allowed(policies, server, Endpoint("10.20.0.7"), 5432), False),
    ]
    wrong = [(what, got) for what, got, want in table if got != want]
    assert not wrong, wrong


def test_pull_secret_is_copied_into_every_team_namespace():
    import base64

    assert not of_kind(render("default"), "Secret"), "off by default"
    docs = render(
        "default",
        (
            "imagePullSecret.create=true",
            "imagePullSecret.registry=registry.example.com",
            "imagePullSecret.username=robot",
            "imagePullSecret.password=s3cret",
        ),
    )
    catalog = catalog_of(docs)
    secrets = {d["metadata"]["namespace"]: d for d in of_kind(docs, "Secret")}
    assert set(secrets) == {team_namespace(t) for t in catalog.teams.values()}
    for secret in secrets.values():
        # z2jh's name and format, so c.KubeSpawner.image_pull_secrets works unchanged.
        assert secret["metadata"]["name"] == "image-pull-secret"
        assert secret["type"] == "kubernetes.io/dockerconfigjson"
        cfg = json.loads(base64.b64decode(secret["data"][".dockerconfigjson"]))
        auth = cfg["auths"]["registry.example.com"]
        assert auth["username"] == "robot" and auth["password"] == "s3cret"
        assert base64.b64decode(auth["auth"]).decode() == "robot:s3cret"
    proc = helm(*template_args([], ("imagePullSecret.create=true",)), check=False)
    assert proc.returncode != 0 and "imagePullSecret.create needs imagePullSecret.registry" in proc.stderr


@pytest.mark.parametrize("variant", ["hami", "kueue", "timeslice", "mig"])
def test_each_teams_cluster_queue_covers_every_resource_its_pods_request(variant):
    """Kueue admits a workload only if its ClusterQueue covers every resource it requests
    (kueue pkg/scheduler/flavorassigner: "resource nvidia.com/gpu unavailable in
    ClusterQueue"); HAMi's GPU-count resource, left out of the ResourceQuota, was left out
    of the ClusterQueue too, so every HAMi job stayed suspended."""
    docs = render(variant, ("kueue.enabled=true",))
    catalog = catalog_of(docs)
    queues = {cq["metadata"]["name"]: cq for cq in of_kind(docs, "ClusterQueue")}
    for team in catalog.teams.values():
        groups = queues[f"gpulab-{team.name}"]["spec"]["resourceGroups"]
        covered = {r for g in groups for r in g["coveredResources"]}
        quota = {
            r["name"]: int(r["nominalQuota"]) + int(r.get("borrowingLimit", 0))
            for g in groups
            for f in g["flavors"]
            for r in f["resources"]
            if r["name"] not in ("cpu", "memory")
        }
        for profile in catalog.profiles_for(team):
            try:
                spec = sharing.pod_gpu_spec(profile, catalog.sharing, team)
            except sharing.SharingError:
                continue
            for res, n in spec.requests.items():
                assert res in covered, f"{variant}: team {team.name}, {profile.slug} requests {res}: not covered"
                # As many pods as the ledger admits within the burst fit the queue.
                assert quota[res] >= (team.burst_milli // spec.effective_milli) * int(n), (team.name, profile.slug, res)
