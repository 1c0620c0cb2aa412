"""Idle warnings, "keep my GPU", reclaims and their audit log (issue 4).

The culler service (a separate process, scope ``custom:gpulab:culler``)
records warnings and reclaims here; the user's lab session reads its warning
and presses "keep my GPU" here; admins read the audit log. Records live in
gpulab's own database (:mod:`hub_config.db`), so a culler or hub restart
never resets a grace period.

- ``GET  /hub/api/gpulab/idle?user=U&server=S``          the user, an admin or the culler
- ``POST /hub/api/gpulab/idle/keepalive`` ``{user, server}`` the user or an admin (409 when used up)
- ``GET  /hub/api/gpulab/idle/state``                    culler: every warning, keep-alive and the timeouts
- ``POST /hub/api/gpulab/idle/warnings``                 culler
- ``DELETE /hub/api/gpulab/idle/warnings?user=U&server=S`` culler
- ``POST /hub/api/gpulab/idle/reclaims``                 culler
- ``GET  /hub/api/gpulab/idle/audit``                    an admin or the culler
"""

from __future__ import annotations

import json
import math
import time
from datetime import datetime, timezone
from typing import Any

from sqlalchemy import Float, Integer, String, Text, select
from sqlalchemy.orm import Mapped, mapped_column
from tornado import web
from traitlets import Integer as IntTrait
from traitlets.config import Configurable

from spawner.idle import KeepalivePolicy, KeepaliveRefused, grant_keepalive

from ..db import Base, session_factory
from ..scopes import ADMIN, CULLER, JOBS
from .base import GPULabAPIHandler

EVENT_KINDS = ("warning", "reclaim", "keepalive", "cleared")
MAX_NAME = 255
MAX_REASON = 2000
MAX_GRACE_SECONDS = 7 * 86400


class GPULabIdle(Configurable):
    """Hub-side policy for "keep my GPU" (``c.GPULabIdle.*``)."""

    keepalive_max_uses = IntTrait(
        2, min=0, config=True,
        help="How many times a user may press 'keep my GPU' per server session (0 disables it).",
    )
    keepalive_extends_seconds = IntTrait(
        3600, min=1, config=True,
        help="How long one 'keep my GPU' protects a server from the GPU idle culler, in seconds.",
    )

    @property
    def policy(self) -> KeepalivePolicy:
        return KeepalivePolicy(self.keepalive_max_uses, self.keepalive_extends_seconds)


# -- tables ---------------------------------------------------------------


class IdleWarningRow(Base):
    __tablename__ = "gpulab_idle_warnings"
    user: Mapped[str] = mapped_column(String(MAX_NAME), primary_key=True)
    server: Mapped[str] = mapped_column(String(MAX_NAME), primary_key=True)
    warned_at: Mapped[float] = mapped_column(Float)
    reclaim_at: Mapped[float] = mapped_column(Float)
    reason: Mapped[str] = mapped_column(Text, default="")
    evidence: Mapped[str] = mapped_column(Text, default="{}")


class KeepaliveRow(Base):
    __tablename__ = "gpulab_idle_keepalives"
    user: Mapped[str] = mapped_column(String(MAX_NAME), primary_key=True)
    server: Mapped[str] = mapped_column(String(MAX_NAME), primary_key=True)
    used: Mapped[int] = mapped_column(Integer, default=0)
    until: Mapped[float | None] = mapped_column(Float, nullable=True)
    #: The server session the count belongs to (the spawner's ``started``); a new session starts at 0.
    session: Mapped[str] = mapped_column(String(64), default="")


class IdleEventRow(Base):
    __tablename__ = "gpulab_idle_events"
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    at: Mapped[float] = mapped_column(Float, index=True)
    kind: Mapped[str] = mapped_column(String(16))
    user: Mapped[str] = mapped_column(String(MAX_NAME), index=True)
    server: Mapped[str] = mapped_column(String(MAX_NAME))
    team: Mapped[str] = mapped_column(String(MAX_NAME), default="")
    profile: Mapped[str] = mapped_column(String(MAX_NAME), default="")
    gpu_milli: Mapped[int] = mapped_column(Integer, default=0)
    reason: Mapped[str] = mapped_column(Text, default="")
    evidence: Mapped[str] = mapped_column(Text, default="{}")
    gpu_hours_reclaimed: Mapped[float] = mapped_column(Float, default=0.0)


