"""Idle warnings, "keep my GPU", reclaims and their audit log.

The culler service (a separate process, scope ``custom:gpulab:culler``)
records warnings and reclaims here; the user's lab session reads its warning
and presses "keep my GPU" here; admins read the audit log. Records live in
gpulab's own database (:mod:`hub_config.storage.db`), so a culler or hub restart
never resets a grace period.

- ``GET  /hub/api/gpulab/idle?user=U&server=S``          the user, an admin or the culler
- ``POST /hub/api/gpulab/idle/keepalive`` ``{user, server}`` the user or an admin (409 when used up)
- ``GET  /hub/api/gpulab/idle/state``                    culler: every warning, keep-alive and the timeouts
- ``POST /hub/api/gpulab/idle/cycle``                    culler: one cycle's warnings, holds, clears
  and reclaim claims in one request (each claim accepted or refused on its own)
- ``POST /hub/api/gpulab/idle/warnings``                 culler (one warning)
- ``DELETE /hub/api/gpulab/idle/warnings?user=U&server=S`` culler
- ``POST /hub/api/gpulab/idle/reclaims``                 culler (one claim)
- ``GET  /hub/api/gpulab/idle/audit``                    an admin or the culler

A warning belongs to one server session (the spawner's start time): a
restarted server's old warning is void. A warning *held* because data went
missing gets a new reclaim time and a fresh grace when data returns.
"""

from __future__ import annotations

import json
import math
from datetime import datetime, timedelta
from typing import Any

from jupyterhub import orm
from jupyterhub.utils import isoformat
from sqlalchemy import select
from tornado import web

