"""What the hub's KubeSpawner configuration gives every user server's pod, given to jobs too.

A job runs a notebook of the user's server, so it must find the same world: the volumes
and mounts Zero to JupyterHub adds (``singleuser.storage.extraVolumes`` /
``extraVolumeMounts``, ``singleuser.extraFiles``), the tolerations and node selector of
the user pods (``scheduling.userPods.tolerations``, ``singleuser.extraTolerations``,
``singleuser.nodeSelector``), the node-purpose affinity (``scheduling.userPods.
nodeAffinity.matchNodePurpose``, which z2jh turns into KubeSpawner's
``node_affinity_required``/``preferred``) and ``singleuser.extraPodConfig``. The job
backend reads them from the hub's config (already expanded for the user): tolerations
and node affinity go with the profile's into the job's request, combined as GPUKubeSpawner
combines them for a server (the config's first, then the profile's, then the GPU share's
requirements AND-ed into every term); volumes, mounts, the node selector and
``extra_pod_config`` go into :class:`ServersPodSettings`, which
:func:`apply_servers_pod_settings` adds to a job's pod.

Left out on purpose: init containers and extra containers (z2jh's cloud-metadata
blocker runs privileged, which the job pods' ``restricted`` Pod Security profile refuses,
and a sidecar that never exits keeps a Job from completing), lifecycle hooks (they
belong to the single-user server's start), and the fields a Job owns.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

#: Pod fields the job sets itself and ``extra_pod_config`` may not replace: a Job's pods
#: must not restart in place (``podFailurePolicy`` needs ``Never``), the job runs its own
#: container, and its identity, priority and scheduling come from the job's team and class.
JOB_OWNED_POD_FIELDS = frozenset(
    {
        "restartPolicy",
        "containers",
        "initContainers",
        "priorityClassName",
        "priority",
        "securityContext",
        "schedulerName",
        "volumes",
        "tolerations",
        "nodeSelector",
        "affinity",
        "imagePullSecrets",
        "automountServiceAccountToken",
        "serviceAccountName",
    }
)


@dataclass(frozen=True)
class ServersPodSettings:
    """What every user server's pod gets from the hub's KubeSpawner config (expanded)."""

    #: Volumes besides the home (KubeSpawner's ``volumes``), and their mounts.
    volumes: tuple[Mapping[str, Any], ...] = ()
    volume_mounts: tuple[Mapping[str, Any], ...] = ()
    node_selector: Mapping[str, str] = field(default_factory=dict)
    #: KubeSpawner's ``extra_pod_config``: pod spec fields, camelCase or snake_case.
    extra_pod_config: Mapping[str, Any] = field(default_factory=dict)


def camel_case(key: str) -> str:
    """``dns_policy`` -> ``dnsPolicy``; camelCase stays (KubeSpawner's update_k8s_model takes both)."""
    head, *rest = key.split("_")
    return head + "".join(part[:1].upper() + part[1:] for part in rest)


def as_list(value: Any) -> list[Any]:
    """KubeSpawner's volumes/mounts/tolerations: a list, or a dict whose values are the items."""
    if isinstance(value, Mapping):
        return list(value.values())
    return list(value or [])


def servers_pod_settings(
    volumes: Any,
    volume_mounts: Any,
    node_selector: Any,
    extra_pod_config: Any,
) -> ServersPodSettings:
    """:class:`ServersPodSettings` from KubeSpawner's traits as the config gives them
    (without the home volume: the job mounts the home itself); a mount of no listed
    volume is dropped."""
    vols = [dict(v) for v in as_list(volumes) if isinstance(v, Mapping)]
    names = {v.get("name") for v in vols}
    mounts = [dict(m) for m in as_list(volume_mounts) if isinstance(m, Mapping) and m.get("name") in names]
    return ServersPodSettings(
        volumes=tuple(vols),
        volume_mounts=tuple(mounts),
        node_selector={str(k): str(v) for k, v in dict(node_selector or {}).items()},
        extra_pod_config=dict(extra_pod_config or {}),
    )


_RESERVED_VOLUME = re.compile(r"^(home|gpulab-.*)$")


def apply_servers_pod_settings(
    pod_spec: dict[str, Any], container: dict[str, Any], settings: ServersPodSettings
) -> list[str]:
    """Add ``settings`` to a job's ``pod_spec`` and its one ``container``; the sentences of
    what was left out (an ``extra_pod_config`` field the job owns, a volume whose name the
    job uses), for the log."""
    skipped: list[str] = []
    volumes = pod_spec.setdefault("volumes", [])
    taken = {v["name"] for v in volumes}
    added: set[str] = set()
    for v in settings.volumes:
        name = str(v.get("name", ""))
        if name in taken or _RESERVED_VOLUME.match(name):
            skipped.append(f"volume {name!r} (the job's own volume has that name)")
            continue
        volumes.append(dict(v))
        added.add(name)
    mounts = container.setdefault("volumeMounts", [])
    mounted_at = {m.get("mountPath") for m in mounts}
    for m in settings.volume_mounts:
        if m.get("name") in added and m.get("mountPath") not in mounted_at:
            mounts.append(dict(m))
    if not volumes:
        del pod_spec["volumes"]
    if not mounts:
        del container["volumeMounts"]
    if settings.node_selector:
        # The GPU share's selector wins, as for the servers (GPUKubeSpawner merges it last).
        pod_spec["nodeSelector"] = {**settings.node_selector, **pod_spec.get("nodeSelector", {})}
    for key, value in settings.extra_pod_config.items():
        field_name = camel_case(str(key))
        if field_name in JOB_OWNED_POD_FIELDS:
            skipped.append(f"extra_pod_config {key!r} (the job sets its own)")
            continue
        pod_spec[field_name] = value
    return skipped
