"""Usage history: the ledger's observer events, idempotent recording, the period report,
the stored catalog's start-up rules. Real SQLite files, real core objects."""

from __future__ import annotations

import json
from datetime import datetime, timedelta

import pytest
from sqlalchemy import select

from hub_config.domain.catalog_store import AuditEntry, CatalogStore, GPULabCatalogStore, StoredCatalog, load_at_start
from hub_config.domain.usage import jobs_by_state, period_report
from hub_config.domain.usage_records import GPULabUsage, UsageInterval, UsageRecorder
from hub_config.storage.db import session_factory, utcnow
from spawner.core.catalog import catalog_from_dict
from spawner.core.catalog.yaml_text import catalog_from_yaml
from spawner.core.ledger import Ledger, Workload
from spawner.core.model import Team
from spawner.runtime import GPULabRuntime

CATALOG = catalog_from_yaml("""
prices: {H100-80GB: 2.5, "*": 1.0}
profiles:
  - {slug: half, gpus: 0.5, gpu_model: H100-80GB}
  - {slug: any-one, gpus: 1}
teams:
  - {name: vision, users: [alice, bob], guarantee: 1, burst: 2}
  - {name: nlp, users: [carol], guarantee: 1, burst: 1}
""")


@pytest.fixture
def sessions(tmp_path):
    return session_factory(url=f"sqlite:///{tmp_path / 'gpulab.sqlite'}")


def test_ledger_observers_see_every_change_once():
    ledger = Ledger([Team("t", users=frozenset({"u"}), guarantee_milli=1000, burst_milli=2000)])
    events: list[tuple[str, str, str]] = []
    ledger.subscribe(lambda e, w: events.append((e, w.key, w.state)))
    assert ledger.reserve("a", "t", "u", 500).allowed
    assert not ledger.reserve("b", "t", "u", 5000).allowed  # refused: no event
    ledger.confirm("a")
    ledger.confirm("a")  # already running: no event
    ledger.adopt(Workload("c", "t", "u", 250))
    ledger.release("a")
    ledger.release("a")  # idempotent: no event
    ledger.rebuild([Workload("c", "t", "u", 250), Workload("d", "t", "u", 250)])
    assert events == [
        ("add", "a", "reserved"),
        ("add", "a", "running"),
        ("add", "c", "running"),
        ("remove", "a", "running"),
        ("add", "d", "running"),
    ]


def test_a_failing_observer_never_undoes_an_admission():
    ledger = Ledger([Team("t", guarantee_milli=1000, burst_milli=1000)])

    def broken(event, w):
        raise RuntimeError("database down")

    ledger.subscribe(broken)
    assert ledger.reserve("a", "t", "u", 500).allowed
    assert ledger.usage("t").held_milli == 500


def test_recording_is_idempotent_by_key_across_restarts(sessions):
    runtime = GPULabRuntime(CATALOG)
    recorder = UsageRecorder(runtime, sessions, GPULabUsage())
    runtime.ledger.subscribe(recorder.observe)
    runtime.ledger.reserve("notebook:alice/", "vision", "alice", 500, profile="half")
    runtime.ledger.confirm("notebook:alice/")
    runtime.ledger.reserve("notebook:bob/", "vision", "bob", 0, profile="cpu")  # no GPU: not recorded

    # A hub restart: a new runtime re-adopts the same running workload.
    runtime2 = GPULabRuntime(CATALOG)
    recorder2 = UsageRecorder(runtime2, sessions, GPULabUsage())
    runtime2.ledger.subscribe(recorder2.observe)
    runtime2.ledger.adopt(Workload("notebook:alice/", "vision", "alice", 500, "half"))
    with sessions() as s:
        rows = s.scalars(select(UsageInterval)).all()
    assert [(r.key, r.gpu_milli, r.gpu_model, r.ended_at) for r in rows] == [
        ("notebook:alice/", 500, "H100-80GB", None)
    ]

    runtime2.ledger.release("notebook:alice/")
    runtime2.ledger.reserve("notebook:alice/", "vision", "alice", 1000, profile="any-one")
    with sessions() as s:
        rows = s.scalars(select(UsageInterval).order_by(UsageInterval.id)).all()
    assert len(rows) == 2 and rows[0].ended_at is not None and rows[1].ended_at is None
    assert rows[1].gpu_model is None  # no model constraint, no packer: priced at "*"


