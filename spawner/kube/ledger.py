"""The ledger on Kubernetes: rebuilt from the pods the cluster runs.

:class:`ClusterLedger` is the part of :class:`spawner.kube.GPUKubeSpawner` that
watches every pod gpulab counts (one informer per team namespace, or one for all)
and rebuilds the process ledger from them, so that a hub restart, or a pod that
ends while the hub is away, never leaves quota counted wrongly. The same
informer is KubeSpawner's pod reflector (see ``GPUKubeSpawner._get_reflector_key``):
a hub makes one pod watch per namespace, or one in all, not two.
"""

from __future__ import annotations

import asyncio
import json
import weakref
from functools import partial
from typing import TYPE_CHECKING, Any

from kubernetes_asyncio.client.rest import ApiException

from spawner.core import labels as gl
from spawner.core.ledger import Workload

from .informer import GPUPodInformer

if TYPE_CHECKING:
    from spawner.runtime import GPULabRuntime

#: Runtimes whose ledger has been rebuilt from the cluster at least once.
_LOADED_RUNTIMES: weakref.WeakSet[Any] = weakref.WeakSet()
#: Runtime -> the informers' revisions (and unreadable namespaces) its ledger was last rebuilt from.
_REBUILT_FROM: weakref.WeakKeyDictionary[Any, tuple] = weakref.WeakKeyDictionary()
#: Seconds a namespace whose pods could not be listed is left alone before the next try.
_RETRY_FAILED_NAMESPACE_SECONDS = 10.0
#: The key of a namespace's (or, for ``None``, every namespace's) pod informer in
#: KubeSpawner's class-level ``reflectors``.
POD_INFORMER = "gpulab-pods"

#: The name this class had before it became an informer; kept for deployments that import it.
GPUPodReflector = GPUPodInformer


