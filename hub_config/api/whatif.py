"""What-if API for admins: replay recorded usage under a proposed catalog, quotas and idle timeout.

- ``GET /hub/api/gpulab/whatif[?team=NAME&days=30]``: today's settings replayed,
  and the profile advisor's catalog for the recorded demand.
- ``POST /hub/api/gpulab/whatif``: ``{"team": null | NAME, "days": 30,
  "sizes": [0.25, 0.5, 1, 2], "quotas": {"vision": {"guarantee": 2, "burst": 4}},
  "idle_timeout": "1h" | null, "max_sizes": 6, "budgets": null | [{"team": "vision",
  "gpu_hours": 100, "period": "month", "at_limit": "refuse"}]}``: the same, plus the proposal
  (``budgets`` null: today's stored GPU-hour budgets; ``[]``: none).

Nothing is saved: the replay runs on copies (:mod:`spawner.core.whatif`, the engine
the capacity benchmark uses). Needs ``custom:gpulab:admin``; a body that is
malformed, too large or names unknown fields, teams or sizes the sharing
backend cannot give is refused with 400/413 and a message saying which.
"""

from __future__ import annotations

import dataclasses
from datetime import timedelta
from typing import Any

from sqlalchemy import select
from tornado import web
from tornado.ioloop import IOLoop

from hub_config.api.admin import AdminAPIHandler
from hub_config.domain.usage_records import UsageInterval, UtilisationSample
from hub_config.storage.db import utcnow
from spawner.core.advisor import AdvisorError, demand_from, fill_work, givable_sizes, recommend
from spawner.core.budgets import Budget, BudgetError, budget_from_dict, budget_to_dict
from spawner.core.catalog import Catalog
from spawner.core.catalog.reader import Reader, format_path
from spawner.core.catalog.tree import read_pool_quotas
from spawner.core.packer import GPUDevice, devices_from_inventory
from spawner.core.quota_tree import PoolQuota
from spawner.core.units import UnitError, format_gpus, parse_duration, parse_gpus
from spawner.core.whatif import Proposal, RecordedSession, replay

MAX_WHATIF_BODY = 16 * 1024
MAX_DAYS = 90
MAX_SIZES = 16
FIELDS = {"team", "days", "sizes", "quotas", "departments", "idle_timeout", "max_sizes", "budgets"}
#: What a proposed quota of a team or department may set.
QUOTA_KEYS = {"guarantee", "burst", "pools"}
MAX_BUDGETS = 256


def catalog_sizes(catalog: Catalog, team: str | None = None) -> list[int]:
    """Distinct GPU sizes of today's offered profiles (those ``team`` may use, if given)."""
    t = catalog.team(team) if team else None
    profiles = catalog.profiles_for(t) if t is not None else [p for p in catalog.profiles.values() if not p.retired]
    return sorted({p.gpu_milli for p in profiles if p.gpu_milli > 0})


def load_history(sessions_factory, since, until, team: str | None) -> list[RecordedSession]:
    """Usage intervals overlapping ``[since, until]`` with their utilisation samples, as replay input."""
    out: list[RecordedSession] = []
    with sessions_factory() as s:
        q = select(UsageInterval).where(UsageInterval.started_at >= since, UsageInterval.started_at < until)
        if team:
            q = q.where(UsageInterval.team == team)
        rows = list(s.scalars(q.order_by(UsageInterval.started_at)))
        keys = {r.key for r in rows}
        samples: dict[str, list[tuple[float, float]]] = {}
        if keys:
            sq = select(UtilisationSample).where(UtilisationSample.at >= since, UtilisationSample.key.in_(keys))
            for smp in s.scalars(sq.order_by(UtilisationSample.at)):
                samples.setdefault(smp.key, []).append((_ts(smp.at), float(smp.util_pct)))
    for r in rows:
        start, end = _ts(r.started_at), _ts(r.ended_at or until)
        own = tuple((t, v) for t, v in samples.get(r.key, ()) if start <= t <= end)
        out.append(
            RecordedSession(
                key=r.key,
                team=r.team,
                user=r.user,
                gpu_milli=r.gpu_milli,
                start=start,
                end=end,
                models=frozenset([r.gpu_model]) if r.gpu_model else frozenset(),
                samples=own,
                profile=r.profile or "",
            )
        )
    return out


