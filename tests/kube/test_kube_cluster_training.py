"""Multi-node training jobs on the real control plane: the real Trainer, JobSet and Kueue
controllers, the real scheduler, real processes and a real collective.

A real hub configured as Zero to JupyterHub configures it submits a script over ``nodes``
× 1 H100 as the chart-bound hub ServiceAccount. The hub creates a Kubeflow Trainer
TrainJob on the chart's torch ClusterTrainingRuntime (or a JobSet where Trainer is off),
suspended, in the team's LocalQueue; Kueue admits it as one Workload; Trainer makes the
JobSet and JobSet the Jobs; z2jh's user-scheduler binds each node's pod to its own node;
the node agent runs each pod's ``torchrun`` in the bed's torch environment (torch 2.15.0,
``scripts/build-torch-env.sh``) in a network namespace of its own on the bed's pod
network, where the names the operator gives the pods resolve through the bed's CoreDNS.
The script's processes rendezvous and all-reduce over torch's gloo backend.

The bed runs the pods' processes as root (it has no user namespaces): ``runAsUser`` is
not applied, the only difference from a kubelet these tests rely on.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from tests.kube.bed.chart import Release
from tests.kube.bed.cluster import Cluster
from tests.kube.bed.testbed import Testbed, build_torch_env, torch_image
from tests.kube.bed.z2jh_hub_config import bed_hub
from tests.support.hub import RunningHub
from tests.support.jobs import get_job, submit, user_token, wait_state
from tests.support.kube_spawner import chart_team

USER = "carol"
HOME_CLAIM = "gpulab-train-home-{username}"
TRAINJOBS = "/apis/trainer.kubeflow.org/v1alpha1/namespaces/{ns}/trainjobs"
JOBSETS = "/apis/jobset.x-k8s.io/v1alpha2/namespaces/{ns}/jobsets"

#: A real collective: every process adds its rank + 1 (torchrun sets RANK, WORLD_SIZE,
#: MASTER_ADDR from the engine's PET_* variables); then it waits while asked to.
ALLREDUCE = """\
import os, socket, sys, time
import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
t = torch.tensor([float(rank + 1)])
dist.all_reduce(t)
print(f"rank {rank} of {world} on {socket.gethostname()}: all_reduce sum {t.item():g}", flush=True)
assert t.item() == world * (world + 1) / 2, t
dist.destroy_process_group()
hold = sys.argv[1:] and sys.argv[1] == "--hold"
while hold:
    time.sleep(0.5)
"""


def torch_env() -> Path:
    return build_torch_env()


def home_volume(kube: Cluster, ns: str, homes: Path, user: str) -> Path:
    """The user's home as a hostPath PersistentVolume bound to the claim the hub mounts
    (what a hostPath or local-volume provisioner would give), and the folder behind it."""
    home = homes / user
    home.mkdir(parents=True, exist_ok=True)
    claim = HOME_CLAIM.format(username=user)
    pv = f"{ns}-{claim}"
    if kube.maybe_get(f"/api/v1/persistentvolumes/{pv}") is not None:
        kube.request("DELETE", f"/api/v1/persistentvolumes/{pv}")
        kube.wait(lambda: kube.maybe_get(f"/api/v1/persistentvolumes/{pv}") is None, "the old volume to go", 30)
    kube.create(
        "/api/v1/persistentvolumes",
        {
            "metadata": {"name": pv},
            "spec": {
                "capacity": {"storage": "1Gi"},
                "accessModes": ["ReadWriteMany"],
                "storageClassName": "",
                "hostPath": {"path": str(home), "type": "Directory"},
                "claimRef": {"namespace": ns, "name": claim},
            },
        },
    )
    if kube.maybe_get(f"/api/v1/namespaces/{ns}/persistentvolumeclaims/{claim}") is None:
        kube.create(
            f"/api/v1/namespaces/{ns}/persistentvolumeclaims",
            {
                "metadata": {"name": claim},
                "spec": {
                    "accessModes": ["ReadWriteMany"],
                    "storageClassName": "",
                    "volumeName": pv,
                    "resources": {"requests": {"storage": "1Gi"}},
                },
            },
        )
    kube.wait(
        lambda: kube.get(f"/api/v1/namespaces/{ns}/persistentvolumeclaims/{claim}")["status"].get("phase") == "Bound",
        "the home claim to be bound",
        60,
    )
    (home / "train").mkdir(exist_ok=True)
    (home / "train" / "allreduce.py").write_text(ALLREDUCE)
    return home


def training_hub(release: Release, workdir: Path, homes: Path, engine: str, guarantee: float) -> RunningHub:
    """A hub whose multi-node jobs go through ``engine`` and Kueue, as the chart configures them."""
    nlp = chart_team(release, "nlp")
    catalog = {
        "sharing": {"backend": "whole"},
        "profiles": [{"slug": "h100-1", "display_name": "1 × H100", "gpus": 1, "gpu_model": "H100-80GB"}],
        "teams": [
            {
                "name": nlp,
                "users": [USER],
                "guarantee": guarantee,
                "burst": guarantee,
                "namespace": release.team_ns(nlp),
            }
        ],
    }
    jobs = {
        "poll_interval": 0.3,
        "kube_image": torch_image(torch_env()),
        "kube_home_claim_template": HOME_CLAIM,
        "home_dir_template": str(homes / "{username}"),
        "kueue_enabled": True,
        "kube_training_engine": engine,
        # The chart's name for it (NOTES.txt says so to the admin): the release's own.
        "kube_training_runtime": release.values.get("training", {}).get("runtime", {}).get("name")
        or f"{release.name}-torch-distributed",
    }
    site = {"hub": {"config": {"GPULabJobs": jobs}}}
    return bed_hub(workdir, release.hub_namespace, release.hub_kubeconfig, yaml.safe_dump(catalog), site)


@pytest.fixture(scope="module")
def homes(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("training-homes")


@pytest.fixture(scope="module")
def trainer_hub(gpulab_release: Release, tmp_path_factory, homes: Path) -> Iterator[RunningHub]:
    # nlp may hold 3 GPUs in the hub's ledger; the chart's ClusterQueue lends it at most 2
    # (guarantee 1, burst 2): Kueue, not the hub, is what holds a 3-node gang back.
    hub = training_hub(gpulab_release, tmp_path_factory.mktemp("trainer-hub"), homes, "trainer", guarantee=3)
    hub.start()
    yield hub
    hub.close()


@pytest.fixture
def carol(trainer_hub: RunningHub, release: Release, kube: Cluster, homes: Path) -> str:
    home_volume(kube, release.team_ns(chart_team(release, "nlp")), homes, USER)
    r = trainer_hub.api("POST", f"/users/{USER}")
    assert r.status_code in (201, 409), r.text
    return user_token(trainer_hub, USER)


def gang_pods(kube: Cluster, ns: str, job_id: int) -> list[dict]:
    return [p for p in kube.pods(ns, f"gpulab.io/job-id={job_id}") if not p["metadata"].get("deletionTimestamp")]


def container_env(tb: Testbed, pod: dict) -> dict[str, str]:
    """The environment the node agent started the pod's container with (its runtime record)."""
    path = tb.state_dir / "pods" / pod["metadata"]["namespace"] / pod["metadata"]["name"] / "container-env.json"
    return json.loads(path.read_text())


