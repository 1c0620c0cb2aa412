"""The right-size line for a user about to start a profile, from their recorded sessions.

The decision is :func:`spawner.core.rightsize.right_size_hint`; this reads the evidence
(:func:`.session_history.session_uses`: NVML samples on the single server, Prometheus'
figures on Kubernetes) and the memory each profile gives here: the machine's devices, the
catalog's inventory, else the device memory the sessions' own GPUs reported (dcgm-exporter's
used + free frame buffer, where the catalog declares no memory for the model).
"""

from __future__ import annotations

from sqlalchemy.orm import Session, sessionmaker

from hub_config.domain.session_history import session_uses
from spawner.core.model import Profile
from spawner.core.profile_facts import device_memory
from spawner.core.rightsize import RightSizeHint, right_size_hint
from spawner.core.units import MILLI_PER_GPU
from spawner.runtime import GPULabRuntime

#: Sessions of the evidence (the newest of the user's for the profile).
WINDOW = 10


def hint_for(
    runtime: GPULabRuntime, sessions: sessionmaker[Session], user: str, profile: Profile
) -> RightSizeHint | None:
    """The hint for ``user`` about to start ``profile``, or ``None``."""
    if not profile.is_gpu:
        return None
    packer = runtime.packer
    devices = [(d.model, d.memory_mib) for d in packer.devices.values()] if packer is not None else []

    uses = session_uses(sessions, user, profile.slug, WINDOW)
    # The evidence's own devices are of the profile's model: the smallest any reported.
    reported = [round(u.device_memory_mib) for u in uses if u.device_memory_mib]
    seen = min(reported) if reported else 0

    def memory_mib_of(p: Profile, milli: int) -> int | None:
        mib = device_memory(p.gpu_model, devices, runtime.catalog.inventory).mib
        if not mib and p.gpu_model == profile.gpu_model:
            mib = seen
        return mib * milli // MILLI_PER_GPU if mib else None

    candidates = [p for p in runtime.catalog.profiles.values() if not p.retired]
    return right_size_hint(profile, candidates, uses, memory_mib_of)


def right_size_line(runtime: GPULabRuntime, sessions: sessionmaker[Session], user: str, profile: Profile) -> str:
    """The one line the spawn page and the sidebar show ('' when no smaller profile would have done)."""
    hint = hint_for(runtime, sessions, user, profile)
    return hint.line if hint is not None else ""
