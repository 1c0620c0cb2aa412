"""Gang admission in the quota ledger: a multi-node job holds all of its GPUs or none.

Hypothesis drives interleaved gangs, single reservations, confirms and releases, and
checks after every step that no gang is ever held in part, that a gang is admitted
exactly when the whole of it fits (never because a part would), and that training
gangs never run over quota; a threaded run checks the same under contention.
"""

from __future__ import annotations

import threading

from hypothesis import given, settings
from hypothesis import strategies as st

from spawner.core.ledger import Ledger
from spawner.core.model import Team

MEMBER_MILLI = st.sampled_from([1000, 2000, 4000, 8000])


def team(guarantee: int, burst: int, cap: int | None = None) -> Team:
    return Team(
        name="vision",
        users=frozenset({"alice", "bob"}),
        guarantee_milli=guarantee,
        burst_milli=burst,
        per_user_cap_milli=cap,
    )


ops = st.lists(
    st.one_of(
        # (reserve, user, per-member milli, members, may_burst)
        st.tuples(
            st.just("reserve"), st.sampled_from(["alice", "bob"]), MEMBER_MILLI, st.integers(1, 8), st.booleans()
        ),
        st.tuples(st.just("release"), st.integers(0, 60), st.just(0), st.just(0), st.just(False)),
        st.tuples(st.just("confirm"), st.integers(0, 60), st.just(0), st.just(0), st.just(False)),
    ),
    max_size=60,
)


@settings(max_examples=300, deadline=None)
@given(
    guarantee=st.integers(0, 64_000),
    extra=st.integers(0, 32_000),
    cap=st.one_of(st.none(), st.integers(0, 64_000)),
    script=ops,
)
def test_a_gang_is_held_whole_or_not_at_all(guarantee, extra, cap, script):
    t = team(guarantee, guarantee + extra, cap)
    ledger = Ledger([t])
    #: key -> (members, per-member milli) of every gang asked for
    asked: dict[str, tuple[int, int]] = {}
    for op, who, per_member, members, may_burst in script:
        if op == "reserve":
            key = f"job:{len(asked)}"
            asked[key] = (members, per_member)
            whole = members * per_member
            held = ledger.usage("vision").held_milli
            mine = ledger.user_held("vision", who)
            d = ledger.reserve(key, "vision", who, whole, kind="job", may_burst=may_burst, members=members)
            fits = held + whole <= t.burst_milli and (cap is None or mine + whole <= cap)
            over = held + whole > t.guarantee_milli
            # Admitted exactly when the WHOLE gang fits, never because a part of it would.
            assert d.allowed == (fits and (may_burst or not over)), (d, held, whole)
            if d.allowed:
                assert d.over_quota == over and d.members == members
            else:
                assert ledger.get(key) is None and ledger.usage("vision").held_milli == held
                if members > 1:
                    assert f"needs {whole // 1000} GPUs in one go" in d.reason, d.reason
        elif asked:
            key = sorted(asked)[who % len(asked)]
            (ledger.release if op == "release" else ledger.confirm)(key)
        # After every step: each gang holds all of its GPUs, or nothing.
        for key, (members, per_member) in asked.items():
            w = ledger.get(key)
            assert w is None or (w.milli == members * per_member and w.members == members)
        u = ledger.usage("vision")
        assert u.held_milli == sum(w.milli for w in ledger.workloads("vision")) <= t.burst_milli
        # What runs inside the quota (every training gang) never passes the guarantee.
        assert u.in_quota_milli <= t.guarantee_milli


def test_refusal_says_what_the_whole_gang_needs():
    ledger = Ledger([team(guarantee=16_000, burst=24_000)])
    assert ledger.reserve("notebooks", "vision", "bob", 6000).allowed
    d = ledger.reserve("job:7", "vision", "alice", 16_000, kind="job", may_burst=False, members=2)
    assert not d.allowed
    assert d.reason == (
        "this job of 2 × 8 GPUs needs 16 GPUs in one go; team vision has 10 free of its guarantee "
        "(16 GPUs), and this work is never admitted over quota"
    )
    # The 8 GPUs of one member would fit; the ledger never takes a part of the gang.
    assert ledger.admit("vision", "alice", 8000, may_burst=False).allowed
    assert ledger.usage("vision").held_milli == 6000 and ledger.get("job:7") is None


def test_gang_refusals_for_burst_and_per_user_cap_name_the_whole():
    ledger = Ledger([team(guarantee=8000, burst=12_000, cap=10_000)])
    d = ledger.reserve("job:1", "vision", "alice", 16_000, members=4)
    assert not d.allowed and d.reason.startswith("this job of 4 × 4 GPUs needs 16 GPUs in one go; team vision has 12")
    d = ledger.reserve("job:2", "vision", "alice", 12_000, members=3)
    assert not d.allowed and "alice may take 10 more of the 10 GPUs one user may hold" in d.reason


def test_gang_sizes_must_split_evenly_and_be_positive():
    ledger = Ledger([team(guarantee=64_000, burst=64_000)])
    for members, milli in ((0, 8000), (-1, 8000), (True, 8000), (3, 8000), ("2", 8000)):
        d = ledger.reserve("job:x", "vision", "alice", milli, members=members)  # type: ignore[arg-type]
        assert not d.allowed and ("gang" in d.reason), d.reason
    assert ledger.usage("vision").held_milli == 0


def test_concurrent_gangs_and_singles_never_split_a_gang_or_pass_the_burst():
    burst = 40_000
    ledger = Ledger([team(guarantee=32_000, burst=burst)])
    barrier = threading.Barrier(60)
    results: dict[str, tuple[int, bool]] = {}

    def ask(i: int) -> None:
        members = 1 if i % 3 else 4
        whole = members * (2000 if members > 1 else 1000)
        barrier.wait()
        d = ledger.reserve(f"k{i}", "vision", "alice" if i % 2 else "bob", whole, members=members, may_burst=i % 5 != 0)
        results[f"k{i}"] = (whole, d.allowed)

    threads = [threading.Thread(target=ask, args=(i,)) for i in range(60)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    admitted = {k: whole for k, (whole, ok) in results.items() if ok}
    assert sum(admitted.values()) == ledger.usage("vision").held_milli <= burst
    for key, whole in admitted.items():
        assert ledger.get(key).milli == whole  # type: ignore[union-attr]
    for key, (_, ok) in results.items():
        assert ok or ledger.get(key) is None
