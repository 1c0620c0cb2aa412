"""gpulab's GPU-aware idle culler: a JupyterHub service (see docs/idle-culler.md)."""

from .app import GPUIdleCuller, main

__all__ = ["GPUIdleCuller", "main"]
