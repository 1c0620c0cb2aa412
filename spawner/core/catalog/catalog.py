"""The validated catalog: teams, profiles, sharing defaults, declared GPUs and prices.

Immutable; built only by :func:`.read.catalog_from_dict` (from any source).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from functools import cached_property
from typing import Any

from spawner.core.identity import DepartmentGrant, TeamGrant
from spawner.core.model import Profile, Team
from spawner.core.quota_tree import Department, GpuPool, pool_of

from .inventory import DeviceSpec


@dataclass(frozen=True)
class Catalog:
    teams: Mapping[str, Team] = field(default_factory=dict)
    profiles: Mapping[str, Profile] = field(default_factory=dict)
    #: Cluster-wide sharing defaults: ``{"backend": "timeslice", "timeslice": {...}}``.
    sharing: Mapping[str, Any] = field(default_factory=lambda: {"backend": "whole"})
    inventory: tuple[DeviceSpec, ...] = ()
    #: Price per GPU-hour by GPU model, ``"*"`` for any model (cost reports).
    prices: Mapping[str, float] = field(default_factory=dict)
    #: Kubernetes: the cluster's PriorityClass per gpulab class (``development`` ->
    #: ``staging-development``), as the Helm chart names them after its release; empty =
    #: gpulab's own names (:func:`spawner.core.priority.cluster_priority_class_name`).
    priority_class_names: Mapping[str, str] = field(default_factory=dict)
    #: GPU pools with quotas of their own, by name (:mod:`spawner.core.quota_tree`).
    pools: Mapping[str, GpuPool] = field(default_factory=dict)
    #: Departments over teams, by name.
    departments: Mapping[str, Department] = field(default_factory=dict)

    def team(self, name: str) -> Team | None:
        return self.teams.get(name)

    def profile(self, slug: str) -> Profile | None:
        return self.profiles.get(slug)

    def teams_for(self, user: str, groups: Iterable[str] = ()) -> list[Team]:
        """The teams ``user`` (with JupyterHub ``groups``) belongs to, by name.

        A :class:`~spawner.core.identity.TeamGrant` among ``groups`` names a team the
        identity provider's rules grant, a :class:`~spawner.core.identity.DepartmentGrant`
        every team this catalog places in that department (:mod:`spawner.core.identity`).

        Looked up in a member index, so the cost follows the user's own teams,
        not the number of teams in the catalog.
        """
        by_user, by_group = self._member_index
        found = {t.name: t for t in by_user.get(user, ())}
        for group in groups:
            if isinstance(group, TeamGrant):  # granted by the identity rules, by team name
                if group in self.teams:
                    found[group] = self.teams[group]
                continue
            if isinstance(group, DepartmentGrant):  # every team the catalog places in it now
                found.update((t.name, t) for t in self._department_index.get(group, ()))
                continue
            found.update((t.name, t) for t in by_group.get(group, ()))
        return [found[name] for name in sorted(found)]

    @cached_property
    def _department_index(self) -> dict[str, tuple[Team, ...]]:
        """``department -> its teams``, built once per catalog."""
        index: dict[str, list[Team]] = {}
        for t in self.teams.values():
            if t.department:
                index.setdefault(t.department, []).append(t)
        return {d: tuple(ts) for d, ts in index.items()}

    @cached_property
    def _member_index(self) -> tuple[dict[str, tuple[Team, ...]], dict[str, tuple[Team, ...]]]:
        """``(user -> teams, group -> teams)``, built once per catalog (catalogs are immutable)."""
        by_user: dict[str, list[Team]] = {}
        by_group: dict[str, list[Team]] = {}
        for t in self.teams.values():
            for u in t.users:
                by_user.setdefault(u, []).append(t)
            for g in t.groups:
                by_group.setdefault(g, []).append(t)
        return ({k: tuple(v) for k, v in by_user.items()}, {k: tuple(v) for k, v in by_group.items()})

    def team_may_use(self, team: Team, profile: Profile) -> bool:
        if profile.teams and team.name not in profile.teams:
            return False
        if team.allowed_profiles is not None and profile.slug not in team.allowed_profiles:
            return False
        return True

    def profiles_for(self, team: Team, *, include_retired: bool = False) -> list[Profile]:
        """Profiles ``team`` may start, in catalog order."""
        return [p for p in self.profiles.values() if (include_retired or not p.retired) and self.team_may_use(team, p)]

    def pool_of(self, profile: Profile) -> str:
        """The pool ``profile``'s GPUs come from (``""``: none; only totals count them)."""
        if not profile.is_gpu:
            return ""
        backend = profile.sharing or str(self.sharing.get("backend") or "whole")
        return pool_of(self.pools, profile.pool, profile.gpu_model, backend)

    @cached_property
    def profile_pools(self) -> dict[str, str]:
        """Profile slug -> its pool, for the GPU profiles that have one (the ledger's lookup)."""
        return {slug: pool for slug, p in self.profiles.items() if (pool := self.pool_of(p))}

    def with_team(self, team: Team) -> Catalog:
        return replace(self, teams={**self.teams, team.name: team})
