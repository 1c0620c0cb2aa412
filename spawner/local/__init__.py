"""The single server: ``gpu-local``, ``gpu-simple-local`` and ``gpulab-launch``.

Read first: :mod:`.spawner` (the two spawners: admission, device placement, start);
:mod:`.account_spawner` runs a server as its user's system account (:mod:`.accounts`),
as root or, for a hub that is not root, through ``sudo -n`` and the mediator
(:mod:`.sudo` asks, :mod:`.mediator` is ``gpulab-launch``, standard library only);
:mod:`.nvml` is the one NVML adapter (the hub's inventory, the culler, the lab);
:mod:`.inventory` the machine's GPUs and the device packer every placement shares.

The spawners are public for deployments (``spawner.local:GPULocalSpawner`` and
``spawner.local:GPUSimpleLocalSpawner`` are the entry points). They are imported on
first use, not with the package: the mediator, which sudo runs for every request a
non-root hub makes, and the NVML adapter must not pay for importing JupyterHub.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .inventory import ensure_packer
    from .spawner import GPULocalMixin, GPULocalSpawner, GPUSimpleLocalSpawner

__all__ = ["GPULocalMixin", "GPULocalSpawner", "GPUSimpleLocalSpawner", "ensure_packer"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from . import spawner

        return getattr(spawner, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
