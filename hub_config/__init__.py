"""gpulab's hub application: what runs inside the JupyterHub process.

Start at :mod:`.config.setup` (``configure_gpulab(c)``: every API, page, scope and role)
or, for the single-server hub, :mod:`.config.embedded`. Then by room: :mod:`.api` (REST
handlers: parse, check scope, call, write), :mod:`.pages` (server-rendered pages),
:mod:`.domain` (the stored catalog, usage, the idle culler's records), :mod:`.jobs`
(notebook jobs and their backends), :mod:`.storage` (gpulab's own database), :mod:`.cli`.
"""
