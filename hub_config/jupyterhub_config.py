# jupyterhub_config.py for gpulab's embedded single-server hub (`gpulab up`).
# Settings come from GPULAB_* environment variables; see hub_config/config/embedded.py
# and docs/single-server.md. Add your own `c.*` lines below to override.
from hub_config.config.embedded import configure_embedded

c = get_config()  # type: ignore[name-defined]  # noqa: F821 (provided by JupyterHub)
configure_embedded(c)
