"""Pods the hub holds no state for: a start the hub never saw end, and a server from before gpulab.

Mixed into GPUKubeSpawner and called from its ``poll``. JupyterHub commits a server's
row before ``start()`` and its state only after it returns, so a hub process that dies
mid-start comes back with rows whose spawner state is empty; the pod informers still
know those pods by their labels (:meth:`PodsWithoutState._adopt_unsaved_pod`). A pod
started by plain KubeSpawner before the hub switched to gpulab has no gpulab labels and
is read directly (:meth:`PodsWithoutState._poll_unlabelled_pod`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from kubernetes_asyncio.client.rest import ApiException

from spawner.core.grant import GrantedShare


class PodsWithoutState:
    """The two lookups ``poll`` makes for a server without gpulab's saved grant."""

    # The spawner's attributes this code uses (KubeSpawner's and ClusterLedger's).
    api: Any
    log: Any
    namespace: str
    pod_name: str
    dns_name: str
    dns_name_template: str
    _log_name: str
    _granted: GrantedShare | None

    if TYPE_CHECKING:  # ClusterLedger's, after this class in GPUKubeSpawner's bases

        async def _ledger_reflectors(self) -> tuple[list[Any], set[str | None]]: ...

        @property
        def workload_key(self) -> str: ...

    async def _adopt_unsaved_pod(self) -> None:
        """Find the pod of a server whose start never got saved, and make it this server's.

        JupyterHub commits a server's row before ``start()`` and its state only after it
        returns (jupyterhub/user.py ``spawn``): a hub process that died while the server
        started comes back with the row and no state, so KubeSpawner would poll a pod in
        the hub's namespace, report it stopped and delete nothing, leaving the real pod in
        the team's namespace holding quota with no server. The pod informers know that pod
        by this server's workload key (its labels): take its namespace, name and grant, so
        the poll reports it and a stop deletes it."""
        try:
            informers = (await self._ledger_reflectors())[0]
        except Exception:  # poll() goes on; the ledger refresh logged why
            return
        for informer in informers:
            pod = informer.pod_of(self.workload_key)
            if pod is None:
                continue
            workload = informer.workloads()[self.workload_key]
            md = pod["metadata"]
            self.log.info(
                "gpulab: %s has no saved state but its pod %s/%s exists (the hub stopped while it "
                "started); this server owns it now",
                self._log_name,
                md["namespace"],
                md["name"],
            )
            self.namespace, self.pod_name = md["namespace"], md["name"]
            self.dns_name = self.dns_name_template.format(namespace=self.namespace, name=self.pod_name)
            self._granted = GrantedShare(
                team=workload.team, profile=workload.profile, milli=workload.milli, over_quota=workload.over_quota
            )
            return

    async def _poll_unlabelled_pod(self, status: int) -> int | None:
        """A server gpulab never granted (started by plain KubeSpawner before the hub
        switched to gpulab) has a pod without gpulab's labels, which the pod informer does
        not see: read it, so the hub does not forget a server that still runs."""
        try:
            pod = await self.api.read_namespaced_pod(self.pod_name, self.namespace)
        except ApiException as e:
            if e.status == 404:
                return status
            raise
        if (pod.status and pod.status.phase in ("Succeeded", "Failed")) or pod.metadata.deletion_timestamp:
            return status
        self.log.info(
            "gpulab: %s runs in pod %s/%s from before gpulab (no gpulab labels); read it directly",
            self._log_name,
            self.namespace,
            self.pod_name,
        )
        return None