def test_reconcile_closes_intervals_of_workloads_that_vanished(sessions):
    runtime = GPULabRuntime(CATALOG)
    recorder = UsageRecorder(runtime, sessions, GPULabUsage())
    runtime.ledger.subscribe(recorder.observe)
    runtime.ledger.adopt(Workload("notebook:alice/", "vision", "alice", 500, "half"))
    runtime.ledger.adopt(Workload("notebook:bob/", "vision", "bob", 500, "half"))
    # After a restart only alice's server came back.
    runtime2 = GPULabRuntime(CATALOG)
    recorder2 = UsageRecorder(runtime2, sessions, GPULabUsage())
    runtime2.ledger.subscribe(recorder2.observe)
    runtime2.ledger.adopt(Workload("notebook:alice/", "vision", "alice", 500, "half"))
    assert recorder2.reconcile() == 1
    with sessions() as s:
        open_keys = s.scalars(select(UsageInterval.key).where(UsageInterval.ended_at.is_(None))).all()
    assert open_keys == ["notebook:alice/"]


def test_no_utilisation_samples_without_nvml(sessions):
    from hub_config.domain.usage import UtilisationSample
    from spawner.core.packer import DevicePacker, devices_from_inventory

    runtime = GPULabRuntime(
        catalog_from_yaml("""
inventory: [{model: H100-80GB, count: 1, memory_mib: 81559}]
teams: [{name: vision, users: [alice], guarantee: 1, burst: 1}]
""")
    )
    runtime.packer = DevicePacker(devices_from_inventory(runtime.catalog.inventory))
    runtime.inventory_source = "declared"
    runtime.packer.place("notebook:alice/", 500)
    runtime.ledger.adopt(Workload("notebook:alice/", "vision", "alice", 500))
    UsageRecorder(runtime, sessions, GPULabUsage()).sample_utilisation()
    with sessions() as s:
        assert s.scalars(select(UtilisationSample)).all() == []  # declared GPUs: no number, never a guess


def add_interval(sessions, key, team, user, milli, start, end, model="H100-80GB", over=False):
    with sessions.begin() as s:
        s.add(
            UsageInterval(
                key=key,
                team=team,
                user=user,
                profile="half",
                kind="notebook",
                gpu_milli=milli,
                gpu_model=model,
                over_quota=over,
                started_at=start,
                ended_at=end,
            )
        )


def test_period_report_clips_splits_and_prices(sessions):
    runtime = GPULabRuntime(CATALOG)
    t0 = datetime(2026, 1, 1)
    add_interval(sessions, "a", "vision", "alice", 500, t0 - timedelta(hours=2), t0 + timedelta(hours=3))
    add_interval(sessions, "b", "vision", "bob", 1000, t0 + timedelta(hours=23), t0 + timedelta(hours=26), over=True)
    add_interval(sessions, "c", "nlp", "carol", 2000, t0 + timedelta(hours=1), t0 + timedelta(hours=2), model=None)
    add_interval(sessions, "d", "nlp", "carol", 2000, t0 - timedelta(days=3), t0 - timedelta(days=2))
    r = period_report(runtime, sessions, GPULabUsage(), t0, t0 + timedelta(days=2), timedelta(days=1))
    teams = {t["team"]: t for t in r["teams"]}
    v = teams["vision"]
    # alice: 3 h of 0.5 GPU inside the period; bob: 3 h of 1 GPU over quota.
    assert v["gpu_hours"] == pytest.approx(1.5 + 3.0)
    assert v["in_quota_gpu_hours"] == pytest.approx(1.5) and v["burst_gpu_hours"] == pytest.approx(3.0)
    assert v["cost"] == pytest.approx(4.5 * 2.5)
    assert v["series"] == pytest.approx([1.5 + 1.0, 2.0])  # bob's 3 h cross midnight
    assert {u["user"]: u["gpu_hours"] for u in v["users"]} == pytest.approx({"alice": 1.5, "bob": 3.0})
    n = teams["nlp"]
    assert n["gpu_hours"] == pytest.approx(2.0) and n["cost"] == pytest.approx(2.0 * 1.0)  # "*" price
    assert n["gpu_hours_by_model"] == {"unknown": 2.0}
    assert r["total"]["cost"] == pytest.approx(4.5 * 2.5 + 2.0)
    assert v["idle_gpu_hours_before_reclaim"] == 0 and v["gpu_hours_freed"] == 0 and v["jobs"] == {}
    assert r["sources"]["reclaims"] == "gpulab_idle_events" and v["utilisation_pct"] is None


