"""Which hub servers hold GPUs, and how to find their GPUs' metrics.

Built from the hub's REST API user models (``GET /hub/api/users?state=ready``
with ``admin:server_state``, so each server model carries its spawner state):

- **Kubernetes** (KubeSpawner): ``state["pod_name"]`` and ``state["namespace"]``
  -> dcgm-exporter series with the same ``pod`` and ``namespace`` labels.
- **Single server** (gpulab's local spawners): ``state["gpulab"]["shares"]``
  (``[[device_index, milli], ...]``) and ``state["pid"]`` -> series with
  ``gpu`` = device index on this machine's ``Hostname``/``hostname``, or NVML
  processes descended from ``pid``.

Team, profile and GPU amount come from ``state["gpulab"]``, the grant both gpulab
spawners save (read as :class:`spawner.core.grant.GrantedShare`), else from ``user_options`` (``team`` + ``profile``, or the
form's ``"team:profile"``) and the hub's catalog.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

from spawner.core.grant import GrantedShare

POD = "pod"
DEVICE = "device"


@dataclass(frozen=True)
class ServerTarget:
    """One running GPU server, as the culler sees it."""

    user: str
    server: str  # "" = the default server
    team: str
    profile: str
    gpu_milli: int
    #: ``pod`` (match by pod + namespace) or ``device`` (match by host + device index).
    mapping: str
    namespace: str = ""
    pod: str = ""
    hostname: str = ""
    devices: tuple[int, ...] = ()
    pid: int | None = None
    #: The profile's GPU sharing backend (``whole``, ``timeslice``, ``mig``, ``hami``, ``kai``; "" unknown).
    sharing: str = ""
    url: str = ""  # the server's URL prefix, e.g. /user/alice/
    full_url: str | None = None  # set when the hub knows its public URL
    last_activity: str | None = None
    #: The server session: the hub's ``started`` timestamp as given (identifies the session) ...
    started: str = ""
    #: ... and as seconds since the epoch (only samples after it count as this session's evidence).
    started_at: float | None = None
    extra: Mapping[str, Any] = field(default_factory=dict)

    @property
    def key(self) -> str:
        return f"{self.user}/{self.server}"

    @property
    def expected_devices(self) -> set[str] | int:
        """What the metrics must cover: device ids (single server) or a device count (pods).

        A pod sees ``ceil(gpus)`` devices: one for any fraction (time-slice
        replica, MIG instance, HAMi share), n for n whole GPUs.
        """
        if self.mapping == DEVICE:
            return {device_id(self.hostname, str(i)) for i in self.devices}
        return max(1, math.ceil(self.gpu_milli / 1000))


def device_id(host: str, gpu: str, mig_instance: str = "") -> str:
    """Stable name of a GPU (or MIG instance) in evidence and decisions."""
    base = f"{host}/gpu{gpu}"
    return f"{base}/mig{mig_instance}" if mig_instance else base


def parse_time(value: Any) -> float | None:
    """Seconds since the epoch from the hub's ISO 8601 timestamps (``...Z``); None if absent or bad."""
    if not isinstance(value, str) or not value:
        return None
    try:
        dt = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=timezone.utc)
    return dt.timestamp()


def targets_from_users(
    users: list[dict[str, Any]], profiles: Mapping[str, Mapping[str, Any]], hostname: str
) -> tuple[list[ServerTarget], list[str], list[str]]:
    """``(gpu_targets, non_gpu_keys, unmapped_keys)`` from hub user models.

    Servers that are pending or not ready are left out (never cull a server
    that is starting or stopping). ``unmapped_keys``: GPU servers whose state
    says neither a pod nor devices -- kept, and counted as skipped.
    """
    targets: list[ServerTarget] = []
    non_gpu: list[str] = []
    unmapped: list[str] = []
    for user in users:
        for name, server in (user.get("servers") or {}).items():
            if server.get("pending") or not server.get("ready"):
                continue
            key = f"{user['name']}/{name}"
            state = server.get("state") or {}
            grant = GrantedShare.from_state(state)
            options = server.get("user_options") or {}
            profile = grant.profile if grant else str(options.get("profile") or "")
            team = grant.team if grant else str(options.get("team") or "")
            if ":" in profile and grant is None:  # the spawn form's "team:profile" choice value
                form_team, _, profile = profile.partition(":")
                team = team or form_team
            raw_milli: Any = grant.milli if grant else (profiles.get(profile) or {}).get("gpu_milli")
            milli: int | None
            try:
                milli = int(raw_milli)
            except (TypeError, ValueError):
                milli = None
            if milli is None:
                unmapped.append(key)  # cannot tell whether it holds a GPU: leave it alone
                continue
            if milli <= 0:
                non_gpu.append(key)
                continue
            common = dict(
                sharing=str((profiles.get(profile) or {}).get("sharing") or ""),
                user=user["name"],
                server=name,
                team=team,
                profile=profile,
                gpu_milli=milli,
                url=server.get("url") or "",
                full_url=server.get("full_url"),
                last_activity=server.get("last_activity"),
                started=server.get("started") or "",
                started_at=parse_time(server.get("started")),
            )
            if state.get("pod_name"):
                targets.append(
                    ServerTarget(
                        mapping=POD, pod=str(state["pod_name"]), namespace=str(state.get("namespace") or ""), **common
                    )
                )
            elif grant is not None and grant.shares:
                devices = grant.devices
                pid = state.get("pid")
                targets.append(
                    ServerTarget(
                        mapping=DEVICE,
                        hostname=hostname,
                        devices=devices,
                        pid=int(pid) if isinstance(pid, int) else None,
                        **common,
                    )
                )
            else:
                unmapped.append(key)
    return targets, non_gpu, unmapped
