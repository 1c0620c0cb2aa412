"""Quota per GPU pool, departments over teams and fair-share reclaim, in the one ledger.

The catalog sections (``pools``, ``departments``, a team's ``pools``, ``department``,
``fair_share_weight``), the ledger's admission with them (refusals in words), the
what-if replay following them, and hypothesis invariants: nothing is admitted past a
pool's burst, a department's burst, and reclaim takes from the team furthest over its
weighted share first.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from spawner.core.catalog import CatalogError, catalog_from_dict, catalog_to_dict
from spawner.core.ledger import RUNNING, Ledger, Workload
from spawner.core.model import Team
from spawner.core.policy import choices_for_user, team_summary
from spawner.core.quota_tree import (
    Borrower,
    Department,
    PoolQuota,
    Reclaimable,
    fair_shares,
    reclaim_choice,
    weighted_share,
)
from spawner.core.whatif import Proposal, RecordedSession, replay

POOLS = [
    {"name": "h100", "gpu_model": "H100-80GB", "sharing": "whole"},
    {"name": "t4", "gpu_model": "T4-16GB"},
    {"name": "inference", "node_labels": {"pool": "inference"}},
]
PROFILES = [
    {"slug": "h100-1", "gpus": 1, "gpu_model": "H100-80GB"},
    {"slug": "h100-2", "gpus": 2, "gpu_model": "H100-80GB"},
    {"slug": "t4-1", "gpus": 1, "gpu_model": "T4-16GB"},
    {"slug": "serve", "gpus": 1, "pool": "inference"},
    {"slug": "any-1", "gpus": 1},
]


def catalog(teams, departments=None, pools=POOLS, profiles=PROFILES):
    data = {"pools": pools, "profiles": profiles, "teams": teams}
    if departments is not None:
        data["departments"] = departments
    return catalog_from_dict(data)


VISION = {
    "name": "vision",
    "users": ["alice", "bob"],
    "guarantee": 4,
    "burst": 6,
    "pools": {"h100": {"guarantee": 2, "burst": 4}},
}


def ledger_of(c):
    return Ledger(c.teams, c.departments, c.profile_pools)


# -- the catalog -------------------------------------------------------------


def test_profiles_belong_to_the_pool_of_their_model_or_the_one_they_name():
    c = catalog([VISION])
    assert c.pool_of(c.profiles["h100-2"]) == "h100"
    assert c.pool_of(c.profiles["t4-1"]) == "t4"
    assert c.pool_of(c.profiles["serve"]) == "inference"
    assert c.pool_of(c.profiles["any-1"]) == ""
    assert c.teams["vision"].pools == (PoolQuota("h100", 2000, 4000),)


def test_a_pool_with_a_backend_takes_only_that_backends_profiles():
    c = catalog(
        [VISION],
        pools=[{"name": "h100", "gpu_model": "H100-80GB", "sharing": "timeslice"}],
        profiles=[{"slug": "h100-1", "gpus": 1, "gpu_model": "H100-80GB"}],
    )
    assert c.pool_of(c.profiles["h100-1"]) == ""  # the cluster default is whole GPUs


def test_a_catalog_without_pools_or_departments_means_what_it_meant_and_round_trips():
    plain = catalog_from_dict({"teams": [{"name": "vision", "guarantee": 2}], "profiles": PROFILES[:1]})
    assert plain.teams["vision"].pools == () and plain.teams["vision"].department is None
    assert "pools" not in catalog_to_dict(plain) and "departments" not in catalog_to_dict(plain)
    c = catalog(
        [{**VISION, "department": "research", "fair_share_weight": 2.5}],
        [{"name": "research", "guarantee": 8, "burst": 12, "pools": {"h100": {"guarantee": 4, "burst": 6}}}],
    )
    again = catalog_from_dict(catalog_to_dict(c))
    assert again.teams == c.teams and again.departments == c.departments and again.pools == c.pools


@pytest.mark.parametrize(
    ("teams", "departments", "words"),
    [
        ([{**VISION, "pools": {"h200": {"guarantee": 1}}}], None, ["teams[0].pools.h200", "unknown pool 'h200'"]),
        ([{**VISION, "department": "reserch"}], [{"name": "research", "guarantee": 8}], ["did you mean 'research'"]),
        ([{**VISION, "department": "research"}], None, ["unknown department", "add a 'departments' section"]),
        ([{**VISION, "pools": {"h100": {"guarantee": 3, "burst": 2}}}], None, ["below the guarantee"]),
        (
            [{**VISION, "pools": {"h100": {"guarantee": 7, "burst": 7}}}],
            None,
            ["more than its burst limit in all pools"],
        ),
        ([{**VISION, "fair_share_weight": -1}], None, ["fair_share_weight", "from 0 to 1000"]),
        ([{**VISION, "fair_share_weight": "heavy"}], None, ["fair_share_weight"]),
        ([{**VISION, "pools": {"h100": {"guarantee": 1, "limit": 2}}}], None, ["unknown key"]),
        ([{**VISION, "pools": ["h100"]}], None, ["expected a mapping of pool name"]),
        (
            [{**VISION, "department": "research"}],
            [{"name": "research", "guarantee": 3, "burst": 8}],
            ["department research guarantees 3 GPUs, less than its teams' guarantees (4 GPUs: vision)"],
        ),
        (
            [{**VISION, "department": "research"}],
            [{"name": "research", "guarantee": 8, "pools": {"h100": {"guarantee": 1}}}],
            ["guarantees 1 GPUs in pool h100, less than its teams' guarantees there (2 GPUs)"],
        ),
    ],
)
def test_bad_pools_and_departments_are_refused_with_the_key_that_is_wrong(teams, departments, words):
    with pytest.raises(CatalogError) as e:
        catalog(teams, departments)
    for w in words:
        assert w in str(e.value), str(e.value)


def test_bad_pool_definitions_are_refused():
    for pools, word in [
        ([{"name": "h100"}], "names a gpu_model"),
        ([{"name": "H100", "gpu_model": "H100-80GB"}], "pool name"),
        ([{"name": "a", "gpu_model": "x", "sharing": "magic"}], "unknown sharing backend"),
        ([{"name": "a", "gpu_model": "x"}, {"name": "a", "gpu_model": "y"}], "duplicate pool name"),
        ([{"name": f"p{i}", "gpu_model": "x"} for i in range(1001)], "at most 1000"),
    ]:
        with pytest.raises(CatalogError) as e:
            catalog_from_dict({"pools": pools, "teams": []})
        assert word in str(e.value)
    with pytest.raises(CatalogError, match="unknown pool 'infer'"):
        catalog([VISION], profiles=[{"slug": "s", "gpus": 1, "pool": "infer"}])


# -- admission per pool --------------------------------------------------------


def test_a_pool_quota_bounds_that_pool_and_the_total_still_bounds_all():
    c = catalog([VISION])
    ledger = ledger_of(c)
    first = ledger.reserve("notebook:alice/", "vision", "alice", 2000, profile="h100-2")
    assert first.allowed and not first.over_quota and first.pool == "h100"
    # past the pool's guarantee (2 H100) but within its burst: admitted, preemptible
    second = ledger.reserve("notebook:bob/", "vision", "bob", 1000, profile="h100-1")
    assert second.allowed and second.over_quota
    ledger.reserve("notebook:bob/b", "vision", "bob", 1000, profile="h100-1")
    refused = ledger.admit("vision", "alice", 1000, profile="h100-1")
    assert not refused.allowed
    assert refused.reason == ("team vision holds 4 of its 4 GPU burst limit in pool h100; this request needs 1")
    # the H100 pool is full; T4 still fits within the total (6), in quota? total 4+1 > 4: over
    t4 = ledger.admit("vision", "alice", 1000, profile="t4-1")
    assert t4.allowed and t4.over_quota and t4.pool == "t4"
    ledger.reserve("notebook:alice/t", "vision", "alice", 2000, profile="t4-1")
    total = ledger.admit("vision", "alice", 1000, profile="serve")
    assert total.reason == "team vision holds 6 of its 6 GPU burst limit; this request needs 1"


def test_in_quota_only_work_is_refused_past_the_pools_guarantee():
    c = catalog([VISION])
    ledger = ledger_of(c)
    ledger.reserve("a", "vision", "alice", 2000, profile="h100-2")
    d = ledger.admit("vision", "alice", 1000, may_burst=False, profile="h100-1")
    assert not d.allowed
    assert "holds 2 of its 2 GPU guarantee in pool h100; this work is never admitted over quota" in d.reason


def test_work_adopted_from_the_cluster_gets_its_profiles_pool():
    c = catalog([VISION])
    ledger = ledger_of(c)
    ledger.rebuild([Workload("notebook:alice/", "vision", "alice", 2000, "h100-2", state=RUNNING)])
    assert ledger.get("notebook:alice/").pool == "h100"
    assert ledger.pool_usage("vision", "h100").held_milli == 2000
    assert ledger.pool_usage("vision", "t4") is None  # no quota of its own there


def test_the_spawn_page_says_what_is_free_in_the_pool():
    c = catalog([VISION])
    ledger = ledger_of(c)
    ledger.reserve("a", "vision", "alice", 2000, profile="h100-2")
    by_slug = {ch.profile.slug: ch for ch in choices_for_user(c, ledger, "alice")}
    assert by_slug["h100-1"].team_summary == "2 of 4 H100-80GB free for team vision (4 of 6 GPUs in all)"
    assert by_slug["t4-1"].team_summary == "4 of 6 GPUs free for team vision"
    assert team_summary(ledger, c.teams["vision"]) == "4 of 6 GPUs free for team vision"


# -- departments -------------------------------------------------------------------


def two_teams(weights=(1.0, 1.0), dept_burst=8):
    return catalog(
        [
            {
                "name": "vision",
                "users": ["alice"],
                "guarantee": 2,
                "burst": 8,
                "department": "research",
                "fair_share_weight": weights[0],
            },
            {
                "name": "nlp",
                "users": ["nina"],
                "guarantee": 2,
                "burst": 8,
                "department": "research",
                "fair_share_weight": weights[1],
            },
            {"name": "ops", "users": ["otto"], "guarantee": 1, "burst": 8},
        ],
        [{"name": "research", "guarantee": 4, "burst": dept_burst}],
    )


def test_a_teams_borrowing_is_bounded_by_its_department():
    c = two_teams()
    ledger = ledger_of(c)
    for i in range(6):
        assert ledger.reserve(f"v{i}", "vision", "alice", 1000, profile="any-1").allowed
    assert ledger.department_usage("research").held_milli == 6000
    d = ledger.admit("nlp", "nina", 1000, profile="any-1")
    # nlp is within its own guarantee, but research holds 6 + nlp's 2 would make 8: admitted
    assert d.allowed and not d.over_quota
    ledger.reserve("n0", "nlp", "nina", 2000, profile="any-1")
    refused = ledger.admit("nlp", "nina", 1000, profile="any-1")
    assert not refused.allowed
    assert refused.reason.startswith("department research holds 8 of its 8 GPU burst limit; this request needs 1")
    # a team outside the department is not bounded by it
    assert ledger.admit("ops", "otto", 1000, profile="any-1").allowed


def test_reclaim_takes_from_the_team_furthest_over_its_weighted_share():
    # vision weighs 3, nlp 1: vision may borrow three times as much before it is "further over"
    c = catalog(
        [
            {
                "name": "vision",
                "users": ["alice"],
                "guarantee": 1,
                "burst": 10,
                "department": "research",
                "fair_share_weight": 3,
            },
            {"name": "nlp", "users": ["nina"], "guarantee": 1, "burst": 10, "department": "research"},
            {"name": "audio", "users": ["ada"], "guarantee": 2, "burst": 10, "department": "research"},
        ],
        [{"name": "research", "guarantee": 4, "burst": 8}],
    )
    ledger = ledger_of(c)
    for i in range(4):  # vision: 1 in quota + 3 borrowed (share 3 / 3 = 1)
        ledger.reserve(f"vision-{i}", "vision", "alice", 1000, profile="any-1")
    for i in range(3):  # nlp: 1 in quota + 2 borrowed (share 2 / 1 = 2)
        ledger.reserve(f"nlp-{i}", "nlp", "nina", 1000, profile="any-1")
    ledger.reserve("audio-0", "audio", "ada", 1000, profile="any-1")
    assert ledger.department_usage("research").held_milli == 8000
    # audio's second GPU is in its guarantee: reclaim takes nlp's borrowed work (share 2 > 1)
    d = ledger.admit("audio", "ada", 1000, profile="any-1")
    assert not d.allowed and "reclaim would take back 1 borrowed, preemptible workload" in d.reason
    (key,) = d.reclaim
    assert key.startswith("nlp-") and ledger.get(key).over_quota
    # two GPUs: nlp's first (share 2 -> 1), then vision's (3 / 3 = 1, and nlp's is 1 too: ties go to the later name)
    assert [
        k.split("-")[0]
        for k in reclaim_choice(
            2000,
            [Borrower("vision", 3000, 3.0), Borrower("nlp", 2000, 1.0)],
            [Reclaimable(w.key, w.team, w.milli) for w in ledger.workloads() if w.over_quota],
            requester="audio",
        )
    ] == ["nlp", "vision"]


def test_a_borrowing_request_never_reclaims_from_teams_at_or_below_its_own_share_after():
    # shares are borrowed milli-GPUs per unit of weight: both 1000
    borrowers = [Borrower("vision", 2000, 2.0), Borrower("nlp", 1000, 1.0)]
    work = [Reclaimable("v", "vision", 1000), Reclaimable("n", "nlp", 1000)]
    # audio would borrow 1 GPU at weight 1: share 1000, not below the others': nothing is taken
    assert reclaim_choice(1000, borrowers, work, requester="audio", requester_share_after=1000.0) == ()
    # at weight 4 its share after is 250: it may take back (the tie at 1000 goes to the later name)
    assert reclaim_choice(1000, borrowers, work, requester="audio", requester_share_after=250.0) == ("v",)
    assert reclaim_choice(5000, borrowers, work, requester="audio") == ()  # not enough to take back


def test_idle_capacity_is_shared_by_weight():
    assert fair_shares(6000, {"vision": 10_000, "nlp": 10_000}, {"vision": 2, "nlp": 1}) == {
        "vision": 4000,
        "nlp": 2000,
    }
    # what one does not want goes to the other
    assert fair_shares(6000, {"vision": 1000, "nlp": 10_000}, {"vision": 2, "nlp": 1}) == {
        "vision": 1000,
        "nlp": 5000,
    }
    assert weighted_share(0, 0) == 0.0 and weighted_share(1, 0) == float("inf")


# -- invariants -----------------------------------------------------------------------

OPS = st.lists(
    st.tuples(
        st.sampled_from(["reserve", "reserve", "release"]),
        st.sampled_from(["vision", "nlp", "ops"]),
        st.sampled_from(["h100-1", "h100-2", "t4-1", "any-1", "serve"]),
        st.integers(0, 40),
        st.booleans(),
    ),
    max_size=60,
)


@settings(max_examples=250, deadline=None)
@given(
    ops=OPS,
    pool_g=st.integers(0, 4),
    pool_extra=st.integers(0, 4),
    dept_extra=st.integers(0, 6),
    weights=st.tuples(st.integers(0, 4), st.integers(0, 4)),
)
def test_never_over_a_pools_or_a_departments_burst(ops, pool_g, pool_extra, dept_extra, weights):
    c = catalog(
        [
            {
                "name": "vision",
                "users": ["u"],
                "guarantee": 2,
                "burst": 8,
                "department": "research",
                "fair_share_weight": weights[0],
                "pools": {"h100": {"guarantee": pool_g, "burst": pool_g + pool_extra}},
            },
            {
                "name": "nlp",
                "users": ["u"],
                "guarantee": 1,
                "burst": 6,
                "department": "research",
                "fair_share_weight": weights[1],
            },
            {"name": "ops", "users": ["u"], "guarantee": 1, "burst": 3, "pools": {"t4": {"guarantee": 0, "burst": 1}}},
        ],
        [
            {
                "name": "research",
                "guarantee": 3 + pool_g,
                "burst": 3 + pool_g + dept_extra,
                "pools": {"h100": {"guarantee": pool_g, "burst": pool_g + dept_extra}},
            }
        ],
    )
    ledger = ledger_of(c)
    keys: list[str] = []
    for n, (op, team, profile, pick, may_burst) in enumerate(ops):
        if op == "release" and keys:
            ledger.release(keys.pop(pick % len(keys)))
            continue
        milli = c.profiles[profile].gpu_milli
        d = ledger.reserve(f"w{n}", team, "u", milli, profile=profile, may_burst=may_burst)
        if d.allowed:
            keys.append(f"w{n}")
        else:
            assert d.reason  # a refusal always says why
            for k in d.reclaim:  # reclaim names only borrowed work of other teams of the department
                w = ledger.get(k)
                assert w is not None and w.over_quota and w.team != team
                assert c.teams[w.team].department == c.teams[team].department
        for t in c.teams.values():
            u = ledger.usage(t.name)
            assert u.held_milli <= t.burst_milli
            for q in t.pools:
                assert ledger.held_in_pools(t.name).get(q.pool, 0) <= q.burst_milli
        dept = c.departments["research"]
        du = ledger.department_usage("research")
        assert du.held_milli <= dept.burst_milli
        assert du.held_milli == sum(ledger.usage(t).held_milli for t in ("vision", "nlp"))
        for q in dept.pools:
            assert ledger.department_pools("research").get(q.pool, 0) <= q.burst_milli
        # in-quota work never exceeds a guarantee, per team and per pool
        for t in c.teams.values():
            assert ledger.usage(t.name).in_quota_milli <= t.guarantee_milli


@settings(max_examples=300, deadline=None)
@given(
    teams=st.lists(st.tuples(st.integers(0, 8), st.integers(0, 5)), min_size=1, max_size=5),
    sizes=st.lists(st.sampled_from([250, 500, 1000, 2000]), min_size=1, max_size=20),
    need=st.integers(1, 8000),
)
def test_reclaim_order_is_by_weighted_share(teams, sizes, need):
    borrowers = [Borrower(f"t{i}", 0, float(w)) for i, (_, w) in enumerate(teams)]
    work = []
    for n, size in enumerate(sizes):
        team = f"t{n % len(teams)}"
        work.append(Reclaimable(f"k{n}", team, size))
    held = {b.team: sum(w.milli for w in work if w.team == b.team) for b in borrowers}
    borrowers = [Borrower(b.team, held[b.team], b.weight) for b in borrowers]
    chosen = reclaim_choice(need, borrowers, work)
    by_key = {w.key: w for w in work}
    if not chosen:
        assert sum(held.values()) < need
        return
    assert sum(by_key[k].milli for k in chosen) >= need
    state = dict(held)
    weight = {b.team: b.weight for b in borrowers}
    for k in chosen:  # each step takes from a team whose share is the highest among those with work left
        w = by_key[k]
        left = {t for t in state if any(x.team == t and x.key not in chosen[: chosen.index(k)] for x in work)}
        top = max(weighted_share(state[t], weight[t]) for t in left)
        assert weighted_share(state[w.team], weight[w.team]) == top
        state[w.team] -= w.milli


# -- the what-if replay follows --------------------------------------------------------------


def test_the_what_if_replay_refuses_past_a_pool_quota():
    c = catalog([{**VISION, "burst": 10}])
    sessions = [
        RecordedSession(f"s{i}", "vision", "alice", 1000, start=i, end=1000 + i, profile="h100-1") for i in range(6)
    ]
    out = replay(sessions, Proposal(teams=dict(c.teams), profile_pools=c.profile_pools))
    assert out.served == 4 and out.refused["quota"] == 2  # the H100 pool's burst is 4
    flat = replay(sessions, Proposal(teams={"vision": Team("vision", guarantee_milli=4000, burst_milli=10_000)}))
    assert flat.served == 6


def test_the_what_if_replay_follows_departments():
    c = two_teams(dept_burst=5)
    sessions = [
        RecordedSession(f"s{i}", "vision" if i % 2 else "nlp", "u", 1000, start=i, end=1000 + i, profile="any-1")
        for i in range(8)
    ]
    out = replay(
        sessions, Proposal(teams=dict(c.teams), departments=dict(c.departments), profile_pools=c.profile_pools)
    )
    assert out.served == 5 and out.refused["quota"] == 3


def test_department_usage_follows_a_team_moving_department():
    c = two_teams()
    ledger = ledger_of(c)
    ledger.reserve("v", "vision", "alice", 3000, profile="any-1")
    assert ledger.department_usage("research").held_milli == 3000
    moved = {**c.teams, "vision": Team("vision", guarantee_milli=2000, burst_milli=8000)}
    ledger.set_teams(moved, [Department("research", "", 4000, 8000)])
    assert ledger.department_usage("research").held_milli == 0
