"""The contracts between processes: a culler cycle's records, the hub's answer, a server's grant;
and the one reclaim rule, which the culler decides by and the hub applies to its own records.

Round trips through JSON (as the HTTP request carries them), the hub's refusals of malformed
records, and :class:`IdleStore` on a real SQLite database with no tornado and no hub.
"""

from __future__ import annotations

import json
import logging
from datetime import timedelta

import pytest

from hub_config.domain.idle_records import IdleEventRow, IdleWarningRow, KeepaliveRow
from hub_config.domain.idle_store import IdleStore
from hub_config.storage.db import from_epoch, session_factory, to_epoch, utcnow
from idle_culler.plan import plan_cycle
from idle_culler.targets import DEVICE, ServerTarget, device_id
from spawner.core.catalog import catalog_from_dict
from spawner.core.grant import GrantedShare
from spawner.core.idle import (
    IDLE,
    DeviceSeries,
    IdleVerdict,
    IdleWarning,
    KeepalivePolicy,
    KeepaliveRefused,
    Step,
    next_step,
    reclaim_refusal,
)
from spawner.core.idle_cycle import (
    ClaimAnswer,
    CycleRecords,
    CycleResult,
    Mark,
    ReclaimClaim,
    RecordError,
    Unattributed,
    WarningRecord,
)

WARNING = WarningRecord(
    user="alice",
    server="",
    session="2026-01-01T10:00:00.000000Z",
    reason="GPU idle",
    team="vision",
    profile="h100-half",
    gpu_milli=500,
    evidence={"devices": {"0": [{"max": 0.5}]}},
    grace_seconds=600,
)
CLAIM = ReclaimClaim(
    user="alice",
    server="",
    session=WARNING.session,
    reason="still idle",
    team="vision",
    profile="h100-half",
    gpu_milli=500,
    action="shutdown-kernel",
    kernel_ids=("k1", "k2"),
    idle_since=1.5e9,
    idle_gpu_hours=0.25,
)
UNATTRIBUTED = Unattributed(user="erin", server="", session="s", code="kai-reservation-pod", reason="KAI holds it")
RECORDS = CycleRecords(
    warnings=(WARNING,),
    holds=(Mark(user="bob", server="x", session="s", reason="no data"),),
    clears=(Mark(user="carol", server="", reason="busy again"),),
    reclaims=(CLAIM, ReclaimClaim(user="dave", server="", reason="idle", idle_gpu_hours=1.0)),
    unattributed=(UNATTRIBUTED,),
)


def over_the_wire(value):
    return json.loads(json.dumps(value))


def test_a_cycle_round_trips_through_json():
    assert CycleRecords.from_json(over_the_wire(RECORDS.to_json())) == RECORDS
    # Without an unattributed list the hub keeps the one it has (None), an empty one clears it.
    assert CycleRecords.from_json({}).unattributed is None
    assert CycleRecords.from_json({"unattributed": []}).unattributed == ()
    assert RECORDS.users == {"alice", "dave"}  # warnings and claims name users the hub must know
    result = CycleResult(
        clears=1, warnings=1, reclaims=(ClaimAnswer(user="a", server="", accepted=False, message="no"),)
    )
    assert CycleResult.from_json(over_the_wire(result.to_json())) == result


@pytest.mark.parametrize(
    ("body", "words"),
    [
        ({"warnings": {}}, "warnings must be a list"),
        ({"warnings": ["x"]}, "each of warnings must be a JSON object"),
        ({"warnings": [{**WARNING.to_json(), "user": ""}]}, "user must be a string of 1-255 characters"),
        ({"holds": [{"user": "a", "server": 3}]}, "server must be a string of at most 255 characters"),
        ({"clears": [{"user": "a", "session": "s" * 65}]}, "session must be a string of at most 64 characters"),
        ({"warnings": [{**WARNING.to_json(), "grace_seconds": True}]}, "grace_seconds must be an integer"),
        ({"warnings": [{**WARNING.to_json(), "renew": "yes"}]}, "renew must be true or false"),
        ({"warnings": [{**WARNING.to_json(), "evidence": []}]}, "evidence must be a JSON object"),
        ({"reclaims": [{**CLAIM.to_json(), "idle_gpu_hours": float("nan")}]}, "idle_gpu_hours must be a non-negative"),
        ({"reclaims": [{**CLAIM.to_json(), "action": "rm -rf"}]}, "action must be 'stop-server' or 'shutdown-kernel'"),
        ({"reclaims": [{**CLAIM.to_json(), "kernel_ids": []}]}, "kernel_ids must be a list of kernel id strings"),
        ({"reclaims": [{**CLAIM.to_json(), "reason": "x" * 2001}]}, "reason must be a string of at most 2000"),
        ({"unattributed": {}}, "unattributed must be a list"),
        ({"unattributed": [{**UNATTRIBUTED.to_json(), "code": "guess"}]}, "code must be one of no-series"),
        ({"unattributed": [{**UNATTRIBUTED.to_json(), "reason": ""}]}, "an unattributed server needs its reason"),
        ({"unattributed": [{**UNATTRIBUTED.to_json(), "user": None}]}, "user must be a string"),
        ({"unattributed": [UNATTRIBUTED.to_json()] * 100_001}, "unattributed must be a list of at most 100000"),
    ],
)
def test_a_malformed_record_is_refused_with_what_to_fix(body, words):
    with pytest.raises(RecordError, match=words.replace("(", r"\(")):
        CycleRecords.from_json(body)


