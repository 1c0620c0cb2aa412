"""What gpulab says about a database it cannot use now: the sentence and the HTTP status.

The errors are the ones SQLite raises (through the stdlib's sqlite3 and SQLAlchemy) for
another process's lock, a full disk and an I/O failure; the handlers answer them with
these sentences (tests/integration/test_faults_single_server.py meets them on a real hub).
"""

from __future__ import annotations

import sqlite3

import pytest
from sqlalchemy.exc import IntegrityError, OperationalError

from hub_config.storage.db import StorageUnavailable, database_file, sqlite_file, storage_failure


def sqlite_error(message: str, statement: str = "INSERT INTO gpulab_jobs (name) VALUES (?)") -> OperationalError:
    return OperationalError(statement, ("x",), sqlite3.OperationalError(message))


def test_a_locked_database_is_a_503_that_names_the_file():
    failure = storage_failure(
        sqlite_error("database is locked"), "/srv/hub/gpulab.sqlite", "/srv/hub/jupyterhub.sqlite"
    )
    assert isinstance(failure, StorageUnavailable) and failure.status == 503
    assert str(failure).startswith("gpulab's database (/srv/hub/gpulab.sqlite) is locked by another process")
    assert "not carried out" in str(failure) and "try again" in str(failure)


def test_a_full_disk_is_a_507_that_says_where():
    failure = storage_failure(sqlite_error("database or disk is full"), "/srv/hub/gpulab.sqlite")
    assert failure is not None and failure.status == 507
    assert "the disk holding gpulab's database (/srv/hub/gpulab.sqlite) is full" in str(failure)


def test_the_statement_tells_which_database_failed():
    hub_error = sqlite_error("database is locked", "SELECT api_tokens.id FROM api_tokens WHERE api_tokens.prefix = ?")
    failure = storage_failure(hub_error, "/srv/hub/gpulab.sqlite", "/srv/hub/jupyterhub.sqlite")
    assert failure is not None and "the hub's database (/srv/hub/jupyterhub.sqlite)" in str(failure)


@pytest.mark.parametrize("message", ["disk I/O error", "attempt to write a readonly database"])
def test_io_failures_are_a_503_with_the_error(message):
    failure = storage_failure(sqlite_error(message), "/srv/hub/gpulab.sqlite")
    assert failure is not None and failure.status == 503 and message.lower() in str(failure)


@pytest.mark.parametrize(
    "error",
    [
        sqlite_error("no such table: gpulab_jobs"),
        IntegrityError("INSERT", (), sqlite3.IntegrityError("UNIQUE constraint failed")),
        ValueError("database is locked"),
        None,
    ],
)
def test_other_errors_are_not_storage_failures(error):
    assert storage_failure(error) is None  # a bug stays a 500 with its traceback in the log


def test_sqlite_files_of_urls():
    assert str(sqlite_file("sqlite:////srv/hub/gpulab.sqlite")) == "/srv/hub/gpulab.sqlite"
    assert sqlite_file("sqlite://") is None and sqlite_file("postgresql://db/gpulab") is None
    assert database_file().endswith("gpulab.sqlite")


def test_new_work_waits_for_room_on_each_data_disk(tmp_path):
    from spawner.runtime import full_disk

    disks = {"the users' homes": str(tmp_path), "a folder not made yet": str(tmp_path / "later")}
    assert full_disk(disks, 0) is None
    sentence = full_disk(disks, 2**62)  # more than any disk has free
    assert sentence is not None and sentence.startswith(f"the disk holding the users' homes ({tmp_path}) is full")
    assert "new servers and jobs are refused" in sentence and "running ones go on" in sentence
