"""gpulab's own database (jobs, admin edits, audit log, culler records), and its time type.

Separate from JupyterHub's database so that gpulab never migrates the hub's
schema. SQLite by default (beside the hub's), any SQLAlchemy URL in production
(``c.GPULabDB.db_url = "postgresql://..."``). Feature modules declare their
tables on :class:`Base`; the schema itself is built and upgraded by the
migrations (:mod:`.migrate`), which :func:`get_engine` runs once per database.
"""

from __future__ import annotations

import os
import threading
from datetime import datetime, timezone
from pathlib import Path

from sqlalchemy import Engine, create_engine, event
from sqlalchemy.orm import DeclarativeBase, Session, sessionmaker
from traitlets import Unicode, default
from traitlets.config import Configurable

from hub_config.storage import migrate


class Base(DeclarativeBase):
    pass


def utcnow() -> datetime:
    """Now, in the one time type gpulab's tables hold: naive UTC.

    Naive because SQLite returns naive values (a mix would fail to compare) and
    every column is UTC by contract; :func:`iso` renders it with a ``Z``.
    """
    return datetime.now(timezone.utc).replace(tzinfo=None)


def as_utc(dt: datetime) -> datetime:
    """``dt`` in gpulab's time type: aware values converted to UTC, naive ones taken as UTC."""
    if dt.tzinfo is not None:
        dt = dt.astimezone(timezone.utc).replace(tzinfo=None)
    return dt


def from_epoch(ts: float) -> datetime:
    """Epoch seconds (the culler's clock) in gpulab's time type."""
    return datetime.fromtimestamp(ts, timezone.utc).replace(tzinfo=None)


def to_epoch(dt: datetime) -> float:
    """A value of gpulab's time type as epoch seconds."""
    return as_utc(dt).replace(tzinfo=timezone.utc).timestamp()


def iso(dt: datetime | None, timespec: str = "seconds") -> str | None:
    """ISO 8601 with a ``Z`` (``None`` stays ``None``), to the second unless ``timespec`` says otherwise."""
    return as_utc(dt).isoformat(timespec=timespec) + "Z" if dt is not None else None


class GPULabDB(Configurable):
    db_url = Unicode(
        config=True,
        help="""SQLAlchemy URL of gpulab's database. Default: `gpulab.sqlite` in
        `$GPULAB_DATA_DIR` (the embedded hub's data folder), else in the working directory.""",
    )

    @default("db_url")
    def _default_db_url(self) -> str:
        data_dir = Path(os.environ.get("GPULAB_DATA_DIR", ".")).resolve()
        return f"sqlite:///{data_dir / 'gpulab.sqlite'}"


_engines: dict[str, Engine] = {}
_lock = threading.Lock()


def get_engine(config=None, url: str | None = None) -> Engine:
    """The (cached) engine for ``url`` or ``c.GPULabDB.db_url``, its schema upgraded to this release's."""
    if url is None:
        url = GPULabDB(config=config).db_url if config is not None else GPULabDB().db_url
    with _lock:
        engine = _engines.get(url)
        if engine is None:
            engine = create_engine(url, future=True)
            if url.startswith("sqlite"):

                @event.listens_for(engine, "connect")
                def _sqlite_pragmas(conn, _record):  # concurrent readers while the hub writes
                    cur = conn.cursor()
                    cur.execute("PRAGMA journal_mode=WAL")
                    cur.execute("PRAGMA foreign_keys=ON")
                    cur.close()

            migrate.upgrade(engine)
            _engines[url] = engine
        return engine


def session_factory(config=None, url: str | None = None) -> sessionmaker[Session]:
    return sessionmaker(get_engine(config, url), expire_on_commit=False)
