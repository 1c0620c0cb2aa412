"""Writing catalogs back to plain data: the admin page stores them, and they round-trip through the reader."""

from __future__ import annotations

from typing import Any

from spawner.core.limits import team_limits_to_dict
from spawner.core.model import Profile, Team
from spawner.core.priority import short_name
from spawner.core.units import format_duration, format_gpus, format_memory

from .catalog import Catalog
from .tree import department_to_dict, pool_to_dict, team_tree_to_dict


def profile_to_dict(p: Profile) -> dict[str, Any]:
    d: dict[str, Any] = {"slug": p.slug, "display_name": p.display_name}
    if p.description:
        d["description"] = p.description
    d["gpu_milli"] = p.gpu_milli
    if p.gpu_model:
        d["gpu_model"] = p.gpu_model
    cpu = {k: v for k, v in (("guarantee", p.cpu_guarantee), ("limit", p.cpu_limit)) if v is not None}
    if cpu:
        d["cpu"] = cpu
    mem = {k: format_memory(v) for k, v in (("guarantee", p.mem_guarantee), ("limit", p.mem_limit)) if v is not None}
    if mem:
        d["memory"] = mem
    if p.images:
        d["images"] = [{"slug": i.slug, "display_name": i.display_name, "image": i.image} for i in p.images]
    d["priority_class"] = short_name(p.priority_class)
    if p.teams:
        d["teams"] = list(p.teams)
    if p.sharing:
        d["sharing"] = p.sharing
    if p.idle_timeout_seconds is not None:
        d["idle_timeout"] = format_duration(p.idle_timeout_seconds)
    if p.max_lifetime_seconds is not None:
        d["max_lifetime"] = format_duration(p.max_lifetime_seconds)
    if p.retired:
        d["retired"] = True
    for key in ("tolerations", "node_affinity_required", "node_affinity_preferred"):
        if getattr(p, key):
            d[key] = [dict(x) for x in getattr(p, key)]
    if p.start_timeout_seconds is not None:
        d["start_timeout"] = format_duration(p.start_timeout_seconds)
    if p.pool is not None:
        d["pool"] = p.pool
    return d


def team_to_dict(t: Team) -> dict[str, Any]:
    d: dict[str, Any] = {"name": t.name}
    if t.display_name:
        d["display_name"] = t.display_name
    d["users"] = sorted(t.users)
    d["groups"] = sorted(t.groups)
    d["guarantee"] = format_gpus(t.guarantee_milli)
    d["burst"] = format_gpus(t.burst_milli)
    if t.per_user_cap_milli is not None:
        d["per_user_cap"] = format_gpus(t.per_user_cap_milli)
    if t.allowed_profiles is not None:
        d["allowed_profiles"] = list(t.allowed_profiles)
    if t.namespace:
        d["namespace"] = t.namespace
    if t.idle_timeout_seconds is not None:
        d["idle_timeout"] = format_duration(t.idle_timeout_seconds)
    if t.max_lifetime_seconds is not None:
        d["max_lifetime"] = format_duration(t.max_lifetime_seconds)
    if not t.limits.empty:
        d["limits"] = team_limits_to_dict(t.limits)
    d.update(team_tree_to_dict(t))
    return d


def catalog_to_dict(c: Catalog) -> dict[str, Any]:
    d: dict[str, Any] = {
        "teams": [team_to_dict(t) for t in c.teams.values()],
        "profiles": [profile_to_dict(p) for p in c.profiles.values()],
        "sharing": dict(c.sharing),
    }
    if c.inventory:
        d["inventory"] = [{"model": s.model, "count": s.count, "memory_mib": s.memory_mib} for s in c.inventory]
    if c.prices:
        d["prices"] = dict(c.prices)
    if c.priority_class_names:
        d["priority_class_names"] = dict(c.priority_class_names)
    if c.pools:
        d["pools"] = [pool_to_dict(p) for p in c.pools.values()]
    if c.departments:
        d["departments"] = [department_to_dict(x) for x in c.departments.values()]
    return d


__all__ = ["catalog_to_dict", "profile_to_dict", "team_to_dict"]
