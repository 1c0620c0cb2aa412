"""``GET /hub/api/gpulab/identity[?user=NAME]`` (admins): the teams the identity provider's
groups and claims grant each user now, why, what their last login said, and every running
server whose team the user's identity no longer grants (it keeps running in that team until
it stops; the next spawn uses the new teams).
"""

from __future__ import annotations

from typing import Any

from tornado import web

from hub_config.api.admin import AdminAPIHandler
from hub_config.domain.identity_teams import GPULabIdentity, IdentityBook
from hub_config.storage.db import session_factory
from spawner.admission import user_groups


def kept_servers(runtime: Any, user_name: str, teams_now: set[str]) -> list[dict[str, Any]]:
    """The user's workloads admitted in a team they are no longer a member of."""
    return [
        {"key": w.key, "team": w.team, "kind": w.kind, "rule": "keeps its team until it stops"}
        for w in runtime.ledger.workloads()
        if w.user == user_name and w.team not in teams_now
    ]


class IdentityHandler(AdminAPIHandler):
    async def get(self) -> None:
        self.check_admin()
        config = self.settings.get("config")
        book = IdentityBook(session_factory(config), GPULabIdentity(config=config).rules())
        name = self.get_argument("user", None)
        if name is not None and (not name or len(name) > 255):
            raise web.HTTPError(400, "invalid user")
        names = (
            [name] if name is not None else sorted(set(book.users()) | {w.user for w in self.gpulab.ledger.workloads()})
        )
        runtime = self.gpulab
        out = []
        for n in names:
            user = self.find_user(n)
            if user is None:
                if name is not None:
                    raise web.HTTPError(404, f"no user {n[:64]!r}")
                continue
            groups = user_groups(user)
            plain = [g for g in groups if type(g) is str]
            view = book.explain(n, plain)
            teams_now = {t.name for t in runtime.catalog.teams_for(n, groups)}
            view["groups"] = plain
            view["member_of"] = sorted(teams_now)
            view["kept_servers"] = kept_servers(runtime, n, teams_now)
            out.append(view)
        self.write_json({"rules": [r.describe() for r in book.rules], "users": out})


handlers = [(r"/api/gpulab/identity", IdentityHandler)]
