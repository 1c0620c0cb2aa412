"""A Kubernetes job request for the manifest tests (spawner/core/jobspec.py): carol of team
nlp, a training notebook with hostile parameters, on the catalog's profiles."""

from __future__ import annotations

from spawner.core import jobspec
from spawner.core.catalog import catalog_from_dict
from spawner.core.labels import workload_annotations, workload_labels
from spawner.core.ledger import Workload
from spawner.core.sharing import pod_gpu_spec

CATALOG = catalog_from_dict(
    {
        "sharing": {"backend": "mig"},
        "profiles": [
            {
                "slug": "h100-2",
                "display_name": "2 x H100",
                "gpus": 2,
                "gpu_model": "H100-80GB",
                "cpu": {"guarantee": 4, "limit": 8},
                "memory": {"guarantee": "32G", "limit": "64G"},
            },
            {"slug": "mig-3g", "display_name": "3g.40gb", "gpus": 0.5, "gpu_model": "H100-80GB"},
        ],
        "teams": [{"name": "nlp", "users": ["carol"], "guarantee": 4, "burst": 8, "namespace": "team-nlp"}],
    },
    "test",
)


def request(profile_slug: str, **kw) -> jobspec.KubeJobRequest:
    profile = CATALOG.profile(profile_slug)
    team = CATALOG.teams["nlp"]
    gpu = pod_gpu_spec(profile, CATALOG.sharing, team)
    w = Workload(
        "job:42", "nlp", "carol@example.org", gpu.effective_milli, profile.slug, "job", kw.get("over_quota", False)
    )
    args = dict(
        job_id=42,
        name="train",
        user="carol@example.org",
        namespace="team-nlp",
        image="example.org/nb:1",
        job_class="training",
        over_quota=False,
        notebook="exp/train.ipynb",
        output_path="exp/runs/train-1.ipynb",
        log_path="exp/runs/train-1.log",
        parameters={"epochs": 3, "name": 'it\'s "quoted"; rm -rf /'},
        time_limit_seconds=7200,
        labels=workload_labels(w),
        annotations=workload_annotations(w),
        gpu=gpu,
        home_claim="claim-carol-40example-2eorg",
        cpu_guarantee=profile.cpu_guarantee,
        cpu_limit=profile.cpu_limit,
        mem_guarantee=profile.mem_guarantee,
        mem_limit=profile.mem_limit,
    )
    args.update(kw)
    return jobspec.KubeJobRequest(**args)
