"""The GPU idle culler's records in gpulab's database, and what is shown from them.

Warnings (one per server, tied to a server session), keep-alives, and the
audit events (warnings, holds, keep-alives, clears, reclaims) with their
evidence and GPU-hour figures. The hub API (:mod:`hub_config.api.idle`)
writes them; the admin page, the usage report and the spawn page read them.
"""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path
from typing import Any

from sqlalchemy import DateTime, Float, Integer, String, Text, select
from sqlalchemy.orm import Mapped, mapped_column
from traitlets import Bool, Unicode
from traitlets import Integer as IntTrait
from traitlets.config import Configurable

from hub_config.domain.usage_records import freed_until, next_gpu_holds
from hub_config.storage.db import Base, GPULabDB, iso, session_factory, to_epoch, utcnow
from spawner.core.idle import IdleFacts, KeepalivePolicy, gpu_hours_freed
from spawner.core.units import format_duration

#: The culler's service name in the hub's configuration.
CULLER_SERVICE = "gpulab-idle-culler"
EVENT_KINDS = ("warning", "held", "reclaim", "keepalive", "cleared")
ACTIONS = ("stop-server", "shutdown-kernel")
MAX_SESSION = 64
#: Largest cycle record the culler may send (thousands of warnings with their evidence).
MAX_CYCLE_BYTES = 64 * 1024 * 1024
MAX_NAME = 255
MAX_REASON = 2000
MAX_GRACE_SECONDS = 7 * 86400


class GPULabIdle(Configurable):
    """Hub-side policy for "keep my GPU" (``c.GPULabIdle.*``)."""

    keepalive_max_uses = IntTrait(
        2,
        min=0,
        config=True,
        help="How many times a user may press 'keep my GPU' per server session (0 disables it).",
    )
    keepalive_extends_seconds = IntTrait(
        3600,
        min=1,
        config=True,
        help="How long one 'keep my GPU' protects a server from the GPU idle culler, in seconds.",
    )

    culler_status = Unicode(
        "",
        config=True,
        help="""What the admin page says about the GPU idle culler: set by the deployment that starts
        it (the embedded hub says whether it runs, with which source, or why it is off). Empty: the
        page shows only the culler's records.""",
    )
    culler_running = Bool(
        None,
        allow_none=True,
        config=True,
        help="""Whether this deployment runs the GPU idle culler. None: decided from
        `c.JupyterHub.services` (a service named gpulab-idle-culler).""",
    )

    @property
    def policy(self) -> KeepalivePolicy:
        return KeepalivePolicy(self.keepalive_max_uses, self.keepalive_extends_seconds)


# -- tables ---------------------------------------------------------------


class IdleWarningRow(Base):
    __tablename__ = "gpulab_idle_warnings"
    user: Mapped[str] = mapped_column(String(MAX_NAME), primary_key=True)
    server: Mapped[str] = mapped_column(String(MAX_NAME), primary_key=True)
    warned_at: Mapped[datetime] = mapped_column(DateTime)
    reclaim_at: Mapped[datetime] = mapped_column(DateTime)
    reason: Mapped[str] = mapped_column(Text, default="")
    evidence: Mapped[str] = mapped_column(Text, default="{}")
    #: The server session warned (the spawner's start time, as the hub's REST API writes it).
    session: Mapped[str] = mapped_column(String(MAX_SESSION), default="")
    #: Set when data went missing after the warning: no reclaim until data returns and a new grace ends.
    held_at: Mapped[datetime | None] = mapped_column(DateTime, nullable=True)


class KeepaliveRow(Base):
    __tablename__ = "gpulab_idle_keepalives"
    user: Mapped[str] = mapped_column(String(MAX_NAME), primary_key=True)
    server: Mapped[str] = mapped_column(String(MAX_NAME), primary_key=True)
    used: Mapped[int] = mapped_column(Integer, default=0)
    until: Mapped[datetime | None] = mapped_column(DateTime, nullable=True)
    #: The server session the count belongs to (the spawner's ``started``); a new session starts at 0.
    session: Mapped[str] = mapped_column(String(64), default="")


