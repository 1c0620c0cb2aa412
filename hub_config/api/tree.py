"""The admin API of GPU pools and departments, and the quota tree.

``GET /api/gpulab/tree``: departments over teams with held / guaranteed / borrowed per
node (:func:`hub_config.domain.quota_tree_view.quota_tree`).
``/api/gpulab/departments`` (GET, POST) and ``/api/gpulab/departments/<name>`` (GET,
PATCH, DELETE); ``/api/gpulab/pools`` and ``/api/gpulab/pools/<name>`` the same. Every
write goes through the admin API's one edit path (the whole catalog validated, stored,
audited, swapped in), so a bad value is a 400 that names the key and nothing changes; a
team's ``pools``, ``department`` and ``fair_share_weight`` are edited on the team
(``PATCH /api/gpulab/teams/<name>``).
"""

from __future__ import annotations

import abc
from typing import Any

from tornado import web

from hub_config.api.admin import AdminAPIHandler
from hub_config.domain.quota_tree_view import quota_tree
from spawner.core.catalog import Catalog
from spawner.core.catalog.tree import department_to_dict, pool_to_dict

_NAME = r"([a-z0-9][a-z0-9-]{0,62})"


class TreeHandler(AdminAPIHandler):
    async def get(self) -> None:
        self.check_admin()
        runtime = self.gpulab
        self.write_json(quota_tree(runtime.catalog, runtime.ledger))


class _Section(abc.ABC):
    """One of the catalog's named sections (``departments``, ``pools``): what its handlers read."""

    section = ""
    noun = ""

    @abc.abstractmethod
    def entries(self, catalog: Catalog) -> dict[str, Any]:
        """The section's entries by name."""

    @abc.abstractmethod
    def as_json(self, catalog: Catalog, name: str) -> dict[str, Any] | None:
        """One entry as the API answers it (``None``: there is none)."""

    @abc.abstractmethod
    def users_of(self, catalog: Catalog, name: str) -> list[str]:
        """What uses the entry ("team vision"): it cannot be deleted while anything does."""


class _SectionHandler(_Section, AdminAPIHandler):
    """A handler of one section, edited as a list of dicts."""

    def existing(self, name: str) -> None:
        if name not in self.entries(self.gpulab.catalog):
            raise web.HTTPError(404, f"no {self.noun} {name!r}")

    def change(self, action: str, name: str, mutate: Any) -> None:
        def in_section(_current: Catalog, data: dict[str, Any]) -> None:
            data.setdefault(self.section, [])
            mutate(data[self.section], data)

        self.edit(
            f"{self.noun}.{action}",
            name,
            in_section,
            lambda c: self.as_json(c, name),
            lambda c: self.as_json(c, name),
        )


class _Collection(_SectionHandler):
    async def get(self) -> None:
        self.check_admin()
        catalog = self.gpulab.catalog
        self.write_json({self.section: [self.as_json(catalog, n) for n in self.entries(catalog)]})

    async def post(self) -> None:
        self.check_admin()
        body = self.body()
        name = body.get("name")
        if not isinstance(name, str) or not name:
            raise web.HTTPError(400, f"a new {self.noun} needs a 'name'")
        if name in self.entries(self.gpulab.catalog):
            raise web.HTTPError(409, f"{self.noun} {name!r} already exists")
        self.change("create", name, lambda entries, _data: entries.append(body))
        self.write_json(self.as_json(self.gpulab.catalog, name), status=201)


class _Item(_SectionHandler):
    async def get(self, name: str) -> None:
        self.check_admin()
        self.existing(name)
        self.write_json(self.as_json(self.gpulab.catalog, name))

    async def patch(self, name: str) -> None:
        self.check_admin()
        body = self.body()
        self.existing(name)
        if body.get("name", name) != name:
            raise web.HTTPError(400, f"a {self.noun} cannot be renamed; create a new one and move its teams")

        def mutate(entries: list[dict[str, Any]], _data: dict[str, Any]) -> None:
            i = next(i for i, e in enumerate(entries) if e["name"] == name)
            merged = {**entries[i], **body}
            entries[i] = {k: v for k, v in merged.items() if v is not None}

        self.change("update", name, mutate)
        self.write_json(self.as_json(self.gpulab.catalog, name))

    async def delete(self, name: str) -> None:
        self.check_admin()
        self.existing(name)
        users = self.users_of(self.gpulab.catalog, name)
        if users:
            raise web.HTTPError(409, f"cannot delete {self.noun} {name}: {', '.join(users)} use it; change them first")
        self.change(
            "delete", name, lambda entries, _data: entries.remove(next(e for e in entries if e["name"] == name))
        )
        self.set_status(204)


class _Departments(_Section):
    section = "departments"
    noun = "department"

    def entries(self, catalog: Catalog) -> dict[str, Any]:
        return dict(catalog.departments)

    def as_json(self, catalog: Catalog, name: str) -> dict[str, Any] | None:
        d = catalog.departments.get(name)
        if d is None:
            return None
        return {**department_to_dict(d), "teams": [t.name for t in catalog.teams.values() if t.department == name]}

    def users_of(self, catalog: Catalog, name: str) -> list[str]:
        return [f"team {t.name}" for t in catalog.teams.values() if t.department == name]


class _Pools(_Section):
    section = "pools"
    noun = "pool"

    def entries(self, catalog: Catalog) -> dict[str, Any]:
        return dict(catalog.pools)

    def as_json(self, catalog: Catalog, name: str) -> dict[str, Any] | None:
        p = catalog.pools.get(name)
        if p is None:
            return None
        return {**pool_to_dict(p), "profiles": sorted(s for s, q in catalog.profile_pools.items() if q == name)}

    def users_of(self, catalog: Catalog, name: str) -> list[str]:
        teams = [f"team {t.name}" for t in catalog.teams.values() if any(q.pool == name for q in t.pools)]
        depts = [f"department {d.name}" for d in catalog.departments.values() if any(q.pool == name for q in d.pools)]
        profiles = [f"profile {p.slug}" for p in catalog.profiles.values() if p.pool == name]
        return teams + depts + profiles


class DepartmentsHandler(_Departments, _Collection):
    pass


class DepartmentHandler(_Departments, _Item):
    pass


class PoolsHandler(_Pools, _Collection):
    pass


class PoolHandler(_Pools, _Item):
    pass


handlers = [
    (r"/api/gpulab/tree", TreeHandler),
    (r"/api/gpulab/departments", DepartmentsHandler),
    (rf"/api/gpulab/departments/{_NAME}", DepartmentHandler),
    (r"/api/gpulab/pools", PoolsHandler),
    (rf"/api/gpulab/pools/{_NAME}", PoolHandler),
]
