"""``configure_gpulab(c)``: what every gpulab hub needs, embedded or on Kubernetes.

Registers the hub-side APIs, the custom scopes and roles, and the templates.
Called from ``hub_config/jupyterhub_config.py`` (embedded) and from the z2jh
overlay's ``hub.extraConfig``.
"""

from __future__ import annotations

from pathlib import PurePosixPath
from typing import Any

from sqlalchemy.engine import make_url

from hub_config.api import admin as admin_api
from hub_config.api import budgets as budgets_api
from hub_config.api import devices as devices_api
from hub_config.api import identity as identity_api
from hub_config.api import idle as idle_api
from hub_config.api import jobs as jobs_api
from hub_config.api import me as me_api
from hub_config.api import queue as queue_api
from hub_config.api import sweeps as sweeps_api
from hub_config.api import tree as tree_api
from hub_config.api import whatif as whatif_api
from hub_config.config import identity, runtime, scopes
from hub_config.domain import metrics
from hub_config.jobs.service import start_with_hub
from hub_config.pages import TEMPLATES
from hub_config.pages import admin as admin_page
from hub_config.pages import queue as queue_page
from hub_config.pages.home import default_url, make_home_view


def gpulab_handlers() -> list[tuple[str, type]]:
    """Every tornado handler gpulab adds to the hub: the REST APIs and the pages.

    The one place that decides where gpulab's hub API lives (docs/architecture.md):
    today in the hub process, through ``c.JupyterHub.extra_handlers``, beside the
    ledger that admits notebooks and jobs.
    """
    return [
        *me_api.handlers,
        *admin_api.handlers,
        *devices_api.handlers,
        *idle_api.handlers,
        *jobs_api.handlers,
        *sweeps_api.handlers,
        *whatif_api.handlers,
        *budgets_api.handlers,
        *identity_api.handlers,
        *tree_api.handlers,
        *queue_api.handlers,
        *admin_page.handlers,
        *queue_page.handlers,
    ]


#: The names ``c.JupyterHub.spawner_class`` may give GPUKubeSpawner (entry point, import string).
KUBE_SPAWNER_NAMES = ("gpu-kube", "spawner.kube.GPUKubeSpawner")


class SpawnerConfigError(SystemExit):
    """The hub config contradicts the spawner; the hub refuses to start with what to change."""


def check_spawner_config(c: Any) -> None:
    """Refuse to start a GPUKubeSpawner hub whose config replaces the catalog's profile list
    (Zero to JupyterHub's ``singleuser.profileList``); an empty one is fine, the spawner
    treats it as unset."""
    if str(c.JupyterHub.get("spawner_class", "")) not in KUBE_SPAWNER_NAMES:
        return
    from spawner.kube.conventions import profile_list_conflict

    for section in ("KubeSpawner", "GPUKubeSpawner"):
        if section in c and "profile_list" in c[section]:
            conflict = profile_list_conflict(c[section]["profile_list"])
            if conflict:
                raise SpawnerConfigError(f"gpulab: refusing to start: {conflict}")


def place_gpulab_database(c: Any) -> None:
    """On Kubernetes, keep gpulab's database (jobs, usage history, idle records) where it
    survives a hub restart, or refuse to start saying what to set.

    Unset, ``c.GPULabDB.db_url`` is a file in the hub's working directory. Under Zero to
    JupyterHub that directory (/srv/jupyterhub) is the hub's volume only with
    ``hub.db.type: sqlite-pvc``, whose ``c.JupyterHub.db_url`` is a SQLite file there:
    gpulab's file goes beside it. With any other hub database the pod's directory is
    thrown away at each restart, and with it every job record (new ids would start at 1
    again and collide with the Jobs Kubernetes still keeps for their TTL).
    """
    if str(c.JupyterHub.get("spawner_class", "")) not in KUBE_SPAWNER_NAMES or "db_url" in c.GPULabDB:
        return
    hub_url = str(c.JupyterHub.get("db_url", "sqlite:///jupyterhub.sqlite"))
    parsed = make_url(hub_url)
    if parsed.drivername.startswith("sqlite") and parsed.database and parsed.database != ":memory:":
        beside = PurePosixPath(parsed.database).with_name("gpulab.sqlite")
        c.GPULabDB.db_url = f"sqlite:///{beside}"
        return
    kind = "in memory" if parsed.drivername.startswith("sqlite") else f"on {parsed.drivername}"
    raise SpawnerConfigError(
        f"gpulab: refusing to start: the hub's database is {kind} (z2jh hub.db.type is not "
        "sqlite-pvc), so gpulab's own database (jobs, usage history, idle records) would be "
        "lost at every hub restart. Set hub.config.GPULabDB.db_url to a database that persists "
        "(e.g. a database of its own on the same server: postgresql://user@host/gpulab), or "
        "use hub.db.type: sqlite-pvc (docs/install-kubernetes.md)."
    )


def declare_queue_service(c: Any) -> None:
    """The ``gpulab-queue`` service (no process: the queue runner in the hub starts queued servers
    with its token) and its role: start and read any user's servers, nothing else."""
    from hub_config.domain.queue_runner import SERVICE_NAME, SERVICE_SCOPES

    services = [dict(s) for s in c.JupyterHub.get("services", [])]
    if not any(s.get("name") == SERVICE_NAME for s in services):
        services.append({"name": SERVICE_NAME, "display": False})
    c.JupyterHub.services = services
    roles = [dict(r) for r in c.JupyterHub.get("load_roles", [])]
    if not any(r.get("name") == SERVICE_NAME for r in roles):
        roles.append(
            {
                "name": SERVICE_NAME,
                "description": "gpulab's queue runner: starts queued servers when their GPUs free",
                "scopes": list(SERVICE_SCOPES),
                "services": [SERVICE_NAME],
            }
        )
    c.JupyterHub.load_roles = roles


def configure_gpulab(c: Any, *, admin_users: list[str] | None = None) -> None:
    """Everything a hub needs for gpulab: handlers, runtime hook, metrics, jobs, scopes, roles, templates."""
    check_spawner_config(c)
    place_gpulab_database(c)
    c.JupyterHub.extra_handlers = list(c.JupyterHub.get("extra_handlers", [])) + gpulab_handlers()
    # Stored catalog + usage history + the culler's notices (docs/admin.md), at runtime creation.
    hooks = list(c.GPULab.get("runtime_hooks", []))
    if runtime.HOOK not in hooks:
        c.GPULab.runtime_hooks = hooks + [runtime.HOOK]
    metrics.register(c)
    identity.install(c)  # teams from the authenticator's groups and claims (c.GPULabIdentity.team_rules)
    # Recover and resume notebook jobs as soon as the hub is up, not on the
    # first request (the config file is loaded inside the hub's event loop).
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
    declare_queue_service(c)
    # The hub home's "Start again" and GPUs per server; an admin in no team lands on the admin page.
    template_vars = dict(c.JupyterHub.get("template_vars", {}))
    template_vars.setdefault("gpulab_home", make_home_view(c))
    c.JupyterHub.template_vars = template_vars
    if "default_url" not in c.JupyterHub:
        c.JupyterHub.default_url = default_url
    paths = list(c.JupyterHub.get("template_paths", []))
    if TEMPLATES not in paths:
        paths.insert(0, TEMPLATES)
    c.JupyterHub.template_paths = paths
