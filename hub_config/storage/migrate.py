"""Bring gpulab's database to the schema this release's code expects (Alembic).

The hub calls :func:`upgrade` once per database when it opens it
(:func:`hub_config.storage.db.get_engine`):

- a new database is built by running every migration from the first one, so
  the migrations are the only definition of the schema that ever runs;
- a database of a release from before migrations existed (no version table)
  is recognised by its columns, stamped with that release's revision, then
  upgraded;
- an SQLite database that needs an upgrade is first copied, consistently
  (SQLite's backup API), to ``<file>.before-<revision>.bak`` beside it.

The version lives in its own table (``gpulab_alembic_version``) so that gpulab
can share a database server, even a database, with JupyterHub's own Alembic.
Concurrent starts on one SQLite file take turns through a lock file.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import sqlite3
from collections.abc import Iterator
from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Connection, Engine, inspect

log = logging.getLogger("gpulab.db")

VERSION_TABLE = "gpulab_alembic_version"
MIGRATIONS = Path(__file__).parent / "migrations"
#: Revisions of the releases made before migrations existed, newest first, with a
#: column only that release's schema has (table, column, present?).
PRE_MIGRATION_RELEASES = (
    ("0001", ("gpulab_idle_events", "gpu_hours_reclaimed", True)),  # 0.1.0
    ("0002", ("gpulab_idle_events", "idle_gpu_hours", True)),  # 0.1.0 with session-true culling
)


def alembic_config(connection: Connection | None = None) -> Config:
    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS))
    cfg.attributes["connection"] = connection
    return cfg


def head() -> str:
    """The newest revision this code knows."""
    rev = ScriptDirectory.from_config(alembic_config()).get_current_head()
    assert rev is not None
    return rev


def current(connection: Connection) -> str | None:
    """The revision a database is at (``None``: never migrated)."""
    return MigrationContext.configure(connection, opts={"version_table": VERSION_TABLE}).get_current_revision()


def _pre_migration_release(connection: Connection) -> str | None:
    """The revision of an unversioned gpulab database, from its columns; ``None`` when it has no tables."""
    insp = inspect(connection)
    tables = set(insp.get_table_names())
    if not any(t.startswith("gpulab_") for t in tables):
        return None
    for revision, (table, column, present) in PRE_MIGRATION_RELEASES:
        if table in tables and (column in {c["name"] for c in insp.get_columns(table)}) == present:
            return revision
    raise RuntimeError(
        "gpulab's database has gpulab tables but no gpulab_alembic_version table, and they match no "
        "known release; restore a backup, or move the gpulab_* tables away to start afresh"
    )


@contextlib.contextmanager
def _sqlite_lock(path: str | None) -> Iterator[None]:
    if not path or path == ":memory:":
        yield
        return
    with open(f"{path}.migrate-lock", "a+") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _backup_sqlite(path: str, revision: str | None) -> None:
    target = f"{path}.before-{head()}.bak"
    src = sqlite3.connect(path)
    try:
        dst = sqlite3.connect(target)
        try:
            src.backup(dst)
        finally:
            dst.close()
    finally:
        src.close()
    log.info("gpulab: copied the database (at revision %s) to %s before upgrading it", revision, target)


def upgrade(engine: Engine) -> str:
    """Upgrade ``engine``'s database to :func:`head`; returns the revision it was at ('' when new)."""
    sqlite_path = engine.url.database if engine.url.get_backend_name() == "sqlite" else None
    with _sqlite_lock(sqlite_path):
        with engine.connect() as conn:
            was = current(conn)
            if was is None:
                stamped = _pre_migration_release(conn)
                if stamped is not None:
                    log.warning("gpulab: the database predates migrations; it is the schema of revision %s", stamped)
                    command.stamp(alembic_config(conn), stamped)
                    conn.commit()
                    was = stamped
        target = head()
        if was == target:
            return was
        if was is not None and sqlite_path and sqlite_path != ":memory:":
            _backup_sqlite(sqlite_path, was)
        with engine.begin() as conn:
            command.upgrade(alembic_config(conn), "head")
        log.info("gpulab: database upgraded from revision %s to %s", was or "(new)", target)
        return was or ""
