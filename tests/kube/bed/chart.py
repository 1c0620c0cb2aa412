"""The gpulab Helm chart installed into the test bed, and a hub identity bound by it.

``gpulab_release`` (session scope) runs the real ``helm install`` of
``helm/gpulab`` into the test bed with a few teams, creates the hub's
ServiceAccount and the Role Zero to JupyterHub gives it in its own namespace
(z2jh's templates/hub/rbac.yaml: pods, PVCs, secrets, services; read-only
events), and hands out a kubeconfig holding that ServiceAccount's token. So
everything the hub does in these tests, it does with exactly the rights the
chart (and z2jh) grant: never as cluster-admin.
"""

from __future__ import annotations

import json
import os
import secrets
import socket
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import yaml

from tests.kube.bed.cluster import Cluster
from tests.kube.bed.testbed import Testbed
from tests.support.helm import CHART
from tests.support.helm import helm as helm_command


def helm(tb: Testbed, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    env = {
        **os.environ,
        "KUBECONFIG": str(tb.kubeconfig),
        "HELM_CACHE_HOME": str(tb.state_dir / "helm-cache"),
        "HELM_CONFIG_HOME": str(tb.state_dir / "helm-config"),
        "HELM_DATA_HOME": str(tb.state_dir / "helm-data"),
    }
    return helm_command(*args, check=check, env=env, timeout=300)


Z2JH_HUB_RULES = [
    {
        "apiGroups": [""],
        "resources": ["pods", "persistentvolumeclaims", "secrets", "services"],
        "verbs": ["get", "watch", "list", "create", "delete"],
    },
    {"apiGroups": [""], "resources": ["events"], "verbs": ["get", "watch", "list"]},
]


SESSION_ANNOTATION = "gpulab.io/test-session"


def _started(pid: int) -> str | None:
    """When process ``pid`` started (clock ticks since boot, from /proc), or None if it is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rpartition(")")[2].split()[19]  # field 22, counted after the command name


def session_id() -> str:
    """This test process, as ``host:pid:start``: the start time tells a reused pid apart."""
    return f"{socket.gethostname()}:{os.getpid()}:{_started(os.getpid())}"


def session_alive(owner: str) -> bool:
    """Is the test process ``host:pid:start`` still running here (the same process, not a reused pid)?"""
    host, pid, started = (owner.split(":") + ["", "", ""])[:3]
    if host != socket.gethostname() or not pid.isdigit():
        return False
    now = _started(int(pid))
    return now is not None and (not started or now == started)


@dataclass
class Release:
    """An installed gpulab chart: its namespaces, teams and the hub's credentials."""

    name: str
    hub_namespace: str
    teams: dict[str, str]  # team name -> namespace
    values: dict
    hub_kubeconfig: Path
    cluster: Cluster
    extra: dict = field(default_factory=dict)

    def team_ns(self, team: str) -> str:
        return self.teams[team]

    def catalog_yaml(self) -> str:
        """The chart's catalog as a hub reads it: its sharing, profiles and teams, each team in its namespace."""
        g = self.values["gpulab"]
        return yaml.safe_dump(
            {
                "sharing": g["sharing"],
                "profiles": g["profiles"],
                "teams": [{**t, "namespace": self.team_ns(t["name"])} for t in g["teams"]],
            }
        )

    def clean_team_namespaces(self) -> None:
        """Delete every TrainJob, JobSet, pod, Job and PVC in the team namespaces and wait
        until the pods are gone."""
        c = self.cluster
        for ns in self.teams.values():
            for path in (
                *(f"{collection.format(ns=ns)}" for collection in TRAINING_COLLECTIONS),
                f"/apis/batch/v1/namespaces/{ns}/jobs",
                f"/api/v1/namespaces/{ns}/pods",
                f"/api/v1/namespaces/{ns}/persistentvolumeclaims",
            ):
                c.request("DELETE", path + "?propagationPolicy=Background&gracePeriodSeconds=0")
        for ns in self.teams.values():
            c.wait(lambda ns=ns: not c.get(f"/api/v1/namespaces/{ns}/pods")["items"], f"pods in {ns} to be gone", 90)


#: The multi-node jobs' kinds (JobSet and Trainer run in the bed), per namespace.
TRAINING_COLLECTIONS = (
    "/apis/trainer.kubeflow.org/v1alpha1/namespaces/{ns}/trainjobs",
    "/apis/jobset.x-k8s.io/v1alpha2/namespaces/{ns}/jobsets",
)


def delete_gangs(c: Cluster) -> None:
    """Delete every gpulab TrainJob and JobSet in the cluster (a release's uninstall waits on
    its ClusterTrainingRuntime, which Trainer keeps while a TrainJob uses it)."""
    for collection in TRAINING_COLLECTIONS:
        everywhere = collection.replace("/namespaces/{ns}", "")
        for obj in c.get(everywhere + "?labelSelector=gpulab.io/job-id")["items"]:
            path = collection.format(ns=obj["metadata"]["namespace"]) + "/" + obj["metadata"]["name"]
            c.request("DELETE", path + "?propagationPolicy=Background")


def team_values(suffix: str) -> dict:
    """Teams for the test bed's GPU nodes (tests/kube/bed/nodes.yaml)."""
    return {
        # Kueue runs in the test bed: the chart's ResourceFlavor, ClusterQueues and LocalQueues.
        "kueue": {"enabled": True},
        # JobSet and Trainer run in the test bed: the hub's rights to them, the torch runtime.
        "training": {"enabled": True},
        "gpulab": {
            # 0.5 GPU = 2 of 4 time-slices: the device plugin's failRequestsGreaterThanOne
            # is off on this pool (tests/kube/bed/nodes.yaml), so gpulab may ask for 2.
            "sharing": {
                "backend": "timeslice",
                "timeslice": {
                    "resource": "nvidia.com/gpu.shared",
                    "replicas": 4,
                    "fail_requests_greater_than_one": False,
                },
            },
            "profiles": [
                {"slug": "cpu", "display_name": "CPU only", "gpus": 0},
                {"slug": "h100-half", "display_name": "0.5 × H100", "gpus": 0.5, "gpu_model": "H100-80GB"},
                {"slug": "h100-1", "display_name": "1 × H100", "gpus": 1, "gpu_model": "H100-80GB", "sharing": "whole"},
            ],
            "teams": [
                {
                    "name": "vision",
                    "users": ["alice", "bob"],
                    "guarantee": 2,
                    "burst": 3,
                    "namespace": f"team-vision-{suffix}",
                },
                {
                    "name": "nlp",
                    "users": ["carol", "alice"],
                    "guarantee": 1,
                    "burst": 2,
                    "namespace": f"team-nlp-{suffix}",
                },
                {"name": "crowd", "groups": ["crowd"], "guarantee": 4, "burst": 6, "namespace": f"team-crowd-{suffix}"},
            ],
        },
    }


@pytest.fixture(scope="session")
def gpulab_release(kube_testbed: Testbed, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Release]:
    tmp = tmp_path_factory.mktemp("gpulab-release")
    c = Cluster(kube_testbed, tmp)
    c._cluster_scoped = []
    suffix = secrets.token_hex(3)
    c.suffix = suffix
    hub_ns = c.namespace("gpulab-hub")
    c.create(f"/api/v1/namespaces/{hub_ns}/serviceaccounts", {"metadata": {"name": "hub"}})
    c.create(
        f"/apis/rbac.authorization.k8s.io/v1/namespaces/{hub_ns}/roles",
        {"metadata": {"name": "hub"}, "rules": Z2JH_HUB_RULES},
    )
    c.create(
        f"/apis/rbac.authorization.k8s.io/v1/namespaces/{hub_ns}/rolebindings",
        {
            "metadata": {"name": "hub"},
            "subjects": [{"kind": "ServiceAccount", "name": "hub", "namespace": hub_ns}],
            "roleRef": {"kind": "Role", "name": "hub", "apiGroup": "rbac.authorization.k8s.io"},
        },
    )
    # The NVIDIA GPU operator's namespace, where the chart puts the device
    # plugin's time-slicing config (a cluster with GPU nodes has it).
    if c.maybe_get("/api/v1/namespaces/gpu-operator") is None:
        c.create("/api/v1/namespaces", {"metadata": {"name": "gpu-operator"}})
    values = team_values(suffix)
    values_file = tmp / "values.yaml"
    values_file.write_text(yaml.safe_dump(values))
    # The release the docs install: its cluster-scoped objects carry its name (gpulab-
    # development, ...), as on a cluster where platform engineers typed `helm install gpulab`.
    name = "gpulab"
    # The chart's team namespaces and PriorityClasses are cluster-wide, so one session's
    # release per test bed: a release of a test session that has died is removed; a live
    # session's is not.
    c.patch(f"/api/v1/namespaces/{hub_ns}", {"metadata": {"annotations": {SESSION_ANNOTATION: session_id()}}})
    for other in json.loads(helm(kube_testbed, "list", "--all-namespaces", "-o", "json").stdout or "[]"):
        if not (
            (other["name"] == "gpulab" or other["name"].startswith("gpulab-"))
            and other["namespace"].startswith("gpulab-hub-")
        ):
            continue
        owner = (
            (c.maybe_get(f"/api/v1/namespaces/{other['namespace']}") or {})
            .get("metadata", {})
            .get("annotations", {})
            .get(SESSION_ANNOTATION, "")
        )
        if session_alive(owner):
            c.cleanup()
            pytest.fail(
                f"another test session ({owner}) has the gpulab chart installed in the test bed at "
                f"{kube_testbed.state_dir}; run beside it with GPULAB_KUBE_TESTBED_DIR=<another folder>",
                pytrace=False,
            )
        # A TrainJob holds its ClusterTrainingRuntime (Trainer's finalizer): gangs go first.
        delete_gangs(c)
        helm(kube_testbed, "uninstall", other["name"], "--namespace", other["namespace"], "--wait", check=False)
    # PriorityClasses a crashed benchmark or run left without a release.
    releases = {
        r["name"] for r in json.loads(helm(kube_testbed, "list", "--all-namespaces", "-o", "json").stdout or "[]")
    }
    for pc in c.get("/apis/scheduling.k8s.io/v1/priorityclasses")["items"]:
        owner = pc["metadata"].get("annotations", {}).get("meta.helm.sh/release-name")
        if pc["metadata"]["name"].startswith("gpulab-") and owner not in releases:
            c.request("DELETE", f"/apis/scheduling.k8s.io/v1/priorityclasses/{pc['metadata']['name']}")
    try:
        helm(
            kube_testbed,
            "install",
            name,
            str(CHART),
            "--namespace",
            hub_ns,
            "-f",
            str(values_file),
            "--wait",
            "--timeout",
            "120s",
        )
    except AssertionError:
        helm(kube_testbed, "uninstall", name, "--namespace", hub_ns, check=False)
        c.cleanup()
        raise
    teams = {t["name"]: t["namespace"] for t in values["gpulab"]["teams"]}
    c.namespaces.extend(teams.values())  # kept by `helm uninstall` (resource-policy: keep)
    for ns in teams.values():
        c.wait(
            lambda ns=ns: c.maybe_get(f"/api/v1/namespaces/{ns}/serviceaccounts/default"),
            f"the default ServiceAccount in {ns}",
            60,
        )
        # ResourceQuota admission refuses pods ("status unknown for quota") until
        # the quota controller has computed the quota's usage once.
        c.wait(
            lambda ns=ns: all(
                q.get("status", {}).get("used") is not None
                for q in c.get(f"/api/v1/namespaces/{ns}/resourcequotas")["items"]
            ),
            f"the ResourceQuota status in {ns}",
            60,
        )
    release = Release(name, hub_ns, teams, values, c.service_account_kubeconfig(hub_ns, "hub"), c)
    yield release
    delete_gangs(c)
    helm(kube_testbed, "uninstall", name, "--namespace", hub_ns, "--wait", check=False)
    c.cleanup()


@pytest.fixture
def release(gpulab_release: Release) -> Iterator[Release]:
    """The session's release, with its team namespaces emptied after the test."""
    yield gpulab_release
    gpulab_release.clean_team_namespaces()
