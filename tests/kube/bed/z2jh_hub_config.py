"""Zero to JupyterHub's hub configuration, for the tests' hub (a test fixture).

A z2jh hub pod runs the chart's ``jupyterhub_config.py`` with ``z2jh.py`` beside
it, over the chart's values: the defaults of its ``values.yaml`` with the
platform engineer's ``-f`` files merged on top (helm), mounted from the hub
Secret (``/usr/local/etc/jupyterhub/secret/values.yaml``, plus the generated
tokens), and the names of its objects mounted from the hub ConfigMap
(``/usr/local/etc/jupyterhub/config/<name>``). This module does the same for a
hub the tests start as a local process: :func:`render_hub_mounts` writes that
folder the way the chart's ``templates/hub/secret.yaml`` and ``configmap.yaml``
render it, and :func:`apply_hub_config` configures ``c`` the way z2jh's
``jupyterhub/files/hub/jupyterhub_config.py`` does. Both are written from the
facts of those files at z2jh 4.1.0 (github.com/jupyterhub/zero-to-jupyterhub-k8s,
tag 4.1.0; BSD-3-Clause), not copied from them:

- ``singleuser.*`` values that are not null set ``c.KubeSpawner.*`` (the
  table :data:`SINGLEUSER_TO_KUBESPAWNER`), ``profileList: []`` included;
- ``scheduling.userScheduler.enabled`` sets ``c.KubeSpawner.scheduler_name``
  to ``<release>-user-scheduler``; ``scheduling.podPriority.enabled`` the
  priority class; ``scheduling.userPods`` the tolerations and node-purpose affinity;
- storage (dynamic or static claims), the image, pull secrets, the iptables
  init container that blocks the cloud metadata server;
- ``hub_bind_url`` ``http://:8081`` and ``hub_connect_url``
  ``http://<hub Service>:<HUB_SERVICE_PORT>``; an external proxy at
  ``http://<proxy-api Service>:<PROXY_API_SERVICE_PORT>``;
- the idle-culler service and role (``cull.*``), then ``hub.services`` (tokens
  from the Secret) and ``hub.loadRoles``;
- the cookie secret and CryptKeeper keys from the Secret, then ``hub.config``,
  then ``hub.extraConfig``, last, in key order, run with the config file's names.

Left out, and why: z2jh switches tornado to its curl HTTP client (speed only;
pycurl is not installed here) and reads ``jupyterhub_config.d`` files from a
fixed path (no chart value puts any there). What a pod network provides the
test bed lacks (Services, cluster DNS, a proxy pod): :func:`use_bed_network`
replaces exactly those addresses afterwards, and says so in the config file.
"""

from __future__ import annotations

import copy
import glob
import os
import re
import secrets
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml
from traitlets.config import Config

from tests.support import REPO

#: The chart defaults the hub config reads (z2jh 4.1.0's values.yaml, as data).
DEFAULTS_FILE = Path(__file__).with_name("z2jh-4.1.0-values.yaml")
#: helm/values-jupyterhub.yaml: gpulab's overlay.
OVERLAY_FILE = REPO / "helm" / "values-jupyterhub.yaml"
#: The z2jh release name the docs use (docs/install-kubernetes.md: ``helm upgrade --install jhub``).
RELEASE = "jhub"
#: The hub container's port (z2jh: ``hub_container_port = 8081``).
HUB_CONTAINER_PORT = 8081
#: The ports of the hub and proxy-api Services (z2jh's templates: 8081 and 8001).
SERVICE_PORTS = {"hub": 8081, "proxy-api": 8001}

