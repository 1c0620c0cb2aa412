"""The Kubernetes jobs backend in-process: its ledger bookkeeping and the home claim it names.

No cluster is needed for these: the backend's decisions are checked
directly. What the real Job controller and Kueue do with its Jobs is in
tests/kube/test_kube_cluster_jobs.py.
"""

from __future__ import annotations

import asyncio

import pytest

from spawner.runtime import set_runtime

NS = "team-vision"


@pytest.fixture(autouse=True)
def fresh_runtime():
    """Each test its own catalog and ledger (the runtime is per hub process)."""
    set_runtime(None)
    yield
    set_runtime(None)


CATALOG = f"""
sharing:
  backend: timeslice
  timeslice: {{replicas: 2}}
profiles:
  - {{slug: cpu, display_name: CPU only, gpus: 0}}
  - {{slug: h100-half, display_name: "0.5 × H100", gpus: 0.5, gpu_model: H100-80GB}}
  - {{slug: h100-1, display_name: "1 × H100", gpus: 1, gpu_model: H100-80GB,
      images: [{{slug: torch, display_name: PyTorch, image: "example.org/torch-notebook:2.4"}}],
      tolerations: [{{key: dedicated, operator: Equal, value: ml, effect: NoSchedule}}],
      node_affinity_required: [{{matchExpressions: [{{key: topology.kubernetes.io/zone, operator: In,
                                                     values: [zone-a]}}]}}]}}
teams:
  - {{name: vision, users: [alice, bob, jo_smith], guarantee: 1, burst: 2, namespace: {NS},
      allowed_profiles: [cpu, h100-half, h100-1]}}
"""


def kube_jobs_config(tmp_path, monkeypatch, kueue: bool = False):
    """A jobs service config on the Kubernetes backend, with the catalog and database in ``tmp_path``."""
    from traitlets.config import Config

    monkeypatch.setenv("GPULAB_DATA_DIR", str(tmp_path))
    (tmp_path / "catalog.yaml").write_text(CATALOG)
    c = Config()
    c.GPULab.catalog_file = str(tmp_path / "catalog.yaml")
    c.GPULabDB.db_url = f"sqlite:///{tmp_path / 'gpulab.sqlite'}"
    c.GPULabJobs.backend_class = "hub_config.jobs.backends.kube.KubeJobBackend"
    c.GPULabJobs.kueue_enabled = kueue
    # The servers' homes as Zero to JupyterHub's default singleuser.storage (type dynamic) sets them.
    c.KubeSpawner.storage_pvc_ensure = True
    c.KubeSpawner.volumes = [{"name": "volume-{user_server}", "persistentVolumeClaim": {"claimName": "{pvc_name}"}}]
    c.KubeSpawner.volume_mounts = [{"mountPath": "/home/jovyan", "name": "volume-{user_server}"}]
    return c


def test_a_job_kueue_suspends_stays_in_the_ledger(tmp_path, monkeypatch):
    """Kueue evicts a running Job by suspending it: its pods go, so a ledger
    rebuilt from pods drops it, but the job is queued again and still holds its share."""
    from hub_config.jobs.service import JobService
    from spawner.core import jobspec

    c = kube_jobs_config(tmp_path, monkeypatch, kueue=True)
    service = JobService(config=c)
    monkeypatch.setattr(service.backend, "submitted", lambda rec: None)  # no cluster here
    rec, _ = asyncio.run(
        service.create_job("alice", [], {"notebook": "exp/calc.ipynb", "job_class": "batch", "profile": "h100-half"})
    )
    key = jobspec.workload_key(rec.id)
    service.transition(rec.id, jobspec.QUEUED, "", kube_namespace=NS, kube_name=f"gpulab-job-{rec.id}")
    service.transition(rec.id, jobspec.RUNNING)
    ledger = service.runtime.ledger
    assert ledger.get(key).state == "running"
    ledger.rebuild([], keep_reserved=True)  # the spawner's rebuild from pods: the pod is gone
    assert ledger.get(key) is None
    rec = service.get_job(rec.id)
    service.backend.move(rec, *jobspec.kube_job_state({"spec": {"suspend": True}, "status": {}}))
    w = ledger.get(key)
    assert w is not None and w.state == "reserved" and w.milli == 500 and w.team == "vision"


