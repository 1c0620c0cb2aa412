"""The environment a GPU workload is started with: one place for its variables.

The single-server spawner (notebook servers) and the single-server job runner
(papermill processes) both start user code on a share of this machine's GPUs;
both build its environment here, so a job sees exactly what a notebook would.
Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from .packer import GPUDevice
from .units import milli_to_fraction_str


def gpu_env(
    team: str,
    profile: str,
    milli: int,
    over_quota: bool,
    shares: Sequence[Sequence[int]] | None = None,
    devices: Mapping[int, GPUDevice] | None = None,
) -> dict[str, str]:
    """Variables that tell the user's code which GPUs it has and its share.

    ``shares`` are ``(device index, milli)`` pairs from the packer's placement;
    ``devices`` the packer's devices by index. Without ``shares`` (``None``: on
    Kubernetes, where the device plugin picks the devices) ``CUDA_VISIBLE_DEVICES``
    is left to the platform; an empty placement hides every GPU.
    """
    env = {
        "GPULAB_TEAM": team,
        "GPULAB_PROFILE": profile,
        "GPULAB_GPU_MILLI": str(milli),
        "GPULAB_GPU_FRACTION": milli_to_fraction_str(milli),
        "GPULAB_QUOTA": "over-quota" if over_quota else "in-quota",
        "GPULAB_PREEMPTIBLE": "1" if over_quota else "0",
    }
    if shares is None:
        return env
    if not shares:
        env["CUDA_VISIBLE_DEVICES"] = ""
        return env
    chosen = [(devices or {})[int(i)] for i, _ in shares]
    env["CUDA_VISIBLE_DEVICES"] = ",".join(d.uuid or str(d.index) for d in chosen)
    env["GPULAB_GPU_MODEL"] = chosen[0].model
    env["GPULAB_GPU_SOURCE"] = chosen[0].source
    if milli < 1000:
        per_device = int(shares[0][1])
        env["GPULAB_GPU_MEMORY_MIB"] = str(chosen[0].memory_mib * per_device // 1000)
        # Framework knobs that keep a process inside its share of memory.
        env["XLA_PYTHON_CLIENT_MEM_FRACTION"] = milli_to_fraction_str(per_device)
        env["XLA_PYTHON_CLIENT_PREALLOCATE"] = "false"
        env["TF_FORCE_GPU_ALLOW_GROWTH"] = "true"
    else:
        env["GPULAB_GPU_MEMORY_MIB"] = str(sum(d.memory_mib for d in chosen))
    return env
