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
from sqlalchemy.engine import make_url
from sqlalchemy.exc import DBAPIError, OperationalError
from sqlalchemy.orm import DeclarativeBase, Session, sessionmaker
from traitlets import Float, Unicode, default
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


#: Longer than the lock a routine backup or an admin's short query holds; requests wait it out.
DEFAULT_BUSY_TIMEOUT = 20.0


class GPULabDB(Configurable):
    db_url = Unicode(
        config=True,
        help="""SQLAlchemy URL of gpulab's database. Default: `gpulab.sqlite` in
        `$GPULAB_DATA_DIR` (the embedded hub's data folder), else in the working directory;
        with GPUKubeSpawner, beside the hub's own SQLite file (z2jh's `sqlite-pvc` volume),
        and with any other hub database it must be set (the hub refuses to start).""",
    )

    busy_timeout = Float(
        DEFAULT_BUSY_TIMEOUT,
        config=True,
        help="""Seconds a write to an SQLite database waits while another process holds
        its lock (a backup, an admin's `sqlite3` session) before it gives up. Requests
        wait that long, then fail with a 503 that says the database is locked; nothing
        is half-written. The embedded hub gives JupyterHub's own SQLite database the
        same wait. Only SQLite databases have such a lock; other URLs ignore it.""",
    )

    @default("db_url")
    def _default_db_url(self) -> str:
        data_dir = Path(os.environ.get("GPULAB_DATA_DIR", ".")).resolve()
        return f"sqlite:///{data_dir / 'gpulab.sqlite'}"


def sqlite_file(url: str) -> Path | None:
    """The file of an SQLite URL (``None`` for another database or an in-memory one)."""
    parsed = make_url(url)
    if not parsed.drivername.startswith("sqlite") or not parsed.database or parsed.database == ":memory:":
        return None
    return Path(parsed.database).resolve()


def database_file(config=None) -> str:
    """gpulab's SQLite file, as text ('' for another database): the sentences name it."""
    url = GPULabDB(config=config).db_url if config is not None else GPULabDB().db_url
    return str(sqlite_file(url) or "")


class StorageUnavailable(RuntimeError):
    """A database cannot be used now; the message is the sentence to show, ``status`` the HTTP
    status to answer with (507 for a full disk, 503 otherwise)."""

    def __init__(self, sentence: str, status: int = 503):
        super().__init__(sentence)
        self.status = status


def storage_failure(error: BaseException | None, gpulab_db: str = "", hub_db: str = "") -> StorageUnavailable | None:
    """What a database error a request cannot fix (locked, full disk, I/O) means, else ``None``.

    These are the operator's to fix (or to wait out), not the request's: the API answers
    them with a 503 and the sentence, never a 500 and a traceback. ``gpulab_db`` and
    ``hub_db`` name the two databases (their files) in the sentence; which one failed is
    told by the statement (gpulab's tables all start with ``gpulab_``).
    """
    if isinstance(error, StorageUnavailable):
        return error
    if not isinstance(error, OperationalError | DBAPIError):
        return None
    text = str(getattr(error, "orig", error) or error).lower()
    statement = str(getattr(error, "statement", "") or "")
    if hub_db and statement and "gpulab_" not in statement:
        what = f"the hub's database ({hub_db})"
    else:
        what = f"gpulab's database ({gpulab_db})" if gpulab_db else "gpulab's database"
    if "locked" in text or "busy" in text:
        return StorageUnavailable(
            f"{what} is locked by another process (a backup, or an open sqlite3 session?) and stayed "
            "locked longer than gpulab waits; the request was not carried out: try again in a moment"
        )
    if "full" in text:
        return StorageUnavailable(
            f"the disk holding {what} is full; the request was not carried out: an admin must free space there", 507
        )
    if "disk i/o" in text or "readonly" in text or "unable to open" in text:
        return StorageUnavailable(
            f"{what} cannot be written ({text.strip()[:120]}); the request was not carried out: "
            "an admin must check its disk"
        )
    return None


_engines: dict[str, Engine] = {}
_lock = threading.Lock()


def get_engine(config=None, url: str | None = None) -> Engine:
    """The (cached) engine for ``url`` or ``c.GPULabDB.db_url``, its schema upgraded to this release's."""
    if url is None:
        url = GPULabDB(config=config).db_url if config is not None else GPULabDB().db_url
    with _lock:
        engine = _engines.get(url)
        if engine is None:
            kwargs: dict = {}
            if url.startswith("sqlite"):
                busy = GPULabDB(config=config).busy_timeout if config is not None else GPULabDB().busy_timeout
                kwargs["connect_args"] = {"timeout": busy}
            engine = create_engine(url, future=True, **kwargs)
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
