"""The ledger on Kubernetes: rebuilt from the pods the cluster runs.

:class:`ClusterLedger` is the part of :class:`spawner.kube.GPUKubeSpawner` that
watches every pod gpulab counts (one reflector per team namespace, or one for all)
and rebuilds the process ledger from them, so that a hub restart, or a pod that
ends while the hub is away, never leaves quota counted wrongly.
"""

from __future__ import annotations

import asyncio
import json
import weakref
from typing import TYPE_CHECKING, Any

from kubernetes_asyncio.client.rest import ApiException
from kubespawner.spawner import PodReflector

from spawner.core import labels as gl
from spawner.core.ledger import Workload

if TYPE_CHECKING:
    from spawner.runtime import GPULabRuntime

#: Runtimes whose ledger has been rebuilt from the cluster at least once.
_LOADED_RUNTIMES: weakref.WeakSet[Any] = weakref.WeakSet()
#: Seconds a namespace whose pods could not be listed is left alone before the next try.
_RETRY_FAILED_NAMESPACE_SECONDS = 10.0


class GPUPodReflector(PodReflector):
    """Watches every pod gpulab counts (``gpulab.io/gpu-milli`` exists), in one namespace or all."""

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        # ResourceReflector only builds key=value selectors; this one selects on existence.
        self.label_selector = gl.SELECTOR


def workload_from_pod(pod: dict) -> Workload | None:
    """The ledger entry a pod stands for; ``None`` if it holds nothing (not ours, or finished)."""
    md = pod.get("metadata") or {}
    if (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
        return None
    return gl.workload_from_labels(
        md.get("labels") or {}, md.get("annotations") or {}, fallback_key=f"pod:{md.get('namespace')}/{md.get('name')}"
    )


def api_message(e: ApiException) -> str:
    try:
        return str(json.loads(e.body or b"").get("message") or e.reason or e)
    except (TypeError, ValueError, AttributeError):
        return e.reason or str(e)


class ClusterLedger:
    """Mixed into GPUKubeSpawner: the reflectors and the rebuild of the ledger from them."""

    # Provided by the spawner this is mixed into.
    if TYPE_CHECKING:

        @property
        def runtime(self) -> GPULabRuntime: ...

    reflectors: dict[Any, Any]
    enable_user_namespaces: bool
    ledger_namespaces: list[str]
    _hub_namespace: str
    log: Any

    def _watched_namespaces(self) -> list[str | None]:
        """The namespaces whose pods count; ``[None]``: every namespace."""
        if self.enable_user_namespaces or "*" in self.ledger_namespaces:
            return [None]
        if self.ledger_namespaces:
            return list(sorted(set(self.ledger_namespaces)))
        teams = self.runtime.catalog.teams.values()
        return list(sorted({self._hub_namespace, *(t.namespace for t in teams if t.namespace)}))

    #: Namespace -> loop time its pods last failed to list (a missing Role or namespace).
    _failed_namespaces: dict[str | None, float] = {}

    async def _ledger_reflectors(self) -> tuple[list[GPUPodReflector], set[str | None]]:
        """Start (once per process) the reflectors the ledger is rebuilt from.

        Returns ``(reflectors, failed namespaces)``. A namespace whose pods
        cannot be listed (no Role there yet, namespace not created) is logged
        and left out, and retried after a short pause; the others go on.
        """
        out = []
        failed: set[str | None] = set()
        now = asyncio.get_running_loop().time()
        for ns in self._watched_namespaces():
            since = ClusterLedger._failed_namespaces.get(ns)
            if since is not None and now - since < _RETRY_FAILED_NAMESPACE_SECONDS:
                failed.add(ns)
                continue
            key = ("gpulab-pods", ns)
            reflector = self.__class__.reflectors.get(key)
            if reflector is not None and reflector.watch_task is not None and reflector.watch_task.done():
                # Its watch gave up (API unreachable for a while): its copy is stale, start afresh.
                self.log.warning("gpulab: GPU pod watch in %s had stopped; restarting it", ns or "all namespaces")
                self.__class__.reflectors.pop(key, None)
                reflector = None
            if reflector is None:
                self.log.info("gpulab: watching GPU pods in %s", ns or "all namespaces")
                reflector = GPUPodReflector(parent=self, namespace=ns, omit_namespace=ns is None)
                self.__class__.reflectors[key] = reflector
                try:
                    await reflector.start()
                except Exception as e:
                    self.__class__.reflectors.pop(key, None)
                    ClusterLedger._failed_namespaces[ns] = now
                    failed.add(ns)
                    self.log.warning(
                        "gpulab: cannot list GPU pods in %s (%s); its teams keep their last "
                        "known usage until it can be read",
                        ns or "all namespaces",
                        api_message(e) if isinstance(e, ApiException) else e,
                    )
                    continue
            elif not reflector.first_load_future.done():
                await reflector.first_load_future
            ClusterLedger._failed_namespaces.pop(ns, None)
            out.append(reflector)
        return out, failed

    def _team_namespace(self, team_name: str) -> str:
        team = self.runtime.catalog.teams.get(team_name)
        return (team.namespace if team is not None and team.namespace else None) or self._hub_namespace

    def _live_workloads(self, reflectors: list[GPUPodReflector]) -> dict[str, Workload]:
        live: dict[str, Workload] = {}
        for reflector in reflectors:
            for pod in list(reflector.pods.values()):
                w = workload_from_pod(pod)
                if w is not None:
                    live[w.key] = w
        return live

    async def refresh_ledger(self) -> set[str | None]:
        """Rebuild the ledger from the pods the cluster runs; pending spawns stay reserved.

        Cheap: reads the reflectors' local copies (no API request once they run).
        Workloads of teams whose namespace could not be read are kept as the
        ledger knew them (never dropped for lack of data). Returns the
        namespaces that could not be read.
        """
        reflectors, failed = await self._ledger_reflectors()
        live = self._live_workloads(reflectors)
        if failed:
            if None in failed:  # the all-namespaces watch: nothing is known
                return failed
            for w in self.runtime.ledger.workloads():
                if self._team_namespace(w.team) in failed and w.key not in live:
                    live[w.key] = w
        self.runtime.ledger.rebuild(live.values(), keep_reserved=True)
        if not failed:
            _LOADED_RUNTIMES.add(self.runtime)
        return failed