def iso(ts: float | None) -> str | None:
    if ts is None:
        return None
    return datetime.fromtimestamp(ts, timezone.utc).isoformat().replace("+00:00", "Z")


def event_json(e: IdleEventRow) -> dict[str, Any]:
    return {
        "at": iso(e.at), "kind": e.kind, "user": e.user, "server": e.server, "team": e.team,
        "profile": e.profile, "gpu_milli": e.gpu_milli, "reason": e.reason,
        "evidence": json.loads(e.evidence or "{}"), "gpu_hours_reclaimed": e.gpu_hours_reclaimed,
    }


# -- handlers -------------------------------------------------------------


class IdleBase(GPULabAPIHandler):
    @property
    def settings_idle(self) -> GPULabIdle:
        return GPULabIdle(config=self.settings.get("config"))

    @property
    def idle_db(self):
        return session_factory(config=self.settings.get("config"))

    def _name(self, value: Any, what: str, allow_empty: bool = False) -> str:
        if not isinstance(value, str) or len(value) > MAX_NAME or (not value and not allow_empty):
            raise web.HTTPError(400, f"{what} must be a string of 1-{MAX_NAME} characters"
                                if not allow_empty else f"{what} must be a string of at most {MAX_NAME} characters")
        return value

    def _target(self, data: dict | None = None) -> tuple[str, str]:
        if data is None:
            user = self.get_argument("user", None)
            server = self.get_argument("server", "")
        else:
            user, server = data.get("user"), data.get("server", "")
        return self._name(user, "user"), self._name(server, "server", allow_empty=True)

    def _require_culler(self) -> None:
        self.require_scope(CULLER)

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
        spawner = self._spawner(user, server)
        started = getattr(getattr(spawner, "orm_spawner", None), "started", None) if spawner else None
        return started.isoformat() if started else ""

    def view(self, session, user: str, server: str) -> dict[str, Any]:
        w = session.get(IdleWarningRow, (user, server))
        k = session.get(KeepaliveRow, (user, server))
        policy = self.settings_idle.policy
        used = until = None
        if k is not None and k.session == self._session_id(user, server):
            used, until = k.used, k.until
        now = time.time()
        return {
            "user": user,
            "server": server,
            "warning": None if w is None else {
                "warned_at": iso(w.warned_at), "reclaim_at": iso(w.reclaim_at), "reason": w.reason,
                "evidence": json.loads(w.evidence or "{}"),
            },
            "keepalive": {
                "used": used or 0,
                "max": policy.max_uses,
                "extends_seconds": policy.extends_seconds,
                "until": iso(until) if until and until > now else None,
            },
        }

    def record(self, session, kind: str, user: str, server: str, data: dict[str, Any], reason: str,
               evidence: Any = None, gpu_hours: float = 0.0) -> None:
        session.add(IdleEventRow(
            at=time.time(), kind=kind, user=user, server=server,
            team=str(data.get("team") or "")[:MAX_NAME], profile=str(data.get("profile") or "")[:MAX_NAME],
            gpu_milli=_int(data.get("gpu_milli", 0), "gpu_milli"), reason=reason[:MAX_REASON],
            evidence=json.dumps(evidence if evidence is not None else {}), gpu_hours_reclaimed=gpu_hours,
        ))


def _int(value: Any, what: str, lo: int = 0, hi: int = 10**9) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
        raise web.HTTPError(400, f"{what} must be an integer between {lo} and {hi}")
    return value


def _reason(data: dict) -> str:
    reason = data.get("reason", "")
    if not isinstance(reason, str) or len(reason) > MAX_REASON:
        raise web.HTTPError(400, f"reason must be a string of at most {MAX_REASON} characters")
    return reason


def _evidence(data: dict) -> dict:
    evidence = data.get("evidence", {})
    if not isinstance(evidence, dict):
        raise web.HTTPError(400, "evidence must be a JSON object")
    return evidence


