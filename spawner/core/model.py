"""Profiles and teams: the nouns of the policy core (plain frozen data)."""

from __future__ import annotations

import re
from collections.abc import Collection
from dataclasses import dataclass
from typing import Any, TypeGuard

from .priority import DEVELOPMENT, PriorityClass
from .quota_tree import PoolQuota

#: Slugs and team names end up in Kubernetes label values and namespaces.
SLUG_RE = re.compile(r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$")


def is_slug(value: object) -> TypeGuard[str]:
    return isinstance(value, str) and bool(SLUG_RE.match(value))


@dataclass(frozen=True)
class ImageChoice:
    slug: str
    display_name: str
    image: str


@dataclass(frozen=True)
class Profile:
    """A GPU profile offered on the spawn page (and to jobs)."""

    slug: str
    display_name: str
    description: str = ""
    #: Exact GPU amount in milli-GPUs: 250, 500, 1000, 2000 ... (0 = CPU only).
    gpu_milli: int = 0
    #: GPU model constraint, e.g. ``"H100-80GB"``; ``None`` = any model.
    gpu_model: str | None = None
    cpu_guarantee: float | None = None
    cpu_limit: float | None = None
    mem_guarantee: int | None = None  # bytes
    mem_limit: int | None = None  # bytes
    images: tuple[ImageChoice, ...] = ()
    priority_class: PriorityClass = DEVELOPMENT
    #: Teams allowed to use this profile; empty = every team that lists it
    #: (or that allows all profiles).
    teams: tuple[str, ...] = ()
    #: Sharing backend override for this profile (``whole``, ``timeslice``,
    #: ``mig``, ``hami``, ``kai``); ``None`` = the cluster default.
    sharing: str | None = None
    #: Per-profile GPU idle timeout for the culler, in seconds.
    idle_timeout_seconds: int | None = None
    #: Per-profile maximum lifetime of a GPU server session, in seconds (``None``: unlimited);
    #: past it the culler warns and reclaims whatever the GPU does, and "keep my GPU" cannot extend it.
    max_lifetime_seconds: int | None = None
    #: Retired profiles are not offered for new spawns; running ones go on.
    retired: bool = False
    #: Kubernetes: pod tolerations, and node affinity terms (KubeSpawner's
    #: ``node_affinity_required`` / ``node_affinity_preferred`` shapes).
    tolerations: tuple[dict[str, Any], ...] = ()
    node_affinity_required: tuple[dict[str, Any], ...] = ()
    node_affinity_preferred: tuple[dict[str, Any], ...] = ()
    #: Seconds a server may take to start (node autoscaling, image pulls,
    #: queueing); ``None`` = the spawner's ``start_timeout``.
    start_timeout_seconds: int | None = None
    #: The admin-named GPU pool this profile's GPUs come from (the catalog's ``pools``);
    #: ``None``: the pool matching its GPU model and sharing backend, if any.
    pool: str | None = None

    @property
    def is_gpu(self) -> bool:
        return self.gpu_milli > 0

    def image_for(self, slug: str | None) -> ImageChoice | None:
        """The image choice with ``slug`` (default: the first), or ``None``."""
        if not self.images:
            return None
        if slug is None or slug == "":
            return self.images[0]
        for choice in self.images:
            if choice.slug == slug:
                return choice
        return None


@dataclass(frozen=True)
class TeamLimits:
    """Caps on each server and job of a team's members, and on how many jobs one member runs.

    On one server they are enforced through cgroups (memory, CPU, process count) and
    the job queue (running jobs); ``None`` = the hub's default (``c.UserLimits``,
    ``c.GPULabJobs.max_running_jobs_per_user``).
    """

    #: Most memory one server or job may use, in bytes.
    memory: int | None = None
    #: Most CPU cores one server or job may use.
    cpu: float | None = None
    #: Most tasks (processes and threads) in one server or job.
    processes: int | None = None
    #: Most jobs one member runs at once (of every class, CPU-only included); more wait, queued.
    running_jobs: int | None = None

    @property
    def empty(self) -> bool:
        return self == TeamLimits()


@dataclass(frozen=True)
class Team:
    """A team: who is in it and how many GPUs it may hold."""

    name: str
    display_name: str = ""
    users: frozenset[str] = frozenset()
    groups: frozenset[str] = frozenset()
    #: Guaranteed milli-GPUs: work within it is never preemptible.
    guarantee_milli: int = 0
    #: Burst limit in milli-GPUs (>= guarantee): nothing is admitted past it.
    burst_milli: int = 0
    #: Most milli-GPUs one user may hold in this team; ``None`` = no cap.
    per_user_cap_milli: int | None = None
    #: Profiles this team may use; ``None`` = every profile that allows it.
    allowed_profiles: tuple[str, ...] | None = None
    #: Kubernetes namespace for this team's pods; ``None`` = the hub's.
    namespace: str | None = None
    #: Per-team GPU idle timeout for the culler, in seconds.
    idle_timeout_seconds: int | None = None
    #: Per-team maximum lifetime of a GPU server session, in seconds (``None``: unlimited);
    #: past it the culler warns and reclaims whatever the GPU does, and "keep my GPU" cannot extend it.
    max_lifetime_seconds: int | None = None
    #: Caps on each member's servers and jobs (memory, CPU, processes, running jobs).
    limits: TeamLimits = TeamLimits()
    #: Guarantee and burst per GPU pool, on top of the totals above (which count any pool).
    pools: tuple[PoolQuota, ...] = ()
    #: The department above this team (the catalog's ``departments``); ``None``: none.
    department: str | None = None
    #: This team's weight when idle capacity is shared between borrowing teams.
    fair_share_weight: float = 1.0

    @property
    def label(self) -> str:
        return self.display_name or self.name

    def has_member(self, user: str, groups: Collection[str] = ()) -> bool:
        return user in self.users or bool(self.groups.intersection(groups))