from hub_config.api.base import GPULabAPIHandler
from hub_config.config.scopes import ADMIN, CULLER, JOBS
from hub_config.domain.idle_records import (
    ACTIONS,
    EVENT_KINDS,
    MAX_CYCLE_BYTES,
    MAX_GRACE_SECONDS,
    MAX_NAME,
    MAX_REASON,
    MAX_SESSION,
    GPULabIdle,
    IdleEventRow,
    IdleWarningRow,
    KeepaliveRow,
    audit_json,
    evidence_peak,
    exact_iso,
    idle_minutes,
    reclaim_message,
)
from hub_config.storage.db import from_epoch, iso, session_factory, to_epoch, utcnow
from spawner.core.idle import KeepaliveRefused, grant_keepalive

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
            raise web.HTTPError(
                400,
                f"{what} must be a string of 1-{MAX_NAME} characters"
                if not allow_empty
                else f"{what} must be a string of at most {MAX_NAME} characters",
            )
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
        """The running session of a server: its start time, written as the hub's REST API writes it."""
        spawner = self._spawner(user, server)
        started = getattr(getattr(spawner, "orm_spawner", None), "started", None) if spawner else None
        return isoformat(started) if started else ""

    def view(self, session, user: str, server: str) -> dict[str, Any]:
        w = session.get(IdleWarningRow, (user, server))
        k = session.get(KeepaliveRow, (user, server))
        policy = self.settings_idle.policy
        current = self._session_id(user, server)
        used = until = None
        if k is not None and k.session == current:
            used, until = k.used, k.until
        now = utcnow()
        if w is not None and w.session and w.session != current:
            w = None  # an earlier session's warning: void for this one
        return {
            "user": user,
            "server": server,
            "session": current,
            "warning": None
            if w is None
            else {
                "warned_at": exact_iso(w.warned_at),
                "reclaim_at": exact_iso(w.reclaim_at),
                "reason": w.reason,
                "held": w.held_at is not None,
                "evidence": json.loads(w.evidence or "{}"),
            },
            "keepalive": {
                "used": used or 0,
                "max": policy.max_uses,
                "extends_seconds": policy.extends_seconds,
                "until": exact_iso(until) if until and until > now else None,
            },
            "reclaimed": None if current else self._last_reclaim(session, user, server),
        }

    def _last_reclaim(self, session, user: str, server: str) -> dict[str, Any] | None:
        """What a user whose server is not running should be told: the last reclaim, in plain words."""
        e = session.scalars(
            select(IdleEventRow)
            .where(
                IdleEventRow.user == user,
                IdleEventRow.server == server,
                IdleEventRow.kind == "reclaim",
                IdleEventRow.action == "stop-server",
            )
            .order_by(IdleEventRow.id.desc())
            .limit(1)
        ).first()
        if e is None:
            return None
        evidence = json.loads(e.evidence or "{}")
        minutes = idle_minutes(e.at, evidence)
        peak = evidence_peak(evidence)
        return {
            "at": exact_iso(e.at),
            "idle_minutes": minutes,
            "peak_percent": peak,
            "threshold_percent": evidence.get("threshold_percent"),
            "gpu_milli": e.gpu_milli,
            "message": reclaim_message(e.at, minutes, peak),
        }

    def record(
        self,
        session,
        kind: str,
        user: str,
        server: str,
        data: dict[str, Any],
        reason: str,
        evidence: Any = None,
        at: datetime | None = None,
    ) -> None:
        session.add(
            IdleEventRow(
                at=utcnow() if at is None else at,
                kind=kind,
                user=user,
                server=server,
                team=str(data.get("team") or "")[:MAX_NAME],
                profile=str(data.get("profile") or "")[:MAX_NAME],
                gpu_milli=data.get("gpu_milli", 0) or 0,
                reason=reason[:MAX_REASON],
                evidence=json.dumps(evidence if evidence is not None else {}),
                session=data.get("session", "") or "",
                action=data.get("action", "") if kind == "reclaim" else "",
                idle_gpu_hours=data.get("idle_gpu_hours", 0.0) if kind == "reclaim" else 0.0,
            )
        )

    # -- the culler's records: validated first, then applied -------------------

    def _common(self, item: Any, what: str) -> dict[str, Any]:
        if not isinstance(item, dict):
            raise web.HTTPError(400, f"each of {what} must be a JSON object")
        user, server = self._target(item)
        session_id = item.get("session", "")
        if not isinstance(session_id, str) or len(session_id) > MAX_SESSION:
            raise web.HTTPError(400, f"session must be a string of at most {MAX_SESSION} characters")
        return {**item, "user": user, "server": server, "session": session_id, "reason": _reason(item)}

    def check_warning(self, item: Any) -> dict[str, Any]:
        d = self._common(item, "warnings")
        d["grace_seconds"] = _int(item.get("grace_seconds"), "grace_seconds", 0, MAX_GRACE_SECONDS)
        d["gpu_milli"] = _int(item.get("gpu_milli", 0), "gpu_milli")
        d["evidence"] = _evidence(item)
        if not isinstance(item.get("renew", False), bool):
            raise web.HTTPError(400, "renew must be true or false")
        return d

    def check_reclaim(self, item: Any) -> dict[str, Any]:
        d = self._common(item, "reclaims")
        d["evidence"] = _evidence(item)
        d["gpu_milli"] = _int(item.get("gpu_milli", 0), "gpu_milli")
        for key in ("idle_gpu_hours", "idle_since"):
            value = item.get(key, 0.0)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
                raise web.HTTPError(400, f"{key} must be a non-negative number")
            d[key] = float(value)
        d["action"] = item.get("action", "stop-server")
        if d["action"] not in ACTIONS:
            raise web.HTTPError(400, "action must be 'stop-server' or 'shutdown-kernel'")
        if d["action"] == "shutdown-kernel":
            kernel_ids = item.get("kernel_ids")
            if (
                not isinstance(kernel_ids, list)
                or not kernel_ids
                or len(kernel_ids) > 64
                or not all(isinstance(k, str) and 0 < len(k) <= 64 for k in kernel_ids)
            ):
                raise web.HTTPError(400, "kernel_ids must be a list of kernel id strings")
        return d

    def apply_warning(self, session, d: dict[str, Any], now: datetime) -> bool:
        """Record a warning (or re-announce a held one); False when it already stands."""
        user, server = d["user"], d["server"]
        w = session.get(IdleWarningRow, (user, server))
        if w is not None and w.session == d["session"] and not d.get("renew"):
            return False  # idempotent: a warning's clock never restarts by itself
        reason = d["reason"]
        if w is not None and w.session == d["session"]:
            reason = f"data returned after a hole; new reclaim time with a fresh grace: {reason}"
        if w is None:
            w = IdleWarningRow(user=user, server=server)
            session.add(w)
        w.warned_at, w.reclaim_at, w.held_at = now, now + timedelta(seconds=d["grace_seconds"]), None
        w.reason, w.evidence, w.session = d["reason"], json.dumps(d["evidence"]), d["session"]
        self.record(session, "warning", user, server, d, reason, d["evidence"], now)
        self.log.info("gpulab idle: warned %s/%s, reclaim at %s: %s", user, server, iso(w.reclaim_at), reason)
        return True

    def apply_hold(self, session, d: dict[str, Any], now: datetime) -> bool:
        w = session.get(IdleWarningRow, (d["user"], d["server"]))
        if w is None or w.held_at is not None or w.session != d["session"]:
            return False
        w.held_at = now
        self.record(
            session,
            "held",
            d["user"],
            d["server"],
            d,
            f"reclaim postponed until utilisation data returns: {d['reason']}",
            at=now,
        )
        return True

    def apply_clear(self, session, d: dict[str, Any], now: datetime) -> bool:
        w = session.get(IdleWarningRow, (d["user"], d["server"]))
        if w is None:
            return False
        session.delete(w)
        self.record(
            session, "cleared", d["user"], d["server"], {"session": w.session}, d["reason"] or "cleared", at=now
        )
        self.log.info("gpulab idle: cleared warning of %s/%s: %s", d["user"], d["server"], d["reason"])
        return True

    def apply_reclaim(self, session, d: dict[str, Any], now: datetime) -> str | None:
        """Claim a reclaim before the culler acts; the reason it is refused, or None when granted.

        A "keep my GPU" pressed after the culler read the idle state, a held or
        restarted session, or a grace not yet over all refuse it.
        """
        user, server = d["user"], d["server"]
        warning = session.get(IdleWarningRow, (user, server))
        k = session.get(KeepaliveRow, (user, server))
        if warning is None:
            return f"no idle warning for {user}/{server} (cleared or kept alive); not reclaiming"
        if warning.session != d["session"]:
            return f"the warning of {user}/{server} belongs to an earlier session; not reclaiming"
        if warning.held_at is not None:
            return f"the warning of {user}/{server} is held until its data returns"
        if warning.reclaim_at > now:
            return f"the grace period of {user}/{server} ends at {iso(warning.reclaim_at)}"
        if k is not None and k.until and k.until > now:
            return f"{user}/{server} is kept alive until {iso(k.until)}"
        session.delete(warning)
        if d["action"] == "stop-server" and k is not None:  # the session ends: so does its keep-alive allowance
            session.delete(k)
        evidence = {**d["evidence"], "action": d["action"], "idle_since": d["idle_since"]}
        if d["action"] == "shutdown-kernel":
            evidence["kernel_ids"] = d["kernel_ids"]
        self.record(session, "reclaim", user, server, d, d["reason"], evidence, now)
        self.log.warning(
            "gpulab idle: reclaimed %s/%s (%s, %.4f idle GPU-hours observed): %s",
            user,
            server,
            d["action"],
            d["idle_gpu_hours"],
            d["reason"],
        )
        return None


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
        now = utcnow()
        with self.idle_db() as session:
            k = session.get(KeepaliveRow, (user, server))
            if k is None:
                k = KeepaliveRow(user=user, server=server, used=0, until=None, session=session_id)
                session.add(k)
            elif k.session != session_id:  # a new server session starts with a fresh allowance
                k.used, k.until, k.session = 0, None, session_id
            try:
                k.used, until = grant_keepalive(
                    policy, k.used, None if k.until is None else to_epoch(k.until), to_epoch(now)
                )
            except KeepaliveRefused as e:
                raise web.HTTPError(409, str(e)) from None
            k.until = from_epoch(until)
            warning = session.get(IdleWarningRow, (user, server))
            if warning is not None:
                session.delete(warning)
            self.record(
                session,
                "keepalive",
                user,
                server,
                {**gpulab_state, "session": session_id},
                f"'keep my GPU' {k.used}/{policy.max_uses} by {self.caller_name}, until {iso(k.until)}",
            )
            session.commit()
            self.log.info(
                "gpulab idle: %s/%s kept alive until %s (%d/%d) by %s",
                user,
                server,
                iso(k.until),
                k.used,
                policy.max_uses,
                self.caller_name,
            )
            self.write_json(self.view(session, user, server))


