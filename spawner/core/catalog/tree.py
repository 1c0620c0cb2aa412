"""The catalog's ``pools`` and ``departments`` sections, and the per-pool quotas of teams.

::

    pools:
      - {name: h100, gpu_model: H100-80GB, sharing: whole}
      - {name: inference, node_labels: {pool: inference}}   # profiles join with `pool: inference`
    departments:
      - {name: research, guarantee: 8, burst: 12, pools: {h100: {guarantee: 4, burst: 6}}}
    teams:
      - name: vision
        department: research
        fair_share_weight: 2
        guarantee: 4          # any pool
        burst: 8
        pools: {h100: {guarantee: 2, burst: 4}}

Everything here is optional: a catalog without these keys means what it meant before.
The model is :mod:`spawner.core.quota_tree`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from spawner.core.model import Profile, Team
from spawner.core.quota_tree import Department, GpuPool, PoolQuota
from spawner.core.sharing import SHARING_BACKENDS
from spawner.core.units import format_gpus

from .reader import KeyPath, Reader, closest_match, kind

POOL_KEYS = {"name", "display_name", "gpu_model", "sharing", "node_labels"}
DEPARTMENT_KEYS = {"name", "display_name", "guarantee", "burst", "pools"}
POOL_QUOTA_KEYS = {"guarantee", "burst"}
#: More pools or departments than this is a mistake in generated input, not a cluster.
MAX_ENTRIES = 1000
#: The largest fair-share weight (Kueue's and KAI's weights are small numbers too).
MAX_WEIGHT = 1000.0


#: One entry as read: its key path, its keys, its name and display name, and how many
#: issues the reader had before it (so a caller can tell whether the entry is whole).
_Named = tuple[KeyPath, dict[str, Any], "str | None", str, int]


def _named_entries(r: Reader, value: Any, section: str, keys: set[str], what: str) -> list[_Named]:
    """The section's entries (a list, or a mapping of name to entry), each with its name read."""
    out: list[_Named] = []
    for path, spec, name in _entries(r, value, section):
        d = r.mapping(spec, path, keys, required=() if name else ("name",))
        if d is None:
            continue
        n_before = len(r.issues)
        slug = r.slug(name if name is not None else d.get("name"), path + ("name",), what)
        display = r.string(d.get("display_name", ""), path + ("display_name",)) or ""
        out.append((path, d, slug, display, n_before))
    return out


def _entries(r: Reader, value: Any, section: str) -> list[tuple[KeyPath, Any, str | None]]:
    raw = value or []
    if isinstance(raw, Mapping):
        out = [((section, k), v, k) for k, v in raw.items()]
    elif isinstance(raw, list):
        out = [((section, i), v, None) for i, v in enumerate(raw)]
    else:
        r.error((section,), f"expected a list or mapping, got {kind(raw)}")
        return []
    if len(out) > MAX_ENTRIES:
        r.error((section,), f"{len(out)} entries; at most {MAX_ENTRIES}")
        return []
    return out


def read_pools(r: Reader, value: Any) -> dict[str, GpuPool]:
    pools: dict[str, GpuPool] = {}
    for path, d, slug, display, n_before in _named_entries(r, value, "pools", POOL_KEYS, "pool name"):
        model = d.get("gpu_model")
        if model is not None:
            model = r.string(model, path + ("gpu_model",), max_len=64)
        backend = d.get("sharing")
        if backend is not None and backend not in SHARING_BACKENDS:
            r.error(path + ("sharing",), f"unknown sharing backend {backend!r}; one of {', '.join(SHARING_BACKENDS)}")
        labels = d.get("node_labels") or {}
        if not isinstance(labels, Mapping) or not all(
            isinstance(k, str) and isinstance(v, str) and k and len(k) <= 253 and len(v) <= 63
            for k, v in labels.items()
        ):
            r.error(path + ("node_labels",), "expected a mapping of node label names to label values (strings)")
            labels = {}
        if model is None and not labels:
            r.error(path, "a pool names a gpu_model (with an optional sharing backend) or node_labels of its nodes")
        if len(r.issues) > n_before or slug is None:
            continue
        if slug in pools:
            r.error(path + ("name",), f"duplicate pool name {slug!r}")
            continue
        pools[slug] = GpuPool(slug, display, model, backend, tuple(sorted(labels.items())))
    return pools


