"""The what-if replay engine and the profile advisor: plain data in, figures out."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from spawner.core.advisor import AdvisorError, demand_from, efficiency_of, givable_sizes, recommend
from spawner.core.model import Team
from spawner.core.packer import GPUDevice
from spawner.core.whatif import Proposal, RecordedSession, replay

H = 3600


def idle_samples(start, end, busy_until=None, step=60):
    return tuple(
        (float(t), 50.0 if busy_until is not None and t < busy_until else 0.0) for t in range(start, end + 1, step)
    )


def test_rounding_quota_and_devices_refuse_with_reasons():
    sessions = [
        RecordedSession("a", "vision", "alice", 300, 0, 2 * H),  # 0.3 -> 0.5
        RecordedSession("b", "vision", "bob", 600, 10, 2 * H),  # 0.6 -> 1: over vision's burst of 1
        RecordedSession("c", "nlp", "carol", 3000, 20, H),  # larger than any size
    ]
    teams = {"vision": Team("vision", guarantee_milli=500, burst_milli=1000)}
    r = replay(sessions, Proposal(sizes=(250, 500, 1000), teams=teams))
    assert r.served == 1 and r.refused["quota"] == 1 and r.refused["not offered"] == 1
    assert r.served_gpu_hours == pytest.approx(0.5 * (2 * H) / H)
    # the same sessions on one GPU: b fits by quota now but not on the device
    r2 = replay(sessions, Proposal(sizes=(250, 500, 1000, 4000)), devices=[GPUDevice(0, "H100")])
    assert r2.refused["no device fits"] == 2 and r2.served == 1


def test_reclaim_and_regret_use_the_recorded_samples():
    # idle from the start; timeout 1h + grace 15 min -> reclaimed at 4500 s; busy again at 5000 s: regret
    busy_again = tuple((t, 0.0) for t, _ in idle_samples(0, 4900)) + ((5000.0, 80.0), (5060.0, 80.0))
    s1 = RecordedSession("x", "vision", "alice", 1000, 0, 3 * H, samples=busy_again)
    # idle to the end, the user never comes back: a reclaim without regret
    s2 = RecordedSession("y", "vision", "bob", 500, 0, 3 * H, samples=idle_samples(0, 3 * H))
    # no samples: never reclaimed
    s3 = RecordedSession("z", "nlp", "carol", 1000, 0, 3 * H)
    r = replay([s1, s2, s3], Proposal(idle_timeout_seconds=H))
    assert r.reclaims == 2 and r.regret == 1 and r.sessions_without_samples == 1
    assert r.reclaimed_gpu_hours == pytest.approx((3 * H - 4500) / H * 1.0 + (3 * H - 4500) / H * 0.5)
    assert replay([s1, s2, s3], Proposal()).reclaims == 0  # no timeout, no culling


def test_a_gap_in_the_samples_prevents_a_reclaim():
    samples = idle_samples(0, 1800) + idle_samples(2400, 3 * H)  # a 10-minute hole
    s = RecordedSession("g", "vision", "alice", 1000, 0, 3 * H, samples=samples)
    r = replay([s], Proposal(idle_timeout_seconds=H, max_gap_seconds=180))
    # idle is proved only from 2400 s on: reclaimed at 2400 + 4500
    assert r.reclaims == 1 and r.reclaimed_gpu_hours == pytest.approx((3 * H - 6900) / H)


sessions_st = st.lists(
    st.builds(
        lambda i, team, milli, start, dur, util: RecordedSession(
            f"k{i}",
            team,
            f"u{i % 3}",
            milli,
            start,
            start + dur,
            samples=tuple((float(t), util) for t in range(start, start + dur, 300)),
        ),
        st.integers(0, 1000),
        st.sampled_from(["a", "b"]),
        st.sampled_from([100, 250, 400, 500, 1000, 2000]),
        st.integers(0, 20 * H),
        st.integers(60, 10 * H),
        st.sampled_from([0.0, 0.5, 40.0]),
    ),
    max_size=40,
)


@settings(max_examples=150, deadline=None)
@given(
    sessions_st,
    st.sampled_from([None, (250, 500, 1000), (500, 1000, 2000)]),
    st.sampled_from([None, 1800, 7200]),
    st.integers(0, 3000),
)
def test_replay_accounts_for_every_session(sessions, sizes, timeout, burst):
    teams = {"a": Team("a", guarantee_milli=0, burst_milli=burst)}
    r = replay(
        sessions,
        Proposal(sizes=sizes, teams=teams, idle_timeout_seconds=timeout, max_gap_seconds=600),
        devices=[GPUDevice(i, "H100", node=f"n{i // 2}") for i in range(4)],
    )
    assert r.sessions == len(sessions) == r.served + sum(r.refused.values())
    assert 0 <= r.regret <= r.reclaims <= r.served
    assert r.regret_gpu_hours <= r.reclaimed_gpu_hours + 1e-9
    assert r.peak_held_milli <= 4000
    asked = sum(s.gpu_milli * (s.end - s.start) for s in sessions) / H / 1000
    if sizes is None:  # nothing rounded: served + refused + reclaimed is exactly what was asked for
        total = r.served_gpu_hours + sum(r.refused_gpu_hours.values()) + r.reclaimed_gpu_hours
        assert total == pytest.approx(asked)


# -- advisor --------------------------------------------------------------------


def test_givable_sizes_follow_the_backend():
    assert givable_sizes("whole", max_gpus=2) == [1000, 2000]
    assert givable_sizes("timeslice", {"replicas": 4}, max_gpus=1) == [250, 500, 750, 1000]
    assert givable_sizes("timeslice", {"replicas": 3}, max_gpus=1) == [334, 667, 1000]
    assert givable_sizes("mig", model="A100-40GB", max_gpus=1)[:3] == [143, 250, 286]
    assert givable_sizes("hami", max_gpus=1)[:2] == [10, 20]
    with pytest.raises(AdvisorError, match="MIG"):
        givable_sizes("mig", model="T4")


def test_recommend_covers_every_request_and_beats_the_shipped_sizes():
    demand = demand_from([(810, 10), (470, 8), (320, 4), (1000, 20), (2000, 1), (8000, 1)])
    advice = recommend(demand, "kai", max_sizes=6, current=[250, 500, 1000, 2000, 4000, 8000])
    assert len(advice.sizes) <= 6 and max(advice.sizes) >= 8000
    assert advice.efficiency >= advice.current_efficiency and advice.predicted_gain >= 0
    with pytest.raises(AdvisorError, match="no recorded"):
        recommend({}, "kai")


@settings(max_examples=200, deadline=None)
@given(
    st.dictionaries(
        st.one_of(st.integers(1, 1000), st.sampled_from([2000, 3000, 4000, 8000])),
        st.floats(0.1, 100),
        min_size=1,
        max_size=12,
    ),
    st.sampled_from(["whole", "timeslice", "hami", "kai"]),
    st.integers(1, 8),
)
def test_advice_is_givable_covering_and_no_worse_than_any_subset_of_its_candidates(demand, backend, n):
    advice = recommend(demand, backend, max_sizes=n)
    givable = set(givable_sizes(backend, max_gpus=8))
    assert set(advice.sizes) <= givable and len(advice.sizes) <= n
    req, alloc, lost = efficiency_of(demand, advice.sizes)
    assert lost == 0  # every recorded request finds a size
    assert 0 < advice.efficiency <= 1 + 1e-12
    # exactness: no catalog of the same candidates and size limit wastes less (checked by brute force)
    from itertools import combinations

    candidates = sorted({min(s for s in givable if s >= m) for m in demand})
    best = min(
        efficiency_of(demand, c)[1]
        for k in range(1, min(n, len(candidates)) + 1)
        for c in combinations(candidates, k)
        if max(c) >= max(demand)
    )
    assert alloc <= best + 1e-6


def test_the_advice_never_shrinks_what_can_be_asked_for():
    # a month with only shared-GPU sessions must not drop today's 8-GPU size
    advice = recommend(demand_from([(470, 5), (810, 3)]), "kai", current=[250, 500, 1000, 8000])
    assert max(advice.sizes) == 8000 and 470 in advice.sizes and 810 in advice.sizes


def test_a_team_replay_still_shares_the_gpus_with_other_teams():
    sessions = [RecordedSession("b1", "b", "bob", 1000, 0, 2 * H), RecordedSession("a1", "a", "ann", 500, 60, H)]
    one_gpu = [GPUDevice(0, "H100")]
    r = replay(sessions, Proposal(), devices=one_gpu, team="a")
    assert r.sessions == 1 and r.refused["no device fits"] == 1 and r.served == 0
    assert set(r.by_team) == {"a"}
    assert replay(sessions, Proposal(), devices=one_gpu).served == 1  # the whole hub: b's session counts


def test_budgets_in_the_replay_refuse_or_admit_over_quota_at_100_percent():
    from spawner.core.budgets import OVER_QUOTA, REFUSE, Budget

    day = 86400
    t0 = 1_764_547_200  # 2025-12-01 00:00 UTC
    # alice uses 1 GPU for 2 h on each of three days; a budget of 4 GPU-hours a month is spent after two
    sessions = [RecordedSession(f"s{d}", "vision", "alice", 1000, t0 + d * day, t0 + d * day + 2 * H) for d in range(3)]
    nlp = RecordedSession("n", "nlp", "nina", 1000, t0 + 2 * day, t0 + 2 * day + H)
    teams = {"vision": Team("vision", guarantee_milli=2000, burst_milli=4000)}
    refuse = Proposal(teams=teams, budgets=(Budget("vision", 4000, at_limit=REFUSE),))
    r = replay([*sessions, nlp], refuse)
    assert r.refused["budget"] == 1 and r.served == 3 and r.refused_gpu_hours["budget"] == pytest.approx(2.0)
    over = replay([*sessions, nlp], Proposal(teams=teams, budgets=(Budget("vision", 4000, at_limit=OVER_QUOTA),)))
    assert over.refused["budget"] == 0 and over.served == 4 and over.budget_over_quota == 1
    # a new month resets it: the third session a month later is admitted as usual
    later = [*sessions[:2], RecordedSession("s3", "vision", "alice", 1000, t0 + 31 * day, t0 + 31 * day + H)]
    assert replay(later, refuse).refused["budget"] == 0
    # without budgets nothing changes
    assert replay([*sessions, nlp], Proposal(teams=teams)).refused["budget"] == 0
