"""Write an SQL dump of a gpulab database as an older release created it, with rows in every table.

Run with that release's source first on the path, e.g. for 0.1.0::

    git archive 525675b spawner hub_config | tar -x -C /tmp/rel
    PYTHONPATH=/tmp/rel python tests/data/make_release_db.py > tests/data/gpulab-0.1.0.sql

The upgrade test (tests/unit/test_db_migrations.py) loads the dump and upgrades it.
"""

import importlib
import json
import sqlite3
import sys
import tempfile
from datetime import datetime, timezone
from pathlib import Path

from sqlalchemy.orm import Session

db = importlib.import_module("hub_config.db")
assert "/work/main/" not in db.__file__, f"run with the old release first on PYTHONPATH, not {db.__file__}"
catalog_store = importlib.import_module("hub_config.catalog_store")
usage = importlib.import_module("hub_config.usage")
models = importlib.import_module("hub_config.jobs.models")
try:
    idle = importlib.import_module("hub_config.idle_records")
except ImportError:  # 0.1.0 kept the culler's tables beside its API
    idle = importlib.import_module("hub_config.api.idle")

with tempfile.TemporaryDirectory() as tmp:
    path = Path(tmp) / "gpulab.sqlite"
    engine = db.get_engine(url=f"sqlite:///{path}")
    t0 = datetime(2026, 6, 1, 9, 0, 0)
    epoch = t0.replace(tzinfo=timezone.utc).timestamp()
    with Session(engine) as s:
        s.add(
            catalog_store.StoredCatalog(
                id=1,
                data=json.dumps(
                    {
                        "teams": [{"name": "vision", "users": ["alice"], "guarantee": 1, "burst": 2}],
                        "profiles": [{"slug": "half", "gpus": 0.5}],
                    }
                ),
                file_digest="0" * 64,
                edited=True,
                version=3,
                updated_at=t0,
                updated_by="admin",
            )
        )
        s.add(
            catalog_store.AuditEntry(
                at=t0, actor="admin", action="team.update", target="vision", old='{"burst": 1}', new='{"burst": 2}'
            )
        )
        s.add(
            usage.UsageInterval(
                key="notebook:alice/",
                team="vision",
                user="alice",
                profile="half",
                kind="notebook",
                gpu_milli=500,
                gpu_model="H100-80GB",
                over_quota=False,
                started_at=t0,
                ended_at=t0.replace(hour=11),
            )
        )
        s.add(usage.UtilisationSample(at=t0, key="notebook:alice/", team="vision", user="alice", util_pct=37.5))
        s.add(
            models.JobRecord(
                name="train",
                user="alice",
                team="vision",
                profile="half",
                job_class="batch",
                state="succeeded",
                reason="the notebook ran to the end",
                gpu_milli=500,
                over_quota=False,
                notebook="train.ipynb",
                output_path="jobs/1/out.ipynb",
                log_path="jobs/1/log.txt",
                parameters_json='{"lr": 0.1}',
                time_limit_seconds=3600,
                backend="local",
                created_at=t0.replace(tzinfo=timezone.utc),
                started_at=t0.replace(tzinfo=timezone.utc, minute=1),
                finished_at=t0.replace(tzinfo=timezone.utc, minute=30),
                attempts=1,
                shares_json="[[0, 500]]",
                history_json="[]",
            )
        )
        s.add(
            idle.IdleWarningRow(
                user="bob",
                server="",
                warned_at=epoch,
                reclaim_at=epoch + 900,
                reason="GPU idle for 60 min",
                evidence="{}",
            )
        )
        s.add(idle.KeepaliveRow(user="bob", server="", used=1, until=epoch + 3600))
        columns = set(idle.IdleEventRow.__table__.columns.keys())
        event = dict(
            at=epoch + 1000,
            kind="reclaim",
            user="carol",
            server="",
            team="vision",
            profile="half",
            gpu_milli=500,
            reason="GPU idle for 60 min",
            evidence=json.dumps({"action": "stop-server"}),
        )
        event.update(
            {"gpu_hours_reclaimed": 0.5}
            if "gpu_hours_reclaimed" in columns
            else {"idle_gpu_hours": 0.5, "action": "stop-server", "session": "2026-06-01T08:00:00Z"}
        )
        s.add(idle.IdleEventRow(**event))
        s.commit()
    engine.dispose()
    conn = sqlite3.connect(path)
    sys.stdout.write("\n".join(conn.iterdump()) + "\n")
    conn.close()
