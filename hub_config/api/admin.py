"""Admin REST API: teams, profiles, prices, usage and the audit log.

Every endpoint needs ``custom:gpulab:admin``. Edits are applied to a copy of
the catalog as the config file's dict, validated by
:func:`spawner.core.catalog.catalog_from_dict` (the one validator), stored with an
audit entry in one transaction, then swapped into the runtime so the next
spawn or job sees them. A refused edit changes neither the database nor the
runtime.

- ``GET/POST /hub/api/gpulab/teams``; ``GET/PATCH/DELETE /hub/api/gpulab/teams/NAME``
- ``GET/POST /hub/api/gpulab/profiles``; ``GET/PATCH /hub/api/gpulab/profiles/SLUG``;
  ``POST /hub/api/gpulab/profiles/SLUG/retire`` and ``.../restore``
- ``GET/PUT /hub/api/gpulab/prices``
- ``GET /hub/api/gpulab/usage[?period=7d | ?start=ISO&end=ISO]`` and ``/usage.csv``
- ``GET /hub/api/gpulab/audit[?limit=&offset=&target=]``
"""

from __future__ import annotations

import csv
import io
from collections.abc import Callable
from datetime import datetime, timedelta, timezone
from typing import Any

from tornado import web

from hub_config.api.base import GPULabAPIHandler
from hub_config.api.me import quota_view
from hub_config.config.scopes import ADMIN
from hub_config.domain.catalog_store import CatalogStore, StaleCatalogError
from hub_config.domain.usage import current_report, period_report
from hub_config.storage.db import utcnow
from spawner.core.catalog import Catalog, CatalogError, catalog_from_dict
from spawner.core.catalog.sharing import known_gpu_models
from spawner.core.catalog.write import catalog_to_dict, profile_to_dict, team_to_dict
from spawner.core.catalog.yaml_text import unknown_gpu_model
from spawner.core.model import is_slug
from spawner.core.units import UnitError, format_gpus, parse_duration
from spawner.runtime import KUBERNETES, GPULabRuntime

#: Admin bodies are small; anything bigger is refused before parsing.
MAX_ADMIN_BODY = 64 * 1024
MAX_PERIOD = timedelta(days=366)
MIN_YEAR, MAX_YEAR = 1970, 9000


def parse_period(period: str | None, start: str | None, end: str | None) -> tuple[datetime, datetime]:
    """``?period=7d`` (ending now) or ``?start=&end=`` (ISO 8601, UTC)."""
    now = utcnow()

    def when(value: str, name: str) -> datetime:
        try:
            dt = datetime.fromisoformat(value.strip().replace("Z", "+00:00"))
            if dt.tzinfo is not None:
                dt = dt.astimezone(timezone.utc).replace(tzinfo=None)
        except (ValueError, OverflowError):
            raise web.HTTPError(400, f"{name} must be an ISO 8601 date or time, got {value[:40]!r}") from None
        if not MIN_YEAR <= dt.year <= MAX_YEAR:  # bucket arithmetic must stay inside datetime's range
            raise web.HTTPError(400, f"{name} must be between the years {MIN_YEAR} and {MAX_YEAR}")
        return dt

    if start or end:
        if period:
            raise web.HTTPError(400, "give either period or start/end, not both")
        s = when(start, "start") if start else now - timedelta(days=7)
        e = when(end, "end") if end else now
    else:
        try:
            seconds = parse_duration(period or "7d")
        except UnitError as err:
            raise web.HTTPError(400, f"period: {err}") from None
        if seconds <= 0:
            raise web.HTTPError(400, "period must be longer than zero")
        e = now
        s = now - timedelta(seconds=min(seconds, MAX_PERIOD.total_seconds() + 1))
    if e <= s:
        raise web.HTTPError(400, "end must be after start")
    if e - s > MAX_PERIOD:
        raise web.HTTPError(400, "a usage period can be at most 366 days")
    return s, e


def bucket_for(span: timedelta) -> timedelta:
    return timedelta(hours=1) if span <= timedelta(hours=48) else timedelta(days=1)


