"""The chart's objects for GPU pools and departments: Kueue ResourceFlavors per pool with each
team's quota per flavor, Cohorts per department, KAI parent queues per department.

Rendered by the real ``helm``; each object is checked against Kueue's v1beta2 API
(kueue.sigs.k8s.io/docs/concepts/cluster_queue, .../cohort: a Cohort's ``parentName``,
its resourceGroups' ``nominalQuota`` added to its children's and ``borrowingLimit`` from
its parent) and KAI's Queue (``parentQueue``, ``overQuotaWeight``).
"""

from __future__ import annotations

import yaml

from spawner.core.units import parse_gpus
from tests.support.helm import catalog_of, helm, of_kind, template_args

VALUES = """
kueue: {enabled: true}
kai: {queues: true}
gpulab:
  pools:
    - {name: h100, gpu_model: H100-80GB, node_labels: {nvidia.com/gpu.product: NVIDIA-H100-80GB-HBM3}}
    - {name: t4, gpu_model: T4-16GB, node_labels: {nvidia.com/gpu.product: Tesla-T4}}
  departments:
    - {name: research, guarantee: 6, burst: 10, pools: {h100: {guarantee: 4, burst: 5}}}
  profiles:
    - {slug: h100-1, gpus: 1, gpu_model: H100-80GB}
    - {slug: t4-1, gpus: 1, gpu_model: T4-16GB}
  teams:
    - {name: vision, guarantee: 4, burst: 8, department: research, fair_share_weight: 2,
       pools: {h100: {guarantee: 2, burst: 4}}}
    - {name: nlp, guarantee: 2, burst: 4, department: research, pools: {h100: {guarantee: 1, burst: 2}}}
    - {name: ops, guarantee: 1, burst: 2}
"""


def rendered(tmp_path, text=VALUES):
    f = tmp_path / "values.yaml"
    f.write_text(text)
    return [d for d in yaml.safe_load_all(helm(*template_args([f])).stdout) if d]


def gpu_flavors(cq):
    (group,) = [g for g in cq["spec"]["resourceGroups"] if "nvidia.com/gpu" in g["coveredResources"]]
    return {f["name"]: {r["name"]: r for r in f["resources"]} for f in group["flavors"]}


def test_one_resource_flavor_per_pool_with_the_pools_node_labels(tmp_path):
    docs = rendered(tmp_path)
    flavors = {d["metadata"]["name"]: d for d in of_kind(docs, "ResourceFlavor")}
    assert set(flavors) == {"gpulab-cpu", "gpulab-pool-h100", "gpulab-pool-t4"}
    assert flavors["gpulab-pool-h100"]["spec"]["nodeLabels"] == {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}
    assert flavors["gpulab-pool-t4"]["metadata"]["labels"]["gpulab.io/pool"] == "t4"


def test_each_teams_cluster_queue_carries_its_quota_per_pool(tmp_path):
    docs = rendered(tmp_path)
    catalog = catalog_of(docs)
    cqs = {d["metadata"]["labels"]["gpulab.io/team"]: d for d in of_kind(docs, "ClusterQueue")}
    for name, team in catalog.teams.items():
        flavors = gpu_flavors(cqs[name])
        assert list(flavors) == ["gpulab-pool-h100", "gpulab-pool-t4"]  # the pools' order
        for pool, flavor in (("h100", "gpulab-pool-h100"), ("t4", "gpulab-pool-t4")):
            q = next((q for q in team.pools if q.pool == pool), None)
            g, b = (q.guarantee_milli, q.burst_milli) if q else (team.guarantee_milli, team.burst_milli)
            gpu = flavors[flavor]["nvidia.com/gpu"]
            assert parse_gpus(gpu["nominalQuota"]) == g, (name, pool)
            assert parse_gpus(gpu["borrowingLimit"]) == b - g, (name, pool)
    assert cqs["vision"]["spec"]["fairSharing"] == {"weight": "2"}
    assert "fairSharing" not in cqs["nlp"]["spec"]


