"""The Kubernetes job backend: one ``batch/v1`` Job per submission.

The Job (built by :func:`spawner.core.jobspec.kube_job_manifest`) runs papermill in
the user's image, in the team's namespace, with the profile's GPU mapping from
:mod:`spawner.core.sharing` (the code GPUKubeSpawner uses), the priority class of
the job class (demoted to ``gpulab-over-quota`` above the guarantee), the
ledger's labels, ``activeDeadlineSeconds`` from the time limit,
``ttlSecondsAfterFinished``, and a ``podFailurePolicy`` that fails the Job
when the notebook raised and ignores ``DisruptionTarget``, so that
Kubernetes itself restarts a preempted pod without counting it against
``backoffLimit``. The pod runs as z2jh's single-user pods do (uid, fsGroup,
no privilege escalation, the same pull secrets), with the profile's
tolerations and node affinity, and mounts the home claim KubeSpawner named.
With Kueue, the Job carries the team's LocalQueue and starts suspended;
Kueue admits it.

The Job objects are the truth for what runs: every poll lists the Jobs of the
namespaces with active jobs and moves each record to the state its Job shows.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from hub_config.jobs.backends.base import JobBackend, config_value, log
from hub_config.jobs.models import JobRecord
from spawner.core import jobspec
from spawner.core.labels import workload_annotations, workload_labels
from spawner.core.ledger import Workload
from spawner.core.sharing import SharingError, pod_gpu_spec
from spawner.kube.conventions import expand_user_template

#: Seconds a job may go without its Job object after creation before it is failed
#: (a list can race a create on a real API server).
MISSING_GRACE_SECONDS = 30
#: KubeSpawner's default pvc_name_template (kubespawner 7).
KUBESPAWNER_PVC_NAME_TEMPLATE = "claim-{user_server}"


class KubeJobBackend(JobBackend):
    """Creates, watches and deletes ``batch/v1`` Jobs; see the module docstring."""

    name = "kubernetes"

    def __init__(self, service):
        super().__init__(service)
        #: The hub reads homes only when an admin mounted them and said where.
        self.sees_homes = bool(self.settings.home_dir_template)
        self._api = None
        self._creating: set[int] = set()
        self._missing_since: dict[int, float] = {}

    # -- the client ---------------------------------------------------------------

    def api(self):
        """KubeSpawner's shared ``BatchV1Api`` (in-cluster config, else ``KUBECONFIG``)."""
        if self._api is None:
            from kubespawner.clients import load_config, shared_client

            load_config()
            self._api = shared_client("BatchV1Api")
        return self._api

    def _to_dict(self, obj: Any) -> Any:
        return self.api().api_client.sanitize_for_serialization(obj)

    @staticmethod
    def _api_message(e: Exception) -> str:
        body = getattr(e, "body", None)
        try:
            return str(json.loads(body or "").get("message") or e)
        except (TypeError, ValueError, AttributeError):
            return f"{getattr(e, 'status', '')} {getattr(e, 'reason', '')}".strip() or str(e)

    # -- namespaces, images, volumes ----------------------------------------------------

    def namespace(self, team_name: str) -> str:
        team = self.runtime.catalog.teams.get(team_name)
        return (team.namespace if team and team.namespace else None) or self.settings.kube_namespace

    def image(self, profile, image_slug: str | None) -> str:
        choice = profile.image_for(image_slug) if profile is not None else None
        if choice is not None:
            return choice.image
        return (
            self.settings.kube_image
            or config_value(self.service.config, "KubeSpawner", "image")
            or "quay.io/jupyter/scipy-notebook:latest"
        )

    def _spawner_config(self, key: str) -> Any:
        """A KubeSpawner setting as the hub's config gives it (GPUKubeSpawner's own first)."""
        for section in ("GPUKubeSpawner", "KubeSpawner"):
            value = config_value(self.service.config, section, key)
            if value is not None:
                return value
        return None

    def scheduler_name(self) -> str | None:
        """The scheduler of the user's servers, unless the jobs' own setting says otherwise."""
        name = self.settings.kube_scheduler_name
        if name is None:
            name = self._spawner_config("scheduler_name")
        return str(name) if name else None

    def home_claim(self, user: str) -> str:
        """The user's home claim: the name KubeSpawner gave it (its ``pvc_name_template``,
        safe slugs), in the team's namespace, where GPUKubeSpawner creates it too."""
        template = self.settings.kube_home_claim_template
        if template is None:
            template = self._spawner_config("pvc_name_template") or KUBESPAWNER_PVC_NAME_TEMPLATE
        return expand_user_template(template, user, self.settings.kube_namespace) if template else ""

    # -- the service's calls --------------------------------------------------------------

    def prepare(self, request, v: dict[str, Any]) -> int:
        """The profile's GPU mapping; what the ledger counts is what the pod takes."""
        try:
            spec = pod_gpu_spec(request.profile, self.runtime.catalog.sharing, request.team)
        except SharingError as e:
            raise jobspec.JobSpecError(f"profile {request.profile.slug} cannot run here: {e}") from None
        return spec.effective_milli

    def manifest(self, rec: JobRecord) -> dict[str, Any]:
        catalog = self.runtime.catalog
        profile = catalog.profile(rec.profile)
        team = catalog.teams.get(rec.team)
        gpu = pod_gpu_spec(profile, catalog.sharing, team) if profile is not None and profile.is_gpu else None
        w = Workload(
            jobspec.workload_key(rec.id), rec.team, rec.user, rec.gpu_milli, rec.profile, "job", rec.over_quota
        )
        s = self.settings
        pull_secrets = self._spawner_config("image_pull_secrets") or []
        if isinstance(pull_secrets, str):
            pull_secrets = [pull_secrets]
        uid = self._spawner_config("uid")
        fs_gid = self._spawner_config("fs_gid")
        req = jobspec.KubeJobRequest(
            job_id=rec.id,
            name=rec.name,
            user=rec.user,
            namespace=self.namespace(rec.team),
            image=self.image(profile, None),
            job_class=rec.job_class,
            over_quota=rec.over_quota,
            notebook=rec.notebook,
            output_path=rec.output_path,
            log_path=rec.log_path,
            parameters=rec.parameters,
            time_limit_seconds=rec.time_limit_seconds,
            labels=workload_labels(w),
            annotations=workload_annotations(w),
            gpu=gpu,
            home_claim=self.home_claim(rec.user),
            home_mount_path=s.kube_home_mount_path,
            home_sub_path=expand_user_template(s.kube_home_sub_path, rec.user) if s.kube_home_sub_path else "",
            ttl_seconds_after_finished=s.kube_ttl_seconds_after_finished,
            backoff_limit=s.kube_backoff_limit,
            kueue_queue=s.kueue_queue_template.format(team=rec.team) if s.kueue_enabled else None,
            service_account=s.kube_service_account or None,
            scheduler_name=self.scheduler_name(),
            cpu_guarantee=profile.cpu_guarantee if profile else None,
            cpu_limit=profile.cpu_limit if profile else None,
            mem_guarantee=profile.mem_guarantee if profile else None,
            mem_limit=profile.mem_limit if profile else None,
            tolerations=profile.tolerations if profile else (),
            node_affinity_required=profile.node_affinity_required if profile else (),
            node_affinity_preferred=profile.node_affinity_preferred if profile else (),
            image_pull_secrets=tuple(p["name"] if isinstance(p, dict) else str(p) for p in pull_secrets),
            uid=uid if isinstance(uid, int) else jobspec.DEFAULT_UID,
            fs_gid=fs_gid if isinstance(fs_gid, int) else jobspec.DEFAULT_FS_GID,
        )
        return jobspec.kube_job_manifest(req)

    def submitted(self, rec: JobRecord) -> None:
        self._creating.add(rec.id)
        asyncio.ensure_future(self._create(rec))

    async def _create(self, rec: JobRecord) -> None:
        body = self.manifest(rec)
        ns, name = body["metadata"]["namespace"], body["metadata"]["name"]
        try:
            await self.api().create_namespaced_job(ns, body)
        except Exception as e:
            message = self._api_message(e)
            log.warning("gpulab jobs: Kubernetes refused Job %s/%s: %s", ns, name, message)
            self.service.transition(rec.id, jobspec.FAILED, f"the cluster refused the Job: {message}")
            return
        finally:
            self._creating.discard(rec.id)
        now = self.service.transition(rec.id, jobspec.QUEUED, "", kube_namespace=ns, kube_name=name)
        if now is not None and now.state in jobspec.FINAL_STATES:  # cancelled while being created
            try:
                await self.api().delete_namespaced_job(name, ns, propagation_policy="Background")
            except Exception as e:
                log.warning(
                    "gpulab jobs: cannot delete Job %s/%s of cancelled job %d: %s",
                    ns,
                    name,
                    rec.id,
                    self._api_message(e),
                )
            return
        log.info("gpulab jobs: created Job %s/%s for job %d", ns, name, rec.id)
        self.service.wake()

    async def cancel(self, rec: JobRecord, reason: str) -> None:
        if rec.kube_name:
            try:
                await self.api().delete_namespaced_job(
                    rec.kube_name, rec.kube_namespace, propagation_policy="Background"
                )
            except Exception as e:
                if getattr(e, "status", None) != 404:
                    raise jobspec.JobSpecError(f"cannot delete the Job: {self._api_message(e)}", 502) from None
        self.service.transition(rec.id, jobspec.CANCELLED, reason)

    # -- the loop: the Job objects are the truth -------------------------------------------

    async def recover(self) -> None:
        pass  # the first tick reconciles every active record with its Job

    async def tick(self) -> None:
        active = [r for r in self.service.active(self.name) if r.kube_name and r.id not in self._creating]
        by_ns: dict[str, list[JobRecord]] = {}
        for rec in active:
            by_ns.setdefault(rec.kube_namespace or "", []).append(rec)
        loop = asyncio.get_running_loop()
        for ns, records in by_ns.items():
            try:
                listed = await self.api().list_namespaced_job(ns, label_selector="gpulab.io/job-id")
            except Exception as e:  # fail safe: no answer changes nothing
                log.warning("gpulab jobs: cannot list Jobs in %s: %s", ns, self._api_message(e))
                continue
            jobs = {j["metadata"]["name"]: j for j in self._to_dict(listed).get("items", [])}
            for rec in records:
                job = jobs.get(rec.kube_name)
                if job is None:
                    first = self._missing_since.setdefault(rec.id, loop.time())
                    if loop.time() - first > MISSING_GRACE_SECONDS or rec.state == jobspec.RUNNING:
                        self.service.transition(
                            rec.id, jobspec.FAILED, f"Job {ns}/{rec.kube_name} disappeared from the cluster"
                        )
                    continue
                self._missing_since.pop(rec.id, None)
                self._apply(rec, job)

    def _apply(self, rec: JobRecord, job: dict[str, Any]) -> None:
        state, reason = jobspec.kube_job_state(job)
        if state == rec.state:
            return
        if not jobspec.may_transition(rec.state, state):
            if state == jobspec.SUCCEEDED and jobspec.may_transition(rec.state, jobspec.RUNNING):
                # A pod that started and finished between two polls: it did run.
                self.service.transition(rec.id, jobspec.RUNNING, "ran between two reads of the cluster")
            # e.g. Kueue evicting a running Job suspends it: running -> preempted -> queued.
            elif jobspec.may_transition(rec.state, jobspec.PREEMPTED) and jobspec.may_transition(
                jobspec.PREEMPTED, state
            ):
                self.service.transition(rec.id, jobspec.PREEMPTED, "the cluster took the pod away")
            else:
                return
        self.service.transition(rec.id, state, reason)
