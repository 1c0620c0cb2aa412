"""Reading a catalog: one reader for every source, section by section.

Traitlets config (a dict), a YAML file (text, :mod:`.yaml_text` adds the lines) and the
admin page (a dict from the database) all come through :func:`catalog_from_dict`. Every
problem is reported with the source, the key path and, for YAML, the line, and all
problems are collected before failing, so ``gpulab check-config`` can list them all.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .catalog import Catalog
from .inventory import read_inventory, read_prices, read_priority_class_names
from .profiles import profile_specs, read_profiles
from .reader import CatalogError, KeyPath, Reader, closest_match
from .sharing import read_sharing
from .teams import TeamEntry, read_teams, team_entries
from .tree import check_tree, read_departments, read_pools

TOP_KEYS = {"teams", "profiles", "sharing", "inventory", "prices", "priority_class_names", "pools", "departments"}


def catalog_from_dict(data: Any, source: str = "<config>", lines: Mapping[KeyPath, int] | None = None) -> Catalog:
    """Validate ``data`` (the YAML/config structure) into a :class:`Catalog`.

    Raises :class:`CatalogError` listing every problem found.
    """
    r = Reader(lines)
    top = r.mapping({} if data is None else data, (), TOP_KEYS)
    if top is None:
        raise CatalogError(source, r.issues)
    specs = profile_specs(r, top.get("profiles"))
    profiles = read_profiles(r, specs)
    pools = read_pools(r, top.get("pools"))
    departments = read_departments(r, top.get("departments"), pools)
    entries = team_entries(r, top.get("teams"))
    teams = read_teams(r, entries, pools, departments)
    check_tree(r, teams, departments, pools, profiles)
    check_references(r, specs, entries)
    sharing = read_sharing(r, top.get("sharing"))
    inventory = read_inventory(r, top.get("inventory"))
    prices = read_prices(r, top.get("prices"))
    class_names = read_priority_class_names(r, top.get("priority_class_names"))
    if r.issues:
        raise CatalogError(source, r.issues)
    return Catalog(
        teams=teams,
        profiles=profiles,
        sharing=sharing,
        inventory=inventory,
        prices=prices,
        priority_class_names=class_names,
        pools=pools,
        departments=departments,
    )


def check_references(r: Reader, profile_specs: list[Any], team_entries: list[TeamEntry]) -> None:
    """Teams' ``allowed_profiles`` and profiles' ``teams`` name things the catalog has.

    Checked against every name written, valid or not, so one broken profile does not
    cascade into "unknown profile" errors.
    """
    written_slugs = {p.get("slug") for p in profile_specs if isinstance(p, Mapping)}
    written_teams = {
        name or (spec.get("name") if isinstance(spec, Mapping) else None) for _, spec, name in team_entries
    }
    for path, spec, _ in team_entries:
        if isinstance(spec, Mapping) and isinstance(spec.get("allowed_profiles"), list):
            for j, slug in enumerate(spec["allowed_profiles"]):
                if isinstance(slug, str) and slug not in written_slugs:
                    hint = closest_match(slug, {x for x in written_slugs if isinstance(x, str)})
                    r.error(
                        path + ("allowed_profiles", j),
                        f"unknown profile {slug!r}" + (f" (did you mean '{hint}'?)" if hint else ""),
                    )
    for i, p in enumerate(profile_specs):
        if isinstance(p, Mapping) and isinstance(p.get("teams"), list):
            for j, tname in enumerate(p["teams"]):
                if isinstance(tname, str) and tname not in written_teams:
                    r.error(("profiles", i, "teams", j), f"unknown team {tname!r}")
