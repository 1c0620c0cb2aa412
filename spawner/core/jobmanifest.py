"""The Kubernetes half of jobs: the ``batch/v1`` Job a submission becomes, and its state read back.

Pure. :func:`kube_job_manifest` builds the Job (its container, pod, scheduling and
failure policy); :func:`kube_job_state` reads a Job's status back into gpulab's job
states. :mod:`spawner.core.jobspec` re-exports every public name here, so
``jobspec.kube_job_manifest`` keeps working.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from . import jobprogram
from .gpu_pools import and_node_affinity
from .jobprogram import NOTEBOOK, SCRIPT
from .jobstates import FAILED, PREEMPTED, QUEUED, RUNNING, SUCCEEDED, TIMED_OUT, kept_input_path, priority_for
from .labels import KUEUE_QUEUE_NAME
from .priority import cluster_priority_class_name, effective_priority_class
from .servers_pod import ServersPodSettings, apply_servers_pod_settings
from .sharing import NO_GPU_ENV, with_shm
from .sweeps import metrics_path

#: A notebook's container command: papermill reads the parameters (JSON is YAML) from an
#: environment variable; :func:`spawner.core.jobprogram.kube_shell` says why a shell stays PID 1.
#: It runs the job's own copy of its notebook, made once (a retried pod runs the same copy); a
#: Job made before jobs kept one has no GPULAB_INPUT and runs its notebook.
PAPERMILL_SCRIPT = jobprogram.kube_shell(
    'mkdir -p "$(dirname "$GPULAB_OUTPUT")" || exit 1; '
    'input="${GPULAB_INPUT:-$GPULAB_NOTEBOOK}"; '
    '[ -e "$input" ] || cp -- "${GPULAB_KEEP_FROM:-$GPULAB_NOTEBOOK}" "$input" 2> "$GPULAB_LOG" || exit 1; ',
    'papermill "$input" "$GPULAB_OUTPUT" -y "$GPULAB_PARAMETERS" '
    '--log-output --no-progress-bar --cwd "$(dirname "$GPULAB_NOTEBOOK")" ',
)
#: A script's container command: ``python script args`` or, over N GPUs, torchrun; the
#: arguments are the shell's own positional parameters (``sh -c SCRIPT gpulab-job args...``).
#: A script runs where it is (a copy elsewhere would not import its neighbours).
SCRIPT_SHELL = jobprogram.kube_shell(
    'script=$(basename "$GPULAB_SCRIPT"); '
    # Several nodes: torchrun takes its nodes, rank and rendezvous from the engine's PET_* variables.
    'if [ "${GPULAB_NODES:-1}" -gt 1 ]; then set -- torchrun "$script" "$@"; '
    'elif [ "${GPULAB_NPROC:-1}" -gt 1 ]; then '
    'set -- torchrun --standalone --nnodes=1 --nproc_per_node="$GPULAB_NPROC" "$script" "$@"; '
    'else set -- python "$script" "$@"; fi; ',
    # In the script's folder; the log's redirection is the outer shell's, relative to the home.
    '(cd "$(dirname "$GPULAB_SCRIPT")" && exec "$@") ',
)


#: papermill's exit status when the notebook raised (or could not be read), and Python's
#: when a script raised: the program's fault, so running it again on a GPU only fails again.
NOTEBOOK_FAILED_EXIT_CODES = (1,)
#: The user and group of z2jh's single-user pods (singleuser.uid, singleuser.fsGid).
DEFAULT_UID = 1000
DEFAULT_FS_GID = 100


@dataclass(frozen=True)
class KubeJobRequest:
    """Everything the Job manifest depends on (all validated before)."""

    job_id: int
    name: str
    user: str
    namespace: str
    image: str
    job_class: str
    over_quota: bool
    notebook: str
    output_path: str
    log_path: str
    parameters: Mapping[str, Any]
    time_limit_seconds: int
    #: ``gpulab.io/*`` labels and annotations from :mod:`spawner.core.labels`.
    labels: Mapping[str, str]
    annotations: Mapping[str, str]
    #: The profile's GPU mapping (:class:`spawner.core.sharing.PodGPUSpec`); ``None`` = CPU only.
    gpu: Any = None
    home_claim: str = ""
    #: What the pod copies its kept notebook from (:func:`kept_input_path`): the notebook, or the
    #: kept copy of the job a Re-run repeats; ``""``: the notebook.
    keep_from: str = ""
    home_mount_path: str = "/home/jovyan"
    home_sub_path: str = ""
    ttl_seconds_after_finished: int = 86400
    backoff_limit: int = 2
    kueue_queue: str | None = None
    service_account: str | None = None
    #: The scheduler of the user's servers (z2jh's user-scheduler); a GPU backend's own
    #: scheduler (HAMi, KAI) takes precedence. ``None``: the cluster's default scheduler.
    scheduler_name: str | None = None
    cpu_guarantee: float | None = None
    cpu_limit: float | None = None
    mem_guarantee: int | None = None
    mem_limit: int | None = None
    extra_env: Mapping[str, str] = field(default_factory=dict)
    #: The servers' tolerations and node affinity (KubeSpawner's config, z2jh's user pods),
    #: then the profile's (KubeSpawner's shapes).
    tolerations: tuple[Mapping[str, Any], ...] = ()
    node_affinity_required: tuple[Mapping[str, Any], ...] = ()
    node_affinity_preferred: tuple[Mapping[str, Any], ...] = ()
    image_pull_secrets: tuple[str, ...] = ()
    uid: int | None = DEFAULT_UID
    fs_gid: int | None = DEFAULT_FS_GID
    #: ``notebook`` (papermill) or ``script`` (``notebook`` is then the script, ``args`` its arguments).
    kind: str = NOTEBOOK
    args: tuple[str, ...] = ()
    #: The job's checkpoint folder, relative to the home (``GPULAB_CHECKPOINT_DIR``); ``""``: none.
    checkpoint_path: str = ""
    #: The checkpoint grace: ``terminationGracePeriodSeconds`` between SIGTERM and SIGKILL.
    termination_grace_seconds: int | None = None
    #: The cluster's PriorityClass per gpulab class (the catalog's ``priority_class_names``).
    priority_class_names: Mapping[str, str] = field(default_factory=dict)
    #: What the hub's KubeSpawner config gives every server pod besides the home (volumes,
    #: node selector, extra_pod_config); tolerations and node affinity come in the fields
    #: above, the config's first, as GPUKubeSpawner combines them.
    servers_pod: ServersPodSettings = field(default_factory=ServersPodSettings)


def _cpu(cores: float) -> str:
    """A CPU quantity: ``8`` for 8.0 cores, ``500m`` for half a core."""
    millicores = round(float(cores) * 1000)
    return str(millicores // 1000) if millicores % 1000 == 0 else f"{millicores}m"


def job_container_name(kind: str) -> str:
    """The job container's name: ``papermill`` for a notebook, ``script`` for a script."""
    return "script" if kind == SCRIPT else "papermill"


