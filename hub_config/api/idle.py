"""Idle warnings, "keep my GPU", reclaims and their audit log.

The culler service (a separate process, scope ``custom:gpulab:culler``)
records warnings and reclaims here; the user's lab session reads its warning
and presses "keep my GPU" here; admins read the audit log. Records live in
gpulab's own database (:mod:`hub_config.storage.db`), so a culler or hub restart
never resets a grace period.

- ``GET  /hub/api/gpulab/idle?user=U&server=S``          the user, an admin or the culler
- ``POST /hub/api/gpulab/idle/keepalive`` ``{user, server}`` the user or an admin (409 when used up,
  or when the server is past its maximum lifetime)
- ``GET  /hub/api/gpulab/idle/state``                    culler: every warning, keep-alive and the timeouts
- ``POST /hub/api/gpulab/idle/cycle``                    culler: one cycle's warnings, holds, clears
  and reclaim claims in one request (each claim accepted or refused on its own)
- ``POST /hub/api/gpulab/idle/warnings``                 culler (one warning)
- ``DELETE /hub/api/gpulab/idle/warnings?user=U&server=S`` culler
- ``POST /hub/api/gpulab/idle/reclaims``                 culler (one claim)
- ``GET  /hub/api/gpulab/idle/audit``                    an admin or the culler

A warning belongs to one server session (the spawner's start time): a
restarted server's old warning is void. A warning *held* because data went
missing gets a new reclaim time and a fresh grace when data returns. A GPU server's
maximum lifetime (catalog ``max_lifetime``) is the hub's to know: from its own catalog and
the session's start, never from the culler's word, when it grants a keep-alive or a claim.
"""

from __future__ import annotations

from typing import Any

from jupyterhub import orm
from jupyterhub.utils import isoformat
from tornado import web

from hub_config.api.base import GPULabAPIHandler
from hub_config.config.scopes import ADMIN, CULLER, JOBS
from hub_config.domain.idle_records import EVENT_KINDS, MAX_CYCLE_BYTES, GPULabIdle
from hub_config.domain.idle_store import IdleStore, UnattributedServers
from hub_config.storage.db import session_factory, to_epoch, utcnow
from spawner.core.idle import KeepaliveRefused, Lifetime, session_lifetime
from spawner.core.idle_cycle import MAX_REASON, CycleRecords, Mark, ReclaimClaim, RecordError, WarningRecord, target_of
from spawner.runtime import granted_share

# -- handlers -------------------------------------------------------------


class IdleBase(GPULabAPIHandler):
    """Parse, check the caller's scope, ask the :class:`IdleStore`, write its answer."""

    @property
    def store(self) -> IdleStore:
        config = self.settings.get("config")
        # The culler's unattributed servers live in the hub's memory, one list per hub process.
        unattributed = self.settings.setdefault("gpulab_idle_unattributed", UnattributedServers())
        return IdleStore(session_factory(config=config), GPULabIdle(config=config).policy, self.log, unattributed)

    def parsed(self, parse: Any, *args: Any) -> Any:
        """A culler record or a target read from the request, or a 400 with the reason."""
        try:
            return parse(*args)
        except RecordError as e:
            raise web.HTTPError(400, str(e)) from None

    def _target(self, data: dict | None = None) -> tuple[str, str]:
        if data is None:
            data = {"user": self.get_argument("user", None), "server": self.get_argument("server", "")}
        return self.parsed(target_of, data)

    def _require_user_or(self, user: str, *extra: str) -> None:
        if not self.current_user:
            raise web.HTTPError(403, "Missing or invalid credentials.")
        if self.has_scope(JOBS, user) or any(self.has_scope(s) for s in (ADMIN, *extra)):
            return
        raise web.HTTPError(403, f"Action is not authorized with current scopes; requires {JOBS} for user {user}")

    def _spawner(self, user: str, server: str):
        u = self.find_user(user)
        if u is None:
            raise web.HTTPError(404, f"no such user {user!r}")
        if server not in u.orm_spawners:
            return None
        return u.spawners[server]

    def _session_id(self, user: str, server: str) -> str:
        """The running session of a server: its start time, written as the hub's REST API writes it."""
        spawner = self._spawner(user, server)
        started = getattr(getattr(spawner, "orm_spawner", None), "started", None) if spawner else None
        return isoformat(started) if started else ""

    def _lifetime(self, user: str, server: str) -> Lifetime | None:
        """The running session's maximum lifetime from this hub's catalog and the server's grant
        (``None``: not running, no GPU, or no lifetime set)."""
        u = self.find_user(user)
        spawner = u.spawners[server] if u is not None and server in u.orm_spawners else None
        started = getattr(getattr(spawner, "orm_spawner", None), "started", None) if spawner else None
        share = granted_share(spawner) if spawner is not None and spawner.active else None
        if started is None or share is None:
            return None
        catalog = self.gpulab.catalog
        return session_lifetime(
            catalog.profiles.get(share.profile), catalog.teams.get(share.team), share.milli, to_epoch(started)
        )

    def _view(self, user: str, server: str) -> dict[str, Any]:
        with self.store.sessions() as session:
            return self.store.view(session, user, server, self._session_id(user, server))