class IdleEventRow(Base):
    __tablename__ = "gpulab_idle_events"
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    at: Mapped[datetime] = mapped_column(DateTime, index=True)
    kind: Mapped[str] = mapped_column(String(16))
    user: Mapped[str] = mapped_column(String(MAX_NAME), index=True)
    server: Mapped[str] = mapped_column(String(MAX_NAME))
    team: Mapped[str] = mapped_column(String(MAX_NAME), default="")
    profile: Mapped[str] = mapped_column(String(MAX_NAME), default="")
    gpu_milli: Mapped[int] = mapped_column(Integer, default=0)
    reason: Mapped[str] = mapped_column(Text, default="")
    evidence: Mapped[str] = mapped_column(Text, default="{}")
    session: Mapped[str] = mapped_column(String(MAX_SESSION), default="")
    #: For reclaims: ``stop-server`` or ``shutdown-kernel``.
    action: Mapped[str] = mapped_column(String(32), default="")
    #: For reclaims: GPUs held x the idle time proven before the reclaim, in hours.
    idle_gpu_hours: Mapped[float] = mapped_column(Float, default=0.0)


def exact_iso(dt: datetime | None) -> str | None:
    """A culler record's time to the microsecond: idle windows and graces may be seconds long."""
    return iso(dt, timespec="microseconds")


def event_json(e: IdleEventRow, freed: float | None = None) -> dict[str, Any]:
    out = {
        "at": exact_iso(e.at),
        "kind": e.kind,
        "user": e.user,
        "server": e.server,
        "team": e.team,
        "profile": e.profile,
        "gpu_milli": e.gpu_milli,
        "reason": e.reason,
        "session": e.session,
        "evidence": json.loads(e.evidence or "{}"),
    }
    if e.kind == "reclaim":
        out.update(action=e.action, idle_gpu_hours_before_reclaim=e.idle_gpu_hours, gpu_hours_freed=freed)
    return out


def reclaim_message(at: datetime, idle_minutes: int | None, peak_percent: float, evidence: dict | None = None) -> str:
    """The sentence a user reads after a reclaim (UTC clock time; the lab shows local time); a reclaim
    at the session's maximum lifetime says so (``evidence`` of the claim), not idleness."""
    when = at.strftime("%H:%M UTC")
    lifetime = (evidence or {}).get("max_lifetime_seconds")
    if isinstance(lifetime, int) and not isinstance(lifetime, bool):
        origin = (evidence or {}).get("max_lifetime_from") or "this server"
        return (
            f"Your GPU was reclaimed at {when}: the session reached the maximum lifetime "
            f"({format_duration(lifetime)} of {origin}) — start again when you need it."
        )
    idle = f" after {idle_minutes} minutes at {peak_percent:g} %" if idle_minutes is not None else ""
    return f"Your GPU was reclaimed at {when}{idle} \u2014 start again when you need it."


def audit_json(sessions, events: list[IdleEventRow]) -> list[dict[str, Any]]:
    """Audit events as JSON; reclaims carry both GPU-hour figures (freed: until the user's next GPU)."""
    reclaims = [e for e in events if e.kind == "reclaim"]
    holds = {}
    if reclaims:
        holds = next_gpu_holds(sessions, {e.user for e in reclaims}, min(e.at for e in reclaims))
    now = to_epoch(utcnow())
    out = []
    for e in events:
        freed = None
        if e.kind == "reclaim":
            freed = 0.0
            if e.action == "stop-server":
                nxt = freed_until(holds, e.user, e.at)
                freed = gpu_hours_freed(e.gpu_milli, to_epoch(e.at), None if nxt is None else to_epoch(nxt), now)
        out.append(event_json(e, freed))
    return out


def culler_is_on(config) -> bool:
    """Whether this hub runs the GPU idle culler: ``c.GPULabIdle.culler_running``, or a hub service of its name."""
    settings = GPULabIdle(config=config)
    services = config.JupyterHub.get("services", []) if config is not None and "JupyterHub" in config else []
    as_service = any(isinstance(s, dict) and s.get("name") == CULLER_SERVICE for s in services)
    return as_service if settings.culler_running is None else (settings.culler_running or as_service)


