"""Each user's last started profile, in gpulab's database.

The spawn page preselects it and offers "Start again with 0.5 × H100 (team
vision)" in one click; the hub home offers the same. One row per user,
written when a server has started (not when a spawn was only asked for), so
a refused or failed spawn never becomes the suggestion.
"""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import DateTime, String
from sqlalchemy.orm import Mapped, Session, mapped_column, sessionmaker

from hub_config.storage.db import Base, utcnow

MAX_NAME = 255


class LastChoiceRow(Base):
    __tablename__ = "gpulab_last_choice"
    user: Mapped[str] = mapped_column(String(MAX_NAME), primary_key=True)
    team: Mapped[str] = mapped_column(String(63))
    profile: Mapped[str] = mapped_column(String(63))
    image: Mapped[str] = mapped_column(String(63), default="")
    at: Mapped[datetime] = mapped_column(DateTime)


def remember_choice(sessions: sessionmaker[Session], user: str, team: str, profile: str, image: str = "") -> None:
    """Record ``team:profile`` as ``user``'s last started choice (one upsert)."""
    with sessions.begin() as s:
        row = s.get(LastChoiceRow, user)
        now = utcnow()
        if row is None:
            s.add(LastChoiceRow(user=user, team=team, profile=profile, image=image or "", at=now))
        else:
            row.team, row.profile, row.image, row.at = team, profile, image or "", now


def last_choice(sessions: sessionmaker[Session], user: str) -> dict[str, str] | None:
    """``{"team", "profile", "image"}`` the user last started, or ``None``."""
    with sessions() as s:
        row = s.get(LastChoiceRow, user)
    if row is None:
        return None
    return {"team": row.team, "profile": row.profile, "image": row.image}