class IdleHandler(IdleBase):
    async def get(self) -> None:
        user, server = self._target()
        self._require_user_or(user, CULLER)
        self.write_json(self._view(user, server))


class KeepaliveHandler(IdleBase):
    async def post(self) -> None:
        user, server = self._target(self.read_json())
        self._require_user_or(user)
        spawner = self._spawner(user, server)
        if spawner is None or not spawner.active:
            raise web.HTTPError(409, f"server {user}/{server} is not running")
        share = granted_share(spawner)
        if share is not None and not share.milli:
            raise web.HTTPError(409, f"server {user}/{server} holds no GPU; the GPU idle culler leaves it alone")
        held = {"team": share.team, "profile": share.profile} if share is not None else {}
        try:
            view = self.store.keep_alive(
                user, server, self._session_id(user, server), held, self.caller_name, self._lifetime(user, server)
            )
        except KeepaliveRefused as e:
            raise web.HTTPError(409, str(e)) from None
        self.write_json(view)


class StateHandler(IdleBase):
    """Everything the culler needs besides the hub's server list, in one request."""

    async def get(self) -> None:
        self.require_scope(CULLER)
        self.write_json(self.store.state(self.gpulab.catalog))


class CycleHandler(IdleBase):
    """One culler cycle's records in one request: all validated first (a 400 records nothing),
    then applied in one transaction; each reclaim claim is granted or refused on its own."""

    async def post(self) -> None:
        self.require_scope(CULLER)
        records = self.parsed(CycleRecords.from_json, self.read_json(max_bytes=MAX_CYCLE_BYTES))
        names = records.users
        known = {n for (n,) in self.db.query(orm.User.name).filter(orm.User.name.in_(names))} if names else set()
        unknown = sorted(names - known)
        if unknown:
            raise web.HTTPError(404, f"no such user(s): {', '.join(unknown[:10])}")
        lifetimes = {(c.user, c.server): self._lifetime(c.user, c.server) for c in records.reclaims}
        self.write_json(self.store.apply_cycle(records, utcnow(), lifetimes))


class WarningsHandler(IdleBase):
    async def post(self) -> None:
        self.require_scope(CULLER)
        w = self.parsed(WarningRecord.from_json, self.read_json())
        if self.find_user(w.user) is None:
            raise web.HTTPError(404, f"no such user {w.user!r}")
        store = self.store
        with store.sessions() as session:
            created = store.apply_warning(session, w, utcnow())
            session.commit()
            view = store.view(session, w.user, w.server, self._session_id(w.user, w.server))
        self.write_json(view, 201 if created else 200)

    async def delete(self) -> None:
        self.require_scope(CULLER)
        user, server = self._target()
        reason = self.get_argument("reason", "GPU busy again")[:MAX_REASON]
        store = self.store
        with store.sessions() as session:
            store.apply_clear(session, Mark(user=user, server=server, reason=reason), utcnow())
            session.commit()
        self.write_json(self._view(user, server))


class ReclaimsHandler(IdleBase):
    async def post(self) -> None:
        self.require_scope(CULLER)
        claim = self.parsed(ReclaimClaim.from_json, self.read_json())
        store = self.store
        with store.sessions() as session:
            refused = store.apply_reclaim(session, claim, utcnow(), self._lifetime(claim.user, claim.server))
            if refused:
                raise web.HTTPError(409, refused)
            session.commit()
        self.write_json({"user": claim.user, "server": claim.server, "recorded": True}, 201)


class AuditHandler(IdleBase):
    async def get(self) -> None:
        if not (self.has_scope(ADMIN) or self.has_scope(CULLER)):
            self.require_scope(ADMIN)
        limit = self.int_argument("limit", 500, 1, 10000)
        user = self.get_argument("user", None)
        if user is not None:
            user = self._target({"user": user})[0]
        kind = self.get_argument("kind", None)
        if kind is not None and kind not in EVENT_KINDS:
            raise web.HTTPError(400, f"kind must be one of {', '.join(EVENT_KINDS)}")
        self.write_json({"events": self.store.audit(limit, user, kind)})


handlers = [
    (r"/api/gpulab/idle", IdleHandler),
    (r"/api/gpulab/idle/keepalive", KeepaliveHandler),
    (r"/api/gpulab/idle/state", StateHandler),
    (r"/api/gpulab/idle/cycle", CycleHandler),
    (r"/api/gpulab/idle/warnings", WarningsHandler),
    (r"/api/gpulab/idle/reclaims", ReclaimsHandler),
    (r"/api/gpulab/idle/audit", AuditHandler),
]
