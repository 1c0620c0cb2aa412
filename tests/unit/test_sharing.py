"""The pure GPU-sharing mappings (spawner/core/sharing.py)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from spawner.core.catalog import CatalogError, catalog_from_dict
from spawner.core.catalog.sharing import sharing_config_issues, validate_sharing_config
from spawner.core.catalog.yaml_text import catalog_from_yaml
from spawner.core.model import Profile, Team
from spawner.core.sharing import (
    DEFAULT_MIG_PROFILES,
    MAPPERS,
    SharingError,
    backend_for,
    effective_milli,
    mig_table,
    pick_mig_slice,
    pod_gpu_spec,
    timeslice_effective_milli,
)

TEAM = Team(name="vision", guarantee_milli=2000, burst_milli=3000)


def profile(milli: int, model: str | None = "H100-80GB", sharing: str | None = None, slug: str = "p") -> Profile:
    return Profile(slug=slug, display_name=slug, gpu_milli=milli, gpu_model=model, sharing=sharing)


def test_whole_gives_whole_gpus_and_refuses_fractions():
    spec = pod_gpu_spec(profile(2000), {"backend": "whole"}, TEAM)
    assert dict(spec.limits) == dict(spec.requests) == {"nvidia.com/gpu": "2"}
    assert spec.effective_milli == 2000 and spec.scheduler_name is None
    assert dict(spec.node_selector) == {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}
    with pytest.raises(SharingError, match=r"asks for 0\.5 GPU, but this cluster gives whole GPUs only"):
        pod_gpu_spec(profile(500), {"backend": "whole"}, TEAM)


@pytest.mark.parametrize(
    "milli,replicas,k,effective",
    [
        (250, 4, 1, 250),
        (300, 4, 2, 500),
        (500, 4, 2, 500),
        (750, 4, 3, 750),
        (1, 4, 1, 250),
        (333, 3, 1, 334),
        (334, 3, 2, 667),
        (100, 10, 1, 100),
        (999, 2, 2, 1000),
    ],
)
def test_timeslice_rounds_up_to_k_of_r(milli, replicas, k, effective):
    # k > 1 replicas only when the device plugin is told to allow it.
    cfg = {"backend": "timeslice", "timeslice": {"replicas": replicas, "fail_requests_greater_than_one": False}}
    spec = pod_gpu_spec(profile(milli), cfg, TEAM)
    assert dict(spec.limits) == {"nvidia.com/gpu.shared": str(k)}
    assert spec.effective_milli == effective
    assert spec.rounded == (effective != milli)


def test_timeslice_options():
    cfg = {
        "backend": "timeslice",
        "timeslice": {"resource": "nvidia.com/gpu-ts", "replicas": 2, "whole_resource": "nvidia.com/gpu-exclusive"},
    }
    assert dict(pod_gpu_spec(profile(500), cfg, TEAM).limits) == {"nvidia.com/gpu-ts": "1"}
    assert dict(pod_gpu_spec(profile(2000), cfg, TEAM).limits) == {"nvidia.com/gpu-exclusive": "2"}
    # NVIDIA's recommendation is the default: one replica per pod, so only 1/R is offered.
    default = {"backend": "timeslice", "timeslice": {"replicas": 4}}
    assert dict(pod_gpu_spec(profile(250), default, TEAM).limits) == {"nvidia.com/gpu.shared": "1"}
    with pytest.raises(
        SharingError,
        match=r"failRequestsGreaterThanOne.*neither 0\.5 of the compute nor "
        r"of the memory; offer 0\.25 GPU",
    ):
        pod_gpu_spec(profile(500), default, TEAM)
    # Whole GPUs come from the whole-GPU pool: nvidia.com/gpu, not the shared resource.
    assert dict(pod_gpu_spec(profile(1000), default, TEAM).limits) == {"nvidia.com/gpu": "1"}


@given(st.integers(1, 999), st.integers(1, 64))
def test_timeslice_effective_covers_and_is_the_next_step(milli, replicas):
    k, eff = timeslice_effective_milli(milli, replicas)
    assert eff >= milli and k * 1000 >= milli * replicas
    assert (k - 1) * 1000 < milli * replicas  # k-1 slices would not cover it
    assert eff - milli < 1000 / replicas + 1


@pytest.mark.parametrize(
    "model,milli,slice_,effective",
    [
        ("H100-80GB", 500, "4g.40gb", 572),  # 3.5/7 compute needs 4 slices
        ("H100-80GB", 250, "2g.20gb", 286),
        ("H100-80GB", 125, "1g.10gb", 143),
        ("H100-80GB", 142, "1g.20gb", 250),  # 1/7 compute covers 0.142, 1g.10gb's memory (1/8) does not
        ("H100-80GB", 143, "2g.20gb", 286),  # 0.143 is more than 1/7 of the compute
        ("H100-80GB", 900, "7g.80gb", 1000),
        ("A100-40GB", 125, "1g.5gb", 143),
        ("A100-40GB", 250, "2g.10gb", 286),
        ("A100-40GB", 500, "4g.20gb", 572),
        ("A100-80GB", 400, "3g.40gb", 500),
        ("H200-141GB", 250, "2g.35gb", 286),
        ("H200-141GB", 500, "4g.71gb", 572),
    ],
)
def test_mig_picks_the_smallest_covering_slice(model, milli, slice_, effective):
    spec = pod_gpu_spec(profile(milli, model), {"backend": "mig"}, TEAM)
    assert dict(spec.limits) == {f"nvidia.com/mig-{slice_}": "1"}
    assert spec.effective_milli == effective


@pytest.mark.parametrize("model", sorted(DEFAULT_MIG_PROFILES))
@given(milli=st.integers(1, 999))
def test_mig_choice_covers_and_nothing_smaller_does(model, milli):
    table = mig_table(model)
    chosen, eff = pick_mig_slice(table, milli)
    total_c, total_m = max(s.compute for s in table), max(s.memory_gb for s in table)
    # MIG memory comes in eighths of the GPU; the names round the gigabytes.
    eighths = lambda s: round(8 * s.memory_gb / total_m)  # noqa: E731
    covers = lambda s: s.compute / total_c >= milli / 1000 and eighths(s) / 8 >= milli / 1000  # noqa: E731
    assert covers(chosen) and eff >= milli
    share = lambda s: max(s.compute / total_c, eighths(s) / 8)  # noqa: E731
    assert all(share(s) >= share(chosen) for s in table if covers(s))
    assert abs(eff / 1000 - share(chosen)) < 0.001


def test_mig_needs_a_known_model_and_takes_extra_tables():
    with pytest.raises(SharingError, match="needs a gpu_model"):
        pod_gpu_spec(profile(500, None), {"backend": "mig"}, TEAM)
    with pytest.raises(SharingError, match="no MIG profiles are known for GPU model 'A30-24GB'"):
        pod_gpu_spec(profile(500, "A30-24GB"), {"backend": "mig"}, TEAM)
    cfg = {
        "backend": "mig",
        "mig": {
            "profiles": {"A30-24GB": ["1g.6gb", "2g.12gb", "4g.24gb"]},
            "node_selector": {"A30-24GB": {"nvidia.com/gpu.product": "NVIDIA-A30"}},
        },
    }
    spec = pod_gpu_spec(profile(500, "A30-24GB"), cfg, TEAM)
    assert dict(spec.limits) == {"nvidia.com/mig-2g.12gb": "1"} and spec.effective_milli == 500
    assert dict(spec.node_selector) == {"nvidia.com/gpu.product": "NVIDIA-A30"}


@pytest.mark.parametrize(
    "labels",
    [
        {"cloud.google.com/gke-accelerator": "nvidia-h100-80gb"},  # GKE's node pools
        {"karpenter.k8s.aws/instance-gpu-name": "h100"},  # Karpenter's well-known label
        {"gpulab.io/pool": "h100"},  # an admin's own, declared on the autoscaler's node template
    ],
)
@pytest.mark.parametrize("backend", ["whole", "timeslice", "mig"])
def test_a_pool_can_select_on_node_template_labels_to_scale_from_zero(backend, labels):
    """GPU Feature Discovery labels a node only after it booted: a profile selecting on
    nvidia.com/gpu.product never makes an autoscaler add the first node of a pool. The
    configured node-template labels replace it, alone."""
    cfg = {"backend": backend, backend: {"node_selector": {"H100-80GB": labels}}}
    spec = pod_gpu_spec(profile({"whole": 1000, "timeslice": 250, "mig": 500}[backend]), cfg, TEAM)
    assert dict(spec.node_selector) == labels
    assert not any("nvidia.com/gpu.product" in str(r) for r in spec.node_requirements)


def test_hami_percentages():
    spec = pod_gpu_spec(profile(500), {"backend": "hami"}, TEAM)
    assert dict(spec.limits) == {
        "nvidia.com/gpu": "1",
        "nvidia.com/gpumem-percentage": "50",
        "nvidia.com/gpucores": "50",
    }
    # HAMi's webhook skips pods that already name another scheduler (z2jh's
    # user-scheduler): the pod must name HAMi's, fractions and whole GPUs alike.
    assert spec.effective_milli == 500 and spec.scheduler_name == "hami-scheduler"
    assert pod_gpu_spec(profile(2000), {"backend": "hami"}, TEAM).scheduler_name == "hami-scheduler"
    odd = pod_gpu_spec(profile(333), {"backend": "hami", "hami": {"scheduler_name": "my-hami"}}, TEAM)
    assert odd.limits["nvidia.com/gpumem-percentage"] == "34" and odd.effective_milli == 340
    assert odd.scheduler_name == "my-hami"


def test_kai_fraction_queue_and_scheduler():
    spec = pod_gpu_spec(profile(500), {"backend": "kai", "kai": {"queue": "team-{team}"}}, TEAM)
    assert dict(spec.annotations) == {"gpu-fraction": "0.5"}
    assert dict(spec.labels) == {"kai.scheduler/queue": "team-vision"}
    assert spec.scheduler_name == "kai-scheduler" and not spec.limits
    whole = pod_gpu_spec(profile(2000), {"backend": "kai"}, TEAM)
    assert dict(whole.limits) == {"nvidia.com/gpu": "2"} and not whole.annotations
    assert dict(whole.labels) == {"kai.scheduler/queue": "vision"}


def test_profile_override_cpu_profiles_and_unknown_models():
    assert backend_for(profile(500, sharing="kai"), {"backend": "timeslice"}) == "kai"
    assert backend_for(profile(500), {}) == "whole"
    cpu = pod_gpu_spec(profile(0, None), {"backend": "mig"}, TEAM)
    assert cpu.effective_milli == 0 and not cpu.limits and not cpu.node_selector
    anywhere = pod_gpu_spec(profile(1000, None), {"backend": "whole"}, TEAM)
    assert not anywhere.node_selector
    with pytest.raises(SharingError, match="no node selector is known for GPU model 'L4'"):
        pod_gpu_spec(profile(1000, "L4"), {"backend": "whole"}, TEAM)
    with pytest.raises(SharingError, match="above one GPU"):
        pod_gpu_spec(profile(1500), {"backend": "timeslice"}, TEAM)
    assert effective_milli(profile(200), {"backend": "timeslice"}) == 250
    assert effective_milli(profile(300), {"backend": "whole"}) == 300  # unmappable: shown as asked
    assert set(MAPPERS) == {"whole", "timeslice", "mig", "hami", "kai"}


def test_config_validation_messages():
    assert sharing_config_issues({"backend": "timeslice", "timeslice": {"replicas": 4}}) == []
    issues = dict(
        sharing_config_issues(
            {
                "timeslice": {"replicas": 0, "colour": "red", "resource": "not a name"},
                "mig": {"profiles": {"A30-24GB": ["1g.6gb", "big"]}},
                "kai": {"queue": "{project}"},
                "hami": {"node_selector": {"H100-80GB": {"nvidia.com/gpu.product": "has spaces"}}},
            }
        )
    )
    assert "replicas per GPU from 1 to 1000, got 0" in issues[("timeslice", "replicas")]
    assert issues[("timeslice", "colour")].startswith("unknown option; timeslice accepts")
    assert "resource or label name" in issues[("timeslice", "resource")]
    assert "MIG profile name like 3g.40gb, got 'big'" in issues[("mig", "profiles", "A30-24GB", "1")]
    assert "using only {team}" in issues[("kai", "queue")]
    assert "node labels like" in issues[("hami", "node_selector", "H100-80GB")]
    with pytest.raises(SharingError, match=r"sharing\.timeslice\.replicas"):
        validate_sharing_config({"timeslice": {"replicas": True}})


def test_catalog_loader_reports_sharing_option_errors_with_lines():
    text = "sharing:\n  backend: timeslice\n  timeslice:\n    replicas: -2\n"
    with pytest.raises(CatalogError) as e:
        catalog_from_yaml(text, "teams.yaml")
    assert "teams.yaml:4: sharing.timeslice.replicas: expected a whole number of replicas" in str(e.value)
    ok = catalog_from_dict({"sharing": {"backend": "mig", "mig": {"profiles": {"A30-24GB": ["1g.6gb"]}}}})
    assert ok.sharing["backend"] == "mig"


def test_a_pod_without_a_gpu_gets_nvidia_visible_devices_void():
    """The NVIDIA container toolkit gives a container the GPUs NVIDIA_VISIBLE_DEVICES names;
    CUDA images set ``all``. ``void``: the runtime acts as runc (no GPU, no driver)."""
    from spawner.core.catalog import catalog_from_dict
    from spawner.core.sharing import pod_gpu_spec

    catalog = catalog_from_dict(
        {
            "profiles": [{"slug": "cpu", "gpus": 0}, {"slug": "h100-1", "gpus": 1, "gpu_model": "H100-80GB"}],
            "teams": [{"name": "t", "guarantee": 1}],
        },
        "test",
    )
    assert pod_gpu_spec(catalog.profiles["cpu"], catalog.sharing).env == {"NVIDIA_VISIBLE_DEVICES": "void"}
    assert pod_gpu_spec(catalog.profiles["h100-1"], catalog.sharing).env == {}


@pytest.mark.parametrize(
    "backend,gpus,selector,requirements",
    [
        ("whole", 1, {}, [{"key": "gpu", "operator": "NotIn", "values": ["on"]}]),
        ("timeslice", 0.25, {}, []),  # nvidia.com/gpu.shared: HAMi nodes do not advertise it
        ("timeslice", 2, {}, [{"key": "gpu", "operator": "NotIn", "values": ["on"]}]),
        ("mig", 0.5, {}, []),
        ("kai", 1, {}, [{"key": "gpu", "operator": "NotIn", "values": ["on"]}]),
        ("hami", 0.5, {"gpu": "on"}, []),
        ("hami", 1, {"gpu": "on"}, []),
    ],
)
def test_only_hami_pods_use_hami_nodes(backend, gpus, selector, requirements):
    """A HAMi node advertises nvidia.com/gpu like a whole-GPU node, but HAMi's device plugin
    fails any pod its scheduler did not place (UnexpectedAdmissionError)."""
    from spawner.core.catalog import catalog_from_dict
    from spawner.core.sharing import GPU_PRODUCT_LABEL, pod_gpu_spec

    catalog = catalog_from_dict(
        {
            "sharing": {"backend": backend},
            "profiles": [{"slug": "p", "gpus": gpus, "gpu_model": "H100-80GB"}],
            "teams": [{"name": "t", "guarantee": 1}],
        },
        "test",
    )
    spec = pod_gpu_spec(catalog.profiles["p"], catalog.sharing, catalog.teams["t"])
    assert {k: v for k, v in spec.node_selector.items() if k != GPU_PRODUCT_LABEL} == selector
    assert list(spec.node_requirements) == requirements


def test_pool_requirements_are_anded_into_every_node_affinity_term():
    from spawner.core.gpu_pools import and_node_affinity

    zone = {"key": "zone", "operator": "In", "values": ["a"]}
    pool = {"key": "gpu", "operator": "NotIn", "values": ["on"]}
    assert and_node_affinity([], [pool]) == [{"matchExpressions": [pool]}]
    assert and_node_affinity([{"matchExpressions": [zone]}, {"matchFields": []}], [pool]) == [
        {"matchExpressions": [zone, pool]},
        {"matchFields": [], "matchExpressions": [pool]},
    ]
    assert and_node_affinity([{"matchExpressions": [zone]}], []) == [{"matchExpressions": [zone]}]


def test_time_slices_under_the_whole_gpu_name_select_the_shared_product_label():
    """With timeslice.resource nvidia.com/gpu (renameByDefault: false) GPU feature discovery
    labels time-shared nodes <product>-SHARED (k8s-device-plugin internal/lm/resource.go);
    the plain product name then matches only whole-GPU nodes, and fractions waited forever."""
    from spawner.core.catalog import catalog_from_dict
    from spawner.core.sharing import GPU_PRODUCT_LABEL, pod_gpu_spec

    def selector(resource: str, gpus: float) -> str:
        catalog = catalog_from_dict(
            {
                "sharing": {"backend": "timeslice", "timeslice": {"resource": resource}},
                "profiles": [{"slug": "p", "gpus": gpus, "gpu_model": "H100-80GB"}],
                "teams": [{"name": "t", "guarantee": 1}],
            },
            "test",
        )
        return pod_gpu_spec(catalog.profiles["p"], catalog.sharing).node_selector[GPU_PRODUCT_LABEL]

    assert selector("nvidia.com/gpu", 0.25) == "NVIDIA-H100-80GB-HBM3-SHARED"
    assert selector("nvidia.com/gpu", 1) == "NVIDIA-H100-80GB-HBM3"  # whole GPUs: the whole pool
    assert selector("nvidia.com/gpu.shared", 0.25) == "NVIDIA-H100-80GB-HBM3"  # renamed: label unchanged
