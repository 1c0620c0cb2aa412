"""GPUKubeSpawner on the test bed: spawners built as KubeSpawner's tests build them, and
what the tests ask of "the cluster", answered by the real one.

:func:`spawner_for` is the one way the kube tests make a spawner (with
:func:`spawner_config` or :func:`chart_config`).

``ClusterView`` reads the test bed as the admin and counts what the hub's
ServiceAccount asked for from the API server's audit log (which records the
bodies of pod creates), so a test can assert on exactly what a spawner sent
and on how many requests it made, as the API server saw them.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlsplit

import yaml
from kubespawner import KubeSpawner
from traitlets.config import Config

from spawner.kube.spawner import GPUKubeSpawner
from tests.kube.bed.chart import Release
from tests.kube.bed.cluster import Cluster
from tests.support.catalogs import KUBE_SPAWNER

_PLURAL_PATHS = {"pods": "/api/v1/namespaces/{ns}/pods", "resourcequotas": "/api/v1/namespaces/{ns}/resourcequotas"}


class User:
    """What a spawner reads from JupyterHub's User (as KubeSpawner's own tests build it)."""

    def __init__(self, name: str, groups: tuple[str, ...] = ()):
        self.name = name
        self.id = abs(hash(name)) % 10**6
        self.url = f"/user/{name}/"
        self.groups = [type("Group", (), {"name": g})() for g in groups]
        self.escaped_name = name


class Hub:
    """What a spawner reads from JupyterHub's Hub: where single-user servers reach it."""

    public_host = ""
    url = "http://127.0.0.1:8081/hub/"
    base_url = "/hub/"
    api_url = "http://127.0.0.1:8081/hub/api"


class ClusterView:
    """Requests of one ServiceAccount since the view was made, and admin reads and writes."""

    def __init__(self, kube: Cluster, username: str):
        self.kube = kube
        self.username = username
        self.offset = kube.tb.audit_offset()

    def events(self) -> list[dict[str, Any]]:
        return self.kube.tb.audit_events(self.offset, self.username)

    def created_pods(self, namespace: str | None = None) -> list[dict[str, Any]]:
        """The pod bodies the hub sent (the API server's audit log), in order."""
        return [
            e["requestObject"]
            for e in self.events()
            if e["verb"] == "create"
            and (e.get("objectRef") or {}).get("resource") == "pods"
            and not (e.get("objectRef") or {}).get("subresource")
            and "requestObject" in e
            and namespace in (None, e["objectRef"].get("namespace"))
        ]

    def count(self, verb: str | None = None, plural: str | None = None) -> int:
        return sum(
            1
            for e in self.events()
            if verb in (None, e["verb"]) and plural in (None, (e.get("objectRef") or {}).get("resource"))
        )

    def requests(self) -> Counter:
        """(verb, path) of every request, the path without its query."""
        return Counter((e["verb"], urlsplit(e["requestURI"]).path) for e in self.events())

    # -- admin reads and writes -------------------------------------------------
    def get(self, plural: str, ns: str, name: str) -> dict | None:
        return self.kube.maybe_get(_PLURAL_PATHS[plural].format(ns=ns) + "/" + name)

    def list(self, plural: str, ns: str, label_selector: str = "", field_selector: str = "") -> list[dict]:
        q = "&".join(
            f"{k}={quote(v)}" for k, v in (("labelSelector", label_selector), ("fieldSelector", field_selector)) if v
        )
        return self.kube.get(_PLURAL_PATHS[plural].format(ns=ns) + (f"?{q}" if q else ""))["items"]

    def create(self, plural: str, ns: str, body: dict) -> dict:
        return self.kube.create(_PLURAL_PATHS[plural].format(ns=ns), body)

    def delete(self, plural: str, ns: str, name: str, grace: int | None = None) -> None:
        q = f"?gracePeriodSeconds={grace}" if grace is not None else ""
        self.kube.request("DELETE", _PLURAL_PATHS[plural].format(ns=ns) + f"/{name}{q}")


def kubeconfig_to_nowhere(tmp_path: Path, monkeypatch: Any) -> None:
    """Point kubernetes_asyncio (and so KubeSpawner's client) at an address nothing
    listens on: for spawners built where nothing talks to a cluster."""
    from kubernetes_asyncio.config import kube_config

    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "none", "cluster": {"server": "https://127.0.0.1:9"}}],
                "users": [{"name": "none", "user": {"token": "none"}}],
                "contexts": [{"name": "none", "context": {"cluster": "none", "user": "none"}}],
                "current-context": "none",
            }
        )
    )
    monkeypatch.setenv("KUBECONFIG", str(kubeconfig))
    monkeypatch.setattr(kube_config, "KUBE_CONFIG_DEFAULT_LOCATION", str(kubeconfig))


#: The Kubernetes version of the test bed, for kubernetes-validate.
K8S_VERSION = "1.36"
#: The toleration every GPU pod of these tests needs (the test bed taints its GPU nodes).
GPU_TOLERATION = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
BASE_IMAGE = "quay.io/jupyter/base-notebook:2024-10-07"


def spawner_config(release: Release, catalog: dict | None = None, *, start_timeout: int = 20) -> Config:
    """A hub's config for GPUKubeSpawner on the test bed: ``catalog`` (default the sample
    :data:`~tests.support.catalogs.KUBE_SPAWNER`) with each team in the namespace the chart
    made for it in this run."""
    data = catalog or KUBE_SPAWNER
    c = Config()
    c.GPULab.teams = [{**t, "namespace": release.team_ns(t["name"])} for t in data["teams"]]
    c.GPULab.profiles = data["profiles"]
    c.GPULab.sharing = data.get("sharing", {})
    c.KubeSpawner.namespace = release.hub_namespace
    c.KubeSpawner.image = BASE_IMAGE
    c.KubeSpawner.start_timeout = start_timeout
    c.KubeSpawner.delete_grace_period = 1
    c.KubeSpawner.tolerations = [GPU_TOLERATION]
    return c


def chart_config(release: Release, **catalog_overrides: Any) -> Config:
    """The hub's config with the catalog the chart itself was installed with (its values),
    ``profiles`` or ``sharing`` replaced when given."""
    return spawner_config(release, {**release.values["gpulab"], **catalog_overrides}, start_timeout=60)


def chart_team(release: Release, name: str) -> str:
    """A team of the chart's catalog, by name (and there, or the test says which are)."""
    assert name in release.teams, release.teams
    return name


def spawner_for(
    config: Config,
    user: str,
    options: dict | None = None,
    groups: tuple[str, ...] = (),
    *,
    cls: type[KubeSpawner] = GPUKubeSpawner,
    name: str = "",
) -> KubeSpawner:
    """A spawner as KubeSpawner's own tests build one, without a hub process: a user with
    ``name``/``groups``, the hub's URLs, and JupyterHub's ORM row (which names the server)."""
    orm_spawner = type("ORMSpawner", (), {"name": name, "server": None, "user_options": {}})()
    s = cls(config=config, user=User(user, groups), hub=Hub(), orm_spawner=orm_spawner)
    s.api_token = "token-" + user
    s.user_options = options or {}
    return s
