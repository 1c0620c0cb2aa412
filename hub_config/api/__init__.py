"""Hub-side REST APIs under ``/hub/api/gpulab/`` (tornado handlers in the hub process).

Each feature module exposes ``handlers`` (a list of ``(pattern, HandlerClass)``);
:func:`hub_config.config.setup.gpulab_handlers` registers them all. They run in
the hub process on purpose: notebook spawns and jobs must be admitted against
the same in-memory ledger (docs/architecture.md).
"""