#: z2jh's ``singleuser.<key>`` -> ``c.KubeSpawner.<trait>``, each applied when not null.
SINGLEUSER_TO_KUBESPAWNER = {
    "podNameTemplate": "pod_name_template",
    "startTimeout": "start_timeout",
    "image.pullPolicy": "image_pull_policy",
    "events": "events_enabled",
    "extraLabels": "extra_labels",
    "extraAnnotations": "extra_annotations",
    "uid": "uid",
    "fsGid": "fs_gid",
    "serviceAccountName": "service_account",
    "storage.extraLabels": "storage_extra_labels",
    "nodeSelector": "node_selector",
    "extraNodeAffinity.required": "node_affinity_required",
    "extraNodeAffinity.preferred": "node_affinity_preferred",
    "extraPodAffinity.required": "pod_affinity_required",
    "extraPodAffinity.preferred": "pod_affinity_preferred",
    "extraPodAntiAffinity.required": "pod_anti_affinity_required",
    "extraPodAntiAffinity.preferred": "pod_anti_affinity_preferred",
    "lifecycleHooks": "lifecycle_hooks",
    "initContainers": "init_containers",
    "extraContainers": "extra_containers",
    "memory.limit": "mem_limit",
    "memory.guarantee": "mem_guarantee",
    "cpu.limit": "cpu_limit",
    "cpu.guarantee": "cpu_guarantee",
    "extraResource.limits": "extra_resource_limits",
    "extraResource.guarantees": "extra_resource_guarantees",
    "extraEnv": "environment",
    "profileList": "profile_list",
    "extraPodConfig": "extra_pod_config",
}
#: z2jh's ``hub.<key>`` -> ``c.JupyterHub.<trait>``, each applied when not null.
HUB_TO_JUPYTERHUB = {
    "concurrentSpawnLimit": "concurrent_spawn_limit",
    "activeServerLimit": "active_server_limit",
    "baseUrl": "base_url",
    "allowNamedServers": "allow_named_servers",
    "namedServerLimitPerUser": "named_server_limit_per_user",
    "authenticatePrometheus": "authenticate_prometheus",
    "redirectToServer": "redirect_to_server",
    "shutdownOnLogout": "shutdown_on_logout",
    "templatePaths": "template_paths",
    "templateVars": "template_vars",
}


# ---------------------------------------------------------------------------
# Values: chart defaults, then each -f file


def chart_defaults() -> tuple[dict[str, Any], dict[str, Any]]:
    """``(chart metadata, default values)`` of the z2jh release the docs name."""
    data = yaml.safe_load(DEFAULTS_FILE.read_text())
    return data["chart"], data["values"]


def overlay() -> dict[str, Any]:
    return yaml.safe_load(OVERLAY_FILE.read_text()) or {}


def merge_values(base: Mapping[str, Any], *layers: Mapping[str, Any] | None) -> dict[str, Any]:
    """Helm's merge of ``-f`` files over chart defaults: maps merge key by key, anything
    else (lists included) is replaced, and a null in a later file deletes the key."""
    out = copy.deepcopy(dict(base))
    for layer in layers:
        for key, value in (layer or {}).items():
            if value is None:
                out.pop(key, None)
            elif isinstance(value, Mapping) and isinstance(out.get(key), Mapping):
                out[key] = merge_values(out[key], value)
            else:
                out[key] = copy.deepcopy(value)
    return out


def release_values(*layers: Mapping[str, Any] | None) -> dict[str, Any]:
    """z2jh's defaults, then gpulab's overlay, then the site's own files (``layers``)."""
    return merge_values(chart_defaults()[1], overlay(), *layers)


# ---------------------------------------------------------------------------
# Names (the hub ConfigMap) and the hub Secret


def fullname(release: str, values: Mapping[str, Any]) -> str:
    """z2jh's ``jupyterhub.fullname``: ``fullnameOverride`` when it is a string (the default
    ``""`` included), else the release name, suffixed with the chart name unless it contains it."""
    override = values.get("fullnameOverride")
    if isinstance(override, str):
        return override
    name = values.get("nameOverride") or "jupyterhub"
    return release if name in release else f"{release}-{name}"


def resource_names(release: str, values: Mapping[str, Any]) -> dict[str, str]:
    """The names z2jh's hub ConfigMap publishes (``jupyterhub.name-templates``), those its hub config reads."""
    full = fullname(release, values)
    dash = f"{full}-" if full else ""
    return {
        "fullname": full,
        "hub": f"{dash}hub",
        "proxy-api": f"{dash}proxy-api",
        "user-scheduler-deploy": f"{dash}user-scheduler",
        "user-scheduler-lock": f"{dash}user-scheduler-lock",
        # The scheduler's registered name: the deployment's name, or <release>-user-scheduler.
        "user-scheduler": f"{dash}user-scheduler" if full else f"{release}-user-scheduler",
        "priority": f"{dash}default-priority" if full else f"{release}-default-priority",
        "image-pull-secret": f"{dash}image-pull-secret",
        "singleuser": f"{dash}singleuser",
    }