class StateHandler(IdleBase):
    """Everything the culler needs besides the hub's server list, in one request."""

    async def get(self) -> None:
        self._require_culler()
        catalog = self.gpulab.catalog
        now = utcnow()
        with self.idle_db() as session:
            warnings = session.scalars(select(IdleWarningRow)).all()
            keepalives = session.scalars(select(KeepaliveRow).where(KeepaliveRow.until > now)).all()
            self.write_json(
                {
                    "now": to_epoch(now),
                    "warnings": [
                        {
                            "user": w.user,
                            "server": w.server,
                            "warned_at": to_epoch(w.warned_at),
                            "reclaim_at": to_epoch(w.reclaim_at),
                            "session": w.session,
                            "held": w.held_at is not None,
                        }
                        for w in warnings
                    ],
                    "keepalives": [
                        {
                            "user": k.user,
                            "server": k.server,
                            "until": to_epoch(k.until),
                            "used": k.used,
                            "session": k.session,
                        }
                        for k in keepalives
                    ],
                    "profiles": {
                        p.slug: {"gpu_milli": p.gpu_milli, "idle_timeout_seconds": p.idle_timeout_seconds}
                        for p in catalog.profiles.values()
                    },
                    "teams": {t.name: {"idle_timeout_seconds": t.idle_timeout_seconds} for t in catalog.teams.values()},
                }
            )


