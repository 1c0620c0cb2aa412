"""The quota tree as the admin API and page show it: departments over teams, each node's
GPUs held, guaranteed and borrowed (in all and per GPU pool), and each borrowing team's
weighted share of its department's idle capacity.

Read from the ledger (what is held now) and the catalog (the limits); writes nothing.
"""

from __future__ import annotations

from typing import Any

from spawner.core.catalog import Catalog
from spawner.core.ledger import Ledger
from spawner.core.ledger_tree import TeamState, department_fair_shares
from spawner.core.model import Team
from spawner.core.quota_tree import NodeUsage, PoolQuota, borrowed, fair_shares, weighted_share
from spawner.core.units import format_gpus


def _node(usage: NodeUsage) -> dict[str, Any]:
    return {
        "guarantee_milli": usage.guarantee_milli,
        "burst_milli": usage.burst_milli,
        "held_milli": usage.held_milli,
        "borrowed_milli": usage.borrowed_milli,
        "words": (
            f"holds {format_gpus(usage.held_milli)} of {format_gpus(usage.guarantee_milli)} guaranteed"
            f" (burst {format_gpus(usage.burst_milli)}), borrows {format_gpus(usage.borrowed_milli)}"
        ),
    }


def _pools(quotas: tuple[PoolQuota, ...], held: dict[str, int]) -> list[dict[str, Any]]:
    return [
        {"pool": q.pool, **_node(NodeUsage(q.pool, q.guarantee_milli, q.burst_milli, held.get(q.pool, 0)))}
        for q in quotas
    ]


def _team(ledger: Ledger, team: Team, fair: int | None, now: int | None = None, waiting: int = 0) -> dict[str, Any]:
    u = ledger.usage(team.name)
    node = _node(NodeUsage(team.name, team.guarantee_milli, team.burst_milli, u.held_milli))
    return {
        "name": team.name,
        "display_name": team.label,
        "kind": "team",
        **node,
        "fair_share_weight": team.fair_share_weight,
        "weighted_share": weighted_share(node["borrowed_milli"], team.fair_share_weight),
        "fair_share_milli": fair,
        "fair_share_now_milli": now,
        "waiting_milli": waiting,
        "pools": _pools(team.pools, ledger.held_in_pools(team.name)),
    }


def quota_tree(catalog: Catalog, ledger: Ledger) -> dict[str, Any]:
    """``{"pools": [...], "departments": [{..., "teams": [...]}], "teams": [teams in no department]}``.

    A department's teams get ``fair_share_milli``: what of the department's idle
    capacity above their guarantees (burst minus what its teams are guaranteed) each
    would borrow if every one of them wanted up to its own burst, split by weight; and
    ``fair_share_now_milli``: the share the ledger's weighted borrowing holds it to now,
    from what each holds and has waiting in the spawn queue (``waiting_milli``); ``None``
    while no team of the department waits (idle capacity then goes first-come).
    """
    waiting = ledger.waiting()
    out_departments = []
    for dept in catalog.departments.values():
        usage = ledger.department_usage(dept.name) or NodeUsage(dept.name, dept.guarantee_milli, dept.burst_milli, 0)
        members = [t for t in catalog.teams.values() if t.department == dept.name]
        borrowable = max(0, dept.burst_milli - sum(t.guarantee_milli for t in members))
        fair = fair_shares(
            borrowable,
            {t.name: borrowed(t.burst_milli, t.guarantee_milli) for t in members},
            {t.name: t.fair_share_weight for t in members},
        )
        states = [TeamState.of(t, ledger.usage(t.name).held_milli, waiting, {}) for t in members]
        # Only while a team of it waits does weighted borrowing hold anyone back.
        contended = any(waiting.get(t.name, 0) for t in members)
        now = department_fair_shares(states, dept.burst_milli) if contended else {}
        out_departments.append(
            {
                "name": dept.name,
                "display_name": dept.label,
                "kind": "department",
                **_node(usage),
                "pools": _pools(dept.pools, ledger.department_pools(dept.name)),
                "teams": [_team(ledger, t, fair.get(t.name), now.get(t.name), waiting.get(t.name, 0)) for t in members],
            }
        )
    return {
        "pools": [
            {
                "name": p.name,
                "display_name": p.label,
                "gpu_model": p.gpu_model,
                "sharing": p.sharing,
                "node_labels": dict(p.node_labels),
                "profiles": sorted(s for s, pool in catalog.profile_pools.items() if pool == p.name),
            }
            for p in catalog.pools.values()
        ],
        "departments": out_departments,
        "teams": [_team(ledger, t, None) for t in catalog.teams.values() if t.department is None],
    }