@pytest.mark.parametrize(
    "user,claim",
    [
        # KubeSpawner 7's safe slugs (what GPUKubeSpawner named the claim); the old
        # label escaping gave "claim-jo_smith" (an invalid DNS name: 422) and another claim.
        ("alice", "claim-alice"),
        ("jo_smith", "claim-jo-smith---515893c9"),
        ("a.b@x.com", "claim-a-b-x-com---464a0cfb"),
    ],
)
def test_the_job_mounts_the_home_claim_kubespawner_named(tmp_path, monkeypatch, user, claim):
    from hub_config.jobs.service import JobService
    from spawner.kube.conventions import expand_user_template

    c = kube_jobs_config(tmp_path, monkeypatch)
    backend = JobService(config=c).backend
    assert backend.home_claim(user) == claim == expand_user_template("claim-{user_server}", user)
    c.KubeSpawner.pvc_name_template = "home-{username}"  # z2jh: singleuser.storage.dynamic.pvcNameTemplate
    assert JobService(config=c).backend.home_claim(user) == expand_user_template("home-{username}", user)


def test_the_job_manifest_follows_z2jh_and_the_profile(tmp_path, monkeypatch):
    """What the backend sends for a 1-GPU profile with tolerations and node affinity,
    under z2jh's single-user settings, checked against the Kubernetes schema (strict)."""
    import kubernetes_validate

    from hub_config.jobs.service import JobService
    from spawner.core.labels import kueue_local_queue

    c = kube_jobs_config(tmp_path, monkeypatch, kueue=True)
    # What z2jh sets for its single-user pods (singleuser.uid, fsGid, image.pullSecrets).
    c.KubeSpawner.uid = 1000
    c.KubeSpawner.fs_gid = 100
    c.KubeSpawner.image_pull_secrets = ["image-pull-secret"]
    service = JobService(config=c)
    monkeypatch.setattr(service.backend, "submitted", lambda rec: None)
    rec, _ = asyncio.run(
        service.create_job("jo_smith", [], {"notebook": "exp/calc.ipynb", "job_class": "batch", "profile": "h100-1"})
    )
    job = service.backend.manifest(service.get_job(rec.id))
    kubernetes_validate.validate(job, kubernetes_validate.latest_version(), strict=True)
    md, spec = job["metadata"], job["spec"]
    # The LocalQueue the Helm chart creates in the team namespace (one name, spawner/core/labels.py).
    assert md["labels"]["kueue.x-k8s.io/queue-name"] == kueue_local_queue("vision") == "gpulab-vision"
    assert spec["suspend"] is True
    # A notebook that raised fails the Job at once; preemption requeues it.
    assert spec["podFailurePolicy"]["rules"] == [
        {"action": "FailJob", "onExitCodes": {"containerName": "papermill", "operator": "In", "values": [1]}},
        {"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}]},
    ]
    pod = spec["template"]["spec"]
    # z2jh's uid and fsGroup, within the "restricted" Pod Security Standard.
    assert pod["securityContext"] == {
        "runAsUser": 1000,
        "runAsNonRoot": True,
        "fsGroup": 100,
        "seccompProfile": {"type": "RuntimeDefault"},
    }
    assert pod["containers"][0]["securityContext"] == {
        "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"]},
    }
    assert pod["automountServiceAccountToken"] is False
    assert pod["imagePullSecrets"] == [{"name": "image-pull-secret"}]
    assert pod["tolerations"] == [
        {"key": "dedicated", "operator": "Equal", "value": "ml", "effect": "NoSchedule"},
        {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},
    ]
    assert pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"] == {
        "nodeSelectorTerms": [
            {
                "matchExpressions": [
                    {"key": "topology.kubernetes.io/zone", "operator": "In", "values": ["zone-a"]},
                    # A whole GPU: never on a HAMi node (spawner/core/gpu_pools.py).
                    {"key": "gpu", "operator": "NotIn", "values": ["on"]},
                ]
            }
        ]
    }
    # KubeSpawner's claim name for jo_smith, not an invalid "claim-jo_smith".
    assert pod["volumes"] == [
        {"name": "home", "persistentVolumeClaim": {"claimName": "claim-jo-smith---515893c9"}},
        {"name": "gpulab-shm", "emptyDir": {"medium": "Memory"}},  # a GPU job: /dev/shm past 64 MiB
    ]


