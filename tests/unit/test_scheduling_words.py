"""The scheduler's FailedScheduling messages, in words (spawner/core/scheduling.py)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from spawner.core.scheduling import explain_unschedulable, parse_unschedulable

# Messages as kube-scheduler v1.36 writes them (seen on the test bed).
BUSY = (
    "0/6 nodes are available: 1 Insufficient nvidia.com/gpu.shared, 2 node(s) had untolerated taint "
    "{nvidia.com/gpu: present}, 3 node(s) didn't match Pod's node affinity/selector. preemption: 0/6 "
    "nodes are available: 1 No preemption victims found for incoming pod, 5 Preemption is not helpful "
    "for scheduling."
)
NOWHERE = (
    "0/6 nodes are available: 6 node(s) didn't match Pod's node affinity/selector. preemption: "
    "0/6 nodes are available: 6 Preemption is not helpful for scheduling."
)


def test_busy_capacity_says_it_waits_for_a_free_one():
    words = explain_unschedulable(BUSY, "0.5 × H100")
    assert words == (
        "Waiting for a free 0.5 × H100: every node that offers it is in use right now (of 6 nodes: "
        "1 node with all of nvidia.com/gpu.shared in use; 2 nodes reserved by a taint (nvidia.com/gpu: present) "
        "this server does not tolerate; 3 nodes with another GPU model or pool). "
        "The server starts as soon as one frees up."
    )


def test_no_matching_node_says_so_and_what_to_do():
    words = explain_unschedulable(NOWHERE, "0.5 × H200")
    assert words.startswith(
        "No node in this cluster offers 0.5 × H200 (of 6 nodes: 6 nodes with another GPU model or pool)."
    )
    assert "pick another profile, or ask an admin" in words


def test_parse_counts_and_insufficient_resources():
    u = parse_unschedulable(BUSY)
    assert (u.available, u.total) == (0, 6)
    assert u.insufficient == {"nvidia.com/gpu.shared": 1}
    assert sum(n for n, _ in u.reasons) == 6


def test_other_events_are_left_alone():
    assert explain_unschedulable("Successfully assigned a/b to gpu-1", "x") is None
    assert explain_unschedulable("", "x") is None


@given(st.text(max_size=300))
def test_any_text_gives_none_or_a_sentence(text):
    out = explain_unschedulable(text, "1 × H100")
    assert out is None or out.endswith(".")
