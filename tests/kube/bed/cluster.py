"""Pytest fixtures and helpers for tests against the real test bed.

``kube_testbed`` (session scope) starts the test bed, or reuses a running
one, and fails with the reason when it cannot: a test that needs a real
control plane never skips silently. ``kube`` gives each test a ``Cluster``
with fresh namespaces that are deleted (and waited for) afterwards, so every
test starts on empty GPU nodes.
"""

from __future__ import annotations

import os
import re
import secrets
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.kube.bed.pki import token_kubeconfig
from tests.kube.bed.testbed import Testbed, TestbedError, down, up


class Cluster:
    """The test bed as one test sees it: admin requests and the namespaces it made."""

    def __init__(self, tb: Testbed, tmp_path: Path):
        self.tb = tb
        self.tmp_path = tmp_path
        self.suffix = secrets.token_hex(3)
        self.namespaces: list[str] = []

    # -- plumbing ----------------------------------------------------------------
    @property
    def server(self) -> str:
        return self.tb.server

    @property
    def kubeconfig(self) -> Path:
        return self.tb.kubeconfig

    def request(self, method: str, path: str, body: Any = None, **kw: Any) -> Any:
        return self.tb.request(method, path, body, **kw)

    def get(self, path: str) -> Any:
        return self.request("GET", path)

    def maybe_get(self, path: str) -> Any | None:
        try:
            return self.get(path)
        except TestbedError as e:
            if "-> 404" in str(e):
                return None
            raise

    def create(self, path: str, body: dict) -> dict:
        return self.request("POST", path, body)

    def patch(self, path: str, body: dict, kind: str = "merge") -> dict:
        return self.request("PATCH", path, body, content_type=f"application/{kind}-patch+json")

    def apply_yaml(self, text: str, namespace: str | None = None) -> list[dict]:
        """Create each document of a manifest (core, apps, batch, rbac, scheduling, kueue)."""
        out = []
        for doc in yaml.safe_load_all(text):
            if doc:
                out.append(self.create(collection_path(doc, namespace), doc))
        return out

    # -- namespaces ------------------------------------------------------------
    def namespace(self, base: str, labels: dict[str, str] | None = None) -> str:
        """A fresh namespace named ``<base>-<suffix>``; it is deleted after the test."""
        name = f"{base}-{self.suffix}"
        self.create("/api/v1/namespaces", {"metadata": {"name": name, "labels": labels or {}}})
        self.namespaces.append(name)
        # Pods are refused until the ServiceAccount controller made "default".
        self.wait(
            lambda: self.maybe_get(f"/api/v1/namespaces/{name}/serviceaccounts/default"),
            f"the default ServiceAccount in {name}",
            30,
        )
        return name

    def cleanup(self) -> None:
        for ns in self.namespaces:
            try:
                self.request("DELETE", f"/api/v1/namespaces/{ns}")
            except TestbedError:
                pass
        for ns in self.namespaces:
            self.wait(
                lambda ns=ns: self.maybe_get(f"/api/v1/namespaces/{ns}") is None, f"namespace {ns} to be deleted", 120
            )
        for cleanup in reversed(self._cluster_scoped):
            try:
                self.request("DELETE", cleanup)
            except TestbedError:
                pass

    _cluster_scoped: list[str]

    def cluster_object(self, path: str, body: dict) -> dict:
        """Create a cluster-scoped object (PriorityClass, ClusterRole...) removed after the test."""
        obj = self.create(path, body)
        self._cluster_scoped.append(f"{path}/{obj['metadata']['name']}")
        return obj

    # -- pods --------------------------------------------------------------------
    def pods(self, namespace: str, selector: str = "") -> list[dict]:
        q = f"?labelSelector={selector}" if selector else ""
        return self.get(f"/api/v1/namespaces/{namespace}/pods{q}")["items"]

    def pod(self, namespace: str, name: str) -> dict | None:
        return self.maybe_get(f"/api/v1/namespaces/{namespace}/pods/{name}")

    def wait_pod(self, namespace: str, name: str, phase: str | Callable[[dict], bool], timeout: float = 60) -> dict:
        check = (lambda p: p["status"].get("phase") == phase) if isinstance(phase, str) else phase
        return self.wait(
            lambda: (p := self.pod(namespace, name)) and check(p) and p,
            f"pod {namespace}/{name} to be {phase}",
            timeout,
        )

    def finish_pod(self, namespace: str, name: str, exit_code: int, reason: str | None = None) -> None:
        """End a Running pod's container with ``exit_code``, as its kubelet reports it."""
        pod = self.wait_pod(namespace, name, "Running", 60)
        t = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        ok = exit_code == 0
        status = pod["status"]
        status["phase"] = "Succeeded" if ok else "Failed"
        status["conditions"] = [
            c for c in status.get("conditions", []) if c["type"] not in ("Ready", "ContainersReady")
        ] + [
            {"type": k, "status": "False", "reason": "PodCompleted" if ok else "PodFailed", "lastTransitionTime": t}
            for k in ("Ready", "ContainersReady")
        ]
        status["containerStatuses"] = [
            {
                **cs,
                "ready": False,
                "started": False,
                "state": {
                    "terminated": {
                        "exitCode": exit_code,
                        "reason": reason or ("Completed" if ok else "Error"),
                        "startedAt": cs["state"].get("running", {}).get("startedAt", t),
                        "finishedAt": t,
                    }
                },
            }
            for cs in status.get("containerStatuses", [])
        ]
        self.request("PUT", f"/api/v1/namespaces/{namespace}/pods/{name}/status", pod)

    def evict_pod(self, namespace: str, name: str) -> None:
        """The Eviction API: the API server adds DisruptionTarget, the node ends the pod."""
        self.create(
            f"/api/v1/namespaces/{namespace}/pods/{name}/eviction",
            {"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": name, "namespace": namespace}},
        )

    def events(self, namespace: str, involved: str | None = None) -> list[dict]:
        q = f"?fieldSelector=involvedObject.name={involved}" if involved else ""
        return self.get(f"/api/v1/namespaces/{namespace}/events{q}")["items"]

    # -- service accounts --------------------------------------------------------
    def token(self, namespace: str, service_account: str, seconds: int = 3600) -> str:
        r = self.create(
            f"/api/v1/namespaces/{namespace}/serviceaccounts/{service_account}/token",
            {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": {"expirationSeconds": seconds}},
        )
        return r["status"]["token"]

    def service_account_kubeconfig(self, namespace: str, service_account: str) -> Path:
        """A kubeconfig holding a ServiceAccount's token: what a hub pod would use."""
        path = self.tmp_path / f"{namespace}-{service_account}.kubeconfig"
        path.write_text(
            yaml.safe_dump(
                token_kubeconfig(self.server, self.tb.ca_file, self.token(namespace, service_account), namespace)
            )
        )
        return path

    # -- the API server's own request counts ------------------------------------
    def request_counts(self) -> dict[tuple[str, str, str], float]:
        """``apiserver_request_total`` by (verb, resource, subresource), from /metrics."""
        counts: dict[tuple[str, str, str], float] = {}
        for line in self.request("GET", "/metrics").splitlines():
            if not line.startswith("apiserver_request_total{"):
                continue
            labels = dict(re.findall(r'(\w+)="([^"]*)"', line.split("}", 1)[0]))
            key = (labels.get("verb", ""), labels.get("resource", ""), labels.get("subresource", ""))
            counts[key] = counts.get(key, 0.0) + float(line.rsplit(" ", 1)[1])
        return counts

    # -- waiting -------------------------------------------------------------------
    @staticmethod
    def wait(check: Callable[[], Any], what: str, timeout: float = 60, interval: float = 0.2) -> Any:
        deadline = time.monotonic() + timeout
        while True:
            result = check()
            if result:
                return result
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")
            time.sleep(interval)


def collection_path(doc: dict, namespace: str | None = None) -> str:
    """The REST collection a manifest document is created in."""
    api_version, kind = doc["apiVersion"], doc["kind"]
    prefix = "/api/v1" if api_version == "v1" else f"/apis/{api_version}"
    plural = PLURALS.get(kind) or kind.lower() + "s"
    ns = doc.get("metadata", {}).get("namespace") or namespace
    if kind in CLUSTER_SCOPED or ns is None:
        return f"{prefix}/{plural}"
    return f"{prefix}/namespaces/{ns}/{plural}"


PLURALS = {
    "PriorityClass": "priorityclasses",
    "NetworkPolicy": "networkpolicies",
    "ResourceQuota": "resourcequotas",
    "LimitRange": "limitranges",
    "ClusterQueue": "clusterqueues",
    "LocalQueue": "localqueues",
    "ResourceFlavor": "resourceflavors",
    "WorkloadPriorityClass": "workloadpriorityclasses",
    "Cohort": "cohorts",
    "Ingress": "ingresses",
    "StorageClass": "storageclasses",
    "ServiceAccount": "serviceaccounts",
    "RuntimeClass": "runtimeclasses",
}
CLUSTER_SCOPED = {
    "Namespace",
    "RuntimeClass",
    "PriorityClass",
    "ClusterRole",
    "ClusterRoleBinding",
    "ClusterQueue",
    "ResourceFlavor",
    "WorkloadPriorityClass",
    "Cohort",
    "StorageClass",
    "Node",
    "CustomResourceDefinition",
    "ValidatingWebhookConfiguration",
    "MutatingWebhookConfiguration",
}


@pytest.fixture(scope="session")
def kube_testbed() -> Iterator[Testbed]:
    """The running test bed (started here if none runs, and then stopped at the end)."""
    from tests.kube.bed.testbed import STATE_DIR

    was_running = Testbed.load(STATE_DIR)
    try:
        tb = up()
    except TestbedError as e:
        pytest.fail(f"the Kubernetes test bed could not start: {e}", pytrace=False)
    yield tb
    if was_running is None and not os.environ.get("GPULAB_KEEP_TESTBED"):
        down()


@pytest.fixture
def kube(kube_testbed: Testbed, tmp_path: Path) -> Iterator[Cluster]:
    cluster = Cluster(kube_testbed, tmp_path)
    cluster._cluster_scoped = []
    yield cluster
    cluster.cleanup()
