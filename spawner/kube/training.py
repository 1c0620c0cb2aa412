"""A multi-node training job on Kubernetes, as the engines' own objects: a Kubeflow Trainer
``TrainJob`` on the torch ``ClusterTrainingRuntime``, or, where Trainer is off, a ``JobSet``.

Pure rendering (a dict ready to POST), from the same
:class:`~spawner.core.jobspec.KubeJobRequest` as a single-pod ``batch/v1`` Job: each node is
the job's pod template (:func:`spawner.core.jobspec.job_pod_template`: image, the script's
command and arguments, the ``GPULAB_*`` variables, the profile's GPU share per node, the
home volume, the security context), and the object carries the ledger's labels and the
team's Kueue queue, created suspended so that Kueue admits the whole gang as one workload.

The field names follow the engines' API types at the versions the test bed builds
(``scripts/build-trainer.sh``, ``scripts/build-jobset.sh``):

- Trainer v2.2.0, ``pkg/apis/trainer/v1alpha1/trainjob_types.go``: ``TrainJobSpec``
  (``runtimeRef``, ``trainer``, ``runtimePatches``, ``suspend``,
  ``activeDeadlineSeconds``), ``Trainer`` (``image``, ``command``, ``args``, ``env``,
  ``numNodes``, ``resourcesPerNode``, ``numProcPerNode``), ``RuntimePatch`` →
  ``TrainingRuntimeSpecPatch`` → ``JobSetTemplatePatch`` → ``ReplicatedJobPatch`` →
  ``JobTemplatePatch`` → ``PodTemplatePatch`` → ``PodSpecPatch`` / ``ContainerPatch``
  (only those fields: the runtime owns the rest). Its torch plugin gives every node
  torchrun's ``PET_NNODES``, ``PET_NPROC_PER_NODE``, ``PET_NODE_RANK``,
  ``PET_MASTER_ADDR`` and ``PET_MASTER_PORT`` (``pkg/constants/constants.go``);
- JobSet v0.11.1, ``api/jobset/v1alpha2/jobset_types.go``: ``JobSetSpec``
  (``replicatedJobs``, ``network``, ``failurePolicy``, ``suspend``), ``ReplicatedJob``
  (``name``, ``replicas``, ``template``: a ``batch/v1`` ``JobTemplateSpec``),
  ``FailurePolicy`` (``maxRestarts``, ``rules`` of ``FailurePolicyRule``). Here gpulab
  sets the ``PET_*`` variables itself: the node rank from the pod's
  ``jobset.sigs.k8s.io/job-index`` label, the master the first node's DNS name
  (``<jobset>-<replicated job>-0-0.<subdomain>``, the subdomain defaulting to the JobSet's
  name with ``enableDNSHostnames``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from spawner.core import jobspec
from spawner.core.jobprogram import processes_per_node
from spawner.core.jobspec import FAILED, QUEUED, RUNNING, SUCCEEDED, TIMED_OUT, KubeJobRequest
from spawner.core.labels import KUEUE_QUEUE_NAME

TRAINER_API_VERSION = "trainer.kubeflow.org/v1alpha1"
JOBSET_API_VERSION = "jobset.x-k8s.io/v1alpha2"
#: The torch runtime Trainer v2.2.0 ships (manifests/base/runtimes/torch_distributed.yaml):
#: one replicated job "node" whose container "node" is the trainer.
TORCH_RUNTIME = "torch-distributed"
NODE = "node"
#: Who writes gpulab's patch of the runtime (a RuntimePatch's ``manager``).
PATCH_MANAGER = "gpulab.io/hub"
#: torchrun's default rendezvous port (torch.distributed.run ``--master-port``).
MASTER_PORT = 29500
#: The label JobSet puts on each pod with the index of its Job (its node rank here).
JOB_INDEX_LABEL = "jobset.sigs.k8s.io/job-index"


def _node_pod(req: KubeJobRequest, nodes: int) -> dict[str, Any]:
    """The job's pod template for one node, its script told it is one of ``nodes``; no two
    nodes of the job on one Kubernetes node (a job's "nodes" are machines)."""
    template = jobspec.job_pod_template(req)
    (container,) = template["spec"]["containers"]
    container["env"].append({"name": "GPULAB_NODES", "value": str(nodes)})
    affinity = template["spec"].setdefault("affinity", {})
    affinity["podAntiAffinity"] = {
        "requiredDuringSchedulingIgnoredDuringExecution": [
            {
                "labelSelector": {"matchLabels": {"gpulab.io/job-id": str(req.job_id)}},
                "topologyKey": "kubernetes.io/hostname",
            }
        ]
    }
    return template


def _metadata(req: KubeJobRequest) -> dict[str, Any]:
    labels = jobspec.job_labels(req)
    if req.kueue_queue:
        labels[KUEUE_QUEUE_NAME] = req.kueue_queue
    return {
        "name": jobspec.kube_job_name(req.job_id),
        "namespace": req.namespace,
        "labels": labels,
        "annotations": dict(req.annotations),
    }


def trainjob_manifest(req: KubeJobRequest, nodes: int, runtime: str = TORCH_RUNTIME) -> dict[str, Any]:
    """The ``TrainJob`` of a script over ``nodes`` nodes of the request's GPU share each."""
    pod = _node_pod(req, nodes)
    spec = pod["spec"]
    (container,) = spec.pop("containers")
    trainer: dict[str, Any] = {
        "image": container["image"],
        "command": container["command"],
        "env": container["env"],
        "numNodes": nodes,
        "numProcPerNode": processes_per_node(req.gpu.effective_milli if req.gpu is not None else 0),
    }
    if container.get("resources"):
        trainer["resourcesPerNode"] = container["resources"]
    # What the runtime's pods must carry besides: gpulab's labels, the home, the security
    # context, the scheduling of the profile (PodSpecPatch and ContainerPatch allow these).
    container_patch = {"name": NODE, "securityContext": container["securityContext"]}
    if container.get("volumeMounts"):
        container_patch["volumeMounts"] = container["volumeMounts"]
    pod_patch = {
        k: v
        for k, v in spec.items()
        if k
        in (
            "serviceAccountName",
            "volumes",
            "imagePullSecrets",
            "securityContext",
            "nodeSelector",
            "affinity",
            "tolerations",
        )
    }
    pod_patch["containers"] = [container_patch]
    replicated = {
        "name": NODE,
        "template": {"spec": {"template": {"metadata": pod["metadata"], "spec": pod_patch}}},
    }
    body: dict[str, Any] = {
        "runtimeRef": {"name": runtime, "apiGroup": "trainer.kubeflow.org", "kind": "ClusterTrainingRuntime"},
        "trainer": trainer,
        "runtimePatches": [
            {
                "manager": PATCH_MANAGER,
                "trainingRuntimeSpec": {"template": {"spec": {"replicatedJobs": [replicated]}}},
            }
        ],
        "activeDeadlineSeconds": req.time_limit_seconds,
    }
    if req.kueue_queue:  # Kueue unsuspends it when it admits the whole gang
        body["suspend"] = True
    return {"apiVersion": TRAINER_API_VERSION, "kind": "TrainJob", "metadata": _metadata(req), "spec": body}


def jobset_manifest(req: KubeJobRequest, nodes: int) -> dict[str, Any]:
    """The ``JobSet`` of a script over ``nodes`` nodes (where Kubeflow Trainer is not installed)."""
    name = jobspec.kube_job_name(req.job_id)
    pod = _node_pod(req, nodes)
    (container,) = pod["spec"]["containers"]
    container["env"] += [
        {"name": "PET_NNODES", "value": str(nodes)},
        {"name": "PET_NPROC_PER_NODE", "value": str(processes_per_node(req.gpu.effective_milli if req.gpu else 0))},
        {"name": "PET_NODE_RANK", "valueFrom": {"fieldRef": {"fieldPath": f"metadata.labels['{JOB_INDEX_LABEL}']"}}},
        {"name": "PET_MASTER_ADDR", "value": f"{name}-{NODE}-0-0.{name}"},
        {"name": "PET_MASTER_PORT", "value": str(MASTER_PORT)},
    ]
    job = jobspec.kube_job_manifest(req)["spec"]
    job["template"] = pod
    # One pod per Job, never retried by the Job: a gang restarts whole (JobSet's failure policy).
    job.update({"parallelism": 1, "completions": 1, "backoffLimit": 0})
    for key in ("ttlSecondsAfterFinished", "suspend"):  # the JobSet's, not each Job's
        job.pop(key, None)
    program = jobspec.job_container_name(req.kind)
    job["podFailurePolicy"] = {
        "rules": [
            {"action": "FailJob", "onExitCodes": {"containerName": program, "operator": "In", "values": [1]}},
            {"action": "FailJob", "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}]},
        ]
    }
    body: dict[str, Any] = {
        "replicatedJobs": [{"name": NODE, "replicas": nodes, "template": {"spec": job}}],
        "network": {"enableDNSHostnames": True, "subdomain": name},
        # The Job controller's messages for those two rules (pkg/controller/job/pod_failure_policy.go):
        # the script raised -> the whole job fails; a preemption or drain -> the gang restarts
        # without spending maxRestarts; the time limit (each Job's activeDeadlineSeconds) ends
        # it; anything else restarts it up to maxRestarts times.
        "failurePolicy": {
            "maxRestarts": req.backoff_limit,
            "rules": [
                {"name": "TimeLimit", "action": "FailJobSet", "onJobFailureReasons": ["DeadlineExceeded"]},
                {
                    "name": "TheScriptRaised",
                    "action": "FailJobSet",
                    "onJobFailureReasons": ["PodFailurePolicy"],
                    "onJobFailureMessagePatterns": [f"Container {program} for pod .* failed with exit code 1 "],
                },
                {
                    "name": "PreemptedOrDrained",
                    "action": "RestartJobSetAndIgnoreMaxRestarts",
                    "onJobFailureReasons": ["PodFailurePolicy"],
                    "onJobFailureMessagePatterns": ["Pod .* has condition DisruptionTarget matching FailJob rule"],
                },
            ],
        },
        "ttlSecondsAfterFinished": req.ttl_seconds_after_finished,
    }
    if req.kueue_queue:
        body["suspend"] = True
    return {"apiVersion": JOBSET_API_VERSION, "kind": "JobSet", "metadata": _metadata(req), "spec": body}


# -- what the engines' objects say ----------------------------------------------------------

#: ``(group, version, plural)`` of each engine's object, for the API's custom object calls.
RESOURCES = {
    "TrainJob": ("trainer.kubeflow.org", "v1alpha1", "trainjobs"),
    "JobSet": ("jobset.x-k8s.io", "v1alpha2", "jobsets"),
}
#: The condition of a finished object: TrainJob's ``Complete``, JobSet's ``Completed``.
_DONE = ("Complete", "Completed")


def _true_condition(status: Mapping[str, Any], kinds: tuple[str, ...]) -> Mapping[str, Any] | None:
    for c in status.get("conditions") or []:
        if isinstance(c, Mapping) and c.get("type") in kinds and str(c.get("status")) == "True":
            return c
    return None


def all_nodes_run(obj: Mapping[str, Any]) -> bool:
    """Does every node of the gang run? Its child Jobs' counts say (TrainJob's
    ``status.jobsStatus``, JobSet's ``status.replicatedJobsStatus``, one entry per replicated
    job): each replicated job has Jobs and each of its live Jobs is ready, i.e. all its pods
    run (Trainer makes one Job of ``numNodes`` pods, gpulab's JobSet one Job per node)."""
    status = obj.get("status") or {}
    entries = [
        e for e in status.get("jobsStatus") or status.get("replicatedJobsStatus") or [] if isinstance(e, Mapping)
    ]
    return bool(entries) and all(
        int(e.get("ready") or 0) > 0 and int(e.get("ready") or 0) >= int(e.get("active") or 0) for e in entries
    )


def gang_state(obj: Mapping[str, Any], nodes: int, admission: str = "") -> tuple[str, str]:
    """``(state, reason)`` of a TrainJob or JobSet as gpulab reports it: running only while
    every node runs (never half-running), queued while Kueue has not admitted the whole gang
    (``admission``: Kueue's words for why, from the gang's Workload) or while its pods are
    being placed again."""
    status = obj.get("status") or {}
    if _true_condition(status, _DONE):
        return SUCCEEDED, f"the script ran to the end on all {nodes} nodes"
    failed = _true_condition(status, ("Failed",))
    if failed:
        message = str(failed.get("message") or failed.get("reason") or "the gang failed")
        if failed.get("reason") == "DeadlineExceeded":
            return TIMED_OUT, f"time limit reached: {message}"
        return FAILED, message
    if (obj.get("spec") or {}).get("suspend"):
        why = f": {admission}" if admission else ""
        return QUEUED, f"waiting for Kueue to admit the whole gang ({nodes} nodes at once){why}"
    if all_nodes_run(obj):
        return RUNNING, ""
    return QUEUED, f"admitted: waiting for all {nodes} nodes of the gang to be placed and started"


def restarts(obj: Mapping[str, Any]) -> int:
    """How many times a JobSet restarted its whole gang (``status.restarts``)."""
    return int((obj.get("status") or {}).get("restarts") or 0)


def workload_admission(workload: Mapping[str, Any]) -> str:
    """Why Kueue has not admitted a Workload yet: its ``QuotaReserved`` condition's message."""
    for c in (workload.get("status") or {}).get("conditions") or []:
        if isinstance(c, Mapping) and c.get("type") == "QuotaReserved" and str(c.get("status")) != "True":
            return str(c.get("message") or c.get("reason") or "")
    return ""