def workload_from_pod(pod: dict) -> Workload | None:
    """The ledger entry a pod stands for; ``None`` if it holds nothing (not ours, or finished)."""
    md = pod.get("metadata") or {}
    if (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
        return None
    return gl.workload_from_labels(
        md.get("labels") or {}, md.get("annotations") or {}, fallback_key=f"pod:{md.get('namespace')}/{md.get('name')}"
    )


def pod_of_workload(reflectors: dict[Any, Any], key: str) -> tuple[str, str] | None:
    """``(namespace, pod)`` of the pod a running workload ``key`` is, from the pod informers in
    ``reflectors`` (KubeSpawner's class-level dict); ``None`` when no informer holds it."""
    for (kind, _ns), informer in list(reflectors.items()):
        if kind != POD_INFORMER:
            continue
        ref = informer.ref_of(key)
        if ref is not None:
            namespace, _, name = ref.partition("/")
            return namespace, name
    return None


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

    def _watches_all_namespaces(self) -> bool:
        """One watch over every namespace (needs the chart's ``rbac.clusterWidePodRead``)."""
        return bool(self.enable_user_namespaces or "*" in self.ledger_namespaces)

    def _watched_namespaces(self) -> list[str | None]:
        """The namespaces whose pods count; ``[None]``: every namespace."""
        if self._watches_all_namespaces():
            return [None]
        if self.ledger_namespaces:
            return list(sorted(set(self.ledger_namespaces)))
        teams = self.runtime.catalog.teams.values()
        return list(sorted({self._hub_namespace, *(t.namespace for t in teams if t.namespace)}))

    #: Namespace -> loop time its pods last failed to list (a missing Role or namespace).
    _failed_namespaces: dict[str | None, float] = {}
    #: The informers' start under way, shared by every caller meanwhile.
    _starting: asyncio.Future | None = None

    async def _pod_informer(self, ns: str | None, replace: bool = False) -> GPUPodInformer:
        """The running pod informer of ``ns`` (``None``: all namespaces), started if needed.

        Raises what its first list raised (no Role there, namespace missing).
        ``replace`` starts a fresh one (KubeSpawner asks for that when a pod
        never showed up); so does a watch that gave up (API server away too long).
        """
        key = (POD_INFORMER, ns)
        informer = self.__class__.reflectors.get(key)
        if informer is not None and (replace or (informer.watch_task is not None and informer.watch_task.done())):
            if not replace:
                self.log.warning("gpulab: GPU pod watch in %s had stopped; restarting it", ns or "all namespaces")
            self.__class__.reflectors.pop(key, None)
            await informer.stop()
            informer = None
        if informer is None:
            self.log.info("gpulab: watching GPU pods in %s", ns or "all namespaces")
            informer = GPUPodInformer(parent=self, namespace=ns, omit_namespace=ns is None)
            informer.derive = workload_from_pod
            self.__class__.reflectors[key] = informer
            # The hub's session GPU recorder finds each session's dcgm-exporter series by its pod.
            self.runtime.workload_pod = partial(pod_of_workload, self.__class__.reflectors)
            try:
                await informer.start()
            except BaseException:
                self.__class__.reflectors.pop(key, None)
                raise
        elif not informer.first_load_future.done():
            await informer.first_load_future
        return informer

    async def _ledger_reflectors(self) -> tuple[list[GPUPodInformer], set[str | None]]:
        """Start (once per process) the informers the ledger is rebuilt from.

        Returns ``(informers, failed namespaces)``. A namespace whose pods
        cannot be listed (no Role there yet, namespace not created) is logged
        and left out, and retried after a short pause; the others go on.
        Namespaces are started together, so a hub start with many team
        namespaces waits for the slowest list, not for their sum.
        """
        now = asyncio.get_running_loop().time()
        failed: set[str | None] = set()
        todo: list[str | None] = []
        for ns in self._watched_namespaces():
            since = ClusterLedger._failed_namespaces.get(ns)
            if since is not None and now - since < _RETRY_FAILED_NAMESPACE_SECONDS:
                failed.add(ns)
            else:
                todo.append(ns)
        ready = [self.__class__.reflectors.get((POD_INFORMER, ns)) for ns in todo]
        if all(r is not None and r.first_load_future.done() and not r.watch_task.done() for r in ready):
            # Every informer runs (the common case): no task per namespace per call.
            return ready, failed  # type: ignore[return-value]
        # Starting: every caller meanwhile (a hub start polls thousands of servers at once)
        # waits for the same start instead of starting one task per namespace each.
        starting = ClusterLedger._starting
        if starting is None or starting.done() or starting.get_loop() is not asyncio.get_running_loop():
            starting = ClusterLedger._starting = asyncio.ensure_future(self._start_informers(todo))
        by_ns = await asyncio.shield(starting)
        results = [by_ns[ns] if ns in by_ns else (await self._start_informers([ns]))[ns] for ns in todo]
        out = []
        for ns, result in zip(todo, results, strict=True):
            if isinstance(result, asyncio.CancelledError):
                raise result
            if isinstance(result, BaseException):
                ClusterLedger._failed_namespaces[ns] = now
                failed.add(ns)
                self.log.warning(
                    "gpulab: cannot list GPU pods in %s (%s); its teams keep their last "
                    "known usage until it can be read",
                    ns or "all namespaces",
                    api_message(result) if isinstance(result, ApiException) else result,
                )
                continue
            ClusterLedger._failed_namespaces.pop(ns, None)
            out.append(result)
        return out, failed

    async def _start_informers(self, namespaces: list[str | None]) -> dict[str | None, Any]:
        """``{namespace: its informer, or what its start raised}``, started together."""
        results = await asyncio.gather(*(self._pod_informer(ns) for ns in namespaces), return_exceptions=True)
        return dict(zip(namespaces, results, strict=True))

    def _team_namespace(self, team_name: str) -> str:
        team = self.runtime.catalog.teams.get(team_name)
        return (team.namespace if team is not None and team.namespace else None) or self._hub_namespace

    def _live_workloads(self, reflectors: list[GPUPodInformer]) -> dict[str, Workload]:
        live: dict[str, Workload] = {}
        for reflector in reflectors:
            live.update(reflector.workloads())
        return live

    async def refresh_ledger(self) -> set[str | None]:
        """Rebuild the ledger from the pods the cluster runs; pending spawns stay reserved.

        Cheap: reads the reflectors' local copies (no API request once they run).
        Workloads of teams whose namespace could not be read are kept as the
        ledger knew them (never dropped for lack of data). Returns the
        namespaces that could not be read.
        """
        reflectors, failed = await self._ledger_reflectors()
        seen = (tuple(r.revision for r in reflectors), frozenset(failed))
        if _REBUILT_FROM.get(self.runtime) == seen:
            # No pod changed since the last rebuild: the ledger holds it, with the reservations,
            # confirmations and releases made since (a rebuild of 5,000 pods costs ~50 ms).
            return failed
        live = self._live_workloads(reflectors)
        if failed:
            if None in failed:  # the all-namespaces watch: nothing is known
                return failed
            for w in self.runtime.ledger.workloads():
                if self._team_namespace(w.team) in failed and w.key not in live:
                    live[w.key] = w
        self.runtime.ledger.rebuild(live.values(), keep_reserved=True)
        _REBUILT_FROM[self.runtime] = seen
        if not failed:
            _LOADED_RUNTIMES.add(self.runtime)
        return failed
