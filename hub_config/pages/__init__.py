"""Server-rendered hub pages (admin, what-if) and the templates gpulab adds to the hub."""

from pathlib import Path

#: Put first in ``c.JupyterHub.template_paths`` (login notice, admin and what-if pages).
TEMPLATES = str(Path(__file__).parent / "templates")
