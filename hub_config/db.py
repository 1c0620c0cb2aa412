"""gpulab's own database (jobs, admin edits, audit log, culler records).

Separate from JupyterHub's database so that gpulab never migrates the hub's
schema. SQLite by default (beside the hub's), any SQLAlchemy URL in production
(``c.GPULabDB.db_url = "postgresql://..."``). Feature modules declare their
tables on :class:`Base`; :func:`get_engine` creates missing tables.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path

from sqlalchemy import Engine, create_engine, event
from sqlalchemy.orm import DeclarativeBase, Session, sessionmaker
from traitlets import Unicode, default
from traitlets.config import Configurable


class Base(DeclarativeBase):
    pass


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
    """The (cached) engine for ``url`` or ``c.GPULabDB.db_url``, tables created."""
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
            _engines[url] = engine
        Base.metadata.create_all(engine)
        return engine


def session_factory(config=None, url: str | None = None) -> sessionmaker[Session]:
    return sessionmaker(get_engine(config, url), expire_on_commit=False)