def kube_job_name(job_id: int) -> str:
    return f"gpulab-job-{int(job_id)}"


def kube_job_manifest(req: KubeJobRequest) -> dict[str, Any]:
    """The ``batch/v1`` Job for one submission (a dict ready to POST).

    Built in named pieces: the labels, the container (:func:`_job_container`), the pod
    (:func:`_job_pod_spec`, with its scheduling: :func:`_job_scheduling`) and the Job
    around it (:func:`_job_spec`).
    """
    labels = job_labels(req)
    annotations = dict(req.annotations)
    job_spec = _job_spec(req, job_pod_template(req))
    if req.kueue_queue:
        labels[KUEUE_QUEUE_NAME] = req.kueue_queue
        # Kueue unsuspends the Job when it admits it against the ClusterQueue.
        job_spec["suspend"] = True
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {
            "name": kube_job_name(req.job_id),
            "namespace": req.namespace,
            "labels": labels,
            "annotations": annotations,
        },
        "spec": job_spec,
    }


def job_labels(req: KubeJobRequest) -> dict[str, str]:
    """The job's own labels: the ledger's, its class and its id."""
    return {**req.labels, "gpulab.io/job-class": req.job_class, "gpulab.io/job-id": str(req.job_id)}


def job_pod_template(req: KubeJobRequest) -> dict[str, Any]:
    """The pod template of the job (of each node of a multi-node job): labels, annotations, spec."""
    # The share's resources, labels and pool apply when it holds a GPU at all.
    gpu = req.gpu if req.gpu is not None and req.gpu.effective_milli > 0 else None
    labels = {**job_labels(req), **(gpu.labels if gpu else {})}
    annotations = {**req.annotations, **(gpu.annotations if gpu else {})}
    return {"metadata": {"labels": labels, "annotations": annotations}, "spec": _job_pod_spec(req, gpu)}


def _job_resources(req: KubeJobRequest, gpu: Any) -> dict[str, dict[str, str]]:
    """The container's requests and limits: the GPU share's, then the profile's CPU and memory."""
    requests: dict[str, str] = dict(gpu.requests) if gpu else {}
    limits: dict[str, str] = dict(gpu.limits) if gpu else {}
    if req.cpu_guarantee:
        requests["cpu"] = _cpu(req.cpu_guarantee)
    if req.cpu_limit:
        limits["cpu"] = _cpu(req.cpu_limit)
    if req.mem_guarantee:
        requests["memory"] = str(req.mem_guarantee)
    if req.mem_limit:
        limits["memory"] = str(req.mem_limit)
    return {k: v for k, v in (("requests", requests), ("limits", limits)) if v}


