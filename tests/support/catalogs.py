"""Sample catalogs the tests and benchmarks start hubs and spawners with.

One place for each: a test that needs a variant builds it from these
(``{**KUBE_SPAWNER, "sharing": ...}``, or YAML from the fragments below) rather than
pasting a copy. A module keeps its own teams when its assertions count their quotas.
"""

from __future__ import annotations


def h100_inventory(count: int) -> str:
    """The YAML ``inventory`` of a single server with ``count`` H100 80GB (no NVML here)."""
    return f"inventory:\n  - {{model: H100-80GB, count: {count}, memory_mib: 81559}}\n"


#: YAML profile entries: a CPU-only server and the three H100 sizes most tests offer.
CPU_PROFILE = "  - {slug: cpu, display_name: CPU only, gpus: 0}\n"
H100_QUARTER = '  - {slug: h100-quarter, display_name: "0.25 × H100", gpus: 0.25, gpu_model: H100-80GB}\n'
H100_HALF = '  - {slug: h100-half, display_name: "0.5 × H100", gpus: 0.5, gpu_model: H100-80GB}\n'
H100_ONE = '  - {slug: h100-1, display_name: "1 × H100", gpus: 1, gpu_model: H100-80GB}\n'
H100_PROFILES = "profiles:\n" + H100_QUARTER + H100_HALF + H100_ONE
#: YAML team entries: vision (alice and bob, half a GPU guaranteed, one at most) and nlp (carol).
VISION_TEAM = (
    "  - {name: vision, display_name: Computer vision, users: [alice, bob], guarantee: 0.5, burst: 1,\n"
    "     allowed_profiles: [h100-quarter, h100-half, h100-1]}\n"
)
NLP_TEAM = "  - {name: nlp, display_name: Language models, users: [carol], guarantee: 1, burst: 2}\n"

#: The GPUKubeSpawner tests' catalog: H100 fractions under time-slicing, three teams
#: (one by group), a team-only profile and a whole-GPU profile.
KUBE_SPAWNER = {
    "profiles": [
        {"slug": "cpu", "display_name": "CPU only", "gpus": 0},
        {"slug": "h100-quarter", "display_name": "0.25 × H100", "gpus": 0.25, "gpu_model": "H100-80GB"},
        {
            "slug": "h100-half",
            "display_name": "0.5 × H100",
            "gpus": 0.5,
            "gpu_model": "H100-80GB",
            "cpu": {"guarantee": 1, "limit": 4},
            "memory": {"guarantee": "8G", "limit": "16G"},
            "images": [
                {"slug": "torch", "display_name": "PyTorch", "image": "quay.io/jupyter/pytorch-notebook:2024-10-07"},
                {"slug": "base", "display_name": "Base", "image": "quay.io/jupyter/base-notebook:2024-10-07"},
            ],
        },
        {"slug": "h100-third", "display_name": "0.3 × H100", "gpus": 0.3, "gpu_model": "H100-80GB"},
        {"slug": "h100-1", "display_name": "1 × H100", "gpus": 1, "gpu_model": "H100-80GB"},
        {"slug": "h100-2-whole", "display_name": "2 × H100", "gpus": 2, "gpu_model": "H100-80GB", "sharing": "whole"},
        {"slug": "nlp-only", "display_name": "NLP box", "gpus": 1, "gpu_model": "H100-80GB", "teams": ["nlp"]},
    ],
    "teams": [
        {
            "name": "vision",
            "users": ["alice", "bob"],
            "guarantee": 2,
            "burst": 3,
            "namespace": "team-vision",
            "allowed_profiles": ["cpu", "h100-quarter", "h100-half", "h100-third", "h100-1", "h100-2-whole"],
        },
        {"name": "nlp", "users": ["carol", "alice"], "guarantee": 1, "burst": 2, "namespace": "team-nlp"},
        {"name": "crowd", "groups": ["crowd"], "guarantee": 4, "burst": 6, "namespace": "team-crowd"},
    ],
    # k-of-R time-slices (0.5 = 2 of 4) only with the device plugin's
    # failRequestsGreaterThanOne turned off; these tests exercise that rounding.
    "sharing": {
        "backend": "timeslice",
        "timeslice": {"replicas": 4, "fail_requests_greater_than_one": False},
        "kai": {"queue": "gpulab-{team}"},
    },
}


#: The hub pages' catalog: two H100s, CPU and three H100 sizes with idle timeouts; vision (alice and
#: bob, per-user cap 1) and nlp (alice): alice sees two teams, and bob's half GPU leaves vision 0.5.
HUB_PAGES = """
inventory:
  - {model: H100-80GB, count: 2, memory_mib: 81559}
prices: {H100-80GB: 2.5}
profiles:
  - {slug: cpu, display_name: "CPU only", gpus: 0}
  - {slug: h100-quarter, display_name: "0.25 × H100", gpus: 0.25, gpu_model: H100-80GB, idle_timeout: 4h}
  - {slug: h100-half, display_name: "0.5 × H100", gpus: 0.5, gpu_model: H100-80GB, idle_timeout: 2h}
  - {slug: h100-1, display_name: "1 × H100", gpus: 1, gpu_model: H100-80GB, idle_timeout: 1h}
teams:
  - {name: vision, display_name: Computer vision, users: [alice, bob], guarantee: 0.5, burst: 1,
     per_user_cap: 1, allowed_profiles: [cpu, h100-quarter, h100-half, h100-1]}
  - {name: nlp, display_name: Language models, users: [alice], guarantee: 1, burst: 1,
     allowed_profiles: [h100-quarter]}
"""


#: The spawn page at its largest common size: three teams of four profiles each (CPU, a quarter,
#: half and one H100, one with two images) for alice on a server of four H100s. Team speech's
#: burst of 0.5 leaves its 1 × H100 unavailable, so a card with a reason and what to do is measured too.
SPAWN_THREE_TEAMS = """
inventory:
  - {model: H100-80GB, count: 4, memory_mib: 81559}
profiles:
  - {slug: cpu, display_name: "CPU only", gpus: 0, cpu: {limit: 2}, memory: {guarantee: 2Gi, limit: 4Gi}}
  - {slug: h100-quarter, display_name: "0.25 × H100", gpus: 0.25, gpu_model: H100-80GB, idle_timeout: 4h,
     memory: {limit: 16Gi}}
  - {slug: h100-half, display_name: "0.5 × H100", gpus: 0.5, gpu_model: H100-80GB, idle_timeout: 2h,
     cpu: {guarantee: 2, limit: 8}, memory: {limit: 32Gi},
     images: [{slug: torch, display_name: PyTorch, image: quay.io/jupyter/pytorch-notebook},
              {slug: base, display_name: Base, image: quay.io/jupyter/base-notebook}]}
  - {slug: h100-1, display_name: "1 × H100", gpus: 1, gpu_model: H100-80GB, idle_timeout: 1h,
     cpu: {limit: 16}, memory: {limit: 64Gi}}
teams:
  - {name: vision, display_name: Computer vision, users: [alice], guarantee: 1, burst: 2, per_user_cap: 1.5}
  - {name: nlp, display_name: Language models, users: [alice], guarantee: 1, burst: 1}
  - {name: speech, display_name: Speech, users: [alice], guarantee: 0.5, burst: 0.5}
"""
