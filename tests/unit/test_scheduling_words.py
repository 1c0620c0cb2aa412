"""The scheduler's FailedScheduling messages, in words (spawner/core/scheduling.py)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from spawner.core.scheduling import explain_scheduler_event, explain_unschedulable, parse_unschedulable

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
        "None of the 6 nodes running now offers 0.5 × H200 (6 nodes with another GPU model or pool)."
    )
    # Not "no node offers it": a node autoscaler may still add one.
    assert "a node autoscaler may be adding one" in words
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


# HAMi's scheduler extender: one FilteringFailed event per reason (pkg/scheduler/score.go,
# recordFilteringFailures: "%d nodes %s(%s)"), reasons from pkg/device/common/common.go.
HAMI_MEMORY = "2 nodes CardInsufficientMemory(gpu-a,gpu-b)"
HAMI_MODEL = "3 nodes CardTypeMismatch(gpu-a,gpu-b,gpu-c)"
HAMI_NONE_LEFT = "no available node, 3 nodes do not meet"  # pkg/scheduler/scheduler.go, Filter


def test_hamis_refusals_in_words_busy_or_never():
    busy = explain_scheduler_event("FilteringFailed", HAMI_MEMORY, "0.5 × H100")
    assert busy == (
        "Waiting for 0.5 × H100: 2 nodes with not enough free GPU memory on any of their GPUs (HAMi). "
        "The server starts as soon as a share frees up."
    )
    never = explain_scheduler_event("FilteringFailed", HAMI_MODEL, "0.5 × H100")
    assert never.startswith("HAMi's scheduler cannot give 0.5 × H100 on 3 nodes: no GPU of the model")
    assert "pick another profile, or ask an admin" in never
    assert explain_scheduler_event("FilteringFailed", HAMI_NONE_LEFT, "0.5 × H100").startswith(
        "Waiting for 0.5 × H100: HAMi's scheduler found none of 3 nodes able to give it now."
    )
    assert explain_scheduler_event("FilteringFailed", "calcScore failed boom for pod x", "0.5 × H100") is None


# KAI's Unschedulable events (pkg/scheduler/api/unschedule_info.go and
# pkg/scheduler/api/common_info/errors.go), with a queue named as the chart names it.
KAI_OVER_QUOTA = (
    "Non-preemptible workload is over quota. Workload requested 1 GPUs, but gpulab-vision quota is 2 GPUs, "
    "while 2 GPUs are already allocated for non-preemptible pods. Use a preemptible workload to go over quota."
)
KAI_LIMIT = (
    "gpulab-vision quota has reached the allowable limit of GPUs. Limit is 3 GPUs, currently 3 GPUs allocated "
    "and workload requested 0.5 GPUs"
)
#: As KAI v0.20.1 recorded it on the test bed (tests/kube/test_kube_cluster_kai_scheduler.py): its
#: FitErrors.Error(), a sorted histogram of the nodes' reasons joined by ". \n".
KAI_NO_NODES = (
    "no nodes with enough resources were found: 1 non MIG jobs cant run on a node with MigStrategy='mixed'. \n"
    "3 node(s) didn't have enough resources: GPUs. \n3 node(s) didn't match Pod's node affinity/selector."
)


def test_kais_refusals_in_words():
    over = explain_scheduler_event("Unschedulable", KAI_OVER_QUOTA, "1 × H100")
    assert over.startswith(
        "Waiting for 1 × H100: in-quota work of queue gpulab-vision already holds 2 of its 2 GPUs and this asks for 1;"
    )
    assert "run it as batch" in over
    assert explain_scheduler_event("Unschedulable", KAI_LIMIT, "0.5 × H100") == (
        "Waiting for 0.5 × H100: queue gpulab-vision holds 3 GPUs, its limit of 3. "
        "It starts when the team's work frees some."
    )
    assert explain_scheduler_event("Unschedulable", KAI_NO_NODES, "1 × H100") == (
        "Waiting for 1 × H100: KAI's scheduler found no node with enough free resources "
        "(of 7 nodes: 3 nodes without enough free GPUs; 3 nodes with another GPU model or pool; "
        "1 node with MIG partitions only). The server starts as soon as one frees up, or a node is added."
    )
    # Each of KAI's per-node reasons in words (common_info/errors.go, node_info.go), and one
    # it may add later kept as KAI wrote it.
    other = (
        "no nodes with enough resources were found: 2 node(s) didn't have enough resources: GPU memory. \n"
        "1 node(s) didn't have enough of mig profile: nvidia.com/mig-1g.10gb. \n"
        "1 node(s) had untolerated taint {nvidia.com/gpu: present}. \n1 something new."
    )
    assert explain_scheduler_event("Unschedulable", other, "0.5 × H100") == (
        "Waiting for 0.5 × H100: KAI's scheduler found no node with enough free resources "
        "(of 5 nodes: 2 nodes without enough GPU memory; 1 node with every nvidia.com/mig-1g.10gb in use; "
        "1 node reserved by a taint (nvidia.com/gpu: present) this server does not tolerate; 1 node: something "
        "new). The server starts as soon as one frees up, or a node is added."
    )
    assert explain_scheduler_event("Unschedulable", "no nodes with enough resources were found", "1 × H100") == (
        "Waiting for 1 × H100: KAI's scheduler found no node with enough free resources. "
        "The server starts as soon as one frees up, or a node is added."
    )


def test_the_autoscalers_answer_in_words():
    """cluster-autoscaler's events on a pending pod (its FAQ, "What events are emitted by CA?")."""
    up = explain_scheduler_event(
        "TriggeredScaleUp", "pod triggered scale-up: [{gpu-h100-pool 0->1 (max: 4)}]", "1 × H100"
    )
    assert up == (
        "A new node is being added for 1 × H100 in gpu-h100-pool (0 → 1 nodes). "
        "The server starts once it has joined the cluster, usually within minutes."
    )
    no = explain_scheduler_event(
        "NotTriggerScaleUp",
        "pod didn't trigger scale-up: 2 node(s) didn't match Pod's node affinity/selector, 1 max node group size reached",
        "1 × H100",
    )
    assert no.startswith("No node offers 1 × H100, and the cluster's autoscaler will not add one (2 node(s)")
    assert explain_scheduler_event("Pulled", "Successfully pulled image", "1 × H100") is None