def test_departments_are_cohorts_and_kai_parent_queues(tmp_path):
    docs = rendered(tmp_path)
    cqs = {d["metadata"]["labels"]["gpulab.io/team"]: d for d in of_kind(docs, "ClusterQueue")}
    assert cqs["vision"]["spec"]["cohortName"] == cqs["nlp"]["spec"]["cohortName"] == "gpulab-department-research"
    assert cqs["ops"]["spec"]["cohortName"] == "gpulab"
    (cohort,) = of_kind(docs, "Cohort")
    assert cohort["metadata"]["name"] == "gpulab-department-research"
    assert cohort["spec"]["parentName"] == "gpulab"
    flavors = gpu_flavors(cohort)
    # h100: the department guarantees 4, its teams 2 + 1: the cohort adds 1, and borrows up to 5 - 4
    assert flavors["gpulab-pool-h100"]["nvidia.com/gpu"] == {
        "name": "nvidia.com/gpu",
        "nominalQuota": "1",
        "borrowingLimit": "1",
    }
    # t4 (no entry: the totals): the department guarantees 6, its teams 4 + 2; borrows up to 10 - 6
    assert flavors["gpulab-pool-t4"]["nvidia.com/gpu"]["nominalQuota"] == "0"
    assert flavors["gpulab-pool-t4"]["nvidia.com/gpu"]["borrowingLimit"] == "4"
    queues = {d["metadata"]["name"]: d["spec"] for d in of_kind(docs, "Queue")}
    assert queues["gpulab-department-research"]["parentQueue"] == "gpulab"
    assert queues["gpulab-department-research"]["resources"]["gpu"] == {"quota": 6, "limit": 10, "overQuotaWeight": 1}
    assert queues["gpulab-vision"]["parentQueue"] == "gpulab-department-research"
    assert queues["gpulab-vision"]["resources"]["gpu"]["overQuotaWeight"] == 2
    assert queues["gpulab-ops"]["parentQueue"] == "gpulab"


def test_the_hub_reads_the_same_pools_and_departments(tmp_path):
    catalog = catalog_of(rendered(tmp_path))
    assert set(catalog.pools) == {"h100", "t4"}
    assert catalog.departments["research"].burst_milli == 10_000
    assert catalog.teams["vision"].department == "research"


def test_a_catalog_without_pools_keeps_its_one_gpu_flavor(tmp_path):
    docs = rendered(
        tmp_path,
        "kueue: {enabled: true}\ngpulab:\n  profiles: [{slug: a, gpus: 1}]\n  teams: [{name: vision, guarantee: 2, burst: 3}]\n",
    )
    assert {d["metadata"]["name"] for d in of_kind(docs, "ResourceFlavor")} == {"gpulab-cpu", "gpulab-gpu"}
    assert not of_kind(docs, "Cohort")


def test_a_pool_without_node_labels_fails_with_what_to_set(tmp_path):
    f = tmp_path / "values.yaml"
    f.write_text(
        "kueue: {enabled: true}\ngpulab:\n  pools: [{name: h100, gpu_model: H100-80GB}]\n"
        "  profiles: [{slug: a, gpus: 1, gpu_model: H100-80GB}]\n  teams: [{name: vision, guarantee: 1}]\n"
    )
    proc = helm(*template_args([f]), check=False)
    assert proc.returncode != 0
    assert 'pool "h100" needs node labels' in proc.stderr and "sharing.whole.node_selector.H100-80GB" in proc.stderr


def test_the_schema_refuses_a_typo_in_a_pool_quota(tmp_path):
    f = tmp_path / "values.yaml"
    f.write_text("gpulab:\n  teams:\n    - {name: vision, guarantee: 1, pools: {h100: {guarnatee: 1}}}\n")
    proc = helm(*template_args([f]), check=False)
    assert proc.returncode != 0 and "guarnatee" in proc.stderr