def render_hub_mounts(folder: Path, release: str, namespace: str, values: Mapping[str, Any]) -> Path:
    """Write what the hub pod mounts under ``/usr/local/etc/jupyterhub``: ``config/<name>``
    (the ConfigMap's names) and ``secret/`` (values.yaml with ``Chart`` and ``Release``
    passed through, and the tokens z2jh generates: services, cookie secret, CryptKeeper
    keys, the proxy's token)."""
    chart, _ = chart_defaults()
    config = folder / "config"
    secret = folder / "secret"
    config.mkdir(parents=True, exist_ok=True)
    secret.mkdir(parents=True, exist_ok=True)
    os.chmod(secret, 0o700)
    for key, name in resource_names(release, values).items():
        (config / key).write_text(name)
    passed = dict(copy.deepcopy(values))
    passed["Chart"] = {"Name": chart["name"], "Version": chart["version"], "AppVersion": chart["appVersion"]}
    passed["Release"] = {"Name": release, "Namespace": namespace, "Service": "Helm"}
    (secret / "values.yaml").write_text(yaml.safe_dump(passed, sort_keys=False))
    for key in values.get("hub", {}).get("services") or {}:
        (secret / f"hub.services.{key}.apiToken").write_text(secrets.token_hex(32))
    (secret / "hub.config.JupyterHub.cookie_secret").write_text(secrets.token_hex(32))
    (secret / "hub.config.CryptKeeper.keys").write_text(secrets.token_hex(32))
    (secret / "hub.config.ConfigurableHTTPProxy.auth_token").write_text(secrets.token_hex(32))
    return folder


def service_environment(release: str, values: Mapping[str, Any]) -> dict[str, str]:
    """The ``<SERVICE>_SERVICE_PORT`` variables Kubernetes gives the hub pod for z2jh's Services."""
    names = resource_names(release, values)
    return {f"{names[key].upper().replace('-', '_')}_SERVICE_PORT": str(port) for key, port in SERVICE_PORTS.items()}


# ---------------------------------------------------------------------------
# The hub config


class HubMounts:
    """z2jh.py's readers over a folder laid out as :func:`render_hub_mounts` writes it."""

    def __init__(self, folder: str | Path):
        self.folder = Path(folder)
        values = yaml.safe_load((self.folder / "secret" / "values.yaml").read_text()) or {}
        existing = self.folder / "existing-secret" / "values.yaml"
        if existing.exists():  # hub.existingSecret merges over the chart's Secret
            values = merge_values(values, yaml.safe_load(existing.read_text()) or {})
        self.values = values

    def get_config(self, key: str, default: Any = None) -> Any:
        """``a.b.c`` in the values; ``default`` when a level is missing or not a map."""
        value: Any = self.values
        for level in key.split("."):
            if not isinstance(value, dict) or level not in value:
                return default
            value = value[level]
        return value

    def set_config_if_not_none(self, section: Any, trait: str, key: str) -> None:
        value = self.get_config(key)
        if value is not None:
            setattr(section, trait, value)

    def get_secret_value(self, key: str, default: Any = ...) -> Any:
        for source in ("existing-secret", "secret"):
            path = self.folder / source / key
            if path.exists():
                return path.read_text()
        if default is not ...:
            return default
        raise KeyError(f"{key} not found in either k8s Secret")

    def get_name(self, name: str) -> str:
        return (self.folder / "config" / name).read_text()

    def get_name_env(self, name: str, suffix: str = "") -> str:
        return os.environ[(self.get_name(name) + suffix).upper().replace("-", "_")]


