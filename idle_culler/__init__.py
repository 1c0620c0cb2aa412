"""gpulab's GPU-aware idle culler: a JupyterHub service (see docs/idle-culler.md).

Start at :mod:`.app` (``GPUIdleCuller``: its traits and one cycle, read -> plan -> apply);
:mod:`.plan` decides each server without I/O (with :mod:`spawner.core.idle`), :mod:`.targets`
finds the GPU servers in the hub's REST API, :mod:`.sources`, :mod:`.dcgm_exporter_source` and
:mod:`.nvml_source` read utilisation, :mod:`.hub` talks to the hub, :mod:`.reclaim` records a
cycle and stops what the hub granted, :mod:`.metrics` exports the culler's own.
"""

from .app import GPUIdleCuller, main

__all__ = ["GPUIdleCuller", "main"]