def test_unreadable_reclaims_and_jobs_are_unknown_not_zero(sessions):
    """A database the culler's and the jobs' records cannot be read from reports None, never 0."""
    engine = sessions.kw["bind"]
    with engine.begin() as conn:
        conn.exec_driver_sql("DROP TABLE gpulab_idle_events")
        conn.exec_driver_sql("DROP TABLE gpulab_jobs")
    t0 = datetime(2026, 1, 1)
    r = period_report(GPULabRuntime(CATALOG), sessions, GPULabUsage(), t0, t0 + timedelta(days=1))
    v = next(t for t in r["teams"] if t["team"] == "vision")
    assert v["idle_gpu_hours_before_reclaim"] is None and v["gpu_hours_freed"] is None and v["jobs"] is None
    assert r["sources"]["reclaims"] is None and r["sources"]["jobs"] is None


def test_jobs_are_counted_by_state_from_the_jobs_table(sessions):
    from hub_config.jobs.models import JobRecord

    runtime = GPULabRuntime(CATALOG)
    now = utcnow()
    with sessions.begin() as s:
        for i, state in enumerate(["succeeded", "succeeded", "failed", "running"]):
            s.add(
                JobRecord(
                    name=f"j{i}",
                    user="alice" if i < 3 else "bob",
                    team="vision",
                    profile="half",
                    job_class="batch",
                    state=state,
                    notebook="n.ipynb",
                    output_path="o",
                    log_path="l",
                    time_limit_seconds=60,
                    backend="local",
                )
            )
    counts = jobs_by_state(sessions, now - timedelta(hours=1), now + timedelta(hours=1))
    assert counts == {("vision", "alice"): {"succeeded": 2, "failed": 1}, ("vision", "bob"): {"running": 1}}
    r = period_report(runtime, sessions, GPULabUsage(), now - timedelta(hours=1), now + timedelta(hours=1))
    assert next(t for t in r["teams"] if t["team"] == "vision")["jobs"] == {"succeeded": 2, "failed": 1, "running": 1}
    counts = jobs_by_state(sessions, now - timedelta(days=9), now - timedelta(days=8))
    assert counts == {}


# -- which catalog wins at start-up -------------------------------------------------


def edited(catalog, burst):
    data = json.loads(json.dumps({"teams": [{"name": "vision", "users": ["alice"], "guarantee": 1, "burst": burst}]}))
    return catalog_from_dict(data)


def test_first_run_seeds_then_the_database_wins_after_an_edit(sessions):
    store = CatalogStore(sessions, GPULabCatalogStore())
    file_v1 = edited(None, 2)
    assert load_at_start(store, file_v1) == file_v1
    assert store.row().edited is False
    admin_edit = edited(None, 5)
    store.save(admin_edit, actor="admin", action="team.update", target="vision", old={"burst": "2"}, new={"burst": "5"})
    file_v2 = edited(None, 3)  # the GitOps file changed meanwhile
    assert load_at_start(store, file_v2).team("vision").burst_milli == 5000  # the database wins
    # Re-seed on request: the file wins once, audited.
    store.settings = GPULabCatalogStore(reseed_from_file=True)
    assert load_at_start(store, file_v2).team("vision").burst_milli == 3000
    with sessions() as s:
        actions = [a.action for a in s.scalars(select(AuditEntry).order_by(AuditEntry.id))]
        assert s.get(StoredCatalog, 1).edited is False
    assert actions == ["catalog.seed", "team.update", "catalog.reseed"]


def test_without_admin_edits_a_changed_file_reseeds(sessions):
    store = CatalogStore(sessions, GPULabCatalogStore())
    load_at_start(store, edited(None, 2))
    assert load_at_start(store, edited(None, 4)).team("vision").burst_milli == 4000
    assert store.stored_catalog().team("vision").burst_milli == 4000
