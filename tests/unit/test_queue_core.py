"""The spawn queue's pure decisions: order, the bound per user, no overtaking, the predicted start."""

from __future__ import annotations

from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st

from spawner.core.queue import (
    BASIS_HISTORY,
    BASIS_RECLAIM,
    BASIS_TIME_LIMIT,
    BLOCK_CAPACITY,
    BLOCK_TEAM,
    BLOCK_USER,
    CANCELLED,
    STARTING,
    Holder,
    QueueEntry,
    ahead_of,
    enqueue_refusal,
    expected_end,
    next_to_start,
    ordinal,
    position_sentence,
    predict_start,
    prediction_sentence,
    queue_order,
)


def entry(i: int, user: str = "alice", team: str = "vision", milli: int = 500, rank: int = 2, at: float = 0.0, **kw):
    return QueueEntry(
        id=i,
        user=user,
        server_name=kw.pop("server", f"s{i}"),
        team=team,
        profile=kw.pop("profile", "h100-half"),
        milli=milli,
        rank=rank,
        enqueued_at=at if at else float(i),
        gpu_model=kw.pop("model", "H100"),
        **kw,
    )


def test_order_is_priority_class_then_first_come():
    a, b, c = entry(1, at=10), entry(2, at=5), entry(3, at=20, rank=3)
    assert [e.id for e in queue_order([a, b, c])] == [3, 2, 1]
    assert [e.id for e in queue_order([a, replace(b, state=CANCELLED)])] == [1]


def test_one_entry_per_server_and_a_bound_per_user():
    waiting = [entry(1, server=""), entry(2, server="big")]
    assert "already in the queue" in enqueue_refusal(waiting, "alice", "", 3)
    assert enqueue_refusal(waiting, "alice", "other", 3) == ""
    assert "2 of the 2 queue entries" in enqueue_refusal(waiting, "alice", "other", 2)
    assert enqueue_refusal(waiting, "bob", "", 1) == ""


def test_position_counts_only_competitors_ahead():
    q = [entry(1, team="vision"), entry(2, team="nlp", model="T4"), entry(3, team="vision")]
    assert [e.id for e in ahead_of(q, q[2])] == [1]
    assert position_sentence(2, "0.5 × H100", "vision") == "You are 2nd in line for 0.5 × H100 in team vision"
    assert position_sentence(1, "0.5 × H100", "vision").startswith("You are next in line")
    assert [ordinal(n) for n in (1, 2, 3, 4, 11, 12, 13, 21, 22, 101, 111)] == [
        "1st",
        "2nd",
        "3rd",
        "4th",
        "11th",
        "12th",
        "13th",
        "21st",
        "22nd",
        "101st",
        "111th",
    ]


def test_a_blocked_entry_is_not_overtaken_by_its_team_but_other_teams_go():
    big, small, other = entry(1, milli=2000), entry(2, user="bob"), entry(3, team="nlp", model="T4")
    fits = {1: BLOCK_TEAM, 2: "", 3: ""}
    assert next_to_start([big, small, other], lambda e: fits[e.id]) is other
    # the user's own cap blocks only that user's later entries in the team
    fits = {1: BLOCK_USER, 2: "", 3: ""}
    assert next_to_start([big, small, other], lambda e: fits[e.id]) is small
    # no free device of the model: later entries for it wait, the T4 one goes
    fits = {1: BLOCK_CAPACITY, 2: "", 3: ""}
    assert next_to_start([big, entry(2, team="nlp"), other], lambda e: fits[e.id]) is other


def test_an_entry_being_started_is_skipped():
    starting = replace(entry(1), state=STARTING)
    assert next_to_start([starting, entry(2, user="bob")], lambda e: "").id == 2


# the queue's fairness, for any queue: the chosen entry fits, and no earlier waiting entry
# that competes for the same team fits (it would have been chosen) or blocks it.
entries = st.lists(
    st.builds(
        entry,
        st.integers(1, 10_000),
        user=st.sampled_from(["alice", "bob", "carol"]),
        team=st.sampled_from(["vision", "nlp"]),
        milli=st.sampled_from([250, 500, 1000, 2000]),
        rank=st.integers(1, 4),
        at=st.floats(1, 1e6),
    ),
    max_size=12,
    unique_by=lambda e: e.id,
)