@pytest.mark.parametrize(
    ("share", "saved"),
    [
        (  # a single server: the image chosen and the device placements
            GrantedShare(team="vision", profile="h100-half", milli=500, over_quota=True, image="", shares=((1, 500),)),
            {
                "team": "vision",
                "profile": "h100-half",
                "milli": 500,
                "over_quota": True,
                "image": "",
                "shares": [[1, 500]],
            },
        ),
        (  # Kubernetes: the pod holds the image, the device plugin picks the devices
            GrantedShare(team="nlp", profile="h100-1", milli=1000, over_quota=False),
            {"team": "nlp", "profile": "h100-1", "milli": 1000, "over_quota": False},
        ),
    ],
)
def test_a_grant_is_saved_in_the_spawner_state_as_before_and_read_back(share, saved):
    assert share.to_json() == saved
    assert GrantedShare.from_state(over_the_wire({"pid": 1, "gpulab": share.to_json()})) == share


@pytest.mark.parametrize(
    "state",
    [None, {}, {"gpulab": "x"}, {"gpulab": {"team": "t"}}, {"gpulab": {"team": "t", "profile": "p", "milli": "many"}}],
)
def test_a_state_without_a_grant_reads_as_none(state):
    assert GrantedShare.from_state(state) is None


# -- the one reclaim rule ---------------------------------------------------------

NOW = 1_800_000_000.0
IDLE_VERDICT = IdleVerdict(idle=True, status=IDLE, reason="idle", evidence={})


@pytest.mark.parametrize(
    ("warning", "keepalive", "session", "refusal"),
    [
        (None, None, "s", "no idle warning for alice/ (cleared or kept alive)"),
        (IdleWarning(NOW - 900, NOW - 300, "old"), None, "s", "belongs to an earlier session"),
        (IdleWarning(NOW - 900, NOW - 300, "s", held=True), None, "s", "is held until its data returns"),
        (IdleWarning(NOW - 900, NOW + 300, "s"), None, "s", "the grace period of alice/ ends at 2027-01-15T08:05:00Z"),
        (IdleWarning(NOW - 900, NOW - 300, "s"), NOW + 60, "s", "alice/ is kept alive until 2027-01-15T08:01:00Z"),
        (IdleWarning(NOW - 900, NOW - 300, "s"), NOW - 60, "s", None),
    ],
)
def test_the_reclaim_rule_and_the_cullers_step_agree(warning, keepalive, session, refusal):
    got = reclaim_refusal(warning, keepalive, session, NOW, "alice/")
    assert (got is None) == (refusal is None) and (refusal is None or refusal in got), got
    step = next_step(IDLE_VERDICT, warning, keepalive, NOW, session)
    assert (step is Step.RECLAIM) == (refusal is None), step


# -- the hub's store, on a real database ---------------------------------------------


@pytest.fixture
def store(tmp_path) -> IdleStore:
    return IdleStore(
        session_factory(url=f"sqlite:///{tmp_path / 'gpulab.sqlite'}"),
        KeepalivePolicy(1, 3600),
        logging.getLogger("test"),
    )


def test_a_cycle_warns_then_a_claim_is_refused_in_grace_and_granted_after(store: IdleStore):
    now = utcnow()
    claim = ReclaimClaim(user="alice", server="", session=WARNING.session, reason="still idle", idle_gpu_hours=0.5)
    first = store.apply_cycle(CycleRecords(warnings=(WARNING,), reclaims=(claim,)), now)
    assert first["warnings"] == 1 and first["reclaims"][0]["accepted"] is False
    assert "the grace period of alice/ ends at" in first["reclaims"][0]["message"]
    again = store.apply_cycle(CycleRecords(warnings=(WARNING,)), now)
    assert again["warnings"] == 0  # idempotent: the warning's clock never restarts by itself
    later = store.apply_cycle(CycleRecords(reclaims=(claim,)), now + timedelta(seconds=601))
    assert later["reclaims"] == [{"user": "alice", "server": "", "accepted": True, "message": "recorded"}]
    with store.sessions() as session:
        assert session.get(IdleWarningRow, ("alice", "")) is None
        kinds = [e.kind for e in session.query(IdleEventRow).order_by(IdleEventRow.id)]
    assert kinds == ["warning", "reclaim"]


