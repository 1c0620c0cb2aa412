"""Hub-side REST APIs under ``/hub/api/gpulab/`` (tornado handlers in the hub process).

Each feature module exposes ``handlers`` (a list of ``(pattern, HandlerClass)``);
``all_handlers()`` collects them for ``c.JupyterHub.extra_handlers``. They run
in the hub process on purpose: notebook spawns and jobs must be admitted
against the same in-memory ledger.
"""

from __future__ import annotations

import importlib

#: Feature modules, in order. A module listed here must exist.
MODULES = [
    "hub_config.api.me",
    "hub_config.api.admin",
    "hub_config.api.idle",
    "hub_config.api.jobs",
    "hub_config.api.whatif",
]


def all_handlers() -> list[tuple[str, type]]:
    out: list[tuple[str, type]] = []
    for name in MODULES:
        out.extend(importlib.import_module(name).handlers)
    return out