def idle_facts(config) -> IdleFacts:
    """What every page's idle sentence needs to know of this hub's culler."""
    settings = GPULabIdle(config=config)
    return IdleFacts(
        culler_on=culler_is_on(config),
        keepalive_uses=settings.keepalive_max_uses,
        keepalive_seconds=settings.keepalive_extends_seconds,
    )


def idle_admin_view(config, limit: int = 50, unattributed: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """The admin page's culler section: whether it runs (or why not), its latest records, and the
    servers it reported it cannot judge (``unattributed``, from the hub's memory)."""
    settings = GPULabIdle(config=config)
    sessions = session_factory(config=config)
    with sessions() as session:
        events = list(
            reversed(session.scalars(select(IdleEventRow).order_by(IdleEventRow.id.desc()).limit(limit)).all())
        )
    on = culler_is_on(config)
    if on:
        status = (
            settings.culler_status
            if settings.culler_running and settings.culler_status
            else f"On: runs as the hub service {CULLER_SERVICE}."
        )
    else:
        status = settings.culler_status or (
            f"Off: no {CULLER_SERVICE} service in this hub's configuration; "
            "idle GPUs are not reclaimed (see docs/idle-culler.md)."
        )
    return {
        "on": on,
        "status": status,
        "events": audit_json(sessions, events),
        "unattributed": sorted(unattributed or [], key=lambda u: (u.get("user", ""), u.get("server", ""))),
    }


def reclaim_notice(config, user: str, server: str) -> str:
    """The spawn page's sentence after a reclaim, or '' when the user's last session of
    ``server`` did not end that way (or they have held a GPU since)."""
    url = GPULabDB(config=config).db_url
    if url.startswith("sqlite:///") and not Path(url[len("sqlite:///") :]).exists():
        return ""  # no gpulab database yet: nothing was ever reclaimed (and none is created here)
    sessions = session_factory(config=config)
    with sessions() as session:
        e = session.scalars(
            select(IdleEventRow)
            .where(
                IdleEventRow.user == user,
                IdleEventRow.server == server,
                IdleEventRow.kind.in_(("reclaim", "warning", "keepalive")),
            )
            .order_by(IdleEventRow.id.desc())
            .limit(1)
        ).first()
    if e is None or e.kind != "reclaim" or e.action != "stop-server":
        return ""
    if freed_until(next_gpu_holds(sessions, {user}, e.at), user, e.at) is not None:
        return ""  # they came back since: old news
    evidence = json.loads(e.evidence or "{}")
    return reclaim_message(e.at, idle_minutes(e.at, evidence), evidence_peak(evidence), evidence)


def idle_minutes(reclaimed_at: datetime, evidence: dict) -> int | None:
    """How long a reclaimed GPU had been idle, in minutes (None: the evidence does not say)."""
    idle_since = evidence.get("idle_since")
    if "max_lifetime_seconds" in evidence:  # stopped for its age: how long it idled is not the point
        return None
    if isinstance(idle_since, bool) or not isinstance(idle_since, (int, float)):
        return None
    return int(round((to_epoch(reclaimed_at) - idle_since) / 60))


def evidence_peak(evidence: dict) -> float:
    """The highest utilisation any device showed over the evidence window (percent)."""
    return max((d.get("max", 0) or 0 for ds in (evidence.get("devices") or {}).values() for d in ds), default=0)


def reclaim_notice_for(spawner) -> str:
    """:func:`reclaim_notice` for a spawner's user and server; '' (logged) when the records
    cannot be read -- the spawn form must render anyway."""
    try:
        return reclaim_notice(spawner.config, spawner.user.name, spawner.name)
    except Exception as e:
        spawner.log.warning("gpulab: cannot read the idle culler's records for %s: %s", spawner.user.name, e)
        return ""
