"""The kube tier: every test runs on the real control plane of ``tests/kube/bed/``.

Fixtures: ``kube`` (a per-test view of the cluster), ``gpulab_release`` / ``release``
(the gpulab chart installed into it), ``hub_identity`` (KubeSpawner's client as the hub
ServiceAccount the chart binds) and ``api`` (the same, plus the API server's audit log
of what the hub sent, and a cleanup that leaves no pod behind).
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

import pytest
from kubernetes_asyncio.config import kube_config
from kubespawner import KubeSpawner

from spawner.runtime import set_runtime
from tests.kube.bed.chart import Release
from tests.kube.bed.cluster import Cluster
from tests.kube.bed.testbed import TestbedError
from tests.support.kube_spawner import ClusterView


@contextlib.asynccontextmanager
async def _as_hub(release: Release, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[None]:
    """KubeSpawner's kubernetes_asyncio client reads the hub's kubeconfig (never admin's);
    a fresh runtime; the reflectors stopped at the end."""
    monkeypatch.setenv("KUBECONFIG", str(release.hub_kubeconfig))
    # kubernetes_asyncio reads $KUBECONFIG once, at import: point its default there too.
    monkeypatch.setattr(kube_config, "KUBE_CONFIG_DEFAULT_LOCATION", str(release.hub_kubeconfig))
    set_runtime(None)
    try:
        yield
    finally:
        await KubeSpawner._stop_all_reflectors()
        set_runtime(None)


@pytest.fixture
async def hub_identity(release: Release, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Release]:
    """KubeSpawner's client, as the hub ServiceAccount (never admin)."""
    async with _as_hub(release, monkeypatch):
        yield release


@pytest.fixture
async def api(release: Release, kube: Cluster, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[ClusterView]:
    """The real cluster, as the hub ServiceAccount sees it and as the audit log counts it."""
    async with _as_hub(release, monkeypatch):
        view = ClusterView(kube, f"system:serviceaccount:{release.hub_namespace}:hub")
        view.release = release
        yield view
    for ns in release.teams.values():
        for q in view.list("resourcequotas", ns):
            if q["metadata"]["name"] != "gpulab-gpus":
                kube.request("DELETE", f"/api/v1/namespaces/{ns}/resourcequotas/{q['metadata']['name']}")
        # The next test's ledger is rebuilt from the labelled pods: none of this test's may linger
        # (a stopped server's pod can still be terminating on a loaded machine).
        for pod in view.list("pods", ns):
            try:
                kube.request(
                    "DELETE", f"/api/v1/namespaces/{ns}/pods/{pod['metadata']['name']}", {"gracePeriodSeconds": 0}
                )
            except TestbedError:
                pass  # gone meanwhile
    kube.wait(lambda: not any(view.list("pods", ns) for ns in release.teams.values()), "this test's pods to be gone")
