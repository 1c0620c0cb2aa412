"""The Helm chart (helm/gpulab), the z2jh overlay and the image Dockerfiles.

Everything here runs the real ``helm`` binary (installed by
scripts/install-helm.sh from a PyPI wheel) and checks what it renders:
built-in kinds against the Kubernetes OpenAPI schemas (kubernetes-validate,
strict), CRD kinds (Kueue, Prometheus Operator) against their structure with
explicit assertions, and the numbers against gpulab's own Python core, which
is the single source of truth for priorities, labels, sharing and the catalog.
The z2jh overlay and the Dockerfiles: tests/unit/test_helm_overlay.py.
"""

from __future__ import annotations

import json
import math
import re
import shutil
import subprocess
from fractions import Fraction
from pathlib import Path

import kubernetes_validate
import pytest
import yaml

from spawner.core import labels, priority, sharing
from spawner.core.catalog import profiles as catalog_profiles
from spawner.core.catalog import read as catalog_read
from spawner.core.catalog import sharing as catalog_sharing
from spawner.core.catalog import teams as catalog_teams
from spawner.core.catalog.yaml_text import catalog_from_yaml
from spawner.core.units import parse_gpus
from spawner.runtime import GPULab
from tests.support import REPO, grafana_dashboard
from tests.support.helm import (
    CHART,
    NAMESPACE,
    VARIANTS,
    catalog_of,
    chart_values,
    helm,
    of_kind,
    quota_in,
    render,
    team_namespace,
    template_args,
)

#: Kinds kubernetes-validate has no schema for; each has a structural check below.
CRD_KINDS = {"ClusterQueue", "LocalQueue", "ResourceFlavor", "ServiceMonitor", "PodMonitor", "Queue", "PrometheusRule"}
#: Oldest Kubernetes the chart supports (Chart.yaml kubeVersion) and the newest schemas we have.
K8S_VERSIONS = ("1.27", kubernetes_validate.utils.latest_version())


# --------------------------------------------------------------------------
# lint, schema validation of every manifest


