"""The catalog's ``teams`` section: who shares which GPUs, with what guarantee and limits."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from spawner.core.limits import TEAM_LIMIT_KEYS, read_team_limits
from spawner.core.model import Team
from spawner.core.units import format_gpus, parse_duration, parse_lifetime

from .reader import KeyPath, Reader, kind
from .tree import read_team_tree

if TYPE_CHECKING:
    from spawner.core.quota_tree import Department, GpuPool

TEAM_KEYS = {
    "name",
    "display_name",
    "users",
    "groups",
    "guarantee",
    "burst",
    "per_user_cap",
    "allowed_profiles",
    "namespace",
    "idle_timeout",
    "max_lifetime",
    "limits",
    # GPU pools and departments (.tree)
    "pools",
    "department",
    "fair_share_weight",
}

#: One entry of the section as written: its key path, its value, and its name when the
#: section is a mapping of name to team.
TeamEntry = tuple[KeyPath, Any, "str | None"]


def team_entries(r: Reader, value: Any) -> list[TeamEntry]:
    """The section's entries as written: a list of teams, or a mapping of name to team."""
    raw = value or []
    if isinstance(raw, Mapping):
        return [(("teams", k), v, k) for k, v in raw.items()]
    if isinstance(raw, list):
        return [(("teams", i), v, None) for i, v in enumerate(raw)]
    r.error(("teams",), f"expected a list or mapping, got {kind(raw)}")
    return []


def read_teams(
    r: Reader,
    entries: list[TeamEntry],
    pools: Mapping[str, GpuPool] | None = None,
    departments: Mapping[str, Department] | None = None,
) -> dict[str, Team]:
    """Every valid team by name; a repeated name is an issue."""
    teams: dict[str, Team] = {}
    for path, spec, name in entries:
        t = read_team(r, spec, path, name, pools, departments)
        if t is None:
            continue
        if t.name in teams:
            r.error(path + ("name",), f"duplicate team name {t.name!r}")
            continue
        teams[t.name] = t
    return teams


def read_team(
    r: Reader,
    spec: Any,
    path: KeyPath,
    name: str | None = None,
    pools: Mapping[str, GpuPool] | None = None,
    departments: Mapping[str, Department] | None = None,
) -> Team | None:
    """One team, or ``None`` (with its issues recorded) when any part of it is wrong."""
    d = r.mapping(spec, path, TEAM_KEYS, required=() if name else ("name",))
    if d is None:
        return None
    n_before = len(r.issues)
    name = name if name is not None else d.get("name")
    if name is None:
        return None
    name = r.slug(name, path + ("name",), "team name")
    display = r.string(d.get("display_name", ""), path + ("display_name",))
    users = r.string_list(d.get("users"), path + ("users",))
    groups = r.string_list(d.get("groups"), path + ("groups",))
    guarantee = r.gpus(d, "guarantee", path) or 0
    burst = r.gpus(d, "burst", path)
    if burst is None:
        burst = guarantee
    if burst < guarantee:
        r.error(
            path + ("burst",),
            f"burst limit ({format_gpus(burst)} GPUs) is below the guarantee ({format_gpus(guarantee)} GPUs)",
        )
    cap = r.gpus(d, "per_user_cap", path)
    allowed = None
    if "allowed_profiles" in d and d["allowed_profiles"] is not None:
        allowed = tuple(r.string_list(d["allowed_profiles"], path + ("allowed_profiles",)))
    namespace = d.get("namespace")
    if namespace is not None:
        namespace = r.slug(namespace, path + ("namespace",), "namespace")
    idle = r.optional(parse_duration, d, "idle_timeout", path)
    lifetime = r.optional(parse_lifetime, d, "max_lifetime", path)
    limits = read_team_limits(
        d.get("limits"),
        lambda v: r.mapping(v, path + ("limits",), TEAM_LIMIT_KEYS),
        lambda fn, v, key: r.convert(fn, v, path + ("limits", key)),
        lambda key, message: r.error(path + ("limits", key), message),
    )
    pool_quotas, department, weight = read_team_tree(r, d, path, pools or {}, departments or {})
    if len(r.issues) > n_before or name is None:
        return None
    return Team(
        name=name,
        display_name=display or "",
        users=frozenset(users),
        groups=frozenset(groups),
        guarantee_milli=guarantee,
        burst_milli=burst,
        per_user_cap_milli=cap,
        allowed_profiles=allowed,
        namespace=namespace,
        idle_timeout_seconds=idle,
        max_lifetime_seconds=lifetime,
        limits=limits,
        pools=pool_quotas,
        department=department,
        fair_share_weight=weight,
    )
