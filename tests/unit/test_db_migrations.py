"""gpulab's database migrations: a new database and each older release's database reach the
schema the models declare, with every row kept. Real SQLite files, real Alembic."""

from __future__ import annotations

import sqlite3
from datetime import datetime, timezone
from pathlib import Path

import pytest
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import create_engine, select

import hub_config.config.runtime  # noqa: F401  (every model module, so Base.metadata is complete)
from hub_config.domain.catalog_store import AuditEntry, StoredCatalog
from hub_config.domain.idle_records import IdleEventRow, IdleWarningRow, KeepaliveRow
from hub_config.domain.usage import jobs_by_state, reclaim_figures
from hub_config.domain.usage_records import UsageInterval
from hub_config.jobs.models import JobRecord
from hub_config.jobs.sweep_models import SweepRecord, SweepRunRecord  # noqa: F401  (the sweeps tables)
from hub_config.storage import migrate
from hub_config.storage.db import Base, session_factory
from tests.support import REPO

DATA = REPO / "tests" / "data"
RELEASES = {
    "0.1.0": ("gpulab-0.1.0.sql", "0001"),
    "0.1.0-session-culling": ("gpulab-0.1.0-session-culling.sql", "0002"),
}


def schema_differences(engine) -> list:
    def ours(obj, name, type_, reflected, compare_to):
        return not (type_ == "table" and name == migrate.VERSION_TABLE)

    with engine.connect() as conn:
        ctx = MigrationContext.configure(conn, opts={"compare_type": True, "include_object": ours})
        return compare_metadata(ctx, Base.metadata)


def load(tmp_path: Path, dump: str) -> Path:
    path = tmp_path / "gpulab.sqlite"
    conn = sqlite3.connect(path)
    conn.executescript((DATA / dump).read_text())
    conn.close()
    return path


def test_a_new_database_is_built_by_the_migrations_alone(tmp_path):
    url = f"sqlite:///{tmp_path / 'new.sqlite'}"
    engine = session_factory(url=url).kw["bind"]
    assert schema_differences(engine) == []
    with engine.connect() as conn:
        assert migrate.current(conn) == migrate.head()
    assert not list(tmp_path.glob("*.bak"))  # nothing to back up


@pytest.mark.parametrize("release", sorted(RELEASES))
def test_an_older_release_database_is_upgraded_with_its_rows(tmp_path, release):
    dump, revision = RELEASES[release]
    path = load(tmp_path, dump)
    raw = create_engine(f"sqlite:///{path}")
    with raw.connect() as conn:
        assert migrate.current(conn) is None  # releases before migrations kept no version
    raw.dispose()

    sessions = session_factory(url=f"sqlite:///{path}")
    engine = sessions.kw["bind"]
    assert schema_differences(engine) == []
    with engine.connect() as conn:
        assert migrate.current(conn) == migrate.head()
    backup = path.with_name(f"gpulab.sqlite.before-{migrate.head()}.bak")
    assert backup.exists()
    with sqlite3.connect(backup) as b:  # the backup is the old schema, consistent and complete
        assert b.execute("SELECT count(*) FROM gpulab_jobs").fetchone() == (1,)

    with sessions() as s:
        catalog = s.get(StoredCatalog, 1)
        assert catalog.edited and catalog.version == 3 and "vision" in catalog.data
        assert s.scalars(select(AuditEntry.action)).all() == ["team.update"]
        interval = s.scalars(select(UsageInterval)).one()
        assert (interval.started_at, interval.ended_at) == (datetime(2026, 6, 1, 9), datetime(2026, 6, 1, 11))
        job = s.scalars(select(JobRecord)).one()
        assert (job.state, job.parameters_json) == ("succeeded", '{"lr": 0.1}')
        assert job.created_at == datetime(2026, 6, 1, 9, 0) and job.finished_at == datetime(2026, 6, 1, 9, 30)
        warning = s.get(IdleWarningRow, ("bob", ""))
        assert warning.reason == "GPU idle for 60 min" and warning.held_at is None
        # The culler's epoch seconds became the one time type (naive UTC).
        assert (warning.warned_at, warning.reclaim_at) == (datetime(2026, 6, 1, 9), datetime(2026, 6, 1, 9, 15))
        keepalive = s.get(KeepaliveRow, ("bob", ""))
        assert (keepalive.used, keepalive.until) == (1, datetime(2026, 6, 1, 10))
        event = s.scalars(select(IdleEventRow)).one()
        assert event.at == datetime(2026, 6, 1, 9, 16, 40)
        # 0.1.0's "gpu_hours_reclaimed" was the idle time before the reclaim; its action was in the evidence.
        assert (event.kind, event.action, event.idle_gpu_hours) == ("reclaim", "stop-server", 0.5)

    # The reports read the upgraded rows through their models.
    day = (datetime(2026, 6, 1), datetime(2026, 6, 2))
    assert jobs_by_state(sessions, *day) == {("vision", "alice"): {"succeeded": 1}}
    figures = reclaim_figures(sessions, *day, now=datetime(2026, 6, 1, 12))
    idle_hours, freed = figures[("vision", "carol")]
    assert idle_hours == 0.5 and freed > 0


def test_a_database_that_matches_no_release_is_refused_not_guessed(tmp_path):
    path = tmp_path / "odd.sqlite"
    with sqlite3.connect(path) as conn:
        conn.execute("CREATE TABLE gpulab_idle_events (id INTEGER PRIMARY KEY, at FLOAT)")
    with pytest.raises(RuntimeError, match="match no known release"):
        migrate.upgrade(create_engine(f"sqlite:///{path}"))


def test_downgrade_to_the_first_release_and_back(tmp_path):
    from alembic import command

    path = load(tmp_path, RELEASES["0.1.0"][0])
    engine = create_engine(f"sqlite:///{path}")
    migrate.upgrade(engine)
    with engine.begin() as conn:
        command.downgrade(migrate.alembic_config(conn), "0001")
    with sqlite3.connect(path) as conn:
        cols = {r[1] for r in conn.execute("PRAGMA table_info(gpulab_idle_events)")}
        assert "gpu_hours_reclaimed" in cols and "idle_gpu_hours" not in cols
        assert conn.execute("SELECT gpu_hours_reclaimed FROM gpulab_idle_events").fetchone() == (0.5,)
        # Epoch seconds again, to the second they were.
        epoch = datetime(2026, 6, 1, 9, tzinfo=timezone.utc).timestamp()
        assert conn.execute("SELECT at FROM gpulab_idle_events").fetchone() == (epoch + 1000,)
        assert conn.execute("SELECT warned_at, reclaim_at FROM gpulab_idle_warnings").fetchone() == (epoch, epoch + 900)
        assert conn.execute("SELECT until FROM gpulab_idle_keepalives").fetchone() == (epoch + 3600,)
    migrate.upgrade(engine)
    assert schema_differences(engine) == []