def _job_container(req: KubeJobRequest, gpu: Any, home: str) -> dict[str, Any]:
    """papermill in the profile's image, told what to run through ``GPULAB_*`` variables."""
    env = [{"name": "GPULAB_HOME", "value": home}]
    if req.kind == SCRIPT:
        nproc = jobprogram.processes_per_node(gpu.effective_milli if gpu else 0)
        env += [{"name": "GPULAB_SCRIPT", "value": req.notebook}, {"name": "GPULAB_NPROC", "value": str(nproc)}]
    else:
        env += [
            {"name": "GPULAB_NOTEBOOK", "value": req.notebook},
            {"name": "GPULAB_INPUT", "value": kept_input_path(req.output_path)},
            {"name": "GPULAB_KEEP_FROM", "value": req.keep_from or req.notebook},
            {"name": "GPULAB_OUTPUT", "value": req.output_path},
            {"name": "GPULAB_PARAMETERS", "value": json.dumps(dict(req.parameters))},
        ]
    if req.checkpoint_path:  # the shell makes it and counts GPULAB_ATTEMPT there (docs/jobs.md)
        env.append({"name": "GPULAB_CHECKPOINT_DIR", "value": f"{home.rstrip('/')}/{req.checkpoint_path}"})
    env += [
        {"name": "GPULAB_LOG", "value": req.log_path},
        # What the run reports (gpulab_run.log_metrics writes it; a sweep reads it back), and its
        # parameters as JSON for either kind (a sweep run's script gets them as arguments too).
        {"name": "GPULAB_METRICS_FILE", "value": f"{home.rstrip('/')}/{metrics_path(req.log_path)}"},
        {"name": "GPULAB_JOB_PARAMETERS", "value": json.dumps(dict(req.parameters))},
        {"name": "GPULAB_JOB_ID", "value": str(req.job_id)},
        {"name": "GPULAB_JOB_CLASS", "value": req.job_class},
        {"name": "GPULAB_PREEMPTIBLE", "value": "1" if req.job_class == "batch" or req.over_quota else "0"},
    ]
    # A job without a GPU sees none, even in a CUDA image on a GPU node (sharing.NO_GPU_ENV).
    share_env = dict(req.gpu.env) if req.gpu is not None else dict(NO_GPU_ENV)
    env += [{"name": k, "value": v} for k, v in sorted({**share_env, **req.extra_env}.items())]
    if req.kind == SCRIPT:  # the arguments are the shell's positional parameters, never parsed by it
        command = ["/bin/sh", "-c", SCRIPT_SHELL, "gpulab-job", *req.args]
    else:
        command = ["/bin/sh", "-c", PAPERMILL_SCRIPT]
    container: dict[str, Any] = {
        "name": job_container_name(req.kind),
        "image": req.image,
        "command": command,
        "env": env,
        "workingDir": home,
        # The "restricted" Pod Security Standard: no setuid, no privilege escalation, no
        # Linux capability (papermill and its kernel need none).
        "securityContext": {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}},
    }
    resources = _job_resources(req, gpu)
    if resources:
        container["resources"] = resources
    return container


def _job_pod_spec(req: KubeJobRequest, gpu: Any) -> dict[str, Any]:
    """The pod: one container, the priority class, the user's identity and home, no API token."""
    home = req.home_mount_path.rstrip("/") or "/"
    container = _job_container(req, gpu, home)
    pc = effective_priority_class(priority_for(req.job_class), req.over_quota)
    pod_spec: dict[str, Any] = {
        "restartPolicy": "Never",
        "priorityClassName": cluster_priority_class_name(pc, req.priority_class_names),
        "containers": [container],
        # A notebook job has no business with the Kubernetes API.
        "automountServiceAccountToken": False,
    }
    if req.termination_grace_seconds is not None:  # the checkpoint grace after SIGTERM
        pod_spec["terminationGracePeriodSeconds"] = int(req.termination_grace_seconds)
    # The "restricted" Pod Security Standard, which the chart's team namespaces warn and
    # audit at: the runtime's default seccomp profile, and never root (unless an admin
    # runs the users' servers as uid 0, c.KubeSpawner.uid = 0: then the job does too).
    security: dict[str, Any] = {"seccompProfile": {"type": "RuntimeDefault"}}
    if req.uid is not None:
        security["runAsUser"] = req.uid
        if req.uid != 0:
            security["runAsNonRoot"] = True
    if req.fs_gid is not None:
        security["fsGroup"] = req.fs_gid
    pod_spec["securityContext"] = security
    _job_scheduling(req, gpu, pod_spec)
    if req.image_pull_secrets:
        pod_spec["imagePullSecrets"] = [{"name": n} for n in req.image_pull_secrets]
    volumes: list[dict[str, Any]] = []
    mounts: list[dict[str, Any]] = []
    if req.home_claim:
        mount: dict[str, Any] = {"name": "home", "mountPath": home}
        if req.home_sub_path:
            mount["subPath"] = req.home_sub_path
        mounts.append(mount)
        volumes.append({"name": "home", "persistentVolumeClaim": {"claimName": req.home_claim}})
    if gpu is not None:  # PyTorch's DataLoader workers need more than 64 MiB there
        volumes, mounts = with_shm(volumes, mounts)
    if volumes:
        container["volumeMounts"] = mounts
        pod_spec["volumes"] = volumes
    if gpu is not None and gpu.node_selector:
        pod_spec["nodeSelector"] = dict(gpu.node_selector)
    scheduler_name = (gpu.scheduler_name if gpu is not None else None) or req.scheduler_name
    if scheduler_name:
        pod_spec["schedulerName"] = scheduler_name
    if req.service_account:
        pod_spec["serviceAccountName"] = req.service_account
    # The world of the user's servers: z2jh's extra volumes, node selector, extraPodConfig.
    apply_servers_pod_settings(pod_spec, container, req.servers_pod)
    return pod_spec