class IdleHandler(IdleBase):
    async def get(self) -> None:
        user, server = self._target()
        self._require_user_or(user, CULLER)
        with self.idle_db() as session:
            self.write_json(self.view(session, user, server))


class KeepaliveHandler(IdleBase):
    async def post(self) -> None:
        data = self.read_json()
        user, server = self._target(data)
        self._require_user_or(user)
        spawner = self._spawner(user, server)
        if spawner is None or not spawner.active:
            raise web.HTTPError(409, f"server {user}/{server} is not running")
        gpulab_state = getattr(spawner, "_gpulab_state", None) or {}
        if gpulab_state and not int(gpulab_state.get("milli") or 0):
            raise web.HTTPError(409, f"server {user}/{server} holds no GPU; the GPU idle culler leaves it alone")
        policy = self.settings_idle.policy
        session_id = self._session_id(user, server)
        now = time.time()
        with self.idle_db() as session:
            k = session.get(KeepaliveRow, (user, server))
            if k is None:
                k = KeepaliveRow(user=user, server=server, used=0, until=None, session=session_id)
                session.add(k)
            elif k.session != session_id:  # a new server session starts with a fresh allowance
                k.used, k.until, k.session = 0, None, session_id
            try:
                k.used, k.until = grant_keepalive(policy, k.used, k.until, now)
            except KeepaliveRefused as e:
                raise web.HTTPError(409, str(e)) from None
            warning = session.get(IdleWarningRow, (user, server))
            if warning is not None:
                session.delete(warning)
            self.record(session, "keepalive", user, server, gpulab_state,
                        f"'keep my GPU' {k.used}/{policy.max_uses} by {self.caller_name}, until {iso(k.until)}")
            session.commit()
            self.log.info("gpulab idle: %s/%s kept alive until %s (%d/%d) by %s",
                          user, server, iso(k.until), k.used, policy.max_uses, self.caller_name)
            self.write_json(self.view(session, user, server))


class StateHandler(IdleBase):
    """Everything the culler needs besides the hub's server list, in one request."""

    async def get(self) -> None:
        self._require_culler()
        catalog = self.gpulab.catalog
        now = time.time()
        with self.idle_db() as session:
            warnings = session.scalars(select(IdleWarningRow)).all()
            keepalives = session.scalars(select(KeepaliveRow).where(KeepaliveRow.until > now)).all()
            self.write_json({
                "now": now,
                "warnings": [{"user": w.user, "server": w.server, "warned_at": w.warned_at,
                              "reclaim_at": w.reclaim_at} for w in warnings],
                "keepalives": [{"user": k.user, "server": k.server, "until": k.until, "used": k.used,
                                "session": k.session} for k in keepalives],
                "profiles": {p.slug: {"gpu_milli": p.gpu_milli, "idle_timeout_seconds": p.idle_timeout_seconds}
                             for p in catalog.profiles.values()},
                "teams": {t.name: {"idle_timeout_seconds": t.idle_timeout_seconds} for t in catalog.teams.values()},
            })


class WarningsHandler(IdleBase):
    async def post(self) -> None:
        self._require_culler()
        data = self.read_json()
        user, server = self._target(data)
        grace = _int(data.get("grace_seconds"), "grace_seconds", 0, MAX_GRACE_SECONDS)
        reason, evidence = _reason(data), _evidence(data)
        _int(data.get("gpu_milli", 0), "gpu_milli")
        if self.find_user(user) is None:
            raise web.HTTPError(404, f"no such user {user!r}")
        now = time.time()
        with self.idle_db() as session:
            existing = session.get(IdleWarningRow, (user, server))
            if existing is not None:  # idempotent: a warning's clock never restarts
                self.write_json(self.view(session, user, server), 200)
                return
            session.add(IdleWarningRow(user=user, server=server, warned_at=now, reclaim_at=now + grace,
                                       reason=reason, evidence=json.dumps(evidence)))
            self.record(session, "warning", user, server, data, reason, evidence)
            session.commit()
            self.log.info("gpulab idle: warned %s/%s, reclaim at %s: %s", user, server, iso(now + grace), reason)
            self.write_json(self.view(session, user, server), 201)

    async def delete(self) -> None:
        self._require_culler()
        user, server = self._target()
        reason = self.get_argument("reason", "GPU busy again")[:MAX_REASON]
        with self.idle_db() as session:
            existing = session.get(IdleWarningRow, (user, server))
            if existing is not None:
                session.delete(existing)
                self.record(session, "cleared", user, server, {}, reason)
                session.commit()
                self.log.info("gpulab idle: cleared warning of %s/%s: %s", user, server, reason)
            self.write_json(self.view(session, user, server))