def read_pool_quotas(r: Reader, value: Any, path: KeyPath, pools: Mapping[str, GpuPool]) -> tuple[PoolQuota, ...]:
    """``pools: {h100: {guarantee: 2, burst: 4}}`` of a team or department; each names a pool."""
    if value is None:
        return ()
    if not isinstance(value, Mapping):
        r.error(path, f"expected a mapping of pool name to {{guarantee, burst}}, got {kind(value)}")
        return ()
    out: list[PoolQuota] = []
    for name, spec in value.items():
        p = path + (name,)
        if name not in pools:
            hint = closest_match(name, set(pools))
            known = ", ".join(sorted(pools)) or "none: add a 'pools' section"
            r.error(p, f"unknown pool {name!r}" + (f" (did you mean '{hint}'?)" if hint else "") + f"; pools: {known}")
            continue
        d = r.mapping(spec, p, POOL_QUOTA_KEYS)
        if d is None:
            continue
        guarantee = r.gpus(d, "guarantee", p) or 0
        burst = r.gpus(d, "burst", p)
        burst = guarantee if burst is None else burst
        if burst < guarantee:
            r.error(
                p + ("burst",),
                f"burst limit ({format_gpus(burst)} GPUs) is below the guarantee ({format_gpus(guarantee)} GPUs)",
            )
            continue
        out.append(PoolQuota(name, guarantee, burst))
    return tuple(out)


def read_departments(r: Reader, value: Any, pools: Mapping[str, GpuPool]) -> dict[str, Department]:
    departments: dict[str, Department] = {}
    named = _named_entries(r, value, "departments", DEPARTMENT_KEYS, "department name")
    for path, d, slug, display, n_before in named:
        guarantee = r.gpus(d, "guarantee", path) or 0
        burst = r.gpus(d, "burst", path)
        burst = guarantee if burst is None else burst
        if burst < guarantee:
            r.error(
                path + ("burst",),
                f"burst limit ({format_gpus(burst)} GPUs) is below the guarantee ({format_gpus(guarantee)} GPUs)",
            )
        quotas = read_pool_quotas(r, d.get("pools"), path + ("pools",), pools)
        if len(r.issues) > n_before or slug is None:
            continue
        if slug in departments:
            r.error(path + ("name",), f"duplicate department name {slug!r}")
            continue
        departments[slug] = Department(slug, display, guarantee, burst, quotas)
    return departments


def read_team_tree(
    r: Reader, d: Mapping[str, Any], path: KeyPath, pools: Mapping[str, GpuPool], departments: Mapping[str, Department]
) -> tuple[tuple[PoolQuota, ...], str | None, float]:
    """A team's ``pools``, ``department`` and ``fair_share_weight``."""
    quotas = read_pool_quotas(r, d.get("pools"), path + ("pools",), pools)
    dept = d.get("department")
    if dept is not None:
        if not isinstance(dept, str) or dept not in departments:
            hint = closest_match(dept, set(departments)) if isinstance(dept, str) else None
            known = ", ".join(sorted(departments)) or "none: add a 'departments' section"
            r.error(
                path + ("department",),
                f"unknown department {str(dept)[:64]!r}"
                + (f" (did you mean '{hint}'?)" if hint else "")
                + f"; departments: {known}",
            )
            dept = None
    weight: Any = d.get("fair_share_weight", 1.0)
    if (
        isinstance(weight, bool)
        or not isinstance(weight, (int, float))
        or not math.isfinite(weight)
        or not 0 <= weight <= MAX_WEIGHT
    ):
        r.error(path + ("fair_share_weight",), f"expected a number from 0 to {MAX_WEIGHT:g}, got {str(weight)[:32]!r}")
        weight = 1.0
    return quotas, dept, float(weight)