@settings(max_examples=300, deadline=None)
@given(entries, st.data())
def test_next_to_start_never_overtakes(queue, data):
    blocks = {e.id: data.draw(st.sampled_from(["", BLOCK_TEAM, BLOCK_USER, BLOCK_CAPACITY])) for e in queue}
    chosen = next_to_start(queue, lambda e: blocks[e.id])
    ordered = queue_order(queue)
    if chosen is None:
        assert all(blocks[e.id] for e in ordered if not ahead_blocked(ordered, e, blocks))
        return
    assert blocks[chosen.id] == ""
    for e in ordered[: ordered.index(chosen)]:
        # every earlier entry waits behind one blocked for the same thing (never asked), or was
        # asked and is blocked itself for something the chosen one does not wait for
        if ahead_blocked(ordered, e, blocks):
            continue
        assert blocks[e.id]
        if blocks[e.id] == BLOCK_TEAM:
            assert e.team != chosen.team
        if blocks[e.id] == BLOCK_USER:
            assert (e.team, e.user) != (chosen.team, chosen.user)
        if blocks[e.id] == BLOCK_CAPACITY:
            assert e.gpu_model != chosen.gpu_model


def ahead_blocked(ordered, e, blocks):
    """Is an earlier entry that was itself asked (not waiting behind another) blocked for
    what ``e`` waits for too?"""
    for x in ordered[: ordered.index(e)]:
        if ahead_blocked(ordered, x, blocks):
            continue  # never asked: its block is not known, so it holds nobody back
        b = blocks[x.id]
        if (b == BLOCK_TEAM and x.team == e.team) or (b == BLOCK_USER and (x.team, x.user) == (e.team, e.user)):
            return True
        if b == BLOCK_CAPACITY and x.gpu_model == e.gpu_model:
            return True
    return False


def test_expected_end_takes_the_earliest_bound():
    # a warned-idle server is reclaimed at the end of its grace
    assert expected_end(0, 100, reclaim_at=400, time_limit_end=900) == (400, BASIS_RECLAIM)
    assert expected_end(0, 100, time_limit_end=900) == (900, BASIS_TIME_LIMIT)
    # history: the median of the past sessions longer than this one so far
    assert expected_end(0, 100, [50, 200, 300, 400, 5000]) == (350, BASIS_HISTORY)
    # too little history, nothing else: unknown
    assert expected_end(0, 100, [200, 300]) == (None, "")
    # never in the past
    assert expected_end(0, 1000, time_limit_end=900) == (1000, BASIS_TIME_LIMIT)


def test_predict_start_waits_for_enough_to_free_for_itself_and_those_ahead():
    holders = [
        Holder("a", "vision", 500, "H100", 600, BASIS_HISTORY),
        Holder("b", "vision", 500, "H100", 300, BASIS_RECLAIM),
        Holder("c", "vision", 1000, "H100", None),
    ]
    me = entry(2)
    # alone: the first 0.5 that frees (b at 300)
    p = predict_start(me, [], holders, 100, team_free_milli=0)
    assert p.at == 300 and "idle reclaim" in p.basis
    # one 0.5 ahead in the team: the second one (a at 600)
    p = predict_start(me, [entry(1)], holders, 100, team_free_milli=0)
    assert p.at == 600
    # needs more than the holders with a known end free: no estimate
    p = predict_start(replace(me, milli=2000), [], holders, 100, team_free_milli=0)
    assert p.at is None and "no estimate" in p.basis
    # the team has room but the devices do not: the later of the two
    p = predict_start(me, [], holders, 100, team_free_milli=1000, device_free_milli=0)
    assert p.at == 300
    assert prediction_sentence(p, 100).startswith("Predicted start in about 3 min")


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.tuples(st.sampled_from([250, 500, 1000]), st.one_of(st.none(), st.floats(0, 1e5))), max_size=10),
    st.integers(0, 2000),
    st.sampled_from([250, 500, 1000, 2000]),
)
def test_prediction_is_never_before_now_and_grows_with_those_ahead(raw, free, milli):
    holders = [Holder(f"h{i}", "vision", m, "H100", end) for i, (m, end) in enumerate(raw)]
    me = entry(9, milli=milli)
    alone = predict_start(me, [], holders, 50.0, team_free_milli=free)
    behind = predict_start(me, [entry(1, milli=500)], holders, 50.0, team_free_milli=free)
    if alone.at is not None:
        assert alone.at >= 50.0
    if behind.at is not None:
        assert alone.at is not None and behind.at >= alone.at
