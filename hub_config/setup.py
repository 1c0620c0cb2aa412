"""``configure_gpulab(c)``: what every gpulab hub needs, embedded or on Kubernetes.

Registers the hub-side APIs, the custom scopes and roles, and the templates.
Called from ``hub_config/jupyterhub_config.py`` (embedded) and from the z2jh
overlay's ``hub.extraConfig``.
"""

from __future__ import annotations

from pathlib import Path

from . import scopes

TEMPLATES = str(Path(__file__).parent / "templates")


def configure_gpulab(c, *, admin_users: list[str] | None = None) -> None:
    from .api import all_handlers

    c.JupyterHub.extra_handlers = list(c.JupyterHub.get("extra_handlers", [])) + all_handlers()
    # Admin page, stored catalog + usage history, Prometheus gauges (docs/admin.md).
    from . import admin_page, metrics

    c.JupyterHub.extra_handlers = c.JupyterHub.extra_handlers + admin_page.handlers
    hooks = list(c.GPULab.get("runtime_hooks", []))
    if "hub_config.catalog_store.attach_runtime" not in hooks:
        c.GPULab.runtime_hooks = hooks + ["hub_config.catalog_store.attach_runtime"]
    metrics.register(c)
    # Recover and resume notebook jobs as soon as the hub is up, not on the
    # first request (the config file is loaded inside the hub's event loop).
    from .jobs.service import start_with_hub

    start_with_hub()
    custom = dict(c.JupyterHub.get("custom_scopes", {}))
    custom.update(scopes.CUSTOM_SCOPES)
    c.JupyterHub.custom_scopes = custom
    # The operator's own roles stay, "user" and "server" included: gpulab's scopes are added to them.
    existing = [dict(r) for r in c.JupyterHub.get("load_roles", [])]
    by_name = {r["name"]: r for r in existing}
    for role in scopes.roles(admin_users):
        if role["name"] in by_name:
            merged = by_name[role["name"]]
            for key in ("scopes", "users", "groups", "services"):
                if role.get(key) or merged.get(key):
                    merged[key] = sorted(set(merged.get(key, [])) | set(role.get(key, [])))
        else:
            existing.append(role)
    c.JupyterHub.load_roles = existing
    # The hub home's "Start again" and GPUs per server; an admin in no team lands on the admin page.
    from .home import default_url, make_home_view

    template_vars = dict(c.JupyterHub.get("template_vars", {}))
    template_vars.setdefault("gpulab_home", make_home_view(c))
    c.JupyterHub.template_vars = template_vars
    if "default_url" not in c.JupyterHub:
        c.JupyterHub.default_url = default_url
    paths = list(c.JupyterHub.get("template_paths", []))
    if TEMPLATES not in paths:
        paths.insert(0, TEMPLATES)
    c.JupyterHub.template_paths = paths