def apply_hub_config(c: Any, folder: str | Path) -> HubMounts:
    """Configure ``c`` as z2jh's jupyterhub_config.py does from the mounts in ``folder``."""
    m = HubMounts(folder)
    get = m.get_config
    c.JupyterHub.spawner_class = "kubespawner.KubeSpawner"
    c.ConfigurableHTTPProxy.api_url = f"http://{m.get_name('proxy-api')}:{m.get_name_env('proxy-api', '_SERVICE_PORT')}"
    c.ConfigurableHTTPProxy.should_start = False
    c.JupyterHub.cleanup_servers = False
    c.JupyterHub.last_activity_interval = 60
    c.JupyterHub.tornado_settings = {"slow_spawn_timeout": 0}

    db_type = get("hub.db.type")
    if db_type == "sqlite-pvc":
        c.JupyterHub.db_url = "sqlite:///jupyterhub.sqlite"
    elif db_type == "sqlite-memory":
        c.JupyterHub.db_url = "sqlite://"
    else:
        m.set_config_if_not_none(c.JupyterHub, "db_url", "hub.db.url")
    password = m.get_secret_value("hub.db.password", None)
    if password is not None:
        os.environ[{"mysql": "MYSQL_PWD", "postgres": "PGPASSWORD"}.get(db_type, "GPULAB_UNUSED_DB_PASSWORD")] = (
            password
        )

    for key, trait in HUB_TO_JUPYTERHUB.items():
        m.set_config_if_not_none(c.JupyterHub, trait, f"hub.{key}")
    c.JupyterHub.hub_bind_url = f"http://:{HUB_CONTAINER_PORT}"
    c.JupyterHub.hub_connect_url = f"http://{m.get_name('hub')}:{m.get_name_env('hub', '_SERVICE_PORT')}"

    # Common labels of user pods: the legacy app/release/chart ones too (z2jh 4).
    labels = {}
    labels["app.kubernetes.io/name"] = labels["app"] = get("nameOverride", default=get("Chart.Name", "jupyterhub"))
    if get("Release.Name"):
        labels["app.kubernetes.io/instance"] = labels["release"] = get("Release.Name")
    if get("Chart.Name") and get("Chart.Version"):
        labels["helm.sh/chart"] = labels["chart"] = f"{get('Chart.Name')}-{get('Chart.Version').replace('+', '_')}"
    labels["app.kubernetes.io/managed-by"] = "kubespawner"
    c.KubeSpawner.common_labels = labels
    c.KubeSpawner.namespace = os.environ.get("POD_NAMESPACE", "default")
    m.set_config_if_not_none(c.Spawner, "consecutive_failure_limit", "hub.consecutiveFailureLimit")

    for key, trait in SINGLEUSER_TO_KUBESPAWNER.items():
        m.set_config_if_not_none(c.KubeSpawner, trait, f"singleuser.{key}")
    image = get("singleuser.image.name")
    if image:
        tag = get("singleuser.image.tag")
        c.KubeSpawner.image = f"{image}:{tag}" if tag else image
    # None, False and True all mean something here, so it is set even when null.
    c.KubeSpawner.allow_privilege_escalation = get("singleuser.allowPrivilegeEscalation")
    pull_secrets = []
    if get("imagePullSecret.automaticReferenceInjection") and get("imagePullSecret.create"):
        pull_secrets.append(m.get_name("image-pull-secret"))
    pull_secrets += get("imagePullSecrets") or []
    pull_secrets += get("singleuser.image.pullSecrets") or []
    if pull_secrets:
        c.KubeSpawner.image_pull_secrets = pull_secrets

    if get("scheduling.userScheduler.enabled"):
        c.KubeSpawner.scheduler_name = m.get_name("user-scheduler")
    if get("scheduling.podPriority.enabled"):
        c.KubeSpawner.priority_class_name = m.get_name("priority")
    _node_purpose(c, get("scheduling.userPods.nodeAffinity.matchNodePurpose"))
    tolerations = list(get("scheduling.userPods.tolerations", []) or []) + list(
        get("singleuser.extraTolerations", []) or []
    )
    if tolerations:
        c.KubeSpawner.tolerations = tolerations
    _storage(c, m)
    _extra_files(c, m)
    c.KubeSpawner.volumes.extend(get("singleuser.storage.extraVolumes", []) or [])
    c.KubeSpawner.volume_mounts.extend(get("singleuser.storage.extraVolumeMounts", []) or [])

    c.JupyterHub.services = []
    c.JupyterHub.load_roles = []
    if get("cull.enabled", False):
        _idle_culler(c, m)
    for key, service in (get("hub.services", {}) or {}).items():
        service = dict(service)
        service.setdefault("name", key)
        service.pop("apiToken", None)
        service["api_token"] = m.get_secret_value(f"hub.services.{key}.apiToken")
        c.JupyterHub.services.append(service)
    for key, role in (get("hub.loadRoles", {}) or {}).items():
        role = dict(role)
        role.setdefault("name", key)
        c.JupyterHub.load_roles.append(role)

    # An explicit null cmd is kept (it means "the image's command").
    unset = object()
    cmd = get("singleuser.cmd", unset)
    if cmd is not unset:
        c.Spawner.cmd = cmd
    m.set_config_if_not_none(c.Spawner, "default_url", "singleuser.defaultUrl")
    metadata = get("singleuser.cloudMetadata") or {}
    if metadata.get("blockWithIptables") is True:
        c.KubeSpawner.init_containers.append(_block_cloud_metadata(m, metadata["ip"]))
    if get("debug.enabled", False):
        c.JupyterHub.log_level = "DEBUG"
        c.Spawner.debug = True

    c.JupyterHub.cookie_secret = m.get_secret_value("hub.config.JupyterHub.cookie_secret")
    c.CryptKeeper.keys = m.get_secret_value("hub.config.CryptKeeper.keys").split(";")
    secret_keys = {"JupyterHub": ("proxy_auth_token", "cookie_secret", "services")}
    secret_keys.update({"ConfigurableHTTPProxy": ("auth_token",), "CryptKeeper": ("keys",)})
    for app, cfg in (get("hub.config", {}) or {}).items():
        cfg = {k: v for k, v in cfg.items() if k not in secret_keys.get(app, ())}
        c[app].update(cfg)

    # hub.extraConfig, last, with the names z2jh's config file has in scope.
    scope = {
        "c": c,
        "get_config": m.get_config,
        "set_config_if_not_none": m.set_config_if_not_none,
        "get_secret_value": m.get_secret_value,
        "get_name": m.get_name,
        "get_name_env": m.get_name_env,
        "os": os,
        "re": re,
        "sys": sys,
        "glob": glob,
    }
    for key, code in sorted((get("hub.extraConfig", {}) or {}).items()):
        exec(compile(code, f"hub.extraConfig.{key}", "exec"), scope)
    return m


