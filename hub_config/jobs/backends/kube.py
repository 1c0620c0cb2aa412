"""The Kubernetes job backend: one ``batch/v1`` Job per submission, or for a multi-node
job one TrainJob or JobSet (:mod:`hub_config.jobs.backends.kube_training`).

The Job (built by :func:`spawner.core.jobspec.kube_job_manifest`) runs papermill in
the user's image, in the team's namespace, with the profile's GPU mapping from
:mod:`spawner.core.sharing` (the code GPUKubeSpawner uses), the priority class of
the job class (demoted to ``gpulab-over-quota`` above the guarantee), the
ledger's labels, ``activeDeadlineSeconds`` from the time limit,
``ttlSecondsAfterFinished``, and a ``podFailurePolicy`` that fails the Job
when the notebook raised and ignores ``DisruptionTarget``, so that
Kubernetes itself restarts a preempted pod without counting it against
``backoffLimit``. The pod runs as z2jh's single-user pods do (uid, fsGroup,
no privilege escalation, the same pull secrets), with the servers' and the
profile's tolerations and node affinity, the servers' extra volumes, node
selector and extra_pod_config (:mod:`spawner.core.servers_pod`), and mounts the
home claim KubeSpawner named.
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
from hub_config.jobs.backends.kube_training import GangJobs
from hub_config.jobs.models import JobRecord
from spawner.core import jobspec
from spawner.core.jobspec import Submission
from spawner.core.labels import workload_annotations, workload_labels
from spawner.core.ledger import Workload
from spawner.core.servers_pod import (
    JOB_OWNED_POD_FIELDS,
    ServersPodSettings,
    as_list,
    camel_case,
    servers_pod_settings,
)
from spawner.core.sharing import SharingError, pod_gpu_spec
from spawner.kube.conventions import expand_user_template, user_template_fields

#: Seconds a job may go without its Job object after creation before it is failed
#: (a list can race a create on a real API server).
MISSING_GRACE_SECONDS = 30
#: KubeSpawner's default pvc_name_template (kubespawner 7).
KUBESPAWNER_PVC_NAME_TEMPLATE = "claim-{user_server}"


def servers_home_volume(volumes: Any, mounts: Any, home_path: str) -> tuple[str, str, str, str] | None:
    """``(volume name, claim template, mount path, subPath template)`` of the claim
    KubeSpawner mounts as the home: the one at ``home_path``, else the only claim mounted at
    all. ``volumes`` and ``mounts`` as KubeSpawner takes them (lists, or dicts keyed by name)."""
    claims = {
        v.get("name"): (v.get("persistentVolumeClaim") or {}).get("claimName")
        for v in as_list(volumes)
        if isinstance(v, dict) and (v.get("persistentVolumeClaim") or {}).get("claimName")
    }
    on_claims = [m for m in as_list(mounts) if isinstance(m, dict) and m.get("name") in claims]
    at_home = [m for m in on_claims if str(m.get("mountPath", "")).rstrip("/") == home_path.rstrip("/")]
    chosen = at_home or (on_claims if len(on_claims) == 1 else [])
    if not chosen:
        return None
    m = chosen[0]
    return str(m["name"]), str(claims[m["name"]]), str(m.get("mountPath") or home_path), str(m.get("subPath") or "")


def servers_home_mount(volumes: Any, mounts: Any, home_path: str) -> tuple[str, str, str] | None:
    """``(claim template, mount path, subPath template)`` of :func:`servers_home_volume`."""
    found = servers_home_volume(volumes, mounts, home_path)
    return found[1:] if found else None


def expand_for_user(value: Any, user: str, namespace: str, pvc_name: str = "") -> Any:
    """``value`` with every string expanded as KubeSpawner expands its volumes and mounts
    for a user's default server (its ``_expand_all``: ``{username}``, ``{user_server}``,
    ``{pvc_name}`` ...)."""
    if isinstance(value, str):
        if "{" not in value:
            return value
        return expand_user_template(value.replace("{pvc_name}", pvc_name), user, namespace)
    if isinstance(value, dict):
        return {k: expand_for_user(v, user, namespace, pvc_name) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [expand_for_user(v, user, namespace, pvc_name) for v in value]
    return value


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
        #: Multi-node jobs: TrainJobs or JobSets.
        self.gangs = GangJobs(self)

    # -- the client ---------------------------------------------------------------

    def api(self):
        """KubeSpawner's shared ``BatchV1Api`` (in-cluster config, else ``KUBECONFIG``)."""
        if self._api is None:
            from kubespawner.clients import load_config, shared_client

            load_config()
            self._api = shared_client("BatchV1Api")
        return self._api

    def core_api(self):
        """KubeSpawner's shared ``CoreV1Api``, configured as :meth:`api` (home claims)."""
        from kubespawner.clients import shared_client

        self.api()  # loads the configuration once
        return shared_client("CoreV1Api")

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

    def _keep_from(self, rec: JobRecord) -> str:
        """What the pod copies the job's notebook from: the kept copy of the job a Re-run repeats
        (in the same home), else the notebook."""
        parent = self.service.get_job(rec.rerun_of) if rec.rerun_of is not None else None
        return jobspec.kept_input_path(parent.output_path) if parent is not None else rec.notebook

    def scheduler_name(self) -> str | None:
        """The scheduler of the user's servers, unless the jobs' own setting says otherwise."""
        name = self.settings.kube_scheduler_name
        if name is None:
            name = self._spawner_config("scheduler_name")
        return str(name) if name else None

    def home_volume(self, user: str) -> tuple[str, str, str] | None:
        """``(claim, mount path, subPath)`` of the user's home, as the user's servers mount it.

        ``c.GPULabJobs.kube_home_claim_template`` when set (empty: no home). Otherwise the
        volume KubeSpawner mounts at the home (``c.KubeSpawner.volumes`` and
        ``volume_mounts``, as Zero to JupyterHub's ``singleuser.storage`` sets them: a
        claim per user, ``{pvc_name}``, or one shared claim with a ``subPath`` per user),
        and without such a volume KubeSpawner's own claim name when it creates claims
        (``storage_pvc_ensure``). ``None``: the servers have no persistent home.
        """
        s = self.settings
        ns = s.kube_namespace
        sub_path = expand_user_template(s.kube_home_sub_path, user) if s.kube_home_sub_path else ""
        if s.kube_home_claim_template is not None:
            claim = expand_user_template(s.kube_home_claim_template, user, ns) if s.kube_home_claim_template else ""
            return (claim, s.kube_home_mount_path, sub_path) if claim else None
        pvc_name = expand_user_template(
            self._spawner_config("pvc_name_template") or KUBESPAWNER_PVC_NAME_TEMPLATE, user, ns
        )
        mounted = servers_home_mount(
            self._spawner_config("volumes") or [], self._spawner_config("volume_mounts") or [], s.kube_home_mount_path
        )
        if mounted is not None:
            claim, mount_path, sub = mounted
            claim = expand_user_template(claim.replace("{pvc_name}", pvc_name), user, ns)
            return claim, mount_path, expand_user_template(sub, user) if sub else sub_path
        if self._spawner_config("storage_pvc_ensure"):
            return pvc_name, s.kube_home_mount_path, sub_path
        return None

    def servers_pod(self, user: str) -> ServersPodSettings:
        """What the hub's KubeSpawner config gives ``user``'s servers besides the home and
        the scheduling (z2jh's extra volumes and mounts, extraFiles, nodeSelector,
        extraPodConfig), expanded for ``user`` as KubeSpawner expands them."""
        ns = self.settings.kube_namespace
        volumes = self._spawner_config("volumes") or []
        mounts = self._spawner_config("volume_mounts") or []
        home = servers_home_volume(volumes, mounts, self.settings.kube_home_mount_path)
        pvc_name = expand_user_template(
            self._spawner_config("pvc_name_template") or KUBESPAWNER_PVC_NAME_TEMPLATE, user, ns
        )
        # The home is the job's own volume: left out by its name before names are expanded.
        home_name = home[0] if home else None
        settings = servers_pod_settings(
            expand_for_user(
                [v for v in as_list(volumes) if isinstance(v, dict) and v.get("name") != home_name], user, ns, pvc_name
            ),
            expand_for_user(
                [m for m in as_list(mounts) if isinstance(m, dict) and m.get("name") != home_name], user, ns, pvc_name
            ),
            self._spawner_config("node_selector"),
            self._spawner_config("extra_pod_config"),
        )
        for key in settings.extra_pod_config:
            if camel_case(str(key)) in JOB_OWNED_POD_FIELDS:
                log.warning(
                    "gpulab jobs: c.KubeSpawner.extra_pod_config[%r] is not given to jobs: the job sets its own", key
                )
        return settings

    def servers_scheduling(self, key: str) -> list[dict[str, Any]]:
        """The servers' ``tolerations`` / ``node_affinity_required`` / ``node_affinity_preferred``
        from the hub's config (z2jh: scheduling.userPods, singleuser.extraTolerations,
        matchNodePurpose), which the job's come before, as for a server."""
        return [dict(t) for t in as_list(self._spawner_config(key)) if isinstance(t, dict)]

    def servers_have_a_home(self) -> bool:
        """Do the users' servers mount a persistent home the jobs can mount too?"""
        volumes = self._spawner_config("volumes") or []
        mounts = self._spawner_config("volume_mounts") or []
        mounted = servers_home_mount(volumes, mounts, self.settings.kube_home_mount_path)
        return mounted is not None or bool(self._spawner_config("storage_pvc_ensure"))

    def home_claim(self, user: str) -> str:
        """The claim of the user's home (``""``: none); see :meth:`home_volume`."""
        home = self.home_volume(user)
        return home[0] if home else ""

    # -- the service's calls --------------------------------------------------------------

    def prepare(self, submission: Submission) -> int:
        """The profile's GPU mapping; what the ledger counts is what the pod takes."""
        request = submission.request
        refusal = self.gangs.refusal(request.profile.slug) if submission.nodes > 1 else None
        if refusal:
            raise jobspec.JobSpecError(refusal, 409)
        try:
            spec = pod_gpu_spec(request.profile, self.runtime.catalog.sharing, request.team)
        except SharingError as e:
            raise jobspec.JobSpecError(f"profile {request.profile.slug} cannot run here: {e}") from None
        if self.settings.kube_home_claim_template is None and not self.servers_have_a_home():
            raise jobspec.JobSpecError(
                "this hub's servers have no persistent home (no claim mounted at "
                f"{self.settings.kube_home_mount_path}; Zero to JupyterHub's singleuser.storage.type none), so a "
                "job's pod could not read your notebook: ask an admin for dynamic or static storage, or to set "
                "c.GPULabJobs.kube_home_claim_template",
                409,
            )
        return spec.effective_milli

    def manifest(self, rec: JobRecord) -> dict[str, Any]:
        """The Job of a one-node job; the TrainJob or JobSet of a multi-node one."""
        req = self.job_request(rec)
        return self.gangs.manifest(req, rec.nodes) if rec.nodes > 1 else jobspec.kube_job_manifest(req)

    def job_request(self, rec: JobRecord) -> jobspec.KubeJobRequest:
        """What the job's manifest is made of (for each node of a multi-node job)."""
        catalog = self.runtime.catalog
        profile = catalog.profile(rec.profile)
        team = catalog.teams.get(rec.team)
        gpu = pod_gpu_spec(profile, catalog.sharing, team) if profile is not None and profile.is_gpu else None
        w = Workload(
            jobspec.workload_key(rec.id), rec.team, rec.user, rec.gpu_milli, rec.profile, "job", rec.over_quota
        )
        s = self.settings
        home = self.home_volume(rec.user)
        pull_secrets = self._spawner_config("image_pull_secrets") or []
        if isinstance(pull_secrets, str):
            pull_secrets = [pull_secrets]
        uid = self._spawner_config("uid")
        fs_gid = self._spawner_config("fs_gid")
        return jobspec.KubeJobRequest(
            job_id=rec.id,
            name=rec.name,
            user=rec.user,
            namespace=self.namespace(rec.team),
            image=self.image(profile, None),
            job_class=rec.job_class,
            over_quota=rec.over_quota,
            notebook=rec.notebook,
            kind=rec.kind,
            args=tuple(rec.args),
            checkpoint_path=rec.checkpoint_path,
            termination_grace_seconds=max(1, round(s.stop_grace_seconds)),
            output_path=rec.output_path,
            log_path=rec.log_path,
            parameters=rec.parameters,
            time_limit_seconds=rec.time_limit_seconds,
            labels=workload_labels(w),
            annotations=workload_annotations(w),
            gpu=gpu,
            home_claim=home[0] if home else "",
            keep_from=self._keep_from(rec),
            home_mount_path=home[1] if home else s.kube_home_mount_path,
            home_sub_path=home[2] if home else "",
            ttl_seconds_after_finished=s.kube_ttl_seconds_after_finished,
            backoff_limit=s.kube_backoff_limit,
            kueue_queue=s.kueue_queue_template.format(team=rec.team) if s.kueue_enabled else None,
            service_account=s.kube_service_account or None,
            scheduler_name=self.scheduler_name(),
            cpu_guarantee=profile.cpu_guarantee if profile else None,
            cpu_limit=profile.cpu_limit if profile else None,
            mem_guarantee=profile.mem_guarantee if profile else None,
            mem_limit=profile.mem_limit if profile else None,
            tolerations=(*self.servers_scheduling("tolerations"), *(profile.tolerations if profile else ())),
            node_affinity_required=(
                *self.servers_scheduling("node_affinity_required"),
                *(profile.node_affinity_required if profile else ()),
            ),
            node_affinity_preferred=(
                *self.servers_scheduling("node_affinity_preferred"),
                *(profile.node_affinity_preferred if profile else ()),
            ),
            image_pull_secrets=tuple(p["name"] if isinstance(p, dict) else str(p) for p in pull_secrets),
            uid=uid if isinstance(uid, int) else jobspec.DEFAULT_UID,
            fs_gid=fs_gid if isinstance(fs_gid, int) else jobspec.DEFAULT_FS_GID,
            priority_class_names=catalog.priority_class_names,
            servers_pod=self.servers_pod(rec.user),
        )

    def submitted(self, rec: JobRecord) -> None:
        self._creating.add(rec.id)
        asyncio.ensure_future(self._create(rec))

    def home_claim_manifest(self, user: str) -> dict[str, Any] | None:
        """The claim KubeSpawner would create for ``user``'s home (its ``get_pvc_manifest``:
        ``pvc_name_template``, ``storage_class``, ``storage_access_modes``, ``storage_capacity``,
        ``storage_selector``), or ``None`` when KubeSpawner creates no claims here or the home
        is another claim (static storage, an admin's own)."""
        if not self._spawner_config("storage_pvc_ensure"):
            return None
        home = self.home_volume(user)
        template = self._spawner_config("pvc_name_template") or KUBESPAWNER_PVC_NAME_TEMPLATE
        name = expand_user_template(template, user, self.settings.kube_namespace)
        if home is None or home[0] != name:
            return None
        spec: dict[str, Any] = {
            "accessModes": list(self._spawner_config("storage_access_modes") or ["ReadWriteOnce"]),
            "resources": {"requests": {"storage": str(self._spawner_config("storage_capacity") or "")}},
        }
        if self._spawner_config("storage_class"):
            spec["storageClassName"] = str(self._spawner_config("storage_class"))
        if self._spawner_config("storage_selector"):
            spec["selector"] = dict(self._spawner_config("storage_selector"))
        labels = {
            "app.kubernetes.io/component": "singleuser-server",
            "component": "singleuser-storage",
            "hub.jupyter.org/username": user_template_fields(user)["username"][:63].strip("-"),
        }
        return {
            "apiVersion": "v1",
            "kind": "PersistentVolumeClaim",
            "metadata": {"name": name, "labels": labels},
            "spec": spec,
        }

    async def _ensure_home_claim(self, rec: JobRecord, ns: str) -> str | None:
        """Create the user's home claim when they never started a server in this namespace
        (KubeSpawner creates it at the first spawn); the failure's sentence, or ``None``."""
        body = self.home_claim_manifest(rec.user)
        if body is None:
            return None
        if not body["spec"]["resources"]["requests"]["storage"]:
            return "the hub's config gives home claims no size (c.KubeSpawner.storage_capacity; z2jh's singleuser.storage.capacity)"
        core = self.core_api()
        try:
            await core.read_namespaced_persistent_volume_claim(body["metadata"]["name"], ns)
            return None
        except Exception as e:
            if getattr(e, "status", None) != 404:
                return f"cannot read the home claim {ns}/{body['metadata']['name']}: {self._api_message(e)}"
        try:
            await core.create_namespaced_persistent_volume_claim(ns, body)
        except Exception as e:
            if getattr(e, "status", None) != 409:  # made meanwhile (the user's first spawn)
                return f"cannot create the home claim {ns}/{body['metadata']['name']}: {self._api_message(e)}"
        log.info("gpulab jobs: created home claim %s/%s for job %d", ns, body["metadata"]["name"], rec.id)
        return None

    async def _create(self, rec: JobRecord) -> None:
        try:
            body = self.manifest(rec)
        except ValueError as e:  # a volume template naming a field KubeSpawner fills per server
            self._creating.discard(rec.id)
            refusal = f"the hub's c.KubeSpawner.volumes or volume_mounts cannot be given to a job: {e}"
            log.warning("gpulab jobs: job %d: %s", rec.id, refusal)
            self.service.transition(rec.id, jobspec.FAILED, refusal)
            return
        ns, name = body["metadata"]["namespace"], body["metadata"]["name"]
        failure = await self._ensure_home_claim(rec, ns)
        if failure is not None:
            self._creating.discard(rec.id)
            log.warning("gpulab jobs: job %d: %s", rec.id, failure)
            self.service.transition(rec.id, jobspec.FAILED, failure)
            return
        kind = body["kind"]
        try:
            if kind == "Job":
                await self.api().create_namespaced_job(ns, body)
            else:
                await self.gangs.create(body)
        except Exception as e:
            message = self._api_message(e)
            log.warning("gpulab jobs: Kubernetes refused %s %s/%s: %s", kind, ns, name, message)
            self.service.transition(rec.id, jobspec.FAILED, f"the cluster refused the {kind}: {message}")
            return
        finally:
            self._creating.discard(rec.id)
        now = self.service.transition(rec.id, jobspec.QUEUED, "", kube_namespace=ns, kube_name=name)
        if now is not None and now.state in jobspec.FINAL_STATES:  # cancelled while being created
            try:
                await self._delete(rec, ns, name)
            except Exception as e:
                log.warning(
                    "gpulab jobs: cannot delete %s %s/%s of cancelled job %d: %s",
                    kind,
                    ns,
                    name,
                    rec.id,
                    self._api_message(e),
                )
            return
        log.info("gpulab jobs: created %s %s/%s for job %d", kind, ns, name, rec.id)
        self.service.wake()

    async def _delete(self, rec: JobRecord, ns: str, name: str) -> None:
        """Delete the job's Job (or gang) and, in the background, every pod of it."""
        if rec.nodes > 1:
            await self.gangs.delete(ns, name)
        else:
            await self.api().delete_namespaced_job(name, ns, propagation_policy="Background")

    async def cancel(self, rec: JobRecord, reason: str) -> None:
        if rec.kube_name:
            try:
                await self._delete(rec, rec.kube_namespace or "", rec.kube_name)
            except Exception as e:
                if getattr(e, "status", None) != 404:
                    raise jobspec.JobSpecError(f"cannot delete the Job: {self._api_message(e)}", 502) from None
        self.service.transition(rec.id, jobspec.CANCELLED, reason)

    # -- the loop: the Job objects are the truth -------------------------------------------

    async def recover(self) -> None:
        pass  # the first tick reconciles every active record with its Job

    async def tick(self) -> None:
        active = [r for r in self.service.active_jobs(self.name) if r.kube_name and r.id not in self._creating]
        by_ns: dict[str, list[JobRecord]] = {}
        gangs_by_ns: dict[str, list[JobRecord]] = {}
        for rec in active:
            (gangs_by_ns if rec.nodes > 1 else by_ns).setdefault(rec.kube_namespace or "", []).append(rec)
        for ns, records in gangs_by_ns.items():
            await self.gangs.reconcile(ns, records)
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
                    self.missing(rec, f"Job {ns}/{rec.kube_name}")
                    continue
                self.found(rec)
                self.move(rec, *jobspec.kube_job_state(job))

    def missing(self, rec: JobRecord, what: str) -> None:
        """The job's object is not in the cluster: failed once that lasts (a list can race a create)."""
        now = asyncio.get_running_loop().time()
        first = self._missing_since.setdefault(rec.id, now)
        if now - first > MISSING_GRACE_SECONDS or rec.state == jobspec.RUNNING:
            self.service.transition(rec.id, jobspec.FAILED, f"{what} disappeared from the cluster")

    def found(self, rec: JobRecord) -> None:
        self._missing_since.pop(rec.id, None)

    def move(self, rec: JobRecord, state: str, reason: str) -> None:
        """Move ``rec`` to the ``state`` its object shows, through the states between when the
        state machine asks for them."""
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