def _job_scheduling(req: KubeJobRequest, gpu: Any, pod_spec: dict[str, Any]) -> None:
    """The profile's tolerations (and the GPU share's) and node affinity, on ``pod_spec``."""
    tolerations = [dict(t) for t in req.tolerations]
    if gpu is not None:
        tolerations += [dict(t) for t in gpu.tolerations if dict(t) not in tolerations]
    if tolerations:
        pod_spec["tolerations"] = tolerations
    node_affinity: dict[str, Any] = {}
    required = and_node_affinity(req.node_affinity_required, gpu.node_requirements if gpu is not None else ())
    if required:
        node_affinity["requiredDuringSchedulingIgnoredDuringExecution"] = {"nodeSelectorTerms": required}
    if req.node_affinity_preferred:
        node_affinity["preferredDuringSchedulingIgnoredDuringExecution"] = [
            dict(t) for t in req.node_affinity_preferred
        ]
    if node_affinity:
        pod_spec["affinity"] = {"nodeAffinity": node_affinity}


def _job_spec(req: KubeJobRequest, template: dict[str, Any]) -> dict[str, Any]:
    """The Job around the pod: retries, deadline, clean-up, and what a failure means."""
    return {
        "backoffLimit": req.backoff_limit,
        "activeDeadlineSeconds": req.time_limit_seconds,
        "ttlSecondsAfterFinished": req.ttl_seconds_after_finished,
        # Kubernetes Job podFailurePolicy (batch/v1): a notebook that raised
        # fails the Job at once, instead of running again on a GPU up to
        # backoffLimit times; preemption and node drains (DisruptionTarget)
        # are not the notebook's fault: the pod is retried without spending
        # backoffLimit, i.e. the job requeues. Rules apply in order.
        "podFailurePolicy": {
            "rules": [
                {
                    "action": "FailJob",
                    "onExitCodes": {
                        "containerName": job_container_name(req.kind),
                        "operator": "In",
                        "values": list(NOTEBOOK_FAILED_EXIT_CODES),
                    },
                },
                {"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}]},
            ]
        },
        "template": template,
    }


def _condition(status: Mapping[str, Any], kind: str) -> Mapping[str, Any] | None:
    for c in status.get("conditions") or []:
        if isinstance(c, Mapping) and c.get("type") == kind and str(c.get("status")) == "True":
            return c
    return None


def kube_job_state(job: Mapping[str, Any]) -> tuple[str, str]:
    """``(state, reason)`` of a ``batch/v1`` Job object as gpulab reports it."""
    spec = job.get("spec") or {}
    status = job.get("status") or {}
    done = _condition(status, "Complete") or _condition(status, "SuccessCriteriaMet")
    if done:
        return SUCCEEDED, "the notebook ran to the end"
    failed = _condition(status, "Failed") or _condition(status, "FailureTarget")
    if failed:
        why = failed.get("reason") or ""
        message = failed.get("message") or why or "the Job failed"
        if why == "DeadlineExceeded":
            return TIMED_OUT, f"time limit reached: {message}"
        return FAILED, message
    if spec.get("suspend"):
        return QUEUED, "waiting for Kueue to admit the Job"
    # `active` counts Pending pods too (a preempted Job's replacement waiting for
    # a GPU); `ready` (batch/v1 since Kubernetes 1.24) counts only pods that run.
    running = status.get("ready") if "ready" in status else status.get("active")
    if int(running or 0) > 0:
        return RUNNING, ""
    if int(status.get("failed") or 0) > 0:
        return PREEMPTED, f"pod ended {status.get('failed')} time(s); Kubernetes retries it"
    return QUEUED, "waiting for a node with a free GPU"