def _node_purpose(c: Any, match: str | None) -> None:
    if not match or match == "ignore":
        return
    term = {"matchExpressions": [{"key": "hub.jupyter.org/node-purpose", "operator": "In", "values": ["user"]}]}
    if match == "prefer":
        c.KubeSpawner.node_affinity_preferred.append({"weight": 100, "preference": term})
    elif match == "require":
        c.KubeSpawner.node_affinity_required.append(term)
    else:
        raise ValueError(f"Unrecognized value for matchNodePurpose: {match}")


def _storage(c: Any, m: HubMounts) -> None:
    get = m.get_config
    kind = get("singleuser.storage.type")
    if kind == "dynamic":
        if get("singleuser.storage.dynamic.pvcNameTemplate"):
            c.KubeSpawner.pvc_name_template = get("singleuser.storage.dynamic.pvcNameTemplate")
        volume = get("singleuser.storage.dynamic.volumeNameTemplate")
        c.KubeSpawner.storage_pvc_ensure = True
        m.set_config_if_not_none(c.KubeSpawner, "storage_class", "singleuser.storage.dynamic.storageClass")
        m.set_config_if_not_none(c.KubeSpawner, "storage_access_modes", "singleuser.storage.dynamic.storageAccessModes")
        m.set_config_if_not_none(c.KubeSpawner, "storage_capacity", "singleuser.storage.capacity")
        c.KubeSpawner.volumes = [{"name": volume, "persistentVolumeClaim": {"claimName": "{pvc_name}"}}]
        c.KubeSpawner.volume_mounts = [
            {
                "mountPath": get("singleuser.storage.homeMountPath"),
                "name": volume,
                "subPath": get("singleuser.storage.dynamic.subPath"),
            }
        ]
    elif kind == "static":
        c.KubeSpawner.volumes = [
            {"name": "home", "persistentVolumeClaim": {"claimName": get("singleuser.storage.static.pvcName")}}
        ]
        c.KubeSpawner.volume_mounts = [
            {
                "mountPath": get("singleuser.storage.homeMountPath"),
                "name": "home",
                "subPath": get("singleuser.storage.static.subPath"),
            }
        ]


