"""gpulab for JupyterLab: a prebuilt lab extension plus its Jupyter server extension.

The server extension runs inside each single-user server. It

- forwards ``/gpulab/api/hub/<path>`` to the hub's ``/hub/api/gpulab/<path>``
  with the server's own ``JUPYTERHUB_API_TOKEN`` (the hub grants that token
  ``custom:gpulab:jobs!user``: the owner's jobs, quota and idle warnings, and
  nothing else), and
- answers ``GET /gpulab/api/session`` with this server's GPU share, read from
  the ``GPULAB_*`` variables the spawner set, and live utilisation from NVML
  when a driver is present.

The lab extension (TypeScript, in ``src/``) is built by ``build.sh`` into
``labextension_static/`` and shipped in the wheel as
``share/jupyter/labextensions/gpulab-labextension``.
"""

from __future__ import annotations

from typing import Any

#: The npm name of the lab extension (its folder under share/jupyter/labextensions).
LABEXTENSION_NAME = "gpulab-labextension"


def _jupyter_labextension_paths() -> list[dict[str, str]]:
    return [{"src": "labextension_static", "dest": LABEXTENSION_NAME}]


def _jupyter_server_extension_points() -> list[dict[str, str]]:
    return [{"module": "labextension"}]


def _load_jupyter_server_extension(server_app: Any) -> None:
    from .handlers import setup_handlers

    setup_handlers(server_app.web_app, server_app.log)
    server_app.log.info("gpulab: server extension loaded (/gpulab/api/session, /gpulab/api/hub/*)")