def describe_issues(e: CatalogError, data: dict[str, Any]) -> str:
    """``teams.vision.burst: ...`` rather than list indices the caller never saw."""
    names = {
        "teams": [t.get("name") if isinstance(t, dict) else None for t in data.get("teams", [])],
        "profiles": [p.get("slug") if isinstance(p, dict) else None for p in data.get("profiles", [])],
        "departments": [d.get("name") if isinstance(d, dict) else None for d in data.get("departments", [])],
        "pools": [p.get("name") if isinstance(p, dict) else None for p in data.get("pools", [])],
    }
    out = []
    for issue in e.issues:
        path = list(issue.path)
        if len(path) >= 2 and path[0] in names and isinstance(path[1], int) and path[1] < len(names[path[0]]):
            path[1] = names[path[0]][path[1]] or path[1]
        where = ".".join(str(p) for p in path) or "(catalog)"
        out.append(f"{where}: {issue.message}")
    return "; ".join(out)


def team_view(runtime, name: str) -> dict[str, Any]:
    team = runtime.catalog.team(name)
    u = runtime.ledger.usage(name)
    return {
        **team_to_dict(team),
        **quota_view(team, u),
        "reserved_milli": u.reserved_milli,
        "workloads": u.workloads,
    }


def _team_json(catalog: Catalog, name: str) -> dict[str, Any]:
    """A team of ``catalog`` as the admin API shows it (404 when it does not exist)."""
    team = catalog.team(name)
    if team is None:
        raise web.HTTPError(404, f"no team {name!r}")
    return team_to_dict(team)


def _profile_json(catalog: Catalog, slug: str) -> dict[str, Any]:
    """A profile of ``catalog`` as the admin API shows it (404 when it does not exist)."""
    profile = catalog.profile(slug)
    if profile is None:
        raise web.HTTPError(404, f"no profile {slug!r}")
    return profile_to_dict(profile)


def profile_view(catalog: Catalog, slug: str) -> dict[str, Any]:
    p = catalog.profile(slug)
    if p is None:
        raise web.HTTPError(404, f"no profile {slug!r}")
    d = profile_to_dict(p)
    d["retired"] = p.retired
    d["gpus"] = format_gpus(p.gpu_milli)
    d["used_by_teams"] = [t.name for t in catalog.teams.values() if catalog.team_may_use(t, p)]
    return d


def hub_known_gpu_models(runtime: GPULabRuntime) -> set[str]:
    """GPU models this hub's profiles may name: the single server's devices (NVML or
    declared), or on Kubernetes the products the sharing backends can select."""
    from spawner.local.inventory import ensure_packer

    if runtime.platform == KUBERNETES:
        return known_gpu_models(runtime.catalog, kubernetes=True)
    packer = ensure_packer(runtime)
    return known_gpu_models(runtime.catalog, kubernetes=False, detected=[d.model for d in packer.devices.values()])


