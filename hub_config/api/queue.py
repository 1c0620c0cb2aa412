"""``/hub/api/gpulab/queue``: the caller's spawn queue ("queue me").

* ``GET``: the caller's entries (waiting ones with their place in line and predicted start;
  those that left the queue in the last hour with how), newest first.
* ``POST`` ``{"team", "profile", "image"?, "server_name"?}``: queue a server for that choice,
  checked as a spawn is (team membership, profile, image); 201 with the entry.
* ``DELETE /hub/api/gpulab/queue/ID``: cancel one of the caller's waiting entries (another
  user's entry is "no such entry", 404: the queue does not tell who else waits).

A user acts on their own queue only (``custom:gpulab:jobs!user``, which every user and
their servers' tokens hold, so the JupyterLab sidebar reaches it through its forwarder).
"""

from __future__ import annotations

from typing import Any

from tornado import web

from hub_config.api.base import GPULabAPIHandler, ascii_id
from hub_config.config.scopes import JOBS
from hub_config.domain.queue_store import QueueError
from spawner.admission import user_groups
from spawner.core.policy import PolicyError

#: The body of a join holds four short strings.
MAX_QUEUE_BODY = 4096
JOIN_KEYS = frozenset({"team", "profile", "image", "server_name"})


class QueueHandlerBase(GPULabAPIHandler):
    def queue_runner(self) -> Any:
        runner = self.gpulab.queue
        if runner is None:
            raise web.HTTPError(503, "the spawn queue is not set up in this hub (configure_gpulab attaches it)")
        return runner

    def caller(self) -> Any:
        user = self.current_user
        if not user or getattr(user, "kind", "user") != "user":
            raise web.HTTPError(403, "the spawn queue is a user's own: call it as a user (or a user's server)")
        self.require_scope(JOBS, user.name)
        return user


class QueueHandler(QueueHandlerBase):
    async def get(self) -> None:
        user = self.caller()
        self.write_json({"user": user.name, "entries": self.queue_runner().view(user.name)})

    async def post(self) -> None:
        user = self.caller()
        runner = self.queue_runner()
        body = self.read_json(MAX_QUEUE_BODY)
        unknown = sorted(str(k)[:40] for k in body if k not in JOIN_KEYS)
        if unknown:
            raise web.HTTPError(
                400, f"unknown field(s) {', '.join(map(repr, unknown[:5]))}; expected {sorted(JOIN_KEYS)}"
            )
        server_name = body.pop("server_name", "")
        if not isinstance(server_name, str):
            raise web.HTTPError(400, "server_name must be a string")
        try:
            entry = runner.join(user.name, user_groups(user), body, server_name)
        except PolicyError as e:
            raise web.HTTPError(e.status, str(e)) from None
        except QueueError as e:
            raise web.HTTPError(e.status, str(e)) from None
        view = next((v for v in runner.view(user.name) if v["id"] == entry.id), {"id": entry.id, "state": entry.state})
        self.write_json(view, 201)


class QueueEntryHandler(QueueHandlerBase):
    async def delete(self, raw_id: str) -> None:
        user = self.caller()
        entry_id = ascii_id(raw_id)
        if entry_id is None:
            raise web.HTTPError(400, f"a queue entry id is a whole number, got {raw_id[:20]!r}")
        try:
            self.queue_runner().cancel(user.name, entry_id)
        except QueueError as e:
            raise web.HTTPError(e.status, str(e)) from None
        self.set_status(204)
        self.finish()


handlers = [
    (r"/api/gpulab/queue", QueueHandler),
    (r"/api/gpulab/queue/([^/]{1,64})", QueueEntryHandler),
]