@pytest.mark.parametrize("variant", VARIANTS)
def test_helm_lint(variant):
    args = ["lint", str(CHART), "--strict", "--namespace", NAMESPACE]
    for f in VARIANTS[variant]:
        args += ["-f", str(f)]
    proc = helm(*args, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "1 chart(s) linted, 0 chart(s) failed" in proc.stdout


@pytest.mark.parametrize("variant", VARIANTS)
def test_every_manifest_is_valid_kubernetes(variant):
    docs = render(variant)
    validated = 0
    for doc in docs:
        name = f"{doc['kind']}/{doc['metadata'].get('name')}"
        if doc["kind"] in CRD_KINDS:
            continue  # structure checked in test_kueue_objects / test_monitors
        for version in K8S_VERSIONS:
            try:
                kubernetes_validate.validate(doc, version, strict=True)
            except kubernetes_validate.SchemaNotFoundError:
                pytest.fail(f"{name}: no Kubernetes schema and no structural check in this file")
            except kubernetes_validate.ValidationError as e:
                pytest.fail(f"{name} is invalid for Kubernetes {version}: {'.'.join(map(str, e.path))}: {e.message}")
        validated += 1
    assert validated >= 8, f"only {validated} manifests validated"


# --------------------------------------------------------------------------
# the catalog the hub reads


@pytest.mark.parametrize("variant", VARIANTS)
def test_rendered_catalog_loads_in_the_hub(variant, tmp_path):
    """The ConfigMap's catalog passes the hub's own loader, unchanged in meaning."""
    docs = render(variant)
    cm = next(d for d in of_kind(docs, "ConfigMap") if d["metadata"]["name"] == "gpulab-catalog")
    assert cm["metadata"]["namespace"] == NAMESPACE
    text = cm["data"]["catalog.yaml"]
    catalog = catalog_from_yaml(text, "catalog.yaml")
    # The hub's code path: c.GPULab.catalog_file pointing at the mounted file.
    path = tmp_path / "catalog.yaml"
    path.write_text(text)
    assert GPULab(catalog_file=str(path)).load_catalog() == catalog

    # Written once: the chart's values went through unchanged.
    values = chart_values()["gpulab"]
    for f in VARIANTS[variant]:
        values = {**values, **(yaml.safe_load(f.read_text()).get("gpulab") or {})}
    assert [t["name"] for t in values["teams"]] == list(catalog.teams)
    assert [p["slug"] for p in values["profiles"]] == list(catalog.profiles)
    for spec in values["teams"]:
        team = catalog.teams[spec["name"]]
        assert team.burst_milli == parse_gpus(spec.get("burst", spec.get("guarantee", 0)))
        assert team.guarantee_milli == parse_gpus(spec.get("guarantee", 0))
    assert catalog.sharing.get("backend") == (values.get("sharing") or {}).get("backend", "whole")
    # Every catalog profile can be mapped to a pod by the spawner's sharing code.
    for p in catalog.profiles.values():
        spec = sharing.pod_gpu_spec(p, catalog.sharing, next(iter(catalog.teams.values())))
        assert spec.effective_milli >= p.gpu_milli


def test_team_namespaces_are_explicit_in_the_catalog():
    docs = render("default")
    catalog = catalog_of(docs)
    namespaces = {d["metadata"]["name"]: d for d in of_kind(docs, "Namespace")}
    for team in catalog.teams.values():
        assert team.namespace == f"gpulab-{team.name}"
        assert namespaces[team.namespace]["metadata"]["labels"][labels.TEAM] == team.name
        assert namespaces[team.namespace]["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"
        # Pod Security admission: z2jh's servers meet baseline, gpulab's job pods restricted.
        ns_labels = namespaces[team.namespace]["metadata"]["labels"]
        assert {k: v for k, v in ns_labels.items() if k.startswith("pod-security.kubernetes.io/")} == {
            "pod-security.kubernetes.io/enforce": "baseline",
            "pod-security.kubernetes.io/enforce-version": "latest",
            "pod-security.kubernetes.io/warn": "restricted",
            "pod-security.kubernetes.io/warn-version": "latest",
            "pod-security.kubernetes.io/audit": "restricted",
            "pod-security.kubernetes.io/audit-version": "latest",
        }
    assert all(t.namespace is None for t in catalog_of(render("no-namespaces")).teams.values())
    assert not of_kind(render("no-namespaces"), "Namespace")
    # Existing namespaces (create: false): the catalog's own namespace is used, none created.
    hami = render("hami")
    assert not of_kind(hami, "Namespace")
    assert catalog_of(hami).teams["vision"].namespace == "team-vision"
    assert quota_in(hami, "team-vision")


# --------------------------------------------------------------------------
# quotas


@pytest.mark.parametrize(
    "variant,sets",
    [(v, ()) for v in VARIANTS if v != "no-namespaces"] + [("timeslice", ("gpulab.sharing.timeslice.replicas=3",))],
)
def test_quota_is_the_team_burst_in_the_backend_unit(variant, sets):
    """requests.<resource> = the burst in the unit of each resource the team's pods request, rounded up."""
    docs = render(variant, sets)
    catalog = catalog_of(docs)
    hami_count = {str((catalog.sharing.get("hami") or {}).get("resource") or "nvidia.com/gpu")}
    replicas = (catalog.sharing.get("timeslice") or {}).get("replicas", 4)
    for team in catalog.teams.values():
        hard = quota_in(docs, team_namespace(team))
        assert all(k.startswith("requests.") for k in hard), f"only requests.* is legal for GPUs: {hard}"
        quota = {k.removeprefix("requests."): int(v) for k, v in hard.items()}
        burst = team.burst_milli
        unit: dict[str, Fraction] = {}  # resource -> milli-GPUs one unit of it stands for
        for profile in catalog.profiles_for(team):
            try:
                spec = sharing.pod_gpu_spec(profile, catalog.sharing, team)
            except sharing.SharingError:
                continue  # the spawner refuses it; nothing to count
            for res, n in ((r, int(q)) for r, q in spec.requests.items()):
                if spec.backend == "hami" and res in hami_count:
                    assert res not in quota, "HAMi's GPU-count resource is one per fractional pod: no bound"
                    continue
                assert res in quota, f"team {team.name}: pods of {profile.slug} request {res}, which has no quota"
                # Never refuse what gpulab's ledger admits: as many pods as fit in the burst.
                assert quota[res] >= (burst // spec.effective_milli) * n, (team.name, profile.slug, res)
                if spec.backend == "timeslice" and profile.gpu_milli < 1000:
                    unit[res] = Fraction(1000, replicas)  # effective_milli is rounded up to whole milli
                else:
                    unit[res] = Fraction(spec.effective_milli, n)
        for res, milli in unit.items():
            assert quota[res] == math.ceil(burst / milli), (team.name, res, quota[res], burst, milli)
        ann = [a["metadata"]["annotations"] for a in of_kind(docs, "ResourceQuota")]
        assert {"gpulab.io/burst-milli": str(burst), "gpulab.io/guarantee-milli": str(team.guarantee_milli)} in ann


def test_quota_numbers_for_the_documented_examples():
    """The worked examples in docs/install-kubernetes.md, from the chart's values."""
    docs = render("timeslice")  # vision: burst 2.25 GPUs; 4 time-slices per GPU
    assert quota_in(docs, "gpulab-vision")["requests.nvidia.com/gpu.shared"] == str(math.ceil(2.25 * 4))
    assert quota_in(docs, "gpulab-vision")["requests.nvidia.com/gpu"] == str(math.ceil(2.25))
    docs = render("mig")  # vision: burst 2.5 GPUs; a 3g.40gb slice is half an H100
    assert quota_in(docs, "gpulab-vision")["requests.nvidia.com/mig-3g.40gb"] == str(math.ceil(2.5 / 0.5))


def test_the_documented_values_example_installs(tmp_path):
    """docs/install-kubernetes.md step 3, copied as a user would."""
    doc = (REPO / "docs" / "install-kubernetes.md").read_text()
    example = doc.split("`my-gpulab.yaml`", 1)[1].split("```yaml\n", 1)[1].split("```", 1)[0]
    path = tmp_path / "my-gpulab.yaml"
    path.write_text(example)
    helm("lint", "--strict", str(CHART), "-f", str(path))
    docs = [d for d in yaml.safe_load_all(helm(*template_args([path])).stdout) if d]
    catalog = catalog_of(docs)
    assert set(catalog.teams) == {"vision", "nlp"}
    assert quota_in(docs, "gpulab-vision") == {"requests.nvidia.com/gpu.shared": "9", "requests.nvidia.com/gpu": "3"}


def test_shared_namespace_quota_is_the_sum_of_bursts():
    docs = render("no-namespaces")
    catalog = catalog_of(docs)
    hard = quota_in(docs, NAMESPACE)
    assert hard == {
        "requests.nvidia.com/gpu": str(sum(math.ceil(t.burst_milli / 1000) for t in catalog.teams.values()))
    }


def test_mig_tables_equal_the_spawners():
    table = chart_values()["migDefaultProfiles"]
    assert {k: tuple(v) for k, v in table.items()} == sharing.DEFAULT_MIG_PROFILES


# --------------------------------------------------------------------------
# priority classes


@pytest.mark.parametrize("choice", sorted(priority.OTHER_TENANTS_VALUES))
def test_priority_classes_equal_the_python_ones(choice):
    """The chart's classes are spawner/core/priority.py's, with the values of the chosen
    ``priorityClasses.otherTenants``, named after the release; the catalog the chart renders
    tells the hub those names, and every class a profile names exists."""
    in_quota, over_quota = priority.OTHER_TENANTS_VALUES[choice]
    expected = [
        {
            "name": pc.name,
            "value": over_quota if pc is priority.OVER_QUOTA else in_quota,
            "preemptionPolicy": pc.preemption_policy,
            "description": pc.description,
        }
        for pc in priority.ALL_PRIORITY_CLASSES
    ]
    docs = render("default", (f"priorityClasses.otherTenants={choice}",))
    rendered = of_kind(docs, "PriorityClass")
    assert [
        {
            "name": d["metadata"]["name"],
            "value": d["value"],
            "preemptionPolicy": d["preemptionPolicy"],
            "description": d["description"],
        }
        for d in rendered
    ] == expected
    assert not any(d["globalDefault"] for d in rendered)
    values = [d["value"] for d in rendered]
    names = [d["metadata"]["name"] for d in rendered]
    assert names == ["gpulab-production", "gpulab-training", "gpulab-development", "gpulab-batch", "gpulab-over-quota"]
    assert values == sorted(values, reverse=True)
    # The relations the module docstring promises hold for both choices.
    assert over_quota < in_quota
    assert (in_quota >= priority.KAI_NON_PREEMPTIBLE_MIN) == (choice == "preempt")
    if choice == "protect":
        assert in_quota == 0 and over_quota < 0, "protect: equal to other tenants' priority-0 pods, borrowed below"
    # Every class a catalog profile can name, and the over-quota class, exists.
    for variant in VARIANTS:
        catalog = catalog_of(render(variant))
        for p in catalog.profiles.values():
            assert priority.cluster_priority_class_name(p.priority_class, catalog.priority_class_names) in names
    assert priority.OVER_QUOTA.name in names


def test_cluster_scoped_names_carry_the_release():
    """PriorityClasses, ClusterQueues, ResourceFlavors, KAI Queues and team namespaces are
    cluster-wide: a second release ("staging") renders none of the first's names, and the
    catalog it renders gives the hub its own PriorityClass and KAI queue names."""
    sets = ("kueue.enabled=true", "gpulab.sharing.backend=kai")

    def cluster_scoped(release: str) -> dict[str, set[str]]:
        out = helm("template", release, str(CHART), "--namespace", NAMESPACE, *[a for s in sets for a in ("--set", s)])
        docs = [d for d in yaml.safe_load_all(out.stdout) if d]
        kinds = ("PriorityClass", "ClusterQueue", "ResourceFlavor", "Queue", "Namespace", "ClusterRole")
        names = {k: {d["metadata"]["name"] for d in docs if d["kind"] == k} for k in kinds}
        names["catalog"] = docs  # type: ignore[assignment]
        return names

    gpulab, staging = cluster_scoped("gpulab"), cluster_scoped("staging")
    for kind in ("PriorityClass", "ClusterQueue", "ResourceFlavor", "Queue", "Namespace"):
        assert gpulab[kind] and staging[kind], kind
        assert not gpulab[kind] & staging[kind], f"{kind}: {gpulab[kind] & staging[kind]} in both releases"
        assert all(n.startswith("staging") for n in staging[kind]), staging[kind]
    # The documented release keeps the names an existing install has.
    assert "gpulab-over-quota" in gpulab["PriorityClass"] and "gpulab-cpu" in gpulab["ResourceFlavor"]
    catalog = catalog_of(staging["catalog"])  # type: ignore[arg-type]
    assert catalog.priority_class_names["over-quota"] == "staging-over-quota"
    assert (
        priority.cluster_priority_class_name(priority.DEVELOPMENT, catalog.priority_class_names)
        == "staging-development"
    )
    assert catalog.sharing["kai"]["queue"] == "staging-{team}"
    team = next(iter(catalog.teams.values()))
    assert f"staging-{team.name}" in staging["Queue"]
    assert team.namespace == f"staging-{team.name}"


def test_protect_other_tenants_is_refused_with_kai():
    proc = helm(*template_args([], ("gpulab.sharing.backend=kai", "priorityClasses.otherTenants=protect")), check=False)
    assert proc.returncode != 0
    assert "KAI scheduler treats as preemptible" in proc.stderr, proc.stderr


def test_no_in_quota_work_can_preempt_another_teams_guarantee():
    """The kube-scheduler preempts by value alone, across namespaces: in-quota
    classes must not be able to evict each other, only borrowed work."""
    in_quota = priority.PRIORITY_CLASSES
    for a in in_quota:
        for b in in_quota:
            assert not priority.may_preempt(a, b), f"{a.name} would evict {b.name} of another team"
        assert priority.may_preempt(a, priority.OVER_QUOTA), f"{a.name} cannot take borrowed GPUs back"
        assert not priority.may_preempt(priority.OVER_QUOTA, a)
        # KAI: >= 100 is non-preemptible and in-quota only; borrowed work must be below it.
        assert a.value >= priority.KAI_NON_PREEMPTIBLE_MIN
    assert priority.OVER_QUOTA.value < priority.KAI_NON_PREEMPTIBLE_MIN
    assert not priority.may_preempt(priority.OVER_QUOTA, priority.OVER_QUOTA)
    # gpulab's own order of the classes is kept, for queues.
    ranks = [pc.rank for pc in priority.ALL_PRIORITY_CLASSES]
    assert ranks == sorted(ranks, reverse=True) and len(set(ranks)) == len(ranks)


# --------------------------------------------------------------------------
# RBAC


@pytest.mark.parametrize("variant,sets", [(v, ()) for v in VARIANTS] + [("default", ("rbac.clusterWidePodRead=true",))])
def test_rbac_grants_no_more_than_needed(variant, sets):
    docs = render(variant, sets)
    catalog = catalog_of(docs)
    team_namespaces = {team_namespace(t) for t in catalog.teams.values()}
    allowed = {
        ("", "pods"): {"get", "list", "watch", "create", "delete"},
        ("", "pods/log"): {"get"},
        ("", "persistentvolumeclaims"): {"get", "list", "watch", "create", "delete"},
        ("", "events"): {"get", "list", "watch"},
        ("", "resourcequotas"): {"get", "list", "watch"},
        ("batch", "jobs"): {"get", "list", "watch", "create", "delete"},
        ("kueue.x-k8s.io", "workloads"): {"get", "list", "watch"},
        # With the kai backend: is the queue a pod names there (spawner/kube/kai_queues.py)?
        ("scheduling.run.ai", "queues"): {"get"},
    }
    read_only = {"get", "list", "watch"}
    roles = of_kind(docs, "Role")
    assert {r["metadata"]["namespace"] for r in roles} == team_namespaces
    for role in roles + of_kind(docs, "ClusterRole"):
        cluster_wide = role["kind"] == "ClusterRole"
        for rule in role["rules"]:
            for group in rule["apiGroups"]:
                for res in rule["resources"]:
                    assert "*" not in (group, res) and "*" not in rule["verbs"], rule
                    assert res != "secrets", f"{role['kind']} grants secrets: {rule}"
                    assert (group, res) in allowed, f"unexpected grant {group}/{res}"
                    verbs = set(rule["verbs"])
                    assert verbs <= allowed[(group, res)], (group, res, verbs)
                    if cluster_wide:
                        assert verbs <= read_only and res in ("pods", "events", "queues"), rule
    for binding in of_kind(docs, "RoleBinding") + of_kind(docs, "ClusterRoleBinding"):
        assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "hub", "namespace": NAMESPACE}]
        assert binding["roleRef"]["kind"] == binding["kind"].removesuffix("Binding")
    kai = catalog.sharing.get("backend") == "kai" or any(p.sharing == "kai" for p in catalog.profiles.values())
    expected = {"pod-reader"} if "rbac.clusterWidePodRead=true" in sets else set()
    if kai:
        expected.add("kai-queue-reader")
    granted = {r["metadata"]["name"].removeprefix("gpulab-gpulab-") for r in of_kind(docs, "ClusterRole")}
    assert granted == expected, granted


@pytest.mark.parametrize(
    "sets, extra",
    [
        (("rbac.servicesEnabled=true",), {("", "services")}),
        (("rbac.internalSsl=true",), {("", "services"), ("", "secrets")}),
    ],
)
def test_team_roles_cover_what_kubespawner_makes_with_services_or_internal_ssl(sets, extra):
    """KubeSpawner creates a Service per server with services_enabled, and a Service and a
    Secret (the server's certificates) with internal_ssl, in the server's namespace
    (KubeSpawner's _start: get_service_manifest, get_secret_manifest): the team Roles then
    allow exactly those, and nothing else changes."""
    base = {
        (g, r): set(rule["verbs"])
        for role in of_kind(render("default"), "Role")
        for rule in role["rules"]
        for g in rule["apiGroups"]
        for r in rule["resources"]
    }
    for role in of_kind(render("default", sets), "Role"):
        grants = {
            (g, r): set(rule["verbs"]) for rule in role["rules"] for g in rule["apiGroups"] for r in rule["resources"]
        }
        assert set(grants) - set(base) == extra, role["metadata"]["namespace"]
        for key in extra:
            assert grants[key] == {"get", "list", "watch", "create", "delete"}


# --------------------------------------------------------------------------
# CRDs: Kueue and Prometheus Operator, checked structurally


@pytest.mark.parametrize("variant,kind", [("kueue", "PodMonitor"), ("no-namespaces", "ServiceMonitor")])
def test_monitors(variant, kind):
    docs = render(variant)
    assert not of_kind(render("default"), kind), "monitors need the Prometheus Operator: off by default"
    (mon,) = [d for d in docs if d["metadata"]["name"] == "gpulab-dcgm-exporter"]
    assert mon["kind"] == kind and mon["apiVersion"] == "monitoring.coreos.com/v1"
    assert mon["metadata"]["namespace"] == "gpu-operator"
    spec = mon["spec"]
    assert spec["selector"]["matchLabels"] == {"app": "nvidia-dcgm-exporter"}
    assert spec["namespaceSelector"] == {"matchNames": ["gpu-operator"]}
    endpoints = spec["podMetricsEndpoints" if kind == "PodMonitor" else "endpoints"]
    assert set(spec) == {
        "selector",
        "namespaceSelector",
        "podMetricsEndpoints" if kind == "PodMonitor" else "endpoints",
    }
    (ep,) = endpoints
    assert isinstance(ep["port"], str) and ep["port"]
    assert re.fullmatch(r"[0-9]+(ms|s|m|h)", ep["interval"]) and ep["path"] == "/metrics"
    assert ep["honorLabels"] is True, "keep dcgm-exporter's pod/namespace labels"
    if kind == "PodMonitor":
        assert mon["metadata"]["labels"]["release"] == "kube-prometheus-stack"


def test_hamis_vgpu_monitor_is_scraped_with_honor_labels_at_the_dcgm_interval():
    """HAMi's per-pod vGPU utilisation is the idle culler's only evidence for HAMi servers."""
    assert not [d for d in render("default") if d["metadata"]["name"] == "gpulab-hami-vgpu-monitor"]
    docs = render("default", ("monitoring.hamiMonitor.enabled=true", "monitoring.dcgmExporter.interval=15s"))
    (mon,) = [d for d in of_kind(docs, "ServiceMonitor") if d["metadata"]["name"] == "gpulab-hami-vgpu-monitor"]
    assert mon["metadata"]["namespace"] == "kube-system"
    # HAMi's chart: the device plugin's monitor Service (charts/hami/templates/device-plugin/monitorservice.yaml).
    assert mon["spec"]["selector"] == {"matchLabels": {"app.kubernetes.io/component": "hami-device-plugin"}}
    assert mon["spec"]["endpoints"] == [
        {"port": "monitorport", "path": "/metrics", "interval": "15s", "honorLabels": True}
    ]


def test_culler_metrics_service_monitor():
    assert not any(d["metadata"]["name"] == "gpulab-idle-culler" for d in render("default"))
    (mon,) = [d for d in render("kueue") if d["metadata"]["name"] == "gpulab-idle-culler"]
    assert mon["kind"] == "ServiceMonitor" and mon["apiVersion"] == "monitoring.coreos.com/v1"
    assert mon["metadata"]["namespace"] == NAMESPACE, "beside the hub"
    assert mon["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    spec = mon["spec"]
    assert set(spec) == {"selector", "namespaceSelector", "endpoints"}
    assert spec["selector"] == {"matchLabels": {"app": "jupyterhub", "component": "hub"}}
    assert spec["namespaceSelector"] == {"matchNames": [NAMESPACE]}
    assert spec["endpoints"] == [{"port": "gpulab-metrics", "path": "/metrics", "interval": "30s"}]


def test_idle_culler_recording_rules_are_the_shipped_file_at_the_scrape_interval():
    from idle_culler.prometheus_source import SAMPLE_AGE_COUNT_RULE, SAMPLE_AGE_RULE
    from idle_culler.sources import METRICS

    rules_file = CHART / "rules" / "idle-culler.rules.yaml"
    hami_file = CHART / "rules" / "idle-culler-hami.rules.yaml"
    for path in (rules_file, hami_file):
        check = subprocess.run(
            [shutil.which("promtool") or "/usr/bin/promtool", "check", "rules", str(path)],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert check.returncode == 0, check.stdout + check.stderr
    shipped = yaml.safe_load(rules_file.read_text())
    hami = yaml.safe_load(hami_file.read_text())
    records = {r["record"] for doc in (shipped, hami) for g in doc["groups"] for r in g["rules"]}
    assert records == {t.format(metric=m) for m in METRICS for t in (SAMPLE_AGE_RULE, SAMPLE_AGE_COUNT_RULE)}
    assert len(shipped["groups"]) == 1, "one group: the count rules vouch for the age rules' evaluations"
    (hami_group,) = hami["groups"]  # the count rule beside its age rule, as above
    (with_hami,) = of_kind(
        render("default", ("monitoring.idleRules.enabled=true", "monitoring.idleRules.hami=true")), "PrometheusRule"
    )
    assert [g["name"] for g in with_hami["spec"]["groups"]] == ["gpulab-idle-culler", "gpulab-idle-culler-hami"]
    assert with_hami["spec"]["groups"][1]["rules"] == hami_group["rules"]
    assert not any(d["kind"] == "PrometheusRule" for d in render("default"))
    (rule,) = of_kind(
        render(
            "default",
            (
                "monitoring.idleRules.enabled=true",
                "monitoring.dcgmExporter.interval=15s",
                "monitoring.idleRules.labels.release=kube-prometheus-stack",
            ),
        ),
        "PrometheusRule",
    )
    assert rule["apiVersion"] == "monitoring.coreos.com/v1" and rule["metadata"]["name"] == "gpulab-idle-culler-rules"
    assert rule["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    (group,) = rule["spec"]["groups"]
    assert group["interval"] == "15s"
    assert group["rules"] == shipped["groups"][0]["rules"]
    (in_kueue,) = of_kind(render("kueue"), "PrometheusRule")  # the kube-prometheus-stack variant
    assert in_kueue["spec"]["groups"][0]["interval"] == chart_values()["monitoring"]["dcgmExporter"]["interval"]


def test_grafana_dashboard_queries_are_valid_promql(tmp_path):
    docs = render("default")
    (cm,) = [d for d in of_kind(docs, "ConfigMap") if d["metadata"]["name"] == "gpulab-grafana-dashboard"]
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
    dash = json.loads(cm["data"]["gpulab.json"])
    exprs = {p["title"]: t["expr"] for p in dash["panels"] for t in p["targets"]}
    # kube-state-metrics exports pod label gpulab.io/team as label_gpulab_io_team.
    ksm = {key: "label_" + re.sub(r"[^a-zA-Z0-9_]", "_", key) for key in (labels.TEAM, labels.USER)}
    assert ksm[labels.TEAM] in exprs["GPU utilisation per team"]
    assert ksm[labels.USER] in exprs["GPU utilisation per user"]
    assert (
        "gpulab_culler_idle_gpu_hours_before_reclaim_total"
        in exprs["Idle GPU-hours observed before reclaims, per team"]
    )
    assert any("kube_resourcequota" in e and 'resourcequota="gpulab-gpus"' in e for e in exprs.values())
    moved = [d for d in render("kueue") if d["metadata"]["name"] == "gpulab-grafana-dashboard"]
    assert moved[0]["metadata"]["namespace"] == "monitoring"
    # Prometheus' own parser, through promtool: every query must parse.
    promtool = shutil.which("promtool") or "/usr/bin/promtool"
    rules = {
        "groups": [
            {
                "name": "gpulab-dashboard",
                "rules": [
                    {
                        "record": f"gpulab:panel{i}",
                        "expr": grafana_dashboard.interpolate(
                            e, {"team": "vision"}, range_seconds=86400, scrape_interval=30
                        ),
                    }
                    for i, e in enumerate(exprs.values())
                ],
            }
        ]
    }
    path = tmp_path / "rules.yaml"
    path.write_text(yaml.safe_dump(rules))
    proc = subprocess.run([promtool, "check", "rules", str(path)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"SUCCESS: {len(exprs)} rules found" in proc.stdout


# --------------------------------------------------------------------------
# values.schema.json: typos fail with a clear message


def write_values(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "values.yaml"
    path.write_text(text)
    return path


@pytest.mark.parametrize(
    "text,words",
    [
        (
            "gpulab:\n  teams:\n    - name: vision\n      gaurantee: 2\n  profiles: []\n",
            ["/gpulab/teams/0", "gaurantee"],
        ),
        ("kueu:\n  enabled: true\n", ["kueu"]),
        (
            "gpulab:\n  sharing:\n    backend: timeslicing\n",
            ["/gpulab/sharing/backend", "value must be one of 'whole', 'timeslice'"],
        ),
        ("gpulab:\n  sharing:\n    timeslice:\n      replica: 4\n", ["/gpulab/sharing/timeslice", "replica"]),
        ("teamNamespaces:\n  enabled: yes please\n", ["/teamNamespaces/enabled"]),
        (
            "teamNamespaces:\n  podSecurity:\n    enforce: strict\n",
            ["/teamNamespaces/podSecurity/enforce", "value must be one of"],
        ),
    ],
)
def test_schema_rejects_typos_with_a_clear_message(tmp_path, text, words):
    proc = helm(*template_args([write_values(tmp_path, text)]), check=False)
    assert proc.returncode != 0
    assert "values don't meet the specifications of the schema" in proc.stderr
    for word in words:
        assert word in proc.stderr, proc.stderr


def test_schema_mirrors_the_catalog_schema():
    schema = json.loads((CHART / "values.schema.json").read_text())
    g = schema["properties"]["gpulab"]["properties"]
    # priority_class_names is the chart's to write (after the release), not a value.
    assert set(g) == catalog_read.TOP_KEYS - {"priority_class_names"}
    assert set(g["teams"]["items"]["properties"]) == catalog_teams.TEAM_KEYS
    assert set(g["profiles"]["items"]["properties"]) == catalog_profiles.PROFILE_KEYS
    backends = g["sharing"]["properties"]
    assert set(backends) == {"backend", *sharing.SHARING_BACKENDS}
    assert backends["backend"]["enum"] == list(sharing.SHARING_BACKENDS)
    for b in sharing.SHARING_BACKENDS:
        assert set(backends[b]["properties"]) == {*catalog_sharing.BACKEND_OPTIONS[b], "node_selector"}, b
    pcs = g["profiles"]["items"]["properties"]["priority_class"]["enum"]
    assert pcs == list(priority.BY_SHORT_NAME)


@pytest.mark.parametrize(
    "text,message",
    [
        (
            "gpulab:\n  teams:\n    - {name: a, namespace: shared}\n    - {name: b, namespace: shared}\n",
            'teams "a" and "b" both use namespace "shared"',
        ),
        (
            "gpulab:\n  sharing: {backend: mig}\n  profiles:\n    - {slug: x, gpus: 0.5, gpu_model: L4-24GB}\n",
            'profile "x" uses MIG on GPU model "L4-24GB"',
        ),
    ],
)
def test_template_refuses_what_the_schema_cannot_see(tmp_path, text, message):
    proc = helm(*template_args([write_values(tmp_path, text)]), check=False)
    assert proc.returncode != 0 and message in proc.stderr, proc.stderr


def test_notes_tell_the_next_steps():
    proc = helm(
        "install",
        "gpulab",
        str(CHART),
        "--namespace",
        NAMESPACE,
        "--dry-run=client",
        "-f",
        str(VARIANTS["timeslice"][0]),
    )
    notes = proc.stdout.split("NOTES:", 1)[1]
    assert "values-jupyterhub.yaml" in notes and '"gpulab-catalog"' in notes
    assert "vision: namespace gpulab-vision" in notes and "nvidia.com/gpu.shared quota 9" in notes
    assert "--set devicePlugin.config.name=gpulab-time-slicing --set devicePlugin.config.default=whole" in notes
    assert "kubectl patch" not in notes, "the GPU operator's next helm upgrade would undo a patch"
    assert "nvidia.com/device-plugin.config=time-sliced" in notes
