"""The spawn queue's entries, in gpulab's database: they survive a hub restart.

One row per "queue me": who, which server, which team and profile, its priority rank
and when it joined (the order, :mod:`spawner.core.queue`), and its state (waiting,
starting, started, cancelled, failed) with the sentence of its last change. Rows
that left the queue stay as history (the page says "started at 14:02" or why it failed).
"""

from __future__ import annotations

import threading
from datetime import datetime

from sqlalchemy import DateTime, Integer, String, Text, select
from sqlalchemy.orm import Mapped, Session, mapped_column, sessionmaker

from hub_config.storage.db import Base, to_epoch, utcnow
from spawner.core.queue import ACTIVE_STATES, CANCELLED, STATES, WAITING, QueueEntry, enqueue_refusal

MAX_NAME = 255


class QueueError(ValueError):
    """A queue request refused; ``status`` is the HTTP status (404: no such entry of yours, 409: state)."""

    def __init__(self, message: str, status: int = 409):
        super().__init__(message)
        self.status = status


class QueueRow(Base):
    __tablename__ = "gpulab_queue"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    user: Mapped[str] = mapped_column(String(MAX_NAME), index=True)
    server_name: Mapped[str] = mapped_column(String(MAX_NAME), default="")
    team: Mapped[str] = mapped_column(String(63))
    profile: Mapped[str] = mapped_column(String(63))
    image: Mapped[str] = mapped_column(String(63), default="")
    gpu_milli: Mapped[int] = mapped_column(Integer)
    gpu_model: Mapped[str | None] = mapped_column(String(64), nullable=True)
    #: The profile's priority class rank at the time it joined (higher is served first).
    rank: Mapped[int] = mapped_column(Integer)
    state: Mapped[str] = mapped_column(String(16), index=True)
    reason: Mapped[str] = mapped_column(Text, default="")
    enqueued_at: Mapped[datetime] = mapped_column(DateTime)
    updated_at: Mapped[datetime] = mapped_column(DateTime)

    def entry(self) -> QueueEntry:
        return QueueEntry(
            id=self.id,
            user=self.user,
            server_name=self.server_name,
            team=self.team,
            profile=self.profile,
            milli=self.gpu_milli,
            rank=self.rank,
            enqueued_at=to_epoch(self.enqueued_at),
            gpu_model=self.gpu_model,
            image=self.image,
            state=self.state,
        )


class QueueStore:
    """Reads and writes of the queue; joins are checked against the bound under one lock."""

    def __init__(self, sessions: sessionmaker[Session]):
        self.sessions = sessions
        self._lock = threading.Lock()

    def active(self) -> list[QueueEntry]:
        """Every entry still in the queue (waiting or being started)."""
        with self.sessions() as s:
            rows = s.scalars(select(QueueRow).where(QueueRow.state.in_(ACTIVE_STATES))).all()
            return [r.entry() for r in rows]

    def of_user(self, user: str, limit: int = 20) -> list[tuple[QueueEntry, str, datetime]]:
        """``user``'s entries, newest first: ``(entry, reason, updated_at)``."""
        with self.sessions() as s:
            rows = s.scalars(
                select(QueueRow).where(QueueRow.user == user).order_by(QueueRow.id.desc()).limit(limit)
            ).all()
            return [(r.entry(), r.reason, r.updated_at) for r in rows]

    def get(self, entry_id: int) -> QueueEntry | None:
        with self.sessions() as s:
            row = s.get(QueueRow, entry_id)
            return row.entry() if row is not None else None

    def join(self, entry: QueueEntry, max_per_user: int) -> QueueEntry:
        """Add ``entry`` (its ``id`` and ``enqueued_at`` are the store's), or :class:`QueueError`."""
        with self._lock, self.sessions.begin() as s:
            mine = [r.entry() for r in s.scalars(select(QueueRow).where(QueueRow.user == entry.user)).all()]
            refusal = enqueue_refusal(mine, entry.user, entry.server_name, max_per_user)
            if refusal:
                raise QueueError(refusal[0].upper() + refusal[1:] + ".", 409)
            now = utcnow()
            row = QueueRow(
                user=entry.user,
                server_name=entry.server_name,
                team=entry.team,
                profile=entry.profile,
                image=entry.image,
                gpu_milli=entry.milli,
                gpu_model=entry.gpu_model,
                rank=entry.rank,
                state=WAITING,
                reason="",
                enqueued_at=now,
                updated_at=now,
            )
            s.add(row)
            s.flush()
            return row.entry()

    def cancel(self, entry_id: int, user: str) -> QueueEntry:
        """Cancel ``user``'s waiting entry. Another user's entry is "no such entry" (404): the
        queue does not tell who else waits."""
        with self._lock, self.sessions.begin() as s:
            row = s.get(QueueRow, entry_id)
            if row is None or row.user != user:
                raise QueueError(f"you have no queue entry {entry_id}", 404)
            if row.state != WAITING:
                raise QueueError(f"queue entry {entry_id} is {row.state}, not waiting: there is nothing to cancel", 409)
            row.state, row.reason, row.updated_at = CANCELLED, "cancelled by you", utcnow()
            return row.entry()

    def mark(self, entry_id: int, state: str, reason: str = "", *, expect: tuple[str, ...] = ()) -> bool:
        """Move an entry to ``state`` (only from one of ``expect``, when given). ``False``: it was
        not in such a state (cancelled meanwhile)."""
        if state not in STATES:
            raise ValueError(f"unknown queue state {state!r}")
        with self._lock, self.sessions.begin() as s:
            row = s.get(QueueRow, entry_id)
            if row is None or (expect and row.state not in expect):
                return False
            row.state, row.reason, row.updated_at = state, reason[:2000], utcnow()
            return True

    def recover(self, reason: str) -> int:
        """After a hub restart: entries left ``starting`` wait again (the runner re-tries them)."""
        with self._lock, self.sessions.begin() as s:
            rows = s.scalars(
                select(QueueRow).where(QueueRow.state.in_([s for s in ACTIVE_STATES if s != WAITING]))
            ).all()
            for row in rows:
                row.state, row.reason, row.updated_at = WAITING, reason, utcnow()
            return len(rows)