class AdminAPIHandler(GPULabAPIHandler):
    """Admin-only; owns the edit-validate-store-apply cycle."""

    def known_gpu_models(self) -> set[str]:
        return hub_known_gpu_models(self.gpulab)

    def check_gpu_model(self, body: dict[str, Any], current: str | None = None) -> None:
        """Refuse a profile's ``gpu_model`` this hub cannot offer (a typo like ``H100-80G``)
        with the known ones; an unchanged model (even an unknown one from the config file) passes."""
        model = body.get("gpu_model")
        if model is None or model == "" or model == current:
            return
        if not isinstance(model, str):
            raise web.HTTPError(400, f"gpu_model must be a string, not {type(model).__name__}")
        known = self.known_gpu_models()
        if model not in known:
            raise web.HTTPError(400, "gpu_model: " + unknown_gpu_model(model[:64], known))

    def check_admin(self) -> None:
        self.require_scope(ADMIN)

    def check_fits_hub(self, catalog: Catalog, slug: str) -> None:
        """Refuse a profile no server of this hub could ever give: on a single server, more GPUs
        (of its model) than the whole inventory holds. (On Kubernetes the nodes come and go: the
        spawn page says when nothing fits.)"""
        runtime = self.gpulab
        profile = catalog.profile(slug)
        if runtime.platform == KUBERNETES or profile is None or not profile.is_gpu:
            return
        from spawner.local.spawner import ensure_packer

        models = {profile.gpu_model} if profile.gpu_model else None
        total = ensure_packer(runtime).total_milli(models)
        if profile.gpu_milli > total:
            model = profile.gpu_model or "GPU"
            raise web.HTTPError(
                400,
                f"gpus: {format_gpus(profile.gpu_milli)} GPUs is more than this server has "
                f"({format_gpus(total)} {model} in all), so no user could ever start it; "
                f"at most {format_gpus(total)} here",
            )

    @property
    def store(self) -> CatalogStore:
        store = self.gpulab.catalog_store
        if store is None:
            raise web.HTTPError(
                503,
                "gpulab's catalog store is not attached "
                "(c.GPULab.runtime_hooks lacks hub_config.config.runtime.attach_runtime)",
            )
        return store

    def body(self) -> dict[str, Any]:
        return self.read_json(MAX_ADMIN_BODY)

    @property
    def actor(self) -> str:
        user = self.current_user
        kind = getattr(user, "kind", "user")
        return self.caller_name if kind == "user" else f"{kind}:{self.caller_name}"

    def edit(
        self,
        action: str,
        target: str,
        mutate: Callable[[Catalog, dict[str, Any]], None],
        old: Callable[[Catalog], Any],
        new: Callable[[Catalog], Any],
        check: Callable[[Catalog], None] | None = None,
    ) -> Catalog:
        """Apply ``mutate`` to the catalog dict, validate (and ``check`` the result), store, audit, swap in."""
        store = self.store
        if store.read_only:
            raise web.HTTPError(
                409,
                "the catalog is managed by the config file "
                "(c.GPULabCatalogStore.source = 'file'); edit the file and restart the hub",
            )
        runtime = self.gpulab
        with runtime.lock:
            current = runtime.catalog
            data = catalog_to_dict(current)
            mutate(current, data)
            try:
                catalog = catalog_from_dict(data, "request")
            except CatalogError as e:
                raise web.HTTPError(400, describe_issues(e, data)) from None
            if check is not None:
                check(catalog)
            before, after = old(current), new(catalog)
            if before == after:
                return current
            row = store.row()
            try:
                store.save(
                    catalog,
                    actor=self.actor,
                    action=action,
                    target=target,
                    old=before,
                    new=after,
                    version=row.version if row is not None else None,
                )
            except StaleCatalogError as e:
                raise web.HTTPError(409, str(e)) from None
            runtime.set_catalog(catalog)
        self.log.info("gpulab admin: %s %s %s by %s", action, target, after if after is not None else "", self.actor)
        return catalog


# -- teams ------------------------------------------------------------------


def _held_reason(runtime, name: str, doing: str) -> str | None:
    u = runtime.ledger.usage(name)
    if u.held_milli <= 0 and u.workloads == 0:
        return None
    keys = ", ".join(w.key for w in runtime.ledger.workloads(name)[:5])
    return (
        f"cannot {doing} team {name}: it holds {format_gpus(u.held_milli)} GPUs in {u.workloads} "
        f"workload(s) ({keys}); stop them first"
    )


class TeamsHandler(AdminAPIHandler):
    async def get(self) -> None:
        self.check_admin()
        runtime = self.gpulab
        row = self.store.row()
        self.write_json(
            {
                "teams": [team_view(runtime, n) for n in runtime.catalog.teams],
                "version": row.version if row else None,
                "source": self.store.settings.source,
            }
        )

    async def post(self) -> None:
        self.check_admin()
        body = self.body()
        name = body.get("name")
        if not isinstance(name, str) or not name:
            raise web.HTTPError(400, "a new team needs a 'name'")
        if self.gpulab.catalog.team(name) is not None:
            raise web.HTTPError(409, f"team {name!r} already exists")

        def mutate(_current, data):
            data["teams"].append(body)

        self.edit("team.create", name, mutate, lambda c: None, lambda c: _team_json(c, name))
        self.write_json(team_view(self.gpulab, name), status=201)


