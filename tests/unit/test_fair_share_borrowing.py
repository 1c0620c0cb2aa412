"""Weighted borrowing in the one ledger: idle capacity of a department shared by
``fair_share_weight`` between teams that want it (spawner/core/ledger_tree.py).

"Demand" is the spawn queue's waiting work (``Ledger.set_waiting``): a team may borrow
past its weighted fair share only while no other team of the department waits below its
own. The hypothesis invariants: nobody waiting means first-come as before (no idle
capacity is held back); an admission while others wait below their share never takes the
borrower past its own; refusals say it in words; teams that all keep asking end up
borrowing in the ratio of their weights.
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from spawner.core.catalog import catalog_from_dict
from spawner.core.ledger import Ledger
from spawner.core.ledger_tree import TeamState, department_fair_shares, fair_share_refusal
from spawner.core.quota_tree import borrowed, fair_shares, weighted_share

PROFILES = [{"slug": "any-1", "gpus": 1}]


def research(weights=(1, 3), burst=4, guarantees=(0, 0), third_guarantee=0):
    teams = [
        {
            "name": "nlp",
            "users": ["nina"],
            "guarantee": guarantees[0],
            "burst": 8,
            "department": "research",
            "fair_share_weight": weights[0],
        },
        {
            "name": "vision",
            "users": ["alice"],
            "guarantee": guarantees[1],
            "burst": 8,
            "department": "research",
            "fair_share_weight": weights[1],
        },
        {"name": "ops", "users": ["otto"], "guarantee": 1, "burst": 8},
    ]
    if third_guarantee:
        teams.append(
            {"name": "audio", "users": ["ada"], "guarantee": third_guarantee, "burst": 8, "department": "research"}
        )
    c = catalog_from_dict(
        {
            "profiles": PROFILES,
            "teams": teams,
            "departments": [{"name": "research", "guarantee": sum(guarantees) + third_guarantee, "burst": burst}],
        }
    )
    return Ledger(c.teams, c.departments, c.profile_pools)


def test_with_nobody_waiting_idle_capacity_goes_first_come():
    ledger = research()
    for i in range(4):
        assert ledger.reserve(f"n{i}", "nlp", "nina", 1000).allowed
    assert ledger.usage("nlp").held_milli == 4000


def test_a_team_past_its_share_waits_while_a_heavier_team_waits_below_its_own():
    ledger = research()
    ledger.set_waiting([("vision", 1000)] * 3)  # vision (weight 3) has three GPUs in the queue
    assert ledger.reserve("n0", "nlp", "nina", 1000).allowed  # nlp's share: 1 of 4
    refused = ledger.reserve("n1", "nlp", "nina", 1000)
    assert not refused.allowed and refused.reclaim == ()
    assert refused.reason == (
        "team nlp would borrow 2 GPUs, past its fair share of 1 GPUs of department research's idle "
        "capacity (weight 1 of 4), while team vision waits with 0 of its fair share of 3 GPUs"
    )
    # vision's own queued work fits (the queue asks whether it fits: it is part of its waiting)
    for i in range(3):
        assert ledger.admit("vision", "alice", 1000).allowed
        assert ledger.reserve(f"v{i}", "vision", "alice", 1000).allowed
        ledger.set_waiting([("vision", 1000)] * (2 - i))
    assert (ledger.usage("nlp").held_milli, ledger.usage("vision").held_milli) == (1000, 3000)
    # a team outside the department is not part of it
    assert ledger.reserve("o0", "ops", "otto", 3000).allowed


def test_a_team_within_its_guarantee_is_never_held_back_by_weights():
    ledger = research(guarantees=(2, 0), burst=6)
    ledger.set_waiting([("vision", 1000)] * 8)
    assert ledger.reserve("n0", "nlp", "nina", 2000).allowed  # its guarantee
    assert not ledger.reserve("n1", "nlp", "nina", 2000).allowed  # 2 borrowed past its share of 1


def test_what_a_waiting_team_cannot_use_goes_to_the_others():
    ledger = research(weights=(1, 3), burst=4)
    ledger.set_waiting([("vision", 1000)])  # vision wants only one GPU: nlp's share is the other 3
    for i in range(3):
        assert ledger.reserve(f"n{i}", "nlp", "nina", 1000).allowed
    assert not ledger.reserve("n3", "nlp", "nina", 1000).allowed
    ledger.set_waiting([])
    assert ledger.reserve("n3", "nlp", "nina", 1000).allowed  # nobody waits: first come


def test_a_weight_of_zero_borrows_only_what_nobody_else_wants():
    ledger = research(weights=(0, 1))
    ledger.set_waiting([("vision", 1000)])
    assert not ledger.admit("nlp", "nina", 1000).allowed
    ledger.set_waiting([])
    assert ledger.admit("nlp", "nina", 1000).allowed


def test_waiting_is_replaced_and_read_back():
    ledger = research()
    ledger.set_waiting([("vision", 1500), ("nlp", 0), ("vision", 500)])
    assert ledger.waiting() == {"vision": 2000}


# -- invariants -----------------------------------------------------------------------

TEAM = st.builds(
    TeamState,
    name=st.sampled_from(["a", "b", "c", "d"]),
    held=st.integers(0, 8000),
    guarantee=st.integers(0, 3000),
    burst=st.integers(3000, 10_000),
    weight=st.sampled_from([0.0, 0.5, 1.0, 2.0, 3.0]),
    waiting=st.sampled_from([0, 0, 500, 1000, 4000]),
).map(lambda t: TeamState(t.name, t.held, t.guarantee, t.burst, t.weight, t.waiting, min(t.waiting, 1000)))


def _unique(teams):
    seen = {}
    for t in teams:
        seen.setdefault(t.name, t)
    return list(seen.values())


def _key(t, milli):
    return (weighted_share(borrowed(t.held + milli, t.guarantee), t.weight), t.name)


@settings(max_examples=400, deadline=None)
@given(
    teams=st.lists(TEAM, min_size=1, max_size=4).map(_unique),
    extra=st.integers(0, 20_000),
    milli=st.integers(1, 3000),
)
def test_refusals_only_while_another_waits_first_in_fair_share_order(teams, extra, milli):
    held = sum(t.held for t in teams)
    burst = held + extra
    me = teams[0]
    waiting = [t for t in teams[1:] if t.waiting > 0]
    said = fair_share_refusal("research", burst, held, me, waiting, lambda: teams, milli)
    shares = department_fair_shares(teams, burst, me.name, milli)
    after = borrowed(me.held + milli, me.guarantee)
    first = [
        t for t in teams[1:] if 0 < t.next <= extra and t.held + t.next <= t.burst and _key(t, t.next) < _key(me, milli)
    ]
    if said:
        # refused: past its own share, while another team waits whose request fits now and comes first
        assert after > shares[me.name] and first
        assert said.startswith(f"team {me.name} would borrow ") and " waits with " in said
    else:
        assert not first or after <= shares[me.name]
    # the ledger's O(1) shortcut (for a request within the team's burst, which the ledger checked
    # first): idle capacity covering the request and all waiting work refuses nothing
    if me.weight > 0 and me.held + milli <= me.burst and extra >= milli + sum(t.waiting for t in teams):
        assert not said
    # the shares never hand out more than the department can lend, nor more than asked
    borrowable = max(0, burst - sum(min(t.held, t.guarantee) for t in teams))
    assert sum(shares.values()) <= borrowable
    assert all(shares[t.name] <= t.demand(max(0, milli - t.waiting) if t is me else 0) for t in teams)


@settings(max_examples=300, deadline=None)
@given(teams=st.lists(TEAM, min_size=1, max_size=4).map(_unique), extra=st.integers(0, 20_000))
def test_of_teams_whose_next_request_fits_one_is_always_admitted(teams, extra):
    """No deadlock: when requests that fit the idle capacity compete, one of them goes in."""
    held = sum(t.held for t in teams)
    fitting = [t for t in teams if 0 < t.next <= extra and t.held + t.next <= t.burst]
    admitted = [
        t
        for t in fitting
        if not fair_share_refusal(
            "r", held + extra, held, t, [o for o in teams if o is not t and o.waiting > 0], lambda: teams, t.next
        )
    ]
    assert admitted or not fitting


@settings(max_examples=150, deadline=None)
@given(
    weights=st.tuples(st.integers(1, 4), st.integers(1, 4)),
    burst=st.integers(2, 12),
    order=st.lists(st.booleans(), min_size=40, max_size=40),
)
def test_teams_that_keep_asking_borrow_in_the_ratio_of_their_weights(weights, burst, order):
    """Both teams always have work waiting; GPUs are asked for one at a time in any order
    (a team refused asks again later). Each ends within one GPU of its weighted split."""
    ledger = research(weights=weights, burst=burst)
    ledger.set_waiting([("nlp", 1000), ("vision", 1000)] * 50)
    n = 0
    for nlp_first in order:
        for team, user in (
            (("nlp", "nina"), ("vision", "alice")) if nlp_first else (("vision", "alice"), ("nlp", "nina"))
        ):
            if ledger.reserve(f"{team}-{n}", team, user, 1000).allowed:
                n += 1
    held = {t: ledger.usage(t).held_milli for t in ("nlp", "vision")}
    assert sum(held.values()) == burst * 1000  # work-conserving: the department is full
    # each within one GPU of the weighted split (water-filled: what one team's burst of 8 leaves goes to the other)
    split = fair_shares(burst * 1000, {"nlp": 8000, "vision": 8000}, dict(zip(("nlp", "vision"), weights, strict=True)))
    for team in ("nlp", "vision"):
        assert abs(held[team] - split[team]) <= 1000, (held, weights, split)
    # and never past the department's burst
    assert ledger.department_usage("research").held_milli <= burst * 1000


def test_the_admin_tree_shows_the_fair_share_now_while_a_team_waits():
    from hub_config.domain.quota_tree_view import quota_tree

    c = catalog_from_dict(
        {
            "profiles": PROFILES,
            "teams": [
                {"name": "nlp", "users": ["nina"], "guarantee": 0, "burst": 8, "department": "research"},
                {
                    "name": "vision",
                    "users": ["alice"],
                    "guarantee": 0,
                    "burst": 8,
                    "department": "research",
                    "fair_share_weight": 3,
                },
            ],
            "departments": [{"name": "research", "guarantee": 0, "burst": 4}],
        }
    )
    ledger = Ledger(c.teams, c.departments, c.profile_pools)
    ledger.reserve("n0", "nlp", "nina", 2000)
    teams = {t["name"]: t for t in quota_tree(c, ledger)["departments"][0]["teams"]}
    assert teams["nlp"]["fair_share_now_milli"] is None  # nobody waits: first come
    ledger.set_waiting([("vision", 1000)] * 3)
    teams = {t["name"]: t for t in quota_tree(c, ledger)["departments"][0]["teams"]}
    assert (teams["nlp"]["fair_share_now_milli"], teams["vision"]["fair_share_now_milli"]) == (1000, 3000)
    assert (teams["nlp"]["waiting_milli"], teams["vision"]["waiting_milli"]) == (0, 3000)
    assert teams["nlp"]["weighted_share"] == 2000.0  # borrowed 2 at weight 1: furthest over its share