def log_of(hub: RunningHub, token: str, job_id: int, rank: int | None = None) -> str:
    query = "" if rank is None else f"?rank={rank}"
    r = hub.api("GET", f"/gpulab/jobs/{job_id}/logs{query}", token=token)
    assert r.status_code == 200, r.text
    return r.json()["text"]


def submit_gang(hub: RunningHub, token: str, nodes: int, *args: str) -> dict:
    return submit(
        hub, token, script="train/allreduce.py", args=list(args), nodes=nodes, job_class="training", profile="h100-1"
    )


def test_a_two_node_trainjob_all_reduces_across_two_pods_on_two_nodes(trainer_hub, release, kube, kube_testbed, carol):
    ns = release.team_ns(chart_team(release, "nlp"))
    job = submit_gang(trainer_hub, carol, 2)
    name = f"gpulab-job-{job['id']}"
    trainjob = kube.wait(lambda: kube.maybe_get(f"{TRAINJOBS.format(ns=ns)}/{name}"), "the TrainJob", 30)
    assert trainjob["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == f"gpulab-{chart_team(release, 'nlp')}"
    assert trainjob["spec"]["runtimeRef"]["name"] == "gpulab-torch-distributed"
    assert trainjob["spec"]["trainer"]["numNodes"] == 2
    # Kueue admits the gang as one Workload of two pods.
    workload = kube.wait(
        lambda: next(
            (
                w
                for w in kube.get(f"/apis/kueue.x-k8s.io/v1beta2/namespaces/{ns}/workloads")["items"]
                if any(o.get("name") == name for o in w["metadata"].get("ownerReferences") or [])
            ),
            None,
        ),
        "the gang's Workload",
        60,
    )
    assert [ps["count"] for ps in workload["spec"]["podSets"]] == [2], workload["spec"]["podSets"]
    done = wait_state(trainer_hub, job["id"], {"succeeded", "failed"}, timeout=240)
    assert done["state"] == "succeeded", (done, log_of(trainer_hub, carol, job["id"]))
    assert [h["state"] for h in done["history"]] == ["queued", "running", "succeeded"]
    # Rank 0's log is the job's; rank 1's is beside it.
    assert "rank 0 of 2" in log_of(trainer_hub, carol, job["id"]) and "all_reduce sum 3" in log_of(
        trainer_hub, carol, job["id"]
    )
    assert "rank 1 of 2" in log_of(trainer_hub, carol, job["id"], rank=1)
    for bad in ("2", "-1", "x", "99999999999999999999"):
        r = trainer_hub.api("GET", f"/gpulab/jobs/{job['id']}/logs?rank={bad}", token=carol)
        assert r.status_code == 400, (bad, r.text)
    # The pods: one per node, told their rank, the gang's size and master by Trainer.
    pods = kube.pods(ns, f"gpulab.io/job-id={job['id']}")
    assert len({p["spec"]["nodeName"] for p in pods}) == 2, [p["spec"]["nodeName"] for p in pods]
    envs = sorted((container_env(kube_testbed, p) for p in pods), key=lambda e: e["PET_NODE_RANK"])
    assert [e["PET_NODE_RANK"] for e in envs] == ["0", "1"]
    assert {e["PET_NNODES"] for e in envs} == {"2"} and {e["PET_NPROC_PER_NODE"] for e in envs} == {"1"}
    assert {e["PET_MASTER_ADDR"] for e in envs} == {f"{name}-node-0-0.{name}"}
    assert [w for w in trainer_hub.holdings() if w["kind"] == "job"] == []


def test_evicting_one_node_restarts_the_whole_gang_and_cancel_removes_every_pod(trainer_hub, release, kube, carol):
    ns = release.team_ns(chart_team(release, "nlp"))
    job = submit_gang(trainer_hub, carol, 2, "--hold")
    wait_state(trainer_hub, job["id"], "running", timeout=240)
    first = {p["metadata"]["uid"]: p for p in gang_pods(kube, ns, job["id"])}
    assert len(first) == 2
    victim = next(iter(first.values()))
    kube.evict_pod(ns, victim["metadata"]["name"])
    # JobSet's failure policy (the chart's runtime) restarts both nodes, not only the evicted one.
    again = kube.wait(
        lambda: (
            pods
            if len(pods := gang_pods(kube, ns, job["id"])) == 2
            and not {p["metadata"]["uid"] for p in pods} & set(first)
            and all(p["status"].get("phase") == "Running" for p in pods)
            else None
        ),
        "both nodes of the gang to run again as new pods",
        120,
    )
    assert len(again) == 2
    wait_state(trainer_hub, job["id"], "running", timeout=60)
    history = [h["state"] for h in get_job(trainer_hub, job["id"], carol)["history"]]
    assert history[:4] == ["queued", "running", "preempted", "queued"], history
    jobset = kube.get(f"{JOBSETS.format(ns=ns)}/gpulab-job-{job['id']}")
    assert jobset["status"]["restarts"] >= 1
    r = trainer_hub.api("POST", f"/gpulab/jobs/{job['id']}/cancel", token=carol)
    assert r.status_code == 200 and r.json()["state"] == "cancelled", r.text
    kube.wait(lambda: not kube.pods(ns, f"gpulab.io/job-id={job['id']}"), "every pod of the gang to go", 90)
    kube.wait(
        lambda: kube.maybe_get(f"{TRAINJOBS.format(ns=ns)}/gpulab-job-{job['id']}") is None, "the TrainJob to go", 60
    )
    assert get_job(trainer_hub, job["id"], carol)["state"] == "cancelled"


def test_a_gang_that_does_not_fit_stays_suspended_whole_with_kueues_reason(trainer_hub, release, kube, carol):
    ns = release.team_ns(chart_team(release, "nlp"))
    job = submit_gang(trainer_hub, carol, 3)  # the hub admits 3 GPUs; nlp's ClusterQueue lends 2
    queued = kube.wait(
        lambda: (
            j if "Kueue" in (j := get_job(trainer_hub, job["id"], carol))["reason"] and ":" in j["reason"] else None
        ),
        "Kueue's reason on the job",
        60,
    )
    assert queued["state"] == "queued"
    assert "whole gang (3 nodes at once)" in queued["reason"] and "quota" in queued["reason"], queued["reason"]
    trainjob = kube.get(f"{TRAINJOBS.format(ns=ns)}/gpulab-job-{job['id']}")
    assert trainjob["spec"]["suspend"] is True
    assert kube.pods(ns, f"gpulab.io/job-id={job['id']}") == []  # none of its pods, not some
    r = trainer_hub.api("POST", f"/gpulab/jobs/{job['id']}/cancel", token=carol)
    assert r.status_code == 200 and r.json()["state"] == "cancelled", r.text


def test_where_trainer_is_off_a_jobset_runs_the_same_collective(gpulab_release, release, kube, homes, tmp_path):
    ns = release.team_ns(chart_team(release, "nlp"))
    home_volume(kube, ns, homes, USER)
    hub = training_hub(gpulab_release, tmp_path / "hub", homes, "jobset", guarantee=2)
    hub.start()
    try:
        r = hub.api("POST", f"/users/{USER}")
        assert r.status_code in (201, 409), r.text
        token = user_token(hub, USER)
        job = submit_gang(hub, token, 2)
        jobset = kube.wait(lambda: kube.maybe_get(f"{JOBSETS.format(ns=ns)}/gpulab-job-{job['id']}"), "the JobSet", 30)
        assert jobset["metadata"]["labels"]["kueue.x-k8s.io/queue-name"].startswith("gpulab-")
        assert not (jobset["metadata"].get("ownerReferences"))  # the hub's own, not a TrainJob's
        done = wait_state(hub, job["id"], {"succeeded", "failed"}, timeout=240)
        assert done["state"] == "succeeded", (done, log_of(hub, token, job["id"]))
        assert "all_reduce sum 3" in log_of(hub, token, job["id"], rank=1)
    finally:
        hub.close()