class TeamHandler(AdminAPIHandler):
    def _team(self, name: str):
        team = self.gpulab.catalog.team(name)
        if team is None:
            raise web.HTTPError(404, f"no team {name!r}")
        return team

    async def get(self, name: str) -> None:
        self.check_admin()
        self._team(name)
        self.write_json(team_view(self.gpulab, name))

    async def patch(self, name: str) -> None:
        self.check_admin()
        body = self.body()
        self._team(name)
        runtime = self.gpulab
        new_name = body.get("name", name)
        if new_name != name:
            if not is_slug(new_name):
                raise web.HTTPError(400, f"team name {new_name!r} must be lowercase letters, digits and '-'")
            if runtime.catalog.team(new_name) is not None:
                raise web.HTTPError(409, f"team {new_name!r} already exists")
            reason = _held_reason(runtime, name, "rename")
            if reason:
                raise web.HTTPError(409, reason)

        def mutate(_current, data):
            teams = data["teams"]
            i = next(i for i, t in enumerate(teams) if t["name"] == name)
            merged = {**teams[i], **body}
            teams[i] = {k: v for k, v in merged.items() if v is not None}
            if new_name != name:
                for p in data["profiles"]:
                    if name in p.get("teams", []):
                        p["teams"] = [new_name if t == name else t for t in p["teams"]]

        action = "team.rename" if new_name != name else "team.update"
        target = f"{name} -> {new_name}" if new_name != name else name
        self.edit(action, target, mutate, lambda c: _team_json(c, name), lambda c: _team_json(c, new_name))
        self.write_json(team_view(runtime, new_name))

    async def delete(self, name: str) -> None:
        self.check_admin()
        self._team(name)
        runtime = self.gpulab
        reason = _held_reason(runtime, name, "delete")
        if reason:
            raise web.HTTPError(409, reason)
        restricted = [p.slug for p in runtime.catalog.profiles.values() if name in p.teams]
        if restricted:
            raise web.HTTPError(
                409,
                f"cannot delete team {name}: profile(s) {', '.join(restricted)} are "
                "restricted to it; edit their teams first",
            )

        def mutate(_current, data):
            data["teams"] = [t for t in data["teams"] if t["name"] != name]

        self.edit("team.delete", name, mutate, lambda c: _team_json(c, name), lambda c: None)
        self.set_status(204)
        self.finish()


# -- profiles ---------------------------------------------------------------


class ProfilesHandler(AdminAPIHandler):
    async def get(self) -> None:
        self.check_admin()
        catalog = self.gpulab.catalog
        self.write_json({"profiles": [profile_view(catalog, s) for s in catalog.profiles]})

    async def post(self) -> None:
        self.check_admin()
        body = self.body()
        slug = body.get("slug")
        if not isinstance(slug, str) or not slug:
            raise web.HTTPError(400, "a new profile needs a 'slug'")
        if self.gpulab.catalog.profile(slug) is not None:
            raise web.HTTPError(409, f"profile {slug!r} already exists")
        self.check_gpu_model(body)

        def mutate(_current, data):
            data["profiles"].append(body)
            # Offered to the teams it names: a team with a list of allowed profiles gains it too,
            # else a new profile would be "offered" to nobody.
            chosen = body.get("teams")
            if isinstance(chosen, list):
                for team in data["teams"]:
                    allowed = team.get("allowed_profiles")
                    if team.get("name") in chosen and isinstance(allowed, list) and slug not in allowed:
                        allowed.append(slug)

        catalog = self.edit(
            "profile.create",
            slug,
            mutate,
            lambda c: None,
            lambda c: _profile_json(c, slug),
            check=lambda c: self.check_fits_hub(c, slug),
        )
        self.write_json(profile_view(catalog, slug), status=201)


class _ProfileBase(AdminAPIHandler):
    def _profile(self, slug: str):
        p = self.gpulab.catalog.profile(slug)
        if p is None:
            raise web.HTTPError(404, f"no profile {slug!r}")
        return p

    def _update(self, slug: str, body: dict[str, Any], action: str) -> None:
        def mutate(_current, data):
            profiles = data["profiles"]
            i = next(i for i, p in enumerate(profiles) if p["slug"] == slug)
            merged = {**profiles[i], **body}
            if "gpus" in body:  # the stored dict carries gpu_milli; the caller gave GPUs
                merged.pop("gpu_milli", None)
            profiles[i] = {k: v for k, v in merged.items() if v is not None}

        catalog = self.edit(
            action,
            slug,
            mutate,
            lambda c: _profile_json(c, slug),
            lambda c: _profile_json(c, slug),
            check=lambda c: self.check_fits_hub(c, slug) if "gpus" in body or "gpu_model" in body else None,
        )
        self.write_json(profile_view(catalog, slug))


class ProfileHandler(_ProfileBase):
    async def get(self, slug: str) -> None:
        self.check_admin()
        self._profile(slug)
        self.write_json(profile_view(self.gpulab.catalog, slug))

    async def patch(self, slug: str) -> None:
        self.check_admin()
        body = self.body()
        profile = self._profile(slug)
        if body.get("slug", slug) != slug:
            raise web.HTTPError(
                400,
                "a profile's slug cannot change (running sessions refer to it); "
                "create a new profile and retire this one",
            )
        self.check_gpu_model(body, current=profile.gpu_model)
        self._update(slug, body, "profile.update")


class ProfileRetireHandler(_ProfileBase):
    async def post(self, slug: str, what: str) -> None:
        self.check_admin()
        self._profile(slug)
        self._update(slug, {"retired": what == "retire"}, f"profile.{what}")


