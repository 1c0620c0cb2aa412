"""What the spawn progress page says while a single-server GPU session is set up.

Pure: built from what the spawner decided (the profile, the team's quota
decision, the devices the packer chose), so the words match what happened.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from .model import Profile, Team
from .packer import GPUDevice
from .profile_facts import gib_words
from .units import MILLI_PER_GPU, format_gpus


def quota_words(team: Team, milli: int, over_quota: bool) -> str:
    """ "in quota" or "preemptible", with the team's guarantee."""
    if over_quota:
        return (
            f"above team {team.name}'s {format_gpus(team.guarantee_milli)}-GPU guarantee: preemptible "
            "(it may be stopped when the team's guaranteed work needs the GPU)"
        )
    return f"within team {team.name}'s {format_gpus(team.guarantee_milli)}-GPU guarantee: in quota, not preemptible"


def device_words(shares: Sequence[Sequence[int]], devices: Mapping[int, GPUDevice]) -> str:
    """ "GPU 0 (H100-80GB, declared): 0.5 of it, 40 GiB of 80 GiB" for each device share."""
    out = []
    for index, milli in shares:
        d = devices.get(int(index))
        if d is None:
            out.append(f"GPU {index}")
            continue
        source = "" if d.source == "nvml" else f", {d.source}"
        if int(milli) >= MILLI_PER_GPU:
            out.append(f"GPU {d.index} ({d.model}{source}): all of it")
        else:
            share = gib_words(d.memory_mib * int(milli) // MILLI_PER_GPU)
            out.append(
                f"GPU {d.index} ({d.model}{source}): {format_gpus(int(milli))} of it, "
                f"{share} of its {gib_words(d.memory_mib)} memory"
            )
    return "; ".join(out)


def setup_messages(
    profile: Profile,
    team: Team,
    milli: int,
    over_quota: bool,
    shares: Sequence[Sequence[int]],
    devices: Mapping[int, GPUDevice],
    runs_as: str,
    idle_policy: str = "",
) -> list[str]:
    """The progress page's lines, in the order the spawner did the work, then the idle policy
    (:func:`spawner.core.idle.idle_policy_text`, the sentence every page uses)."""
    if milli <= 0:
        first = f"{profile.display_name} in team {team.name}: no GPU (CPU only)"
        return [first, f"Starting JupyterLab {runs_as}"]
    lines = [
        f"Reserved {format_gpus(milli)} GPU for {profile.display_name} in team {team.name}, "
        f"{quota_words(team, milli, over_quota)}",
        "Devices: " + (device_words(shares, devices) or "none placed"),
    ]
    if idle_policy:
        lines.append(idle_policy)
    lines.append(
        f"Starting JupyterLab {runs_as} with CUDA_VISIBLE_DEVICES set to "
        + ("these devices" if len(shares) > 1 else "this device")
    )
    return lines
