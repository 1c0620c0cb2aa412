"""GPU-hour budgets over REST.

Admins (``custom:gpulab:admin``):

- ``GET /hub/api/gpulab/budgets``: every budget with its period and use, the webhook URL, the
  latest threshold notices and their delivery.
- ``PUT /hub/api/gpulab/budgets/teams/TEAM`` and ``.../teams/TEAM/users/USER`` with
  ``{"gpu_hours": 100, "period": "month" | "week", "at_limit": "over-quota" | "refuse"}``;
  ``DELETE`` the same paths.
- ``PUT /hub/api/gpulab/budgets/webhook`` with ``{"url": "https://..." | ""}``.
- ``POST /hub/api/gpulab/budgets/check``: check every budget now (else every
  ``c.GPULabBudgets.check_interval``), record due notices and deliver them.

Users: ``GET /hub/api/gpulab/me/budgets`` (the caller's teams' budgets and their own; admins
may add ``?user=NAME``), which the spawn page and the lab sidebar show.

A malformed, oversized or unknown-field body, a team that does not exist, a user the hub does
not know, a ``team`` in the body that differs from the path, a URL that is not http(s): a 4xx
with the reason, and nothing stored.
"""

from __future__ import annotations

from typing import Any

from tornado import web

from hub_config.api.admin import AdminAPIHandler
from hub_config.api.base import GPULabAPIHandler
from hub_config.config.scopes import ADMIN, JOBS
from hub_config.domain.budget_webhook import WebhookURLError, check_webhook_url
from hub_config.domain.budgets import BudgetBook, status_dict
from spawner.admission import user_groups
from spawner.core.budgets import BudgetError

#: Budget bodies are a handful of fields.
MAX_BUDGET_BODY = 4 * 1024


class BudgetsBase(GPULabAPIHandler):
    @property
    def book(self) -> BudgetBook:
        book = self.gpulab.budgets
        if book is None:
            raise web.HTTPError(
                503,
                "gpulab's budgets are not attached "
                "(c.GPULab.runtime_hooks lacks hub_config.config.runtime.attach_runtime)",
            )
        return book


class BudgetsAdminBase(BudgetsBase, AdminAPIHandler):
    def team_or_404(self, team: str) -> str:
        if team not in self.gpulab.catalog.teams:
            raise web.HTTPError(404, f"there is no team {team!r}")
        return team

    def user_or_404(self, name: str) -> str:
        if self.find_user(name) is None:
            raise web.HTTPError(404, f"there is no user {name[:64]!r} in this hub")
        return name

    def budget_body(self, team: str, user: str | None) -> dict[str, Any]:
        body = self.read_json(MAX_BUDGET_BODY)
        for field, value in (("team", team), ("user", user)):
            if field in body and body[field] != value:
                raise web.HTTPError(400, f"'{field}' in the body differs from the path ({value!r}); leave it out")
        return {**body, "team": team, **({"user": user} if user is not None else {})}

    def put_budget(self, team: str, user: str | None) -> None:
        self.check_admin()
        self.team_or_404(team)
        if user is not None:
            self.user_or_404(user)
        data = self.budget_body(team, user)
        try:
            budget = self.book.set_budget(data, self.actor)
        except BudgetError as e:
            raise web.HTTPError(400, str(e)) from None
        self.write_json(status_dict(self.book.statuses([budget])[0]))

    def delete_budget(self, key: str) -> None:
        self.check_admin()
        if not self.book.delete_budget(key, self.actor):
            raise web.HTTPError(404, f"there is no budget {key}")
        self.set_status(204)
        self.finish()


class BudgetsHandler(BudgetsAdminBase):
    async def get(self) -> None:
        self.check_admin()
        book = self.book
        teams = self.gpulab.catalog.teams
        out = []
        for s in book.statuses():
            d = status_dict(s)
            d["team_exists"] = s.budget.team in teams
            out.append(d)
        self.write_json(
            {
                "budgets": out,
                "time_zone": book.zone,
                "webhook": {"url": book.webhook_url()},
                "notices": [n.to_dict() for n in book.notices()],
            }
        )


class TeamBudgetHandler(BudgetsAdminBase):
    async def put(self, team: str) -> None:
        self.put_budget(team, None)

    async def delete(self, team: str) -> None:
        self.delete_budget(f"team:{team}")


class UserBudgetHandler(BudgetsAdminBase):
    async def put(self, team: str, user: str) -> None:
        self.put_budget(team, user)

    async def delete(self, team: str, user: str) -> None:
        self.delete_budget(f"user:{team}/{user}")


class WebhookHandler(BudgetsAdminBase):
    async def put(self) -> None:
        self.check_admin()
        body = self.read_json(MAX_BUDGET_BODY)
        unknown = sorted(str(k)[:40] for k in body if k != "url")
        if unknown:
            raise web.HTTPError(400, f"unknown field(s) {', '.join(map(repr, unknown[:5]))}; give only 'url'")
        if "url" not in body:
            raise web.HTTPError(400, "give 'url': the webhook's http(s) URL, or '' for none")
        try:
            url = check_webhook_url(body["url"])
        except WebhookURLError as e:
            raise web.HTTPError(400, str(e)) from None
        self.book.set_webhook_url(url, self.actor)
        self.log.info("gpulab budgets: webhook %s by %s", "set" if url else "removed", self.actor)
        self.write_json({"url": url})


class CheckHandler(BudgetsAdminBase):
    async def post(self) -> None:
        self.check_admin()
        book = self.book
        if book.notifier is None:
            raise web.HTTPError(503, "the budget check is not running in this hub")
        before = len(book.notices(limit=10_000))
        delivered = await book.notifier.check()
        self.write_json({"recorded": len(book.notices(limit=10_000)) - before, "delivered": delivered})


class MyBudgetsHandler(BudgetsBase):
    async def get(self) -> None:
        me = self.current_user
        if me is None:
            raise web.HTTPError(403, "Missing or invalid credentials.")
        name = self.get_argument("user", None) or self.caller_name
        if len(name) > 255:
            raise web.HTTPError(400, "invalid user")
        if name != self.caller_name and not self.has_scope(ADMIN):
            raise web.HTTPError(403, f"requires {ADMIN} to read another user's budgets")
        if not (self.has_scope(JOBS, name) or self.has_scope(ADMIN)):
            raise web.HTTPError(403, f"Action is not authorized with current scopes; requires {JOBS}")
        user = self.find_user(name)
        if user is None:
            raise web.HTTPError(404, f"no user {name[:64]!r}")
        teams = [t.name for t in self.gpulab.catalog.teams_for(name, user_groups(user))]
        self.write_json({"user": name, "time_zone": self.book.zone, "budgets": self.book.for_user(name, teams)})


_TEAM = r"([a-z0-9][a-z0-9-]{0,62})"
_USER = r"([^/]{1,255})"
handlers = [
    (r"/api/gpulab/budgets", BudgetsHandler),
    (r"/api/gpulab/budgets/webhook", WebhookHandler),
    (r"/api/gpulab/budgets/check", CheckHandler),
    (rf"/api/gpulab/budgets/teams/{_TEAM}", TeamBudgetHandler),
    (rf"/api/gpulab/budgets/teams/{_TEAM}/users/{_USER}", UserBudgetHandler),
    (r"/api/gpulab/me/budgets", MyBudgetsHandler),
]