def _extra_files(c: Any, m: HubMounts) -> None:
    files = m.get_config("singleuser.extraFiles", {}) or {}
    if not files:
        return
    items = [{"key": k, "path": k, **({"mode": f["mode"]} if "mode" in f else {})} for k, f in files.items()]
    c.KubeSpawner.volumes.append({"name": "files", "secret": {"secretName": m.get_name("singleuser"), "items": items}})
    c.KubeSpawner.volume_mounts.extend(
        {"mountPath": f["mountPath"], "subPath": k, "name": "files"} for k, f in files.items()
    )


def _idle_culler(c: Any, m: HubMounts) -> None:
    """jupyterhub-idle-culler as a hub-managed service with z2jh's scoped role."""
    get = m.get_config
    scopes = ["list:users", "read:users:activity", "read:servers", "delete:servers"]
    base_url = c.JupyterHub.get("base_url", "/")
    cmd = ["python3", "-m", "jupyterhub_idle_culler", f"--url=http://localhost:8081{base_url.rstrip('/')}/hub/api"]
    for key, flag in (("timeout", "timeout"), ("every", "cull-every"), ("concurrency", "concurrency")):
        if get(f"cull.{key}"):
            cmd.append(f"--{flag}={get(f'cull.{key}')}")
    if get("cull.users"):
        cmd.append("--cull-users")
        scopes.append("admin:users")
    if not get("cull.adminUsers"):
        cmd.append("--cull-admin-users=false")
    if get("cull.removeNamedServers"):
        cmd.append("--remove-named-servers")
    if get("cull.maxAge"):
        cmd.append(f"--max-age={get('cull.maxAge')}")
    c.JupyterHub.services.append({"name": "jupyterhub-idle-culler", "command": cmd})
    c.JupyterHub.load_roles.append(
        {"name": "jupyterhub-idle-culler", "scopes": scopes, "services": ["jupyterhub-idle-culler"]}
    )


def _block_cloud_metadata(m: HubMounts, ip: str) -> dict[str, Any]:
    """z2jh's privileged init container that drops the pod's traffic to the metadata server."""
    get = m.get_config
    container: dict[str, Any] = {
        "name": "block-cloud-metadata",
        "image": f"{get('singleuser.networkTools.image.name')}:{get('singleuser.networkTools.image.tag')}",
        "command": ["iptables", "--append", "OUTPUT", "--protocol", "tcp", "--destination", ip]
        + ["--destination-port", "80", "--jump", "DROP"],
        "securityContext": {"privileged": True, "runAsUser": 0, "capabilities": {"add": ["NET_ADMIN"]}},
    }
    if get("singleuser.networkTools.resources"):
        container["resources"] = get("singleuser.networkTools.resources")
    return container


# ---------------------------------------------------------------------------
# The user-scheduler and the test bed's network


def user_scheduler_config(release: str, namespace: str, values: Mapping[str, Any]) -> dict[str, Any] | None:
    """The KubeSchedulerConfiguration z2jh's ``templates/scheduling/user-scheduler/configmap.yaml``
    renders: one profile named ``<release>-user-scheduler`` with ``scheduling.userScheduler``'s
    plugins and pluginConfig. None when the user-scheduler is off."""
    user_scheduler = (values.get("scheduling") or {}).get("userScheduler") or {}
    if not user_scheduler.get("enabled"):
        return None
    names = resource_names(release, values)
    profile: dict[str, Any] = {"schedulerName": names["user-scheduler"]}
    if user_scheduler.get("plugins"):
        profile["plugins"] = copy.deepcopy(user_scheduler["plugins"])
    if user_scheduler.get("pluginConfig"):
        profile["pluginConfig"] = copy.deepcopy(user_scheduler["pluginConfig"])
    return {
        "apiVersion": "kubescheduler.config.k8s.io/v1",
        "kind": "KubeSchedulerConfiguration",
        "leaderElection": {
            "resourceLock": "leases",
            "resourceName": names["user-scheduler-lock"],
            "resourceNamespace": namespace,
        },
        "profiles": [profile],
    }