def test_keep_my_gpu_clears_the_warning_and_then_wins_over_a_claim(store: IdleStore):
    now = utcnow()
    store.apply_cycle(CycleRecords(warnings=(WARNING,)), now)
    view = store.keep_alive("alice", "", WARNING.session, {"team": "vision", "profile": "h100-half"}, "alice")
    assert view["warning"] is None and view["keepalive"]["used"] == 1
    with pytest.raises(KeepaliveRefused, match="already used 1 of 1"):
        store.keep_alive("alice", "", WARNING.session, {}, "alice")
    store.apply_cycle(CycleRecords(warnings=(WARNING,)), now)
    claim = ReclaimClaim(user="alice", server="", session=WARNING.session, reason="idle")
    answer = store.apply_cycle(CycleRecords(reclaims=(claim,)), now + timedelta(seconds=601))["reclaims"][0]
    assert not answer["accepted"] and "kept alive until" in answer["message"]
    with store.sessions() as session:
        k = session.get(KeepaliveRow, ("alice", ""))
        assert to_epoch(k.until) > to_epoch(now) and from_epoch(to_epoch(k.until)) == k.until


# -- the culler's plan: pure, testable without a hub ------------------------------------


def gpu_server(user: str) -> ServerTarget:
    return ServerTarget(
        user=user, server="", team="t", profile="p", gpu_milli=1000, mapping=DEVICE, hostname="h", devices=(0,)
    )


def samples(percent: float, window: int = 600) -> list[DeviceSeries]:
    return [
        DeviceSeries(device_id("h", "0"), tuple((NOW - window + i * 30.0, percent) for i in range(window // 30 + 1)))
    ]


def test_the_cycle_plan_judges_each_server_and_steps_its_warning():
    idle, busy, fresh = gpu_server("idle"), gpu_server("busy"), gpu_server("fresh")
    plan = plan_cycle(
        [idle, busy, fresh],
        {idle.key: samples(0.0), busy.key: samples(80.0), fresh.key: samples(0.0)},
        {
            ("idle", ""): IdleWarning(NOW - 900, NOW - 300),
            ("busy", ""): IdleWarning(NOW - 900, NOW + 300),
            ("gone", ""): IdleWarning(NOW - 900, NOW - 300),
        },
        {},
        {t.key: (600, "default") for t in (idle, busy, fresh)},
        [("idle", ""), ("busy", ""), ("fresh", "")],
        now=NOW,
        threshold_percent=1.0,
        max_gap_seconds=90,
    )
    assert plan.gone == (("gone", ""),)  # its server stopped: the warning is cleared
    assert [(s.target.user, s.step) for s in plan.steps] == [
        ("idle", Step.RECLAIM),
        ("busy", Step.CLEAR),
        ("fresh", Step.WARN),
    ]


def test_the_hub_shows_why_reclaim_is_off_for_the_running_session_only(store: IdleStore):
    now = utcnow()
    assert store.state(catalog_from_dict(ONE_PROFILE))["unattributed"] is None  # nothing reported since start
    store.apply_cycle(CycleRecords(unattributed=(UNATTRIBUTED,)), now)
    with store.sessions() as session:
        view = store.view(session, "erin", "", "s")["reclaim_off"]
        assert view == {"code": "kai-reservation-pod", "reason": "KAI holds it", "since": view["since"]}
        assert store.view(session, "erin", "", "a later session")["reclaim_off"] is None
        assert store.view(session, "frank", "", "s")["reclaim_off"] is None
    state = store.state(catalog_from_dict(ONE_PROFILE))
    assert [u["code"] for u in state["unattributed"]] == ["kai-reservation-pod"]
    assert state["profiles"]["h100-half"]["sharing"] == "timeslice"  # the culler's reason depends on it
    # The same server again keeps its "since"; a cycle without the list leaves it; an empty list clears it.
    since = view["since"]
    store.apply_cycle(CycleRecords(unattributed=(UNATTRIBUTED,)), now + timedelta(minutes=5))
    store.apply_cycle(CycleRecords(), now + timedelta(minutes=6))
    with store.sessions() as session:
        assert store.view(session, "erin", "", "s")["reclaim_off"]["since"] == since
    store.apply_cycle(CycleRecords(unattributed=()), now + timedelta(minutes=7))
    assert store.state(catalog_from_dict(ONE_PROFILE))["unattributed"] == []


ONE_PROFILE = {
    "sharing": {"backend": "timeslice", "timeslice": {"replicas": 4, "resource": "nvidia.com/gpu.shared"}},
    "profiles": [{"slug": "h100-half", "display_name": "half", "gpus": 0.5, "gpu_model": "H100-80GB"}],
    "teams": [{"name": "vision", "display_name": "V", "users": ["erin"], "guarantee": 1, "burst": 2}],
}