def _pools_json(pools: tuple[PoolQuota, ...]) -> dict[str, Any]:
    if not pools:
        return {}
    return {"pools": {q.pool: {"guarantee_milli": q.guarantee_milli, "burst_milli": q.burst_milli} for q in pools}}


def _ts(dt) -> float:
    return (dt - dt.__class__(1970, 1, 1)).total_seconds()


class WhatIfHandler(AdminAPIHandler):
    def _history(self, team: str | None, days: int) -> tuple[list[RecordedSession], Any, Any]:
        """The recorded sessions of the last ``days`` (one team's, or everyone's for ``None``)."""
        recorder = self.gpulab.usage
        if recorder is None:
            raise web.HTTPError(503, "gpulab's usage history is not attached")
        until = utcnow()
        since = until - timedelta(days=days)
        return load_history(recorder.sessions, since, until, team), since, until

    def _team(self, value: Any) -> str | None:
        if value is None or value == "":
            return None
        if not isinstance(value, str) or self.gpulab.catalog.team(value) is None:
            raise web.HTTPError(400, f"team: no team named {str(value)[:64]!r}")
        return value

    def _days(self, value: Any) -> int:
        if isinstance(value, str) and value.isdigit():
            value = int(value)
        if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_DAYS:
            raise web.HTTPError(400, f"days: expected a whole number of days from 1 to {MAX_DAYS}")
        return value

    def _sizes(self, value: Any, rules: OfferRules) -> tuple[int, ...]:
        if not isinstance(value, list) or not 1 <= len(value) <= MAX_SIZES:
            raise web.HTTPError(400, f"sizes: expected a list of 1 to {MAX_SIZES} GPU sizes, e.g. [0.25, 0.5, 1, 2]")
        givable = rules.givable()
        out = set()
        for v in value:
            try:
                milli = parse_gpus(v)
            except UnitError as e:
                raise web.HTTPError(400, f"sizes: {e}") from None
            if milli not in givable:
                raise web.HTTPError(
                    400, f"sizes: {format_gpus(milli)} GPU is not a size this hub can give ({rules.label})"
                )
            out.add(milli)
        return tuple(sorted(out))

    def _quotas(self, value: Any, catalog: Catalog) -> dict[str, Any]:
        teams = dict(catalog.teams)
        if value is None:
            return teams
        if not isinstance(value, dict) or len(value) > 256:
            raise web.HTTPError(400, "quotas: expected {team: {guarantee: GPUs, burst: GPUs}}")
        for name, q in value.items():
            if name not in teams:
                raise web.HTTPError(400, f"quotas: no team named {str(name)[:64]!r}")
            t = teams[name]
            g, b, pools = self._quota(q, f"quotas.{name}", t.guarantee_milli, t.burst_milli, t.pools, catalog)
            teams[name] = dataclasses.replace(t, guarantee_milli=g, burst_milli=b, pools=pools)
        return teams

    def _quota(
        self, q: Any, where: str, guarantee: int, burst: int, pools: tuple[PoolQuota, ...], catalog: Catalog
    ) -> tuple[int, int, tuple[PoolQuota, ...]]:
        """A proposed ``{guarantee, burst, pools}`` over today's figures (keys left out keep theirs)."""
        if not isinstance(q, dict) or not set(q) <= QUOTA_KEYS:
            raise web.HTTPError(400, f"{where}: expected {{guarantee: GPUs, burst: GPUs, pools: {{POOL: ...}}}}")
        try:
            g = parse_gpus(q.get("guarantee", guarantee / 1000))
            b = parse_gpus(q.get("burst", burst / 1000))
        except UnitError as e:
            raise web.HTTPError(400, f"{where}: {e}") from None
        if b < g:
            raise web.HTTPError(400, f"{where}: burst ({format_gpus(b)}) is below the guarantee ({format_gpus(g)})")
        if "pools" in q:
            r = Reader()
            pools = read_pool_quotas(r, q["pools"], (where, "pools"), catalog.pools)
            if r.issues:
                raise web.HTTPError(400, "; ".join(f"{format_path(i.path)}: {i.message}" for i in r.issues[:5]))
        return g, b, pools

    def _departments(self, value: Any, catalog: Catalog) -> dict[str, Any]:
        departments = dict(catalog.departments)
        if value is None:
            return departments
        if not isinstance(value, dict) or len(value) > 256:
            raise web.HTTPError(400, "departments: expected {department: {guarantee: GPUs, burst: GPUs, pools}}")
        for name, q in value.items():
            if name not in departments:
                raise web.HTTPError(400, f"departments: no department named {str(name)[:64]!r}")
            d = departments[name]
            g, b, pools = self._quota(q, f"departments.{name}", d.guarantee_milli, d.burst_milli, d.pools, catalog)
            departments[name] = dataclasses.replace(d, guarantee_milli=g, burst_milli=b, pools=pools)
        return departments

    def _timeout(self, value: Any) -> int | None:
        if value is None or value == "":
            return None
        try:
            seconds = parse_duration(value)
        except UnitError as e:
            raise web.HTTPError(400, f"idle_timeout: {e}") from None
        if not 60 <= seconds <= 30 * 86400:
            raise web.HTTPError(400, 'idle_timeout: expected 1 minute to 30 days, e.g. "1h"')
        return seconds

    def _stored_budgets(self) -> tuple[tuple[Budget, ...], str]:
        """Today's GPU-hour budgets and the usage time zone their periods are in."""
        book = self.gpulab.budgets
        if book is None:
            return (), "UTC"
        return tuple(book.budgets()), book.zone

    def _budgets(self, value: Any, catalog: Catalog) -> tuple[Budget, ...]:
        if value is None:
            return self._stored_budgets()[0]
        if not isinstance(value, list) or len(value) > MAX_BUDGETS:
            raise web.HTTPError(400, f"budgets: expected a list of at most {MAX_BUDGETS} budgets")
        out: dict[str, Budget] = {}
        for n, entry in enumerate(value):
            try:
                b = budget_from_dict(entry, catalog.teams)
            except BudgetError as e:
                raise web.HTTPError(400, f"budgets[{n}]: {e}") from None
            if b.key in out:
                raise web.HTTPError(400, f"budgets[{n}]: {b.key} is given twice")
            out[b.key] = b
        return tuple(out.values())

    def _max_sizes(self, value: Any) -> int:
        if value is None:
            return 6
        if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_SIZES:
            raise web.HTTPError(400, f"max_sizes: expected a whole number from 1 to {MAX_SIZES}")
        return value

    def _answer(self, team: str | None, days: int, proposal: Proposal | None, max_sizes: int) -> dict[str, Any]:
        catalog = self.gpulab.catalog
        rules = offer_rules(self.gpulab)
        # Every team's sessions are replayed (they share the GPUs); a team's figures count its own.
        everyone, since, until = self._history(None, days)
        history = [s for s in everyone if team is None or s.team == team]
        current_sizes = catalog_sizes(catalog, team)
        stored, zone = self._stored_budgets()
        today = Proposal(
            sizes=tuple(current_sizes) or None,
            teams=dict(catalog.teams),
            departments=dict(catalog.departments),
            profile_pools=catalog.profile_pools,
            budgets=stored,
            time_zone=zone,
        )
        # Weighted by GPU-hours: a size held for days matters more than one tried for a minute.
        demand = demand_from((s.gpu_milli, max(60.0, s.end - s.start) / 3600) for s in history)
        evaluate = None
        if rules.devices:  # the paper's fill measure on this server's own GPUs
            requests = [(s.gpu_milli, s.models) for s in history]
            evaluate = lambda sizes: fill_work(requests, rules.devices, sizes)  # noqa: E731
        try:
            advice = recommend(
                demand,
                rules.backend,
                max_sizes=max_sizes,
                options=rules.options,
                model=rules.model,
                current=current_sizes or None,
                evaluate=evaluate,
            ).to_dict()
            advice["error"] = None
        except AdvisorError as e:
            advice = {"error": str(e)}
        out = {
            "team": team,
            "days": days,
            "since": since.isoformat() + "Z",
            "until": until.isoformat() + "Z",
            "sessions": len(history),
            "offers": rules.label,
            "current_sizes_milli": current_sizes,
            "current": replay(everyone, today, rules.devices, team=team).to_dict(),
            "advice": advice,
            "proposed": None,
        }
        if proposal is not None:
            out["proposed"] = replay(everyone, proposal, rules.devices, team=team).to_dict()
            out["proposal"] = {
                "sizes_milli": list(proposal.sizes or ()),
                "idle_timeout_seconds": proposal.idle_timeout_seconds,
                "quotas": {
                    n: {"guarantee_milli": t.guarantee_milli, "burst_milli": t.burst_milli, **_pools_json(t.pools)}
                    for n, t in (proposal.teams or {}).items()
                },
                "departments": {
                    n: {"guarantee_milli": d.guarantee_milli, "burst_milli": d.burst_milli, **_pools_json(d.pools)}
                    for n, d in (proposal.departments or {}).items()
                },
                "budgets": [budget_to_dict(b) for b in proposal.budgets],
            }
        return out

    async def get(self) -> None:
        self.check_admin()
        team = self._team(self.get_argument("team", None))
        days = self._days(self.get_argument("days", "30"))
        self.write_json(await self._run(team, days, None, self._max_sizes(None)))

    async def post(self) -> None:
        self.check_admin()
        body = self.read_json(MAX_WHATIF_BODY)
        unknown = set(body) - FIELDS
        if unknown:
            raise web.HTTPError(
                400, f"unknown field(s) {', '.join(sorted(unknown))[:200]}; expected {', '.join(sorted(FIELDS))}"
            )
        catalog = self.gpulab.catalog
        team = self._team(body.get("team"))
        days = self._days(body.get("days", 30))
        sizes = (
            self._sizes(body["sizes"], offer_rules(self.gpulab))
            if body.get("sizes") is not None
            else tuple(catalog_sizes(catalog, team)) or None
        )
        proposal = Proposal(
            sizes=sizes,
            teams=self._quotas(body.get("quotas"), catalog),
            idle_timeout_seconds=self._timeout(body.get("idle_timeout")),
            departments=self._departments(body.get("departments"), catalog),
            profile_pools=catalog.profile_pools,
            budgets=self._budgets(body.get("budgets"), catalog),
            time_zone=self._stored_budgets()[1],
        )
        self.write_json(await self._run(team, days, proposal, self._max_sizes(body.get("max_sizes"))))

    async def _run(self, team: str | None, days: int, proposal: Proposal | None, max_sizes: int) -> dict[str, Any]:
        # Reading a month of history and replaying it is CPU work: keep it off the hub's event loop.
        return await IOLoop.current().run_in_executor(None, self._answer, team, days, proposal, max_sizes)