def use_bed_network(c: Any) -> None:
    """After z2jh's config: what the test bed has no pod network for.

    No Services or cluster DNS: the hub listens and is reached on loopback at
    ``c.JupyterHub.hub_port`` instead of ``http://:8081`` and
    ``http://hub.<namespace>.svc.cluster.local:8081``, and the hub-managed services
    (which reach the hub at ``localhost:8081`` inside the hub pod) are pointed there
    too; their own listening ports get free loopback ports, since every hub of a
    test run shares this machine's network. No proxy pod: the hub starts
    configurable-http-proxy itself, on the harness's address (``GPULAB_BIND``).
    """
    from tests.support.ports import free_port

    port = c.JupyterHub.hub_port
    c.JupyterHub.hub_bind_url = f"http://127.0.0.1:{port}"
    c.JupyterHub.hub_connect_url = f"http://127.0.0.1:{port}"
    c.JupyterHub.bind_url = os.environ["GPULAB_BIND"]
    c.ConfigurableHTTPProxy.should_start = True
    for service in c.JupyterHub.services:
        command = service.get("command")
        if not command:
            continue
        out = []
        for arg in command:
            arg = arg.replace(f"http://localhost:{HUB_CONTAINER_PORT}", f"http://127.0.0.1:{port}")
            arg = re.sub(r"^(--[\w-]+=https?://)0\.0\.0\.0:\d+", lambda m: f"{m.group(1)}127.0.0.1:{free_port()}", arg)
            out.append(arg)
        service["command"] = out


# ---------------------------------------------------------------------------
# A hub of the test bed, configured as z2jh configures it


def bed_site_values(catalog_file: Path, extra: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The test's own ``-f`` file (a platform engineer's my-jupyterhub.yaml), with the stand-ins
    the test bed needs: any user name logs in (z2jh's default dummy authenticator), the
    catalog is a file (the gpulab chart's ConfigMap is mounted at a fixed path in a real
    hub pod), no home claims (the bed has no storage provisioner), short timeouts."""
    site = {
        "hub": {
            "config": {
                "Authenticator": {"allow_all": True},
                "GPULab": {"catalog_file": str(catalog_file)},
                "KubeSpawner": {"http_timeout": 90, "delete_grace_period": 1},
            }
        },
        "singleuser": {"storage": {"type": "none"}, "startTimeout": 90},
    }
    return merge_values(site, extra)


def bed_hub(
    workdir: Path,
    namespace: str,
    kubeconfig: Path,
    catalog_yaml: str,
    site: Mapping[str, Any] | None = None,
    extra_config: str = "",
) -> Any:
    """A :class:`tests.support.hub.RunningHub` configured by :func:`apply_hub_config` from
    z2jh's defaults, the overlay and ``site`` (merged over :func:`bed_site_values`), as
    release ``jhub`` in ``namespace``, talking to the cluster with ``kubeconfig`` (the
    stand-in for the pod's in-cluster ServiceAccount token)."""
    from tests.support.hub import RunningHub

    workdir.mkdir(parents=True, exist_ok=True)
    catalog = workdir / "catalog.yaml"
    values = release_values(bed_site_values(catalog, site))
    mounts = render_hub_mounts(workdir / "z2jh", RELEASE, namespace, values)
    base = f"""
# Zero to JupyterHub's hub config (tests/kube/bed/z2jh_hub_config.py), release {RELEASE}:
# its chart defaults, helm/values-jupyterhub.yaml, the test's values; extraConfig last.
from tests.kube.bed.z2jh_hub_config import apply_hub_config, use_bed_network
apply_hub_config(c, {str(mounts)!r})
"""
    hub = RunningHub(
        workdir,
        catalog_yaml=catalog_yaml,
        env={"KUBECONFIG": str(kubeconfig), "POD_NAMESPACE": namespace, **service_environment(RELEASE, values)},
        base_config=base,
        extra_config="use_bed_network(c)\n" + extra_config,
    )
    hub.z2jh_values = values
    return hub


def z2jh_config(tmp_path: Path, monkeypatch, *site: dict, namespace: str = "jhub"):
    """The hub's traitlets config as Zero to JupyterHub's hub config makes it from its chart
    defaults, the overlay and the site's files, extraConfig last."""
    values = release_values(*site)
    mounts = render_hub_mounts(tmp_path / "z2jh-hub", RELEASE, namespace, values)
    monkeypatch.setenv("POD_NAMESPACE", namespace)
    for key, value in service_environment(RELEASE, values).items():
        monkeypatch.setenv(key, value)
    c = Config()
    apply_hub_config(c, mounts)
    return c
