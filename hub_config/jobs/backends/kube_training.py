"""The multi-node half of the Kubernetes job backend: a gang as the engines' own object.

A job over ``nodes`` > 1 becomes a Kubeflow Trainer ``TrainJob`` on the chart's torch
``ClusterTrainingRuntime``, or a ``JobSet`` where Trainer is off
(``c.GPULabJobs.kube_training_engine``; the manifests: :mod:`spawner.kube.training`). With
Kueue it is created suspended and Kueue admits it as one workload from the team's
LocalQueue, all nodes or none; the engine's failure policy restarts the whole gang when
one of its pods is preempted or evicted.

What the hub reads back, each poll, per namespace: the engine's objects (their conditions
and the child Jobs' ready counts), the JobSets (a TrainJob's JobSet has its name; its
``status.restarts`` counts the gang's restarts), and, while a gang is suspended, Kueue's
Workloads, whose ``QuotaReserved`` message says why it waits. A job is running only while
every node runs; a restart of the gang shows as ``preempted``, then ``queued`` until all
nodes run again.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from hub_config.jobs.backends.base import log
from spawner.core import jobspec
from spawner.core.jobspec import KubeJobRequest
from spawner.kube import training

if TYPE_CHECKING:
    from hub_config.jobs.backends.kube import KubeJobBackend
    from hub_config.jobs.models import JobRecord

#: Kueue's Workload API (v1beta2 is what Kueue v0.17 stores).
KUEUE_WORKLOADS = ("kueue.x-k8s.io", "v1beta2", "workloads")


class GangJobs:
    """Creates, reads and deletes the TrainJobs or JobSets of :class:`KubeJobBackend`."""

    def __init__(self, backend: KubeJobBackend):
        self.backend = backend
        #: The gang restarts last seen per job (``None`` until first seen: a hub restart
        #: counts from what it finds).
        self._restarts: dict[int, int] = {}

    @property
    def kind(self) -> str:
        return "TrainJob" if self.backend.settings.kube_training_engine == "trainer" else "JobSet"

    def api(self):
        """KubeSpawner's shared ``CustomObjectsApi``, configured as the backend's."""
        from kubespawner.clients import shared_client

        self.backend.api()  # loads the configuration once
        return shared_client("CustomObjectsApi")

    def refusal(self, profile: str) -> str | None:
        """Why this hub cannot run a multi-node job, or ``None``."""
        if not self.backend.settings.kube_training_engine:
            return (
                "this hub runs jobs on Kubernetes as one pod (c.GPULabJobs.kube_training_engine is off): ask for "
                f"nodes: 1, or a profile with more GPUs than {profile} on one node"
            )
        return None

    def manifest(self, req: KubeJobRequest, nodes: int) -> dict[str, Any]:
        if self.kind == "TrainJob":
            return training.trainjob_manifest(req, nodes, self.backend.settings.kube_training_runtime)
        return training.jobset_manifest(req, nodes)

    async def create(self, body: dict[str, Any]) -> None:
        group, version, plural = training.RESOURCES[body["kind"]]
        ns = body["metadata"]["namespace"]
        await self.api().create_namespaced_custom_object(group, version, ns, plural, body)

    async def delete(self, ns: str, name: str) -> None:
        """Delete the gang and, in the background, every pod of it (its Jobs are its children)."""
        group, version, plural = training.RESOURCES[self.kind]
        await self.api().delete_namespaced_custom_object(
            group, version, ns, plural, name, propagation_policy="Background"
        )

    async def _list(self, ns: str, resource: tuple[str, str, str]) -> list[dict[str, Any]]:
        group, version, plural = resource
        listed = await self.api().list_namespaced_custom_object(
            group, version, ns, plural, label_selector="gpulab.io/job-id"
        )
        return list(listed.get("items") or [])

    async def _admissions(self, ns: str) -> dict[str, str]:
        """Kueue's reason per owner uid for the suspended gangs of ``ns`` (nothing when unreadable)."""
        try:
            workloads = await self.api().list_namespaced_custom_object(*KUEUE_WORKLOADS[:2], ns, KUEUE_WORKLOADS[2])
        except Exception as e:  # the reason is a courtesy; the state comes from the gang
            log.info("gpulab jobs: cannot list Kueue's Workloads in %s: %s", ns, self.backend._api_message(e))
            return {}
        out = {}
        for w in workloads.get("items") or []:
            message = training.workload_admission(w)
            for owner in (w.get("metadata") or {}).get("ownerReferences") or []:
                if message and owner.get("uid"):
                    out[owner["uid"]] = message
        return out

    async def reconcile(self, ns: str, records: list[JobRecord]) -> None:
        """Move each multi-node record of ``ns`` to the state its gang shows."""
        try:
            gangs = {g["metadata"]["name"]: g for g in await self._list(ns, training.RESOURCES[self.kind])}
            jobsets = (
                gangs if self.kind == "JobSet" else
                {j["metadata"]["name"]: j for j in await self._list(ns, training.RESOURCES["JobSet"])}
            )  # fmt: skip
        except Exception as e:  # fail safe: no answer changes nothing
            log.warning("gpulab jobs: cannot list %ss in %s: %s", self.kind, ns, self.backend._api_message(e))
            return
        suspended = any((g.get("spec") or {}).get("suspend") for g in gangs.values())
        admissions = await self._admissions(ns) if suspended else {}
        for rec in records:
            gang = gangs.get(rec.kube_name or "")
            if gang is None:
                self.backend.missing(rec, f"{self.kind} {ns}/{rec.kube_name}")
                continue
            self.backend.found(rec)
            restarted = training.restarts(jobsets.get(rec.kube_name or "") or {})
            seen = self._restarts.get(rec.id)
            self._restarts[rec.id] = restarted
            if seen is not None and restarted > seen and jobspec.may_transition(rec.state, jobspec.PREEMPTED):
                self.backend.service.transition(
                    rec.id,
                    jobspec.PREEMPTED,
                    f"a node of the gang was preempted or evicted: the {self.kind}'s failure policy restarts all "
                    f"{rec.nodes} nodes (restart {restarted})",
                )
                rec = self.backend.service.get_job(rec.id) or rec
            admission = admissions.get((gang.get("metadata") or {}).get("uid", ""), "")
            state, reason = training.gang_state(gang, rec.nodes, admission)
            if state == rec.state == jobspec.QUEUED and reason != rec.reason:
                self.backend.service.set_reason(rec.id, reason)  # e.g. Kueue's words once it has them
            self.backend.move(rec, state, reason)
            if rec.state in jobspec.FINAL_STATES:
                self._restarts.pop(rec.id, None)
