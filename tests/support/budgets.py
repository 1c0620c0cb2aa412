"""GPU-hour budget tests' helpers: usage earlier in the period, as the usage recorder records it."""

from __future__ import annotations

import itertools
import sqlite3
from datetime import datetime, timedelta, timezone
from pathlib import Path

from spawner.core.budgets import period_bounds
from tests.support.hub import RunningHub

_history = itertools.count(1)


def gpulab_database(hub: RunningHub) -> Path:
    """The hub's gpulab SQLite file: in its data folder (the embedded hub), or beside the hub's
    own database in its working directory (Zero to JupyterHub's sqlite-pvc layout)."""
    for path in (hub.state_dir / "gpulab.sqlite", hub.workdir / "gpulab.sqlite"):
        if path.exists():
            return path
    raise FileNotFoundError(f"no gpulab.sqlite under {hub.workdir}")


def add_history(hub: RunningHub, team: str, user: str, gpu_hours: float, zone: str) -> None:
    """``gpu_hours`` of ``team``'s work earlier this month (in ``zone``), written into gpulab's
    usage table in the recorder's own format: one closed interval of one workload."""
    now = datetime.now(timezone.utc).replace(tzinfo=None)
    start = max(period_bounds(now, "month", zone)[0], now - timedelta(hours=1))
    end = now - timedelta(seconds=1)
    milli = round(gpu_hours * 1000 * 3600 / (end - start).total_seconds()) + 1
    with sqlite3.connect(gpulab_database(hub)) as conn:
        conn.execute(
            "INSERT INTO gpulab_usage (key, team, user, profile, kind, gpu_milli, gpu_model, over_quota,"
            " started_at, ended_at) VALUES (?, ?, ?, 'h100-1', 'job', ?, 'H100-80GB', 0, ?, ?)",
            (f"job:history-{next(_history)}", team, user, milli, str(start), str(end)),
        )