@pytest.mark.parametrize(
    "setting,profile_sharing,scheduler",
    [
        (None, None, "jhub-user-scheduler"),  # the notebooks' scheduler: z2jh's user-scheduler
        ("", None, None),  # explicitly the cluster's default scheduler
        ("batch-scheduler", None, "batch-scheduler"),
        (None, "hami", "hami-scheduler"),  # a GPU backend's own scheduler comes first
    ],
)
def test_job_pods_go_to_the_scheduler_of_the_users_servers(tmp_path, monkeypatch, setting, profile_sharing, scheduler):
    """Two schedulers that bind the same GPU pool do not see each other's bindings: both
    take the last free GPU and the kubelet rejects one pod (tests/kube/test_kube_cluster_devices.py)."""
    from hub_config.jobs.service import JobService

    c = kube_jobs_config(tmp_path, monkeypatch)
    c.KubeSpawner.scheduler_name = "jhub-user-scheduler"  # what z2jh sets (scheduling.userScheduler)
    if setting is not None:
        c.GPULabJobs.kube_scheduler_name = setting
    if profile_sharing:
        catalog = (tmp_path / "catalog.yaml").read_text()
        (tmp_path / "catalog.yaml").write_text(
            catalog.replace("gpu_model: H100-80GB}", f"gpu_model: H100-80GB, sharing: {profile_sharing}}}", 1)
        )
    service = JobService(config=c)
    monkeypatch.setattr(service.backend, "submitted", lambda rec: None)
    rec, _ = asyncio.run(
        service.create_job("alice", [], {"notebook": "a.ipynb", "job_class": "batch", "profile": "h100-half"})
    )
    pod = service.backend.manifest(service.get_job(rec.id))["spec"]["template"]["spec"]
    assert pod.get("schedulerName") == scheduler


