"""Each user's last started profile, in gpulab's database.

The spawn page preselects it and offers "Start again with 0.5 × H100 (team
vision)" in one click; the hub home offers the same. One row per user,
written when a server has started (not when a spawn was only asked for), so
a refused or failed spawn never becomes the suggestion.
"""

from __future__ import annotations

from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from sqlalchemy import DateTime, String, select
from sqlalchemy.orm import Mapped, Session, mapped_column, sessionmaker

from .db import Base, GPULabDB, session_factory

MAX_NAME = 255


class LastChoiceRow(Base):
    __tablename__ = "gpulab_last_choice"
    user: Mapped[str] = mapped_column(String(MAX_NAME), primary_key=True)
    team: Mapped[str] = mapped_column(String(63))
    profile: Mapped[str] = mapped_column(String(63))
    image: Mapped[str] = mapped_column(String(63), default="")
    at: Mapped[datetime] = mapped_column(DateTime)


_sessions: dict[str, sessionmaker[Session]] = {}


def _sessions_for(config: Any, create: bool) -> sessionmaker[Session] | None:
    """gpulab's session factory (cached: the spawn page reads this on every visit);
    ``None`` when ``create`` is false and the hub never wrote a database."""
    url = GPULabDB(config=config).db_url
    factory = _sessions.get(url)
    if factory is None:
        if not create and url.startswith("sqlite:///") and not Path(url[len("sqlite:///"):]).exists():
            return None
        factory = _sessions[url] = session_factory(url=url)
    return factory


def remember_choice(config: Any, user: str, team: str, profile: str, image: str = "") -> None:
    """Record ``team:profile`` as ``user``'s last started choice (one upsert)."""
    sessions = _sessions_for(config, create=True)
    with sessions.begin() as s:
        row = s.get(LastChoiceRow, user)
        now = datetime.now(timezone.utc).replace(tzinfo=None)
        if row is None:
            s.add(LastChoiceRow(user=user, team=team, profile=profile, image=image or "", at=now))
        else:
            row.team, row.profile, row.image, row.at = team, profile, image or "", now


def last_choice(config: Any, user: str) -> dict[str, str] | None:
    """``{"team", "profile", "image"}`` the user last started, or ``None``.

    Reads nothing (and creates no database) on a hub that never wrote one.
    """
    sessions = _sessions_for(config, create=False)
    if sessions is None:
        return None
    with sessions() as s:
        row = s.scalars(select(LastChoiceRow).where(LastChoiceRow.user == user)).first()
    if row is None:
        return None
    return {"team": row.team, "profile": row.profile, "image": row.image}
