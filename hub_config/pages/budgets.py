"""``/hub/gpulab/admin/budgets``: the GPU-hour budgets, where each stands, the webhook and its notices.

Server-rendered from :class:`hub_config.domain.budgets.BudgetBook`; its forms call
``/hub/api/gpulab/budgets`` (which validates everything), so the page holds no rule of its own.
The admin page shows the same banners (:func:`admin_budget_banners`).
"""

from __future__ import annotations

from typing import Any

from jupyterhub.handlers.base import BaseHandler
from jupyterhub.scopes import Scope
from tornado import web

from hub_config.config.scopes import ADMIN
from hub_config.domain.budgets import status_dict
from spawner.core.budgets import AT_LIMIT, PERIODS
from spawner.runtime import GPULabRuntime, get_runtime


def admin_budget_banners(runtime: GPULabRuntime) -> list[dict[str, Any]]:
    """Every budget at 80 % or more, for the admin page's banner (never breaks the page)."""
    book = runtime.budgets
    if book is None:
        return []
    try:
        return [d for d in (status_dict(s) for s in book.statuses()) if d["level"] != "ok"]
    except Exception:
        return []


class BudgetsPageHandler(BaseHandler):
    """Needs the ``custom:gpulab:admin`` scope, like the admin page."""

    @web.authenticated
    async def get(self) -> None:
        if (self.parsed_scopes or {}).get(ADMIN) != Scope.ALL:
            raise web.HTTPError(403, f"the budgets page requires the {ADMIN} scope")
        runtime = get_runtime(config=self.settings.get("config"))
        book = runtime.budgets
        if book is None:
            raise web.HTTPError(503, "gpulab's budgets are not attached to this hub")
        rows = [status_dict(s) for s in book.statuses()]
        html = await self.render_template(
            "gpulab-budgets.html",
            budgets=rows,
            banners=[r for r in rows if r["level"] != "ok"],
            teams=sorted(runtime.catalog.teams),
            periods=PERIODS,
            at_limit=AT_LIMIT,
            time_zone=book.zone,
            webhook_url=book.webhook_url(),
            notices=[n.to_dict() for n in book.notices()],
        )
        self.finish(html)


handlers = [(r"/gpulab/admin/budgets/?", BudgetsPageHandler)]