@dataclasses.dataclass(frozen=True)
class OfferRules:
    """What sizes this hub can give, and (single server) on which devices."""

    label: str
    backend: str
    options: Any
    model: str | None
    devices: list[GPUDevice] | None

    def givable(self, max_gpus: int = 64) -> set[int]:
        try:
            return set(givable_sizes(self.backend, self.options, self.model, max_gpus=max_gpus))
        except AdvisorError as e:
            raise web.HTTPError(400, f"sizes: {e}") from None


def offer_rules(runtime) -> OfferRules:
    """On a single server the packer gives any milli-GPU share of the declared or detected GPUs;
    on Kubernetes the sharing backend decides, and the hub does not know the nodes."""
    catalog = runtime.catalog
    packer = runtime.packer
    if packer is not None or catalog.inventory:
        devices = list(packer.devices.values()) if packer is not None else devices_from_inventory(catalog.inventory)
        return OfferRules("single server (any share of a GPU)", "kai", {}, None, devices)
    backend = str(catalog.sharing.get("backend") or "whole")
    return OfferRules(backend, backend, catalog.sharing.get(backend), _mig_model(catalog), None)


def _mig_model(catalog: Catalog) -> str | None:
    """The GPU model of the catalog's MIG profiles (MIG sizes differ per model)."""
    models = sorted({p.gpu_model for p in catalog.profiles.values() if p.gpu_model})
    return models[0] if models else None


handlers = [
    (r"/api/gpulab/whatif", WhatIfHandler),
]
