"""The culler's warnings, holds, clears, reclaims and the users' "keep my GPU", as recorded.

:class:`IdleStore` is the hub's side of the warn -> grace -> reclaim machine: it applies
what a culler cycle sends (:class:`spawner.core.idle_cycle.CycleRecords`) to the records in
gpulab's database and grants or refuses each reclaim claim with the same rule the culler
decides by (:func:`spawner.core.idle.reclaim_refusal`). The REST handlers
(``hub_config/api/idle.py``) only parse, check scopes, call it and write its answer.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Mapping
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from hub_config.domain.idle_records import (
    EVENT_KINDS,
    IdleEventRow,
    IdleWarningRow,
    KeepaliveRow,
    audit_json,
    evidence_peak,
    exact_iso,
    idle_minutes,
    reclaim_message,
)
from hub_config.storage.db import from_epoch, iso, to_epoch, utcnow
from spawner.core.catalog import Catalog
from spawner.core.idle import IdleWarning, KeepalivePolicy, Lifetime, grant_keepalive, reclaim_refusal
from spawner.core.idle_cycle import (
    MAX_NAME,
    MAX_REASON,
    ClaimAnswer,
    CycleRecords,
    Mark,
    ReclaimClaim,
    ServerRecord,
    Unattributed,
    WarningRecord,
)
from spawner.core.sharing import backend_for


class UnattributedServers:
    """The servers the culler last said it cannot judge, and why (held in the hub's memory:
    the culler compares its list with :meth:`to_json` in the idle state every cycle and
    sends its own whenever they differ, so a restarted hub has it again after one cycle)."""

    def __init__(self) -> None:
        #: ``None`` until a culler reported since the hub started.
        self.servers: dict[tuple[str, str], tuple[Unattributed, datetime]] | None = None

    def replace(self, servers: tuple[Unattributed, ...], now: datetime) -> None:
        before = self.servers or {}
        out: dict[tuple[str, str], tuple[Unattributed, datetime]] = {}
        for u in servers:
            old = before.get((u.user, u.server))
            same = old is not None and old[0].session == u.session and old[0].code == u.code
            out[(u.user, u.server)] = (u, old[1] if same and old else now)
        self.servers = out

    def of(self, user: str, server: str, session: str) -> dict[str, Any] | None:
        """Why idle GPU reclaim is off for this server session, or ``None``."""
        found = (self.servers or {}).get((user, server))
        if found is None or (found[0].session and found[0].session != session):
            return None
        u, since = found
        return {"code": u.code, "reason": u.reason, "since": exact_iso(since)}

    def to_json(self) -> list[dict[str, Any]] | None:
        if self.servers is None:
            return None
        return [{**u.to_json(), "since": exact_iso(since)} for u, since in self.servers.values()]


class IdleStore:
    """The culler's records and the keep-alives of one hub, read and written in one place.

    ``sessions`` opens a database session; ``policy`` is the hub's "keep my GPU" allowance.
    """

    def __init__(
        self,
        sessions: Callable[[], Session],
        policy: KeepalivePolicy,
        log: logging.Logger,
        unattributed: UnattributedServers | None = None,
    ):
        self.sessions = sessions
        self.policy = policy
        self.log = log
        self.unattributed = unattributed if unattributed is not None else UnattributedServers()

    # -- what a user, the lab and the culler read --------------------------------

    def view(self, session: Session, user: str, server: str, current: str) -> dict[str, Any]:
        """One server's warning and keep-alive for its running session ``current`` ("": not running)."""
        w = session.get(IdleWarningRow, (user, server))
        k = session.get(KeepaliveRow, (user, server))
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
                "max": self.policy.max_uses,
                "extends_seconds": self.policy.extends_seconds,
                "until": exact_iso(until) if until and until > now else None,
            },
            "reclaimed": None if current else self.last_reclaim(session, user, server),
            # The culler finds no utilisation for this server: it will never be reclaimed as idle.
            "reclaim_off": self.unattributed.of(user, server, current) if current else None,
        }

    def last_reclaim(self, session: Session, user: str, server: str) -> dict[str, Any] | None:
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
            "message": reclaim_message(e.at, minutes, peak, evidence),
        }

    def state(self, catalog: Catalog) -> dict[str, Any]:
        """Everything the culler needs besides the hub's server list (its clock is epoch seconds)."""
        now = utcnow()
        with self.sessions() as session:
            warnings = session.scalars(select(IdleWarningRow)).all()
            keepalives = session.scalars(select(KeepaliveRow).where(KeepaliveRow.until > now)).all()
            return {
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
                    if k.until is not None
                ],
                "profiles": {
                    p.slug: {
                        "gpu_milli": p.gpu_milli,
                        "idle_timeout_seconds": p.idle_timeout_seconds,
                        "max_lifetime_seconds": p.max_lifetime_seconds,
                        "sharing": backend_for(p, catalog.sharing),
                    }
                    for p in catalog.profiles.values()
                },
                "unattributed": self.unattributed.to_json(),
                "teams": {
                    t.name: {
                        "idle_timeout_seconds": t.idle_timeout_seconds,
                        "max_lifetime_seconds": t.max_lifetime_seconds,
                    }
                    for t in catalog.teams.values()
                },
            }

    def audit(self, limit: int, user: str | None = None, kind: str | None = None) -> list[dict[str, Any]]:
        """The latest audit events, oldest first (``kind`` one of :data:`EVENT_KINDS`)."""
        query = select(IdleEventRow).order_by(IdleEventRow.id.desc()).limit(limit)
        if user is not None:
            query = query.where(IdleEventRow.user == user)
        if kind is not None:
            assert kind in EVENT_KINDS, kind
            query = query.where(IdleEventRow.kind == kind)
        with self.sessions() as session:
            events = list(reversed(session.scalars(query).all()))
        return audit_json(self.sessions, events)

    # -- the audit log ------------------------------------------------------------

    def record(
        self,
        session: Session,
        kind: str,
        user: str,
        server: str,
        reason: str,
        *,
        at: datetime,
        team: str = "",
        profile: str = "",
        gpu_milli: int = 0,
        evidence: Any = None,
        session_id: str = "",
        action: str = "",
        idle_gpu_hours: float = 0.0,
    ) -> None:
        session.add(
            IdleEventRow(
                at=at,
                kind=kind,
                user=user,
                server=server,
                team=str(team or "")[:MAX_NAME],
                profile=str(profile or "")[:MAX_NAME],
                gpu_milli=gpu_milli or 0,
                reason=reason[:MAX_REASON],
                evidence=json.dumps(evidence if evidence is not None else {}),
                session=session_id or "",
                action=action if kind == "reclaim" else "",
                idle_gpu_hours=idle_gpu_hours if kind == "reclaim" else 0.0,
            )
        )

    def _record_of(self, session: Session, kind: str, r: Mark, reason: str, at: datetime, **extra: Any) -> None:
        """An audit event for a culler's record (a server record carries who held what)."""
        held: dict[str, Any] = (
            {"team": r.team, "profile": r.profile, "gpu_milli": r.gpu_milli} if isinstance(r, ServerRecord) else {}
        )
        self.record(session, kind, r.user, r.server, reason, at=at, session_id=r.session, **held, **extra)

    # -- the culler's records ------------------------------------------------------

    def apply_warning(self, session: Session, w: WarningRecord, now: datetime) -> bool:
        """Record a warning (or re-announce a held one); False when it already stands."""
        row = session.get(IdleWarningRow, (w.user, w.server))
        if row is not None and row.session == w.session and not w.renew:
            return False  # idempotent: a warning's clock never restarts by itself
        reason = w.reason
        if row is not None and row.session == w.session:
            reason = f"data returned after a hole; new reclaim time with a fresh grace: {reason}"
        if row is None:
            row = IdleWarningRow(user=w.user, server=w.server)
            session.add(row)
        row.warned_at, row.reclaim_at, row.held_at = now, now + timedelta(seconds=w.grace_seconds), None
        row.reason, row.evidence, row.session = w.reason, json.dumps(dict(w.evidence)), w.session
        self._record_of(session, "warning", w, reason, now, evidence=dict(w.evidence))
        self.log.info("gpulab idle: warned %s/%s, reclaim at %s: %s", w.user, w.server, iso(row.reclaim_at), reason)
        return True

    def apply_hold(self, session: Session, m: Mark, now: datetime) -> bool:
        row = session.get(IdleWarningRow, (m.user, m.server))
        if row is None or row.held_at is not None or row.session != m.session:
            return False
        row.held_at = now
        self._record_of(session, "held", m, f"reclaim postponed until utilisation data returns: {m.reason}", now)
        return True

    def apply_clear(self, session: Session, m: Mark, now: datetime) -> bool:
        row = session.get(IdleWarningRow, (m.user, m.server))
        if row is None:
            return False
        session.delete(row)
        self.record(session, "cleared", m.user, m.server, m.reason or "cleared", at=now, session_id=row.session)
        self.log.info("gpulab idle: cleared warning of %s/%s: %s", m.user, m.server, m.reason)
        return True

    def apply_reclaim(
        self, session: Session, c: ReclaimClaim, now: datetime, lifetime: Lifetime | None = None
    ) -> str | None:
        """Claim a reclaim before the culler acts; the reason it is refused, or None when granted.

        The culler's own rule (:func:`reclaim_refusal`) against the hub's records: a "keep my
        GPU" pressed after the culler read the idle state, a held or restarted session, or a
        grace not yet over all refuse it. ``lifetime``: the running session's maximum lifetime,
        as the hub knows it (its catalog and the session's start); no keep-alive counts past it.
        """
        row = session.get(IdleWarningRow, (c.user, c.server))
        k = session.get(KeepaliveRow, (c.user, c.server))
        warning = (
            None
            if row is None
            else IdleWarning(to_epoch(row.warned_at), to_epoch(row.reclaim_at), row.session, row.held_at is not None)
        )
        keepalive_until = to_epoch(k.until) if k is not None and k.until else None
        refused = reclaim_refusal(
            warning,
            keepalive_until,
            c.session,
            to_epoch(now),
            f"{c.user}/{c.server}",
            None if lifetime is None else lifetime.ends_at,
        )
        if refused is not None or row is None:
            return refused
        session.delete(row)
        if c.action == "stop-server" and k is not None:  # the session ends: so does its keep-alive allowance
            session.delete(k)
        evidence: dict[str, Any] = {**c.evidence, "action": c.action, "idle_since": c.idle_since}
        if c.action == "shutdown-kernel":
            evidence["kernel_ids"] = list(c.kernel_ids)
        self._record_of(
            session, "reclaim", c, c.reason, now, evidence=evidence, action=c.action, idle_gpu_hours=c.idle_gpu_hours
        )
        self.log.warning(
            "gpulab idle: reclaimed %s/%s (%s, %.4f idle GPU-hours observed): %s",
            c.user,
            c.server,
            c.action,
            c.idle_gpu_hours,
            c.reason,
        )
        return None

    def apply_cycle(
        self,
        records: CycleRecords,
        now: datetime,
        lifetimes: Mapping[tuple[str, str], Lifetime | None] | None = None,
    ) -> dict[str, Any]:
        """One cycle in one transaction: clears, warnings, holds, then each claim on its own
        (``lifetimes``: the running sessions' maximum lifetimes by ``(user, server)``)."""
        with self.sessions() as session:
            clears = sum(self.apply_clear(session, m, now) for m in records.clears)
            warnings = sum(self.apply_warning(session, w, now) for w in records.warnings)
            holds = sum(self.apply_hold(session, m, now) for m in records.holds)
            answers = []
            for c in records.reclaims:
                refused = self.apply_reclaim(session, c, now, (lifetimes or {}).get((c.user, c.server)))
                answers.append(
                    ClaimAnswer(user=c.user, server=c.server, accepted=refused is None, message=refused or "recorded")
                )
            session.commit()
        if records.unattributed is not None:
            self.unattributed.replace(records.unattributed, now)
        return {"clears": clears, "warnings": warnings, "holds": holds, "reclaims": [a.to_json() for a in answers]}

    # -- "keep my GPU" ---------------------------------------------------------------

    def keep_alive(
        self,
        user: str,
        server: str,
        current: str,
        held: dict[str, Any],
        caller: str,
        lifetime: Lifetime | None = None,
    ) -> dict[str, Any]:
        """One "keep my GPU" for the running session ``current``: the server's view afterwards,
        or :class:`~spawner.core.idle.KeepaliveRefused` when the allowance is used up or the
        session's maximum ``lifetime`` has passed (a press never reaches past it).

        ``held``: the server's grant (team, profile), recorded with the event."""
        now = utcnow()
        with self.sessions() as session:
            k = session.get(KeepaliveRow, (user, server))
            if k is None:
                k = KeepaliveRow(user=user, server=server, used=0, until=None, session=current)
                session.add(k)
            elif k.session != current:  # a new server session starts with a fresh allowance
                k.used, k.until, k.session = 0, None, current
            k.used, until = grant_keepalive(
                self.policy, k.used, None if k.until is None else to_epoch(k.until), to_epoch(now), lifetime
            )
            k.until = from_epoch(until)
            warning = session.get(IdleWarningRow, (user, server))
            if warning is not None:
                session.delete(warning)
            self.record(
                session,
                "keepalive",
                user,
                server,
                f"'keep my GPU' {k.used}/{self.policy.max_uses} by {caller}, until {iso(k.until)}",
                at=now,
                team=held.get("team", ""),
                profile=held.get("profile", ""),
                gpu_milli=held.get("gpu_milli", 0),
                session_id=current,
            )
            session.commit()
            self.log.info(
                "gpulab idle: %s/%s kept alive until %s (%d/%d) by %s",
                user,
                server,
                iso(k.until),
                k.used,
                self.policy.max_uses,
                caller,
            )
            return self.view(session, user, server, current)
