"""The quota ledger: invariants (hypothesis), concurrency, rebuild."""

from __future__ import annotations

import threading

from hypothesis import given, settings
from hypothesis import strategies as st

from spawner.core.ledger import RESERVED, RUNNING, Ledger, Workload
from spawner.core.model import Team

SIZES = st.sampled_from([0, 250, 500, 1000, 2000, 4000, 8000, 125, 1])


def team(name="vision", guarantee=4000, burst=6000, cap=None):
    return Team(
        name=name,
        users=frozenset({"alice", "bob"}),
        guarantee_milli=guarantee,
        burst_milli=burst,
        per_user_cap_milli=cap,
    )


ops = st.lists(
    st.one_of(
        st.tuples(st.just("reserve"), st.sampled_from(["a", "b", "c"]), SIZES, st.booleans()),
        st.tuples(st.just("release"), st.integers(0, 60), st.just(0), st.just(False)),
        st.tuples(st.just("confirm"), st.integers(0, 60), st.just(0), st.just(False)),
    ),
    max_size=80,
)


@settings(max_examples=300, deadline=None)
@given(
    guarantee=st.integers(0, 8000),
    extra=st.integers(0, 8000),
    cap=st.one_of(st.none(), st.integers(0, 8000)),
    script=ops,
)
def test_never_past_burst_and_preemptible_exactly_when_over_guarantee(guarantee, extra, cap, script):
    t = team(guarantee=guarantee, burst=guarantee + extra, cap=cap)
    ledger = Ledger([t])
    keys: list[str] = []
    for op, who, milli, may_burst in script:
        if op == "reserve":
            key = f"w{len(keys)}"
            keys.append(key)
            held_before = ledger.usage("vision").held_milli
            user_before = ledger.user_held("vision", who)
            d = ledger.reserve(key, "vision", who, milli, may_burst=may_burst)
            if d.allowed:
                # Admitted work never passes the burst limit or the per-user cap ...
                assert held_before + milli <= t.burst_milli
                assert cap is None or user_before + milli <= cap
                # ... and is preemptible exactly when it runs above the guarantee.
                assert d.over_quota == (milli > 0 and held_before + milli > t.guarantee_milli)
                assert may_burst or not d.over_quota
            else:
                assert d.reason
                would_fit = held_before + milli <= t.burst_milli and (cap is None or user_before + milli <= cap)
                would_be_over = milli > 0 and held_before + milli > t.guarantee_milli
                assert not would_fit or (would_be_over and not may_burst)
        elif keys:
            key = keys[who % len(keys)]
            if op == "release":
                ledger.release(key)
            else:
                ledger.confirm(key)
        u = ledger.usage("vision")
        assert 0 <= u.held_milli <= t.burst_milli
        assert u.held_milli == sum(w.milli for w in ledger.workloads("vision"))
        assert u.over_quota_milli == sum(w.milli for w in ledger.workloads("vision") if w.over_quota)
        assert u.reserved_milli == sum(w.milli for w in ledger.workloads("vision") if w.state == RESERVED)


def test_reason_names_team_limit_and_request():
    ledger = Ledger([team(guarantee=8000, burst=8000)])
    for i in range(15):
        assert ledger.reserve(f"k{i}", "vision", "alice", 500).allowed
    d = ledger.reserve("last", "vision", "bob", 1000)
    assert not d.allowed
    assert d.reason == "team vision holds 7.5 of its 8 GPU burst limit; this request needs 1"


def test_training_never_admitted_over_quota():
    ledger = Ledger([team(guarantee=1000, burst=4000)])
    assert ledger.reserve("a", "vision", "alice", 1000).allowed
    d = ledger.reserve("b", "vision", "alice", 500, may_burst=False)
    assert not d.allowed
    assert "never admitted over quota" in d.reason
    d = ledger.reserve("c", "vision", "alice", 500, may_burst=True)
    assert d.allowed and d.over_quota


def test_per_user_cap():
    ledger = Ledger([team(cap=1000)])
    assert ledger.reserve("a", "vision", "alice", 1000).allowed
    d = ledger.reserve("b", "vision", "alice", 250)
    assert not d.allowed and d.reason.startswith("alice holds 1 of the 1 GPUs one user may hold in team vision")
    assert ledger.reserve("c", "vision", "bob", 250).allowed


def test_unknown_team_and_bad_amounts_refused():
    ledger = Ledger([team()])
    assert not ledger.reserve("x", "nope", "alice", 250).allowed
    for bad in (-1, 0.5, "500", True, None):
        d = ledger.reserve("y", "vision", "alice", bad)  # type: ignore[arg-type]
        assert not d.allowed and "invalid GPU request" in d.reason
    assert ledger.usage("vision").held_milli == 0


def test_duplicate_key_refused():
    ledger = Ledger([team()])
    assert ledger.reserve("k", "vision", "alice", 250).allowed
    assert not ledger.reserve("k", "vision", "alice", 250).allowed
    assert ledger.usage("vision").held_milli == 250


def test_200_concurrent_admissions_admit_exactly_the_quota():
    ledger = Ledger([team(guarantee=4000, burst=6000)])
    barrier = threading.Barrier(200)
    results = [None] * 200

    def admit(i: int) -> None:
        barrier.wait()
        results[i] = ledger.reserve(f"k{i}", "vision", "alice" if i % 2 else "bob", 250)

    threads = [threading.Thread(target=admit, args=(i,)) for i in range(200)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    admitted = [d for d in results if d.allowed]
    assert len(admitted) == 24  # 6 GPUs / 0.25
    assert sum(d.milli for d in admitted) == 6000
    assert sum(1 for d in admitted if not d.over_quota) == 16  # 4 GPUs of guarantee
    assert sum(1 for d in admitted if d.over_quota) == 8
    refused = [d for d in results if not d.allowed]
    assert all("burst limit" in d.reason for d in refused)
    assert ledger.usage("vision").held_milli == 6000


def test_rebuild_replaces_running_keeps_pending_and_never_double_counts():
    ledger = Ledger([team()])
    ledger.reserve("pending", "vision", "alice", 500)
    ledger.reserve("old", "vision", "alice", 1000)
    ledger.confirm("old")
    live = [
        Workload("pod-a", "vision", "bob", 2000, over_quota=False),
        Workload("pod-a", "vision", "bob", 2000, over_quota=False),  # listed twice
        Workload("pending", "vision", "alice", 500),
    ]  # the pending spawn's pod appeared
    ledger.rebuild(live)
    u = ledger.usage("vision")
    assert u.held_milli == 2500
    assert {w.key for w in ledger.workloads()} == {"pod-a", "pending"}
    assert ledger.get("pending").state == RUNNING
    ledger.adopt(Workload("pod-a", "vision", "bob", 2000))
    assert ledger.usage("vision").held_milli == 2500


def test_set_teams_keeps_holdings_and_applies_new_limits():
    ledger = Ledger([team(guarantee=1000, burst=2000)])
    assert ledger.reserve("a", "vision", "alice", 1000).allowed
    ledger.set_teams([team(guarantee=1000, burst=1000)])
    assert ledger.usage("vision").held_milli == 1000
    assert not ledger.reserve("b", "vision", "alice", 250).allowed