class CycleHandler(IdleBase):
    """One culler cycle's records in one request: all validated first (a 400 records nothing),
    then applied in one transaction; each reclaim claim is granted or refused on its own."""

    async def post(self) -> None:
        self._require_culler()
        data = self.read_json(max_bytes=MAX_CYCLE_BYTES)
        lists = {}
        for key in ("warnings", "holds", "clears", "reclaims"):
            items = data.get(key, [])
            if not isinstance(items, list):
                raise web.HTTPError(400, f"{key} must be a list")
            lists[key] = items
        warnings = [self.check_warning(i) for i in lists["warnings"]]
        holds = [self._common(i, "holds") for i in lists["holds"]]
        clears = [self._common(i, "clears") for i in lists["clears"]]
        claims = [self.check_reclaim(i) for i in lists["reclaims"]]
        names = {d["user"] for d in warnings + claims}
        known = {n for (n,) in self.db.query(orm.User.name).filter(orm.User.name.in_(names))} if names else set()
        unknown = sorted(names - known)
        if unknown:
            raise web.HTTPError(404, f"no such user(s): {', '.join(unknown[:10])}")
        now = utcnow()
        reclaims: list[dict[str, Any]] = []
        with self.idle_db() as session:
            out = {
                "clears": sum(self.apply_clear(session, d, now) for d in clears),
                "warnings": sum(self.apply_warning(session, d, now) for d in warnings),
                "holds": sum(self.apply_hold(session, d, now) for d in holds),
                "reclaims": reclaims,
            }
            for d in claims:
                refused = self.apply_reclaim(session, d, now)
                reclaims.append(
                    {
                        "user": d["user"],
                        "server": d["server"],
                        "accepted": refused is None,
                        "message": refused or "recorded",
                    }
                )
            session.commit()
        self.write_json(out)


class WarningsHandler(IdleBase):
    async def post(self) -> None:
        self._require_culler()
        d = self.check_warning(self.read_json())
        if self.find_user(d["user"]) is None:
            raise web.HTTPError(404, f"no such user {d['user']!r}")
        with self.idle_db() as session:
            created = self.apply_warning(session, d, utcnow())
            session.commit()
            self.write_json(self.view(session, d["user"], d["server"]), 201 if created else 200)

    async def delete(self) -> None:
        self._require_culler()
        user, server = self._target()
        reason = self.get_argument("reason", "GPU busy again")[:MAX_REASON]
        with self.idle_db() as session:
            self.apply_clear(session, {"user": user, "server": server, "reason": reason}, utcnow())
            session.commit()
            self.write_json(self.view(session, user, server))


class ReclaimsHandler(IdleBase):
    async def post(self) -> None:
        self._require_culler()
        d = self.check_reclaim(self.read_json())
        with self.idle_db() as session:
            refused = self.apply_reclaim(session, d, utcnow())
            if refused:
                raise web.HTTPError(409, refused)
            session.commit()
        self.write_json({"user": d["user"], "server": d["server"], "recorded": True}, 201)


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
        sessions = self.idle_db
        with sessions() as session:
            events = list(reversed(session.scalars(query).all()))
        self.write_json({"events": audit_json(sessions, events)})


handlers = [
    (r"/api/gpulab/idle", IdleHandler),
    (r"/api/gpulab/idle/keepalive", KeepaliveHandler),
    (r"/api/gpulab/idle/state", StateHandler),
    (r"/api/gpulab/idle/cycle", CycleHandler),
    (r"/api/gpulab/idle/warnings", WarningsHandler),
    (r"/api/gpulab/idle/reclaims", ReclaimsHandler),
    (r"/api/gpulab/idle/audit", AuditHandler),
]