def check_tree(
    r: Reader,
    teams: Mapping[str, Team],
    departments: Mapping[str, Department],
    pools: Mapping[str, GpuPool],
    profiles: Mapping[str, Profile],
) -> None:
    """A department guarantees at least its teams' guarantees (in all and per pool), so a
    team's in-quota work can only ever wait for its own department's borrowed work; a
    team's pool guarantee fits in its total burst; profiles name pools the catalog has."""
    for d in departments.values():
        members = [t for t in teams.values() if t.department == d.name]
        total = sum(t.guarantee_milli for t in members)
        if total > d.guarantee_milli:
            r.error(
                ("departments", d.name, "guarantee"),
                f"department {d.name} guarantees {format_gpus(d.guarantee_milli)} GPUs, less than its teams' "
                f"guarantees ({format_gpus(total)} GPUs: {', '.join(t.name for t in members)})",
            )
        for q in d.pools:
            in_pool = sum(tq.guarantee_milli for t in members for tq in t.pools if tq.pool == q.pool)
            if in_pool > q.guarantee_milli:
                r.error(
                    ("departments", d.name, "pools", q.pool, "guarantee"),
                    f"department {d.name} guarantees {format_gpus(q.guarantee_milli)} GPUs in pool {q.pool}, less "
                    f"than its teams' guarantees there ({format_gpus(in_pool)} GPUs)",
                )
    for t in teams.values():
        for q in t.pools:
            if q.guarantee_milli > t.burst_milli:
                r.error(
                    ("teams", t.name, "pools", q.pool, "guarantee"),
                    f"team {t.name} is guaranteed {format_gpus(q.guarantee_milli)} GPUs in pool {q.pool}, more than "
                    f"its burst limit in all pools ({format_gpus(t.burst_milli)} GPUs)",
                )
    for p in profiles.values():
        if p.pool is not None and p.pool not in pools:
            hint = closest_match(p.pool, set(pools))
            r.error(
                ("profiles", p.slug, "pool"),
                f"unknown pool {p.pool!r}" + (f" (did you mean '{hint}'?)" if hint else ""),
            )


def pool_quotas_to_dict(quotas: tuple[PoolQuota, ...]) -> dict[str, dict[str, str]]:
    return {q.pool: {"guarantee": format_gpus(q.guarantee_milli), "burst": format_gpus(q.burst_milli)} for q in quotas}


def pool_to_dict(p: GpuPool) -> dict[str, Any]:
    d: dict[str, Any] = {"name": p.name}
    if p.display_name:
        d["display_name"] = p.display_name
    if p.gpu_model is not None:
        d["gpu_model"] = p.gpu_model
    if p.sharing is not None:
        d["sharing"] = p.sharing
    if p.node_labels:
        d["node_labels"] = dict(p.node_labels)
    return d


def department_to_dict(dep: Department) -> dict[str, Any]:
    d: dict[str, Any] = {"name": dep.name}
    if dep.display_name:
        d["display_name"] = dep.display_name
    d["guarantee"] = format_gpus(dep.guarantee_milli)
    d["burst"] = format_gpus(dep.burst_milli)
    if dep.pools:
        d["pools"] = pool_quotas_to_dict(dep.pools)
    return d


def team_tree_to_dict(t: Team) -> dict[str, Any]:
    d: dict[str, Any] = {}
    if t.pools:
        d["pools"] = pool_quotas_to_dict(t.pools)
    if t.department is not None:
        d["department"] = t.department
    if t.fair_share_weight != 1.0:
        d["fair_share_weight"] = t.fair_share_weight
    return d
