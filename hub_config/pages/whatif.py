"""``/hub/gpulab/admin/whatif``: replay the last days under proposed settings, before saving them.

The page is a form over ``/hub/api/gpulab/whatif`` (the API does all the
validation and the replay); it shows today's settings and the proposal side
by side, and the profile advisor's catalog with its predicted gain.
"""

from __future__ import annotations

from typing import Any

from jupyterhub.handlers.base import BaseHandler
from jupyterhub.scopes import Scope
from tornado import web

from hub_config.api.whatif import MAX_DAYS, catalog_sizes, offer_rules
from hub_config.config.scopes import ADMIN
from spawner.core.budgets import budget_to_dict
from spawner.core.idle import idle_and_lifetime_words
from spawner.core.units import format_gpus
from spawner.runtime import get_runtime


class WhatIfPageHandler(BaseHandler):
    """The what-if page; needs the ``custom:gpulab:admin`` scope, like the admin page."""

    @web.authenticated
    async def get(self) -> None:
        if (self.parsed_scopes or {}).get(ADMIN) != Scope.ALL:
            raise web.HTTPError(403, f"the what-if page requires the {ADMIN} scope")
        runtime = get_runtime(config=self.settings.get("config"))
        catalog = runtime.catalog
        book = runtime.budgets
        budgets = [budget_to_dict(b) for b in book.budgets()] if book is not None else []
        team_budgets = {b["team"]: b for b in budgets if "user" not in b}
        teams: list[dict[str, Any]] = [
            {
                "name": t.name,
                "budget": team_budgets.get(t.name),
                "label": t.label,
                "guarantee": format_gpus(t.guarantee_milli),
                "burst": format_gpus(t.burst_milli),
                # What each of the team's GPU profiles gets today (the shorter of profile and team).
                "idle_timeout": "; ".join(
                    f"{p.display_name}: {idle_and_lifetime_words(p, t)}" for p in catalog.profiles_for(t) if p.is_gpu
                ),
            }
            for t in catalog.teams.values()
        ]
        facts = runtime.idle_facts
        html = await self.render_template(
            "gpulab-whatif.html",
            teams=teams,
            culler_off=facts.culler_on is False,
            sizes=", ".join(format_gpus(m) for m in catalog_sizes(catalog)),
            offers=offer_rules(runtime).label,
            max_days=MAX_DAYS,
            user_budgets=[b for b in budgets if "user" in b],
        )
        self.finish(html)


handlers = [(r"/gpulab/admin/whatif/?", WhatIfPageHandler)]
