"""What a profile gives, as both spawn pages say it: GPU share and GPU memory (from the
machine's devices, the catalog's inventory or the model's name; a MIG slice's own memory),
CPU and RAM (the profile's, or what the server really runs under), and the images."""

from __future__ import annotations

from spawner.core.catalog import catalog_from_dict
from spawner.core.catalog.inventory import DeviceSpec
from spawner.core.form import render_options_form
from spawner.core.ledger import Ledger
from spawner.core.policy import choices_for_user
from spawner.core.profile_facts import DeviceMemory, device_memory, profile_facts
from spawner.core.sharing import pod_gpu_spec

CATALOG = catalog_from_dict(
    {
        "profiles": [
            {
                "slug": "cpu",
                "display_name": "CPU only",
                "gpus": 0,
                "cpu": {"guarantee": 1, "limit": 2},
                "memory": {"guarantee": "2Gi", "limit": "4Gi"},
            },
            {
                "slug": "q",
                "display_name": "0.25 × H100",
                "gpus": 0.25,
                "gpu_model": "H100-80GB",
                "memory": {"limit": "16Gi"},
                "images": [
                    {"slug": "torch", "display_name": "PyTorch", "image": "quay.io/jupyter/pytorch-notebook"},
                    {"slug": "jax", "display_name": "JAX", "image": "example.org/jax"},
                ],
            },
            {"slug": "mig", "display_name": "MIG 1g.10gb", "gpus": 0.125, "gpu_model": "H100-80GB", "sharing": "mig"},
            {"slug": "two", "display_name": "2 × H100", "gpus": 2, "gpu_model": "H100-80GB", "cpu": {"limit": 16}},
        ],
        "teams": [{"name": "vision", "users": ["alice"], "guarantee": 2, "burst": 2}],
    }
)
H100 = DeviceMemory(mib=81559)


def profile(slug: str):
    p = CATALOG.profile(slug)
    assert p is not None
    return p


def test_fractional_whole_mig_and_cpu_profiles_say_what_they_give():
    q = profile_facts(profile("q"), 250, H100)
    assert q == ["0.25 × H100-80GB · 19.9 GiB GPU memory", "CPU not limited · up to 16 GiB RAM", "Images: PyTorch, JAX"]
    two = profile_facts(profile("two"), 2000, H100)
    assert two[0] == "2 × H100-80GB · 159.3 GiB GPU memory"
    assert two[1] == "up to 16 CPU · RAM not limited"
    spec = pod_gpu_spec(profile("mig"), {"backend": "mig"})
    assert spec.mig_slice == "1g.10gb"
    mig = profile_facts(profile("mig"), spec.effective_milli, H100, mig_slice=spec.mig_slice)
    assert mig[0] == "MIG slice 1g.10gb of one H100-80GB · 10 GB GPU memory"
    cpu = profile_facts(profile("cpu"), 0, DeviceMemory())
    assert cpu == ["No GPU", "1 CPU guaranteed, up to 2 · 2 GiB RAM guaranteed, up to 4 GiB"]


def test_what_the_server_runs_under_replaces_the_profiles_limits():
    # The single server's team cap (or hub default) is what a server really gets.
    facts = profile_facts(profile("q"), 250, H100, cpu_limit=4, mem_limit=8 << 30)
    assert facts[1] == "up to 4 CPU · up to 8 GiB RAM"


def test_device_memory_from_devices_then_inventory_then_the_models_name():
    assert device_memory("H100-80GB", [("A100-40GB", 40960), ("H100-80GB", 81559)]) == DeviceMemory(mib=81559)
    assert device_memory("H100-80GB", (), [DeviceSpec("H100-80GB", 8, 81559)]) == DeviceMemory(mib=81559)
    named = device_memory("H200-141GB")
    assert named == DeviceMemory(named_gb=141) and named.share_words(500) == "70.5 GB"
    assert device_memory("A100-SXM4-40GB").named_gb == 40
    assert device_memory("T4") == DeviceMemory() and DeviceMemory().share_words(500) == ""
    # A profile of any model takes the first device the machine has.
    assert device_memory(None, [("H100-80GB", 81559)]) == DeviceMemory(mib=81559)


def test_the_spawn_form_shows_the_facts_first_on_each_card_and_the_cap_once_per_team():
    catalog = catalog_from_dict(
        {
            "profiles": [{"slug": "q", "display_name": "0.25 × H100", "gpus": 0.25, "gpu_model": "H100-80GB"}],
            "teams": [{"name": "vision", "users": ["alice"], "guarantee": 1, "burst": 1, "per_user_cap": 0.5}],
        }
    )
    choices = choices_for_user(catalog, Ledger(catalog.teams), "alice")
    html = render_options_form(choices, gives=lambda c: profile_facts(c.profile, c.profile.gpu_milli, H100))
    card = html[html.index('<label class="gpulab-profile') :]
    assert card.index("0.25 × H100-80GB · 19.9 GiB GPU memory") < card.index("</label>")
    assert 'class="gpulab-gives"' in card
    assert html.count("at most 0.5 GPUs per user") == 1  # in the team's heading, not on each card
    assert "per-user cap in team" not in html
    assert '<div class="gpulab-cards">' in html