# -- prices -----------------------------------------------------------------


class PricesHandler(AdminAPIHandler):
    async def get(self) -> None:
        self.check_admin()
        self.write_json({"prices": dict(self.gpulab.catalog.prices)})

    async def put(self) -> None:
        self.check_admin()
        body = self.body()
        if set(body) != {"prices"}:
            raise web.HTTPError(400, 'body must be {"prices": {MODEL: price per GPU-hour, ...}}')

        def mutate(_current, data):
            data["prices"] = body["prices"]

        catalog = self.edit("prices.update", "prices", mutate, lambda c: dict(c.prices), lambda c: dict(c.prices))
        self.write_json({"prices": dict(catalog.prices)})


# -- usage and audit ----------------------------------------------------------


class UsageHandler(AdminAPIHandler):
    def report(self) -> dict[str, Any]:
        start, end = parse_period(
            self.get_argument("period", None), self.get_argument("start", None), self.get_argument("end", None)
        )
        runtime = self.gpulab
        recorder = runtime.usage
        if recorder is None:
            raise web.HTTPError(503, "gpulab's usage history is not attached")
        report = period_report(runtime, recorder.sessions, recorder.settings, start, end, bucket_for(end - start))
        report["now"] = current_report(runtime)
        return report

    async def get(self) -> None:
        self.check_admin()
        self.write_json(self.report())


CSV_COLUMNS = [
    "start",
    "end",
    "team",
    "user",
    "gpu_hours",
    "in_quota_gpu_hours",
    "burst_gpu_hours",
    "cost",
    "utilisation_pct",
    "idle_gpu_hours_before_reclaim",
    "gpu_hours_freed",
    "held_milli_now",
    "jobs",
]


class UsageCSVHandler(UsageHandler):
    async def get(self) -> None:
        self.check_admin()
        report = self.report()
        held_now = {(t["team"], u["user"]): u["held_milli"] for t in report["now"] for u in t["users"]}
        team_now = {t["team"]: t["held_milli"] for t in report["now"]}
        buf = io.StringIO()
        w = csv.writer(buf)
        w.writerow(CSV_COLUMNS)

        def row(team, user, d, held):
            jobs = d.get("jobs")
            w.writerow(
                [
                    report["start"],
                    report["end"],
                    team,
                    user,
                    d["gpu_hours"],
                    d["in_quota_gpu_hours"],
                    d["burst_gpu_hours"],
                    d["cost"],
                    "" if d["utilisation_pct"] is None else d["utilisation_pct"],
                    *("" if d[k] is None else d[k] for k in ("idle_gpu_hours_before_reclaim", "gpu_hours_freed")),
                    held,
                    "" if jobs is None else " ".join(f"{k}={v}" for k, v in sorted(jobs.items())),
                ]
            )

        for t in report["teams"]:
            row(t["team"], "", t, team_now.get(t["team"], 0))
            for u in t["users"]:
                row(t["team"], u["user"], u, held_now.get((t["team"], u["user"]), 0))
        self.set_header("Content-Type", "text/csv; charset=utf-8")
        self.set_header(
            "Content-Disposition",
            f'attachment; filename="gpulab-usage-{report["start"][:10]}-{report["end"][:10]}.csv"',
        )
        self.finish(buf.getvalue())


class AuditHandler(AdminAPIHandler):
    async def get(self) -> None:
        self.check_admin()
        limit = self.int_argument("limit", 100, 1, 1000)
        offset = self.int_argument("offset", 0)
        target = self.get_argument("target", None)
        entries, total = self.store.entries(limit=limit, offset=offset, target=target)
        self.write_json({"entries": entries, "total": total})


_NAME = r"([a-z0-9][a-z0-9-]{0,62})"
handlers = [
    (r"/api/gpulab/teams", TeamsHandler),
    (rf"/api/gpulab/teams/{_NAME}", TeamHandler),
    (r"/api/gpulab/profiles", ProfilesHandler),
    (rf"/api/gpulab/profiles/{_NAME}", ProfileHandler),
    (rf"/api/gpulab/profiles/{_NAME}/(retire|restore)", ProfileRetireHandler),
    (r"/api/gpulab/prices", PricesHandler),
    (r"/api/gpulab/usage", UsageHandler),
    (r"/api/gpulab/usage\.csv", UsageCSVHandler),
    (r"/api/gpulab/audit", AuditHandler),
]
