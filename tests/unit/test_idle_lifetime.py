"""A GPU server's maximum lifetime (catalog ``max_lifetime``, the shorter of the profile's and
the team's): from its session start S plus the lifetime L on, the server is warned and then
reclaimed after the grace, whatever its GPU does and whatever "keep my GPU" was pressed;
before S+L it is decided exactly as without a lifetime."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from idle_culler.plan import lifetimes_of, plan_cycle
from idle_culler.targets import DEVICE, ServerTarget
from spawner.core.catalog import CatalogError, catalog_from_dict
from spawner.core.catalog.write import catalog_to_dict
from spawner.core.form import render_options_form
from spawner.core.idle import (
    BUSY,
    IDLE,
    LIFETIME,
    MISSING,
    STALE,
    IdleFacts,
    IdleVerdict,
    IdleWarning,
    KeepalivePolicy,
    KeepaliveRefused,
    Lifetime,
    Step,
    grant_keepalive,
    idle_and_lifetime_words,
    idle_policy_text,
    lifetime_verdict,
    max_lifetime_for,
    next_step,
    reclaim_refusal,
    session_lifetime,
)
from spawner.core.ledger import Ledger
from spawner.core.model import Profile, Team
from spawner.core.policy import choices_for_user

START = 1_700_000_000.0
LIFE = 8 * 3600
GRACE = 900.0
S = "2023-11-14T22:13:20.000000Z"  # the running session
LIFETIME_8H = Lifetime(LIFE, "profile h100-4", START)
ENDS = START + LIFE

VERDICTS = [
    IdleVerdict(True, IDLE, "idle", {}),
    IdleVerdict(False, BUSY, "GPU in use: gpu0 peaked at 97%", {}),
    IdleVerdict(False, MISSING, "no samples", {}),
    IdleVerdict(False, STALE, "stale", {}),
]
verdicts = st.sampled_from(VERDICTS)
keepalives = st.one_of(st.none(), st.floats(min_value=START - 10 * LIFE, max_value=START + 10 * LIFE))


# -- the catalog ------------------------------------------------------------


def test_max_lifetime_is_read_from_profiles_and_teams_and_written_back():
    catalog = catalog_from_dict(
        {
            "profiles": [{"slug": "h100-4", "gpus": 4, "max_lifetime": "8h"}, {"slug": "cpu", "gpus": 0}],
            "teams": [{"name": "vision", "guarantee": 4, "max_lifetime": "1d12h"}, {"name": "open", "guarantee": 4}],
        }
    )
    assert catalog.profiles["h100-4"].max_lifetime_seconds == LIFE
    assert catalog.teams["vision"].max_lifetime_seconds == 36 * 3600
    assert catalog.teams["open"].max_lifetime_seconds is None
    written = catalog_to_dict(catalog)
    assert {p["slug"]: p.get("max_lifetime") for p in written["profiles"]} == {"h100-4": "8h", "cpu": None}
    assert catalog_from_dict(written) == catalog


@pytest.mark.parametrize(
    "value, words",
    [
        ("0s", "longer than 0s"),
        (0, "longer than 0s"),
        (-5, "cannot be negative"),
        ("forever", "expected a duration"),
        (True, "expected a duration"),
        ("9" * 300, "a duration"),
    ],
)
def test_a_bad_max_lifetime_is_refused_with_its_path(value, words):
    for section in ("profiles", "teams"):
        spec = {"slug": "x", "gpus": 1} if section == "profiles" else {"name": "x"}
        with pytest.raises(CatalogError) as e:
            catalog_from_dict({section: [{**spec, "max_lifetime": value}]})
        assert f"{section}[0].max_lifetime" in str(e.value) or f"{section}.0.max_lifetime" in str(e.value), e.value
        assert words in str(e.value)


def test_the_shorter_of_profile_and_team_wins_and_only_gpu_servers_have_one():
    p = Profile("h100-4", "4 × H100", gpu_milli=4000, max_lifetime_seconds=LIFE)
    assert max_lifetime_for(p, Team("vision", max_lifetime_seconds=3600)) == (3600, "team vision")
    assert max_lifetime_for(p, Team("slow", max_lifetime_seconds=2 * LIFE)) == (LIFE, "profile h100-4")
    assert max_lifetime_for(p, Team("open")) == (LIFE, "profile h100-4")
    assert max_lifetime_for(Profile("q", "q", gpu_milli=250), Team("open")) is None  # none: unlimited
    assert max_lifetime_for(Profile("cpu", "cpu"), Team("vision", max_lifetime_seconds=60)) is None
    # A running session's, as the hub knows it: only with a GPU held and a start.
    assert session_lifetime(p, Team("open"), 4000, START) == Lifetime(LIFE, "profile h100-4", START)
    assert session_lifetime(p, Team("open"), 0, START) is None
    assert session_lifetime(p, Team("open"), 4000, None) is None
    assert session_lifetime(None, Team("vision", max_lifetime_seconds=60), 500, START) == Lifetime(
        60, "team vision", START
    )  # a profile gone from the catalog: the team's still applies


# -- the decision -----------------------------------------------------------


def test_past_its_lifetime_a_busy_server_is_warned_with_the_lifetime_as_reason():
    v = lifetime_verdict(LIFETIME_8H, ENDS)
    assert v is not None and v.idle and v.status == LIFETIME
    assert v.reason == "maximum lifetime 8h of profile h100-4 reached"
    assert v.evidence == {
        "max_lifetime_seconds": LIFE,
        "max_lifetime_from": "profile h100-4",
        "session_started_at": START,
        "lifetime_ends_at": ENDS,
    }
    assert lifetime_verdict(LIFETIME_8H, ENDS - 0.001) is None
    assert lifetime_verdict(None, ENDS) is None


@given(
    st.lists(st.tuples(verdicts, keepalives, st.floats(min_value=0.0, max_value=600.0)), min_size=1, max_size=40),
    st.floats(min_value=0.0, max_value=LIFE),
    st.sampled_from(["none", "idle", "held"]),
)
def test_past_its_lifetime_a_server_is_always_warned_then_reclaimed_after_the_grace(cycles, after, before):
    """Whatever its utilisation and whatever keep-alives, from S+L on: a warning (or the one it
    already has), then the reclaim at the first cycle at or after its reclaim time, and the hub
    grants that claim with any keep-alive on its records."""
    now = ENDS + after
    warning = {
        "none": None,
        "idle": IdleWarning(now - 100, now + 50, S),  # warned for idleness just before
        "held": IdleWarning(now - 100, now - 50, S, held=True),
    }[before]
    for verdict, keepalive, step_seconds in cycles:
        v = lifetime_verdict(LIFETIME_8H, now) or verdict
        step = next_step(v, warning, keepalive, now, S, ENDS)
        assert step in (Step.WARN, Step.REWARN, Step.WAIT, Step.RECLAIM), step
        if warning is None or warning.held:
            assert step is (Step.WARN if warning is None else Step.REWARN)
            warning = IdleWarning(now, now + GRACE, S)  # as the hub records it
        elif now >= warning.reclaim_at:
            assert step is Step.RECLAIM
            assert reclaim_refusal(warning, keepalive, S, now, lifetime_ends_at=ENDS) is None
            return
        else:
            assert step is Step.WAIT
            assert reclaim_refusal(warning, keepalive, S, now, lifetime_ends_at=ENDS) is not None
        now += step_seconds


@given(
    verdicts,
    st.one_of(st.none(), st.builds(IdleWarning, st.just(START), st.floats(START, START + LIFE), st.just(S))),
    keepalives,
    st.floats(min_value=START, max_value=ENDS - 0.001),
)
def test_before_its_lifetime_a_server_is_decided_exactly_as_without_one(verdict, warning, keepalive, now):
    assert lifetime_verdict(LIFETIME_8H, now) is None
    assert next_step(verdict, warning, keepalive, now, S, ENDS) is next_step(verdict, warning, keepalive, now, S)
    # The same answer; a refusal for a keep-alive says it runs until S+L at most.
    refused = reclaim_refusal(warning, keepalive, S, now, lifetime_ends_at=ENDS)
    assert (refused is None) == (reclaim_refusal(warning, keepalive, S, now) is None)


@given(
    st.integers(min_value=0, max_value=3),
    st.one_of(st.none(), st.floats(START, ENDS + LIFE)),
    st.floats(min_value=START, max_value=ENDS + LIFE),
)
def test_a_keepalive_never_reaches_past_the_lifetime_and_is_refused_once_it_passed(used, until, now):
    policy = KeepalivePolicy(max_uses=3, extends_seconds=7200)
    try:
        used_after, until_after = grant_keepalive(policy, used, until, now, LIFETIME_8H)
    except KeepaliveRefused as e:
        assert now >= ENDS or used >= policy.max_uses
        if now >= ENDS:
            assert "maximum lifetime (8h of profile h100-4)" in str(e)
        return
    assert now < ENDS and used_after == used + 1
    assert until_after <= ENDS
    assert until_after == min(max(until or 0.0, now + 7200), ENDS)


def test_without_a_lifetime_keepalive_is_granted_as_before():
    policy = KeepalivePolicy(max_uses=2, extends_seconds=100)
    assert grant_keepalive(policy, 0, None, ENDS + 5) == (1, ENDS + 105)


# -- one cycle's plan ---------------------------------------------------------


def _target(user: str, profile: str, team: str = "vision") -> ServerTarget:
    return ServerTarget(
        user=user,
        server="",
        team=team,
        profile=profile,
        gpu_milli=1000,
        mapping=DEVICE,
        hostname="h",
        devices=(0,),
        started=S,
        started_at=START,
    )


def test_the_plan_warns_a_busy_kept_alive_server_past_its_lifetime_and_leaves_a_younger_one():
    old, young = _target("alice", "h100-4"), _target("bob", "long")
    profiles = {"h100-4": {"max_lifetime_seconds": LIFE}, "long": {"max_lifetime_seconds": 2 * LIFE}, "cpu": {}}
    lifetimes = lifetimes_of([old, young], profiles, {"vision": {"max_lifetime_seconds": None}})
    assert lifetimes == {"alice/": LIFETIME_8H, "bob/": Lifetime(2 * LIFE, "profile long", START)}
    now = ENDS + 1
    plan = plan_cycle(
        [old, young],
        {},  # no samples at all: within its lifetime, "not idle"
        {},
        {("alice", ""): now + 3600, ("bob", ""): now + 3600},
        {"alice/": (3600, "default"), "bob/": (3600, "default")},
        [("alice", ""), ("bob", "")],
        now=now,
        threshold_percent=1.0,
        max_gap_seconds=30.0,
        lifetimes=lifetimes,
    )
    by_user = {s.target.user: s for s in plan.steps}
    assert by_user["alice"].step is Step.WARN
    assert by_user["alice"].verdict.reason == "maximum lifetime 8h of profile h100-4 reached"
    assert by_user["bob"].step is Step.NOTHING and by_user["bob"].verdict.status == MISSING


def test_a_team_lifetime_applies_to_the_teams_servers():
    t = _target("alice", "q", team="vision")
    assert lifetimes_of([t], {"q": {}}, {"vision": {"max_lifetime_seconds": 600}}) == {
        "alice/": Lifetime(600, "team vision", START)
    }
    assert lifetimes_of([t], {"q": {}}, {"vision": {}}) == {}


def test_the_culler_stops_the_server_at_its_lifetime_even_with_per_kernel_data():
    from idle_culler.app import CycleBatch, GPUIdleCuller

    culler = GPUIdleCuller(config_file="", source="nvml", api_token="x")
    culler.initialize([])
    culler.hub = culler.make_hub_client()
    t = _target("alice", "h100-4")
    culler.utilisation._holders = {t.key: [{"pid": 1, "device": 0, "kernel_id": "k1", "started_at": ENDS}]}
    verdict = lifetime_verdict(LIFETIME_8H, ENDS + GRACE)
    assert verdict is not None
    batch = CycleBatch()
    culler._plan_reclaim(batch, t, verdict, IdleWarning(ENDS, ENDS + GRACE, S), 3600, "default", ENDS + GRACE)
    (claim, _, _), *rest = batch.claims
    assert not rest and claim.action == "stop-server" and claim.idle_gpu_hours == 0.0
    assert claim.reason == "maximum lifetime 8h of profile h100-4 reached"
    assert claim.evidence["max_lifetime_seconds"] == LIFE


# -- words --------------------------------------------------------------------

RULE = "stopped after 8h, whatever it does, after a warning and its grace"


def test_the_idle_sentence_says_the_lifetime_and_is_unchanged_without_one():
    p = Profile("h100-4", "4 × H100", gpu_milli=4000, idle_timeout_seconds=1800, max_lifetime_seconds=LIFE)
    plain = Profile("h100-4", "4 × H100", gpu_milli=4000, idle_timeout_seconds=1800)
    on = IdleFacts(culler_on=True)
    text = idle_policy_text(p, Team("vision"), on)
    assert text == f"{idle_policy_text(plain, Team('vision'), on)}; {RULE}"
    assert text.startswith("After 30m with the GPU idle you get a warning")
    off = idle_policy_text(p, None, IdleFacts(culler_on=False))
    assert off.endswith("until it is stopped; maximum lifetime 8h, not enforced")
    team_rule = idle_policy_text(plain, Team("vision", max_lifetime_seconds=3600), on)
    assert team_rule.endswith("; stopped after 1h, whatever it does, after a warning and its grace")
    # The admin and what-if pages list both per team.
    assert idle_and_lifetime_words(p, Team("vision")) == "30m, maximum lifetime 8h"
    assert idle_and_lifetime_words(plain, Team("vision")) == "30m"


def test_the_spawn_card_says_the_lifetime_next_to_the_idle_timeout():
    catalog = catalog_from_dict(
        {
            "profiles": [
                {"slug": "q", "display_name": "0.25 × H100", "gpus": 0.25, "max_lifetime": "8h"},
                {"slug": "w", "display_name": "1 × H100", "gpus": 1, "idle_timeout": "2h"},
            ],
            "teams": [{"name": "vision", "users": ["alice"], "guarantee": 2, "burst": 2}],
        }
    )
    html = render_options_form(choices_for_user(catalog, Ledger(catalog.teams), "alice"))
    q = html[html.index('data-choice="vision:q"') :]
    q = q[: q.index("</label>")]
    assert f"Idle timeout the culler&#x27;s default idle time · {RULE}" in q
    w = html[html.index('data-choice="vision:w"') :]
    assert "Idle timeout 2h<" in w[: w.index("</label>")]


# -- the hub's re-check, on a real database ---------------------------------------


def test_the_hub_grants_a_claim_past_the_lifetime_over_a_keepalive_on_its_records(tmp_path):
    """A keep-alive granted before the lifetime was set (its record reaches past S+L) blocks an
    idle claim, never one at the lifetime; a press after S+L is refused and changes nothing."""
    import logging
    from datetime import timedelta

    from hub_config.domain.idle_records import IdleEventRow, KeepaliveRow
    from hub_config.domain.idle_store import IdleStore
    from hub_config.storage.db import session_factory, to_epoch, utcnow
    from spawner.core.idle_cycle import CycleRecords, ReclaimClaim, WarningRecord

    store = IdleStore(
        session_factory(url=f"sqlite:///{tmp_path / 'gpulab.sqlite'}"), KeepalivePolicy(3, 7200), logging.getLogger()
    )
    now = utcnow()
    session_id = "2026-01-01T00:00:00.000000Z"
    store.keep_alive("alice", "", session_id, {"team": "vision", "profile": "h100-4"}, "alice")  # no lifetime yet
    lifetime = Lifetime(LIFE, "profile h100-4", to_epoch(now) - LIFE)  # ... and now it has passed
    warning = WarningRecord(user="alice", server="", session=session_id, grace_seconds=60, reason=lifetime.reason)
    claim = ReclaimClaim(user="alice", server="", session=session_id, reason=lifetime.reason)
    store.apply_cycle(CycleRecords(warnings=(warning,)), now)
    later = now + timedelta(seconds=61)
    refused = store.apply_cycle(CycleRecords(reclaims=(claim,)), later)["reclaims"][0]
    assert not refused["accepted"] and "kept alive until" in refused["message"]  # no lifetime known: as before
    with pytest.raises(KeepaliveRefused, match="cannot extend this server past its maximum lifetime"):
        store.keep_alive("alice", "", session_id, {}, "alice", lifetime)
    granted = store.apply_cycle(CycleRecords(reclaims=(claim,)), later, {("alice", ""): lifetime})["reclaims"][0]
    assert granted == {"user": "alice", "server": "", "accepted": True, "message": "recorded"}
    with store.sessions() as session:
        kinds = [e.kind for e in session.query(IdleEventRow).order_by(IdleEventRow.id)]
        assert session.get(KeepaliveRow, ("alice", "")) is None  # the session ended with its allowance
    assert kinds == ["keepalive", "warning", "reclaim"]