class ReclaimsHandler(IdleBase):
    async def post(self) -> None:
        self._require_culler()
        data = self.read_json()
        user, server = self._target(data)
        reason, evidence = _reason(data), _evidence(data)
        hours = data.get("gpu_hours_reclaimed", 0.0)
        if isinstance(hours, bool) or not isinstance(hours, (int, float)) or not math.isfinite(hours) or hours < 0:
            raise web.HTTPError(400, "gpu_hours_reclaimed must be a non-negative number")
        action = data.get("action", "stop-server")
        if action not in ("stop-server", "shutdown-kernel"):
            raise web.HTTPError(400, "action must be 'stop-server' or 'shutdown-kernel'")
        _int(data.get("gpu_milli", 0), "gpu_milli")
        evidence = {**evidence, "action": action}
        if action == "shutdown-kernel":
            kernel_ids = data.get("kernel_ids")
            if (not isinstance(kernel_ids, list) or not kernel_ids or len(kernel_ids) > 64
                    or not all(isinstance(k, str) and 0 < len(k) <= 64 for k in kernel_ids)):
                raise web.HTTPError(400, "kernel_ids must be a list of kernel id strings")
            evidence["kernel_ids"] = kernel_ids
        now = time.time()
        with self.idle_db() as session:
            # The culler claims a reclaim here *before* it acts, so a "keep my GPU" pressed
            # after the culler read the idle state still wins.
            warning = session.get(IdleWarningRow, (user, server))
            k = session.get(KeepaliveRow, (user, server))
            if warning is None:
                raise web.HTTPError(409, f"no idle warning for {user}/{server} (cleared or kept alive); not reclaiming")
            if warning.reclaim_at > now:
                raise web.HTTPError(409, f"the grace period of {user}/{server} ends at {iso(warning.reclaim_at)}")
            if k is not None and k.until and k.until > now:
                raise web.HTTPError(409, f"{user}/{server} is kept alive until {iso(k.until)}")
            session.delete(warning)
            if action == "stop-server" and k is not None:  # the session ends: so does its keep-alive allowance
                session.delete(k)
            self.record(session, "reclaim", user, server, data, reason, evidence, float(hours))
            session.commit()
        self.log.warning("gpulab idle: reclaimed %s/%s (%s, %.4f GPU-hours): %s",
                         user, server, action, hours, reason)
        self.set_status(201)
        self.write_json({"user": user, "server": server, "recorded": True}, 201)


class AuditHandler(IdleBase):
    async def get(self) -> None:
        if not (self.has_scope(ADMIN) or self.has_scope(CULLER)):
            self.require_scope(ADMIN)
        limit = self.int_argument("limit", 500, 1, 10000)
        query = select(IdleEventRow).order_by(IdleEventRow.id.desc()).limit(limit)
        user = self.get_argument("user", None)
        if user is not None:
            query = query.where(IdleEventRow.user == self._name(user, "user"))
        kind = self.get_argument("kind", None)
        if kind is not None:
            if kind not in EVENT_KINDS:
                raise web.HTTPError(400, f"kind must be one of {', '.join(EVENT_KINDS)}")
            query = query.where(IdleEventRow.kind == kind)
        with self.idle_db() as session:
            events = list(reversed(session.scalars(query).all()))
            self.write_json({"events": [event_json(e) for e in events]})


handlers = [
    (r"/api/gpulab/idle", IdleHandler),
    (r"/api/gpulab/idle/keepalive", KeepaliveHandler),
    (r"/api/gpulab/idle/state", StateHandler),
    (r"/api/gpulab/idle/warnings", WarningsHandler),
    (r"/api/gpulab/idle/reclaims", ReclaimsHandler),
    (r"/api/gpulab/idle/audit", AuditHandler),
]