@pytest.mark.parametrize("profile,visible", [("cpu", "void"), ("h100-half", None), ("h100-1", None)])
def test_a_job_without_a_gpu_sees_no_gpu_even_in_a_cuda_image(tmp_path, monkeypatch, profile, visible):
    """CUDA images set NVIDIA_VISIBLE_DEVICES=all; on a GPU node with the nvidia runtime a
    CPU job would get every GPU of the node. The device plugin sets it for GPU pods."""
    import kubernetes_validate

    from hub_config.jobs.service import JobService

    service = JobService(config=kube_jobs_config(tmp_path, monkeypatch))
    monkeypatch.setattr(service.backend, "submitted", lambda rec: None)
    rec, _ = asyncio.run(
        service.create_job("alice", [], {"notebook": "a.ipynb", "job_class": "batch", "profile": profile})
    )
    job = service.backend.manifest(service.get_job(rec.id))
    kubernetes_validate.validate(job, kubernetes_validate.latest_version(), strict=True)
    env = {e["name"]: e["value"] for e in job["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env.get("NVIDIA_VISIBLE_DEVICES") == visible


@pytest.mark.parametrize(
    "storage, home",
    [
        # singleuser.storage.type static: one claim, a subPath per user (z2jh's hub config).
        (
            {
                "volumes": [{"name": "home", "persistentVolumeClaim": {"claimName": "nfs-homes"}}],
                "volume_mounts": [{"mountPath": "/home/jovyan", "name": "home", "subPath": "homes/{username}"}],
            },
            ("nfs-homes", "/home/jovyan", "homes/jo-smith---515893c9"),
        ),
        # dynamic, with z2jh's pvcNameTemplate and another homeMountPath.
        (
            {
                "storage_pvc_ensure": True,
                "pvc_name_template": "home-{username}",
                "volumes": [{"name": "v", "persistentVolumeClaim": {"claimName": "{pvc_name}"}}],
                "volume_mounts": [{"mountPath": "/home/data", "name": "v"}],
            },
            ("home-jo-smith---515893c9", "/home/data", ""),
        ),
        # KubeSpawner's own dict form, keyed by name.
        (
            {
                "volumes": {"home": {"name": "home", "persistentVolumeClaim": {"claimName": "shared"}}},
                "volume_mounts": {"home": {"name": "home", "mountPath": "/home/jovyan", "subPath": "{username}"}},
            },
            ("shared", "/home/jovyan", "jo-smith---515893c9"),
        ),
    ],
)
def test_a_job_mounts_the_home_as_the_users_servers_do(tmp_path, monkeypatch, storage, home):
    """The job's pod mounts the claim, path and subPath z2jh gives the user's servers."""
    from hub_config.jobs.service import JobService

    c = kube_jobs_config(tmp_path, monkeypatch)
    del c.KubeSpawner["storage_pvc_ensure"], c.KubeSpawner["volumes"], c.KubeSpawner["volume_mounts"]
    for key, value in storage.items():
        c.KubeSpawner[key] = value
    service = JobService(config=c)
    assert service.backend.home_volume("jo_smith") == home
    monkeypatch.setattr(service.backend, "submitted", lambda rec: None)
    rec, _ = asyncio.run(
        service.create_job("jo_smith", [], {"notebook": "exp/calc.ipynb", "job_class": "batch", "profile": "cpu"})
    )
    pod = service.backend.manifest(service.get_job(rec.id))["spec"]["template"]["spec"]
    [mount] = [m for m in pod["containers"][0]["volumeMounts"] if m["name"] == "home"]
    assert (
        pod["volumes"][0]["persistentVolumeClaim"]["claimName"],
        mount["mountPath"],
        mount.get("subPath", ""),
    ) == home


def test_servers_without_a_persistent_home_refuse_jobs_with_what_to_do(tmp_path, monkeypatch):
    """z2jh's singleuser.storage.type none: the server's home dies with its pod, and a job's
    pod could not read the notebook; the submission is refused (409) and nothing is recorded."""
    from hub_config.jobs.service import JobService
    from spawner.core.jobspec import JobSpecError

    c = kube_jobs_config(tmp_path, monkeypatch)
    del c.KubeSpawner["storage_pvc_ensure"], c.KubeSpawner["volumes"], c.KubeSpawner["volume_mounts"]
    service = JobService(config=c)
    with pytest.raises(JobSpecError) as refused:
        asyncio.run(
            service.create_job("alice", [], {"notebook": "exp/calc.ipynb", "job_class": "batch", "profile": "cpu"})
        )
    assert refused.value.status == 409
    assert "no persistent home" in str(refused.value) and "c.GPULabJobs.kube_home_claim_template" in str(refused.value)
    assert service.list_jobs("alice") == []


def test_the_home_claim_a_job_creates_is_the_one_kubespawner_would(tmp_path, monkeypatch):
    """A user who never started a server in the team namespace has no home claim there yet;
    the job creates the claim KubeSpawner's get_pvc_manifest would (its pvc name, storage
    class, access modes and capacity, as z2jh's singleuser.storage.dynamic sets them), and
    none for static storage, which is not KubeSpawner's to create."""
    from hub_config.jobs.service import JobService

    c = kube_jobs_config(tmp_path, monkeypatch)
    c.KubeSpawner.storage_class = "fast-rwx"
    c.KubeSpawner.storage_access_modes = ["ReadWriteMany"]
    c.KubeSpawner.storage_capacity = "10Gi"
    body = JobService(config=c).backend.home_claim_manifest("jo_smith")
    assert body["metadata"]["name"] == "claim-jo-smith---515893c9"
    assert body["spec"] == {
        "accessModes": ["ReadWriteMany"],
        "resources": {"requests": {"storage": "10Gi"}},
        "storageClassName": "fast-rwx",
    }
    import kubernetes_validate

    kubernetes_validate.validate(body, kubernetes_validate.latest_version(), strict=True)
    c.KubeSpawner.volumes = [{"name": "home", "persistentVolumeClaim": {"claimName": "nfs-homes"}}]
    c.KubeSpawner.volume_mounts = [{"mountPath": "/home/jovyan", "name": "home", "subPath": "{username}"}]
    assert JobService(config=c).backend.home_claim_manifest("jo_smith") is None


def test_the_jobs_pod_keeps_its_notebook_and_a_rerun_copies_the_earlier_jobs_copy(tmp_path, monkeypatch):
    """The hub does not reach the homes on Kubernetes: the pod copies the notebook to the job's
    own file beside its output (as the single server's hub does at submit) and runs it; a Re-run's
    pod copies from the earlier job's kept copy, "Run current"'s from the notebook."""
    from hub_config.jobs.service import JobService

    service = JobService(config=kube_jobs_config(tmp_path, monkeypatch))
    monkeypatch.setattr(service.backend, "submitted", lambda rec: None)
    body = {"notebook": "exp/calc.ipynb", "job_class": "batch", "profile": "cpu"}
    first, _ = asyncio.run(service.create_job("alice", [], body))

    def env(rec) -> dict[str, str]:
        container = service.backend.manifest(service.get_job(rec.id))["spec"]["template"]["spec"]["containers"][0]
        return {e["name"]: e.get("value", "") for e in container["env"]}

    kept = first.output_path.removesuffix(".ipynb") + ".input.ipynb"
    assert env(first)["GPULAB_INPUT"] == kept and env(first)["GPULAB_KEEP_FROM"] == "exp/calc.ipynb"
    again = asyncio.run(service.rerun(service.get_job(first.id), []))
    assert again.rerun_of == first.id and env(again)["GPULAB_KEEP_FROM"] == kept
    assert env(again)["GPULAB_INPUT"] == again.output_path.removesuffix(".ipynb") + ".input.ipynb"
    current = asyncio.run(service.rerun(service.get_job(first.id), [], "current"))
    assert current.rerun_of is None and env(current)["GPULAB_KEEP_FROM"] == "exp/calc.ipynb"


@pytest.mark.parametrize("engine, kind", [("trainer", "TrainJob"), ("jobset", "JobSet"), ("", None)])
def test_a_multi_node_job_is_the_engines_object_or_refused_where_none_is_on(tmp_path, monkeypatch, engine, kind):
    """nodes > 1: a TrainJob on the chart's torch runtime, a JobSet, or (engine off) a 409
    that says what to ask for; a one-node job stays a batch/v1 Job."""
    from hub_config.jobs.service import JobService
    from spawner.core.jobspec import JobSpecError

    c = kube_jobs_config(tmp_path, monkeypatch, kueue=True)
    c.GPULabJobs.kube_training_engine = engine
    c.GPULabJobs.max_nodes = 2
    catalog = tmp_path / "catalog.yaml"  # training stays in quota: room for the 2-GPU gang
    catalog.write_text(catalog.read_text().replace("guarantee: 1, burst: 2", "guarantee: 3, burst: 3"))
    service = JobService(config=c)
    service.backend.submitted = lambda rec: None  # no cluster here: only the manifest is looked at
    body = {"script": "train.py", "nodes": 2, "job_class": "training", "profile": "h100-1"}
    if kind is None:
        with pytest.raises(JobSpecError) as refused:
            asyncio.run(service.create_job("alice", [], body))
        assert refused.value.status == 409 and "kube_training_engine" in str(refused.value)
        assert service.list_jobs("alice") == []
        return
    rec, _ = asyncio.run(service.create_job("alice", [], body))
    manifest = service.backend.manifest(rec)
    assert manifest["kind"] == kind and manifest["spec"]["suspend"] is True
    assert manifest["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "gpulab-vision"
    if kind == "TrainJob":
        assert manifest["spec"]["runtimeRef"]["name"] == "gpulab-torch-distributed"
    one = dict(body, nodes=1)
    single, _ = asyncio.run(service.create_job("bob", [], one))
    assert service.backend.manifest(single)["kind"] == "Job"


def test_the_training_engine_setting_refuses_an_unknown_engine():
    from traitlets import TraitError

    from hub_config.jobs.settings import GPULabJobs

    with pytest.raises(TraitError, match="'trainer', 'jobset' or ''"):
        GPULabJobs(kube_training_engine="mpi")
