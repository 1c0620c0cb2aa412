"""The embedded hub's GPU idle culler: on by default where there is something to measure.

With an NVIDIA driver (NVML answers), the culler runs as a hub-managed service
with the ``nvml`` source (per-process use on this machine, no Prometheus
needed). Without one, it stays off -- with no GPU metrics it could never prove
a GPU idle, and it never guesses -- and the admin page says why
(``c.GPULabIdle.culler_status``). ``GPULAB_IDLE_CULLER=off`` turns it off;
``GPULAB_IDLE_CULLER_ARGS`` adds command-line options (e.g. ``--timeout=1800``).
"""

from __future__ import annotations

import os
import shlex
import sys
from collections.abc import Callable

from hub_config.config.scopes import CULLER_SERVICE_SCOPES
from hub_config.domain.idle_records import CULLER_SERVICE as SERVICE
from spawner.local.nvml import detect_gpus


def configure_idle_culler(c, detect: Callable[[], list | None] | None = None) -> bool:
    """Add the culler service to ``c`` when a driver is present; True when it will run."""
    if detect is None:
        detect = detect_gpus
    setting = os.environ.get("GPULAB_IDLE_CULLER", "auto").strip().lower()
    if setting in ("0", "off", "false", "no"):
        c.GPULabIdle.culler_running = False
        c.GPULabIdle.culler_status = "Off: GPULAB_IDLE_CULLER=off. Idle GPUs are not reclaimed."
        return False
    gpus = detect()
    if not gpus:
        c.GPULabIdle.culler_running = False
        c.GPULabIdle.culler_status = (
            "Off: no NVIDIA driver found on this machine (NVML did not answer), so there are no GPU "
            "utilisation samples and the culler could never prove a GPU idle. Install the NVIDIA driver "
            "and restart the hub to turn it on."
        )
        return False
    extra = shlex.split(os.environ.get("GPULAB_IDLE_CULLER_ARGS", ""))
    command = [sys.executable, "-m", "idle_culler", "--source=nvml"]
    bind_url = c.JupyterHub.get("bind_url")
    if bind_url:  # to reach single-user servers when shutting down one idle kernel
        command.append(f"--public-url={str(bind_url).rstrip('/')}")
    command += extra
    c.JupyterHub.services = [*_configured(c, "services"), {"name": SERVICE, "command": command}]
    c.JupyterHub.load_roles = [
        *_configured(c, "load_roles"),
        {"name": SERVICE, "scopes": CULLER_SERVICE_SCOPES, "services": [SERVICE]},
    ]
    models = sorted({getattr(g, "model", "GPU") for g in gpus})
    c.GPULabIdle.culler_running = True
    c.GPULabIdle.culler_status = (
        f"On: NVML source on this machine ({len(gpus)} GPU(s): {', '.join(models)}); per-process use of each "
        f"server's kernels; options: {' '.join(command[3:])}."
    )
    return True


def _configured(c, name: str) -> list:
    """A list-valued JupyterHub setting as configured so far (empty when unset)."""
    value = c.JupyterHub.get(name)
    return list(value) if isinstance(value, (list, tuple)) else []
