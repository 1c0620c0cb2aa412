"""The spawn page's "Queue me" and "Leave the queue" buttons: form posts (the page's script makes them).

``POST /hub/gpulab/queue?server=NAME`` with ``queue=team:profile`` (and the card's
``image-team:profile``) queues the server; ``POST /hub/gpulab/queue/cancel`` with
``cancel=ID`` cancels one of the caller's entries. Both answer with a redirect to the
spawn page, which shows the queue (or the refusal, as a sentence) at its top. The hub's
XSRF check applies to both: the script posts the spawn form's own token.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import quote

from jupyterhub.handlers.base import BaseHandler
from tornado import web

from hub_config.api.base import ascii_id
from hub_config.domain.queue_store import QueueError
from spawner.admission import user_groups
from spawner.core.policy import PolicyError
from spawner.runtime import get_runtime

MAX_FIELD = 256


class QueuePageBase(BaseHandler):
    def runner(self) -> Any:
        runner = get_runtime(config=self.settings.get("config")).queue
        if runner is None:
            raise web.HTTPError(503, "the spawn queue is not set up in this hub")
        return runner

    def field(self, name: str) -> str:
        values = self.request.body_arguments.get(name) or []
        if len(values) != 1:
            raise web.HTTPError(400, f"the form must carry exactly one {name!r}")
        value = values[0].decode("utf-8", "replace")
        if len(value) > MAX_FIELD:
            raise web.HTTPError(400, f"{name!r} is longer than {MAX_FIELD} characters")
        return value

    def back_to_spawn(self, user: str, server_name: str) -> None:
        path = f"{self.hub.base_url}spawn/{quote(user, safe='')}"
        if server_name:
            path += "/" + quote(server_name, safe="")
        self.redirect(path, status=303)


class QueueJoinPage(QueuePageBase):
    @web.authenticated
    async def post(self) -> None:
        user = self.current_user
        runner = self.runner()
        server_name = self.get_query_argument("server", "")
        if len(server_name) > MAX_FIELD:
            raise web.HTTPError(400, "server name too long")
        choice = self.field("queue")
        team, sep, profile = choice.partition(":")
        if not sep or not team or not profile:
            raise web.HTTPError(400, "'queue' must be team:profile")
        options = {"team": team, "profile": profile}
        image = self.request.body_arguments.get(f"image-{choice}") or []
        if len(image) == 1:
            options["image"] = image[0].decode("utf-8", "replace")[:MAX_FIELD]
        try:
            runner.join(user.name, user_groups(user), options, server_name)
        except (PolicyError, QueueError) as e:
            status = e.status
            if status >= 500 or status == 400 and not isinstance(e, PolicyError):
                raise web.HTTPError(status, str(e)) from None
            runner.notices[user.name] = f"Not queued: {e}"
        self.back_to_spawn(user.name, server_name)


class QueueCancelPage(QueuePageBase):
    @web.authenticated
    async def post(self) -> None:
        user = self.current_user
        runner = self.runner()
        raw = self.field("cancel")
        entry_id = ascii_id(raw)
        if entry_id is None:
            raise web.HTTPError(400, "'cancel' must be a queue entry id")
        try:
            entry = runner.cancel(user.name, entry_id)
        except QueueError as e:
            raise web.HTTPError(e.status, str(e)) from None
        runner.notices[user.name] = "You left the queue."
        self.back_to_spawn(user.name, entry.server_name)


handlers = [
    (r"/gpulab/queue", QueueJoinPage),
    (r"/gpulab/queue/cancel", QueueCancelPage),
]
