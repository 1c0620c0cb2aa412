"""The Kubernetes scheduler's "unschedulable" message, in words a user follows.

kube-scheduler records why it could not place a pod in a FailedScheduling
event such as::

    0/6 nodes are available: 1 Insufficient nvidia.com/gpu.shared,
    2 node(s) had untolerated taint {nvidia.com/gpu: present},
    3 node(s) didn't match Pod's node affinity/selector. preemption: 0/6 nodes
    are available: 1 No preemption victims found for incoming pod, 5
    Preemption is not helpful for scheduling.

``explain_unschedulable`` turns that into one sentence for the spawn progress
page: whether the pod waits for capacity that is in use (it will start when
some frees up) or no node offers what it asks for at all (it waits only for a
new node), and how the nodes split. Pure text in, text out.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_HEADER = re.compile(r"^\s*(\d+)/(\d+) nodes are available(?::\s*(.*))?$", re.S)
_REASON = re.compile(r"^(\d+)\s+(.*)$")
_TAINT = re.compile(r"untolerated taint\(?s?\)?\s*\{([^}]*)\}")


@dataclass(frozen=True)
class Unschedulable:
    """A parsed FailedScheduling message."""

    available: int
    total: int
    reasons: tuple[tuple[int, str], ...]

    @property
    def insufficient(self) -> dict[str, int]:
        """Resource -> number of nodes where it is all in use."""
        out: dict[str, int] = {}
        for n, text in self.reasons:
            if text.startswith("Insufficient "):
                res = text[len("Insufficient ") :].strip()
                out[res] = out.get(res, 0) + n
        return out


def parse_unschedulable(message: str) -> Unschedulable | None:
    """The numbers in a scheduler message; ``None`` if it is not one."""
    main = re.split(r"\.?\s*preemption:", message, maxsplit=1)[0].strip().rstrip(".")
    m = _HEADER.match(main)
    if not m:
        return None
    reasons = []
    for part in re.split(r",\s*(?=\d+\s)", m.group(3) or ""):
        r = _REASON.match(part.strip())
        if r:
            reasons.append((int(r.group(1)), r.group(2).strip().rstrip(".")))
    return Unschedulable(int(m.group(1)), int(m.group(2)), tuple(reasons))


def _nodes(n: int) -> str:
    return f"{n} node" + ("" if n == 1 else "s")


def _reason_words(n: int, text: str) -> str:
    if text.startswith("Insufficient "):
        return f"{_nodes(n)} with all of {text[len('Insufficient ') :]} in use"
    if "didn't match Pod's node affinity/selector" in text:
        return f"{_nodes(n)} with another GPU model or pool"
    t = _TAINT.search(text)
    if t:
        return f"{_nodes(n)} reserved by a taint ({t.group(1).strip()}) this server does not tolerate"
    if "unschedulable" in text:
        return f"{_nodes(n)} cordoned for maintenance"
    if "didn't have free ports" in text or "Too many pods" in text:
        return f"{_nodes(n)} full ({text})"
    return f"{_nodes(n)}: {text}"


def explain_unschedulable(message: str, what: str) -> str | None:
    """A sentence for the spawn page, or ``None`` when ``message`` is no scheduler refusal.

    ``what`` names what the server asked for ("0.5 × H100").
    """
    u = parse_unschedulable(message)
    if u is None:
        return None
    detail = "; ".join(_reason_words(n, text) for n, text in u.reasons) or "no reason given"
    if u.insufficient:
        return (
            f"Waiting for a free {what}: every node that offers it is in use right now "
            f"(of {_nodes(u.total)}: {detail}). The server starts as soon as one frees up."
        )
    # Not "no node offers it": a node autoscaler may still add one (its own events say so).
    return (
        f"None of the {_nodes(u.total)} running now offers {what} ({detail}). The server waits in case "
        f"one is added (a node autoscaler may be adding one); otherwise stop it and pick another "
        f"profile, or ask an admin."
    )


# -- the cluster autoscaler ---------------------------------------------------------
#
# cluster-autoscaler records on the pod ``TriggeredScaleUp`` ("pod triggered scale-up:
# [{<node group> 0->1 (max: 4)}]") or ``NotTriggerScaleUp`` ("pod didn't trigger scale-up:
# <reasons>"), cluster-autoscaler's FAQ, "What events are emitted by CA?".

_SCALE_UP_GROUPS = re.compile(r"\{([^}\s]+)\s+(\d+)->(\d+)")


def explain_scale_up(reason: str, message: str, what: str) -> str | None:
    """The autoscaler's scale-up events as a sentence, or ``None``."""
    if reason == "TriggeredScaleUp":
        groups = ", ".join(f"{g} ({a} → {b} nodes)" for g, a, b in _SCALE_UP_GROUPS.findall(message))
        return (
            f"A new node is being added for {what}{' in ' + groups if groups else ''}. "
            f"The server starts once it has joined the cluster, usually within minutes."
        )
    if reason == "NotTriggerScaleUp":
        why = message.split(":", 1)[1].strip().rstrip(".") if ":" in message else message
        return (
            f"No node offers {what}, and the cluster's autoscaler will not add one ({why}). "
            f"Stop the server and pick another profile, or ask an admin."
        )
    return None


# -- HAMi's scheduler ---------------------------------------------------------------
#
# HAMi's scheduler extender records a ``FilteringFailed`` event per reason, as
# "<n> nodes <Reason>(<node>,<node>)" (pkg/scheduler/score.go, recordFilteringFailures),
# and "no available node, <n> nodes do not meet" when no node is left
# (pkg/scheduler/scheduler.go, Filter); the reasons are pkg/device/common/common.go's.

_HAMI_REASON = re.compile(r"^(\d+) nodes (\w+)\(([^)]*)\)$")
_HAMI_NONE_LEFT = re.compile(r"^no available node, (\d+) nodes do not meet$")
#: HAMi's reason -> (words, True when the capacity is only in use, i.e. it frees up).
_HAMI_WORDS: dict[str, tuple[str, bool]] = {
    "CardInsufficientMemory": ("not enough free GPU memory on any of their GPUs", True),
    "CardInsufficientCore": ("not enough free GPU compute (cores) on any of their GPUs", True),
    "CardTimeSlicingExhausted": ("every time-slice of their GPUs taken", True),
    "CardComputeUnitsExhausted": ("every compute unit of their GPUs taken", True),
    "NodeInsufficientDevice": ("fewer free GPUs than the server asks for", True),
    "AllocatedCardsInsufficientRequest": ("fewer free GPUs than the server asks for", True),
    "ExclusiveDeviceAllocateConflict": ("their GPUs held exclusively by another pod", True),
    "ResourceQuotaNotFit": ("the namespace's GPU quota in HAMi used up", True),
    "CardTypeMismatch": ("no GPU of the model the profile asks for", False),
    "CardUuidMismatch": ("not the GPU the pod names", False),
    "CardNotHealth": ("unhealthy GPUs", False),
    "CardCordoned": ("their GPUs cordoned", False),
    "NumaNotFit": ("no GPUs on one NUMA node as the pod asks", False),
    "CardMigTopologyInfeasible": ("no MIG layout that fits", False),
    "ModeNotFit": ("GPUs in another sharing mode", False),
}


def explain_hami_filtering(message: str, what: str) -> str | None:
    """HAMi's ``FilteringFailed`` event as a sentence, or ``None`` when it is not one."""
    text = message.strip().rstrip(".")
    none_left = _HAMI_NONE_LEFT.match(text)
    if none_left:
        return (
            f"Waiting for {what}: HAMi's scheduler found none of {_nodes(int(none_left.group(1)))} able to "
            f"give it now. The server starts when a GPU share frees up."
        )
    m = _HAMI_REASON.match(text)
    if not m:
        return None
    count, reason = int(m.group(1)), m.group(2)
    words, frees_up = _HAMI_WORDS.get(reason, (reason, False))
    if frees_up:
        return (
            f"Waiting for {what}: {_nodes(count)} with {words} (HAMi). The server starts as soon as a share frees up."
        )
    return (
        f"HAMi's scheduler cannot give {what} on {_nodes(count)}: {words}. The server waits in case "
        f"that changes or a node is added; otherwise stop it and pick another profile, or ask an admin."
    )


# -- KAI's scheduler ----------------------------------------------------------------
#
# KAI records an ``Unschedulable`` event on the pod with its queue's or its nodes'
# reason: "Non-preemptible workload is over quota. Workload requested <n> GPUs, but
# <queue> quota is <q> GPUs, while <u> GPUs are already allocated for non-preemptible
# pods. Use a preemptible workload to go over quota." and "<queue> quota has reached the
# allowable limit of GPUs. Limit is ..." (pkg/scheduler/api/unschedule_info.go), or
# "no nodes with enough resources were found: <n> <reason>. \n<n> <reason>." with the
# nodes' reasons counted and sorted (pkg/scheduler/api/common_info/errors.go,
# FitErrors.Error; the reasons there and in node_info/node_info.go, plus kube-scheduler's
# own filters' words), as KAI v0.20.1 wrote it on the test bed.

_KAI_OVER_QUOTA = re.compile(
    r"Workload requested ([\d.]+) GPUs, but (\S+) quota is ([\d.]+) GPUs, while ([\d.]+) GPUs are already allocated"
)
_KAI_LIMIT = re.compile(
    r"^(\S+) quota has reached the allowable limit of GPUs\. Limit is ([\d.]+) GPUs, currently ([\d.]+) GPUs allocated"
)
_KAI_NO_NODES = re.compile(r"no nodes with enough resources were found(?::\s*(.*))?$", re.S)
_KAI_NODE_REASON = re.compile(r"^(\d+)\s+(.*)$", re.S)
#: KAI's own per-node reasons -> words (common_info/errors.go, node_info/node_info.go).
_KAI_WORDS = {
    "node(s) didn't have enough resources: GPUs": "without enough free GPUs",
    "node(s) didn't have enough resources: GPU memory": "without enough GPU memory",
    "node(s) didn't have enough resources: CPU cores": "without enough free CPU",
    "node(s) didn't have enough resources: memory": "without enough free memory",
    "non MIG jobs cant run on a node with MigStrategy='mixed'": "with MIG partitions only",
    "only whole gpu jobs can run on a node with MigStrategy='single'": "with MIG partitions only",
}
_KAI_MIG_PROFILE = "node(s) didn't have enough of mig profile: "


def _kai_reason_words(n: int, text: str) -> str:
    if text in _KAI_WORDS:
        return f"{_nodes(n)} {_KAI_WORDS[text]}"
    if text.startswith(_KAI_MIG_PROFILE):
        return f"{_nodes(n)} with every {text[len(_KAI_MIG_PROFILE) :]} in use"
    return _reason_words(n, text)  # kube-scheduler's filters, which KAI runs as predicates


def _kai_nodes_detail(histogram: str) -> str:
    """KAI's "<n> <reason>. \n<n> <reason>." as "of <total> nodes: <words>; <words>"."""
    reasons = []
    for part in re.split(r"\.\s*\n", histogram.strip()):
        m = _KAI_NODE_REASON.match(" ".join(part.split()).rstrip("."))
        if m:
            reasons.append((int(m.group(1)), m.group(2)))
    if not reasons:
        return " ".join(histogram.split()).rstrip(".")
    total = sum(n for n, _ in reasons)
    reasons.sort(key=lambda r: -r[0])  # KAI sorts them as text: the most nodes first reads better
    return f"of {_nodes(total)}: " + "; ".join(_kai_reason_words(n, text) for n, text in reasons)


def explain_kai_unschedulable(message: str, what: str) -> str | None:
    """KAI's ``Unschedulable`` event as a sentence, or ``None`` when it is not one of KAI's."""
    text = " ".join(message.split())
    over = _KAI_OVER_QUOTA.search(text)
    if text.startswith("Non-preemptible workload is over quota") and over:
        asked, queue, quota, used = over.groups()
        return (
            f"Waiting for {what}: in-quota work of queue {queue} already holds {used} of its {quota} GPUs "
            f"and this asks for {asked}; KAI never lends non-preemptible work borrowed GPUs. It starts when "
            f"the team's in-quota work frees some (or run it as batch, which may borrow and be preempted)."
        )
    limit = _KAI_LIMIT.match(text)
    if limit:
        queue, cap, used = limit.groups()
        return (
            f"Waiting for {what}: queue {queue} holds {used} GPUs, its limit of {cap}. "
            f"It starts when the team's work frees some."
        )
    nodes = _KAI_NO_NODES.search(message.strip())
    if nodes:
        detail = _kai_nodes_detail(nodes.group(1) or "") if (nodes.group(1) or "").strip() else ""
        return (
            f"Waiting for {what}: KAI's scheduler found no node with enough free resources"
            f"{' (' + detail + ')' if detail else ''}. The server starts as soon as one frees up, "
            f"or a node is added."
        )
    return None


#: The event reasons :func:`explain_scheduler_event` turns into words.
SCHEDULER_EVENT_REASONS = frozenset(
    {"FailedScheduling", "FilteringFailed", "Unschedulable", "TriggeredScaleUp", "NotTriggerScaleUp"}
)


def explain_scheduler_event(reason: str, message: str, what: str) -> str | None:
    """Any scheduler's "cannot place it" event (kube-scheduler's ``FailedScheduling``,
    HAMi's ``FilteringFailed``, KAI's ``Unschedulable``) or the autoscaler's answer to it
    (``TriggeredScaleUp``, ``NotTriggerScaleUp``) as a sentence, or ``None``."""
    if reason == "FailedScheduling":
        return explain_unschedulable(message, what)
    if reason == "FilteringFailed":
        return explain_hami_filtering(message, what)
    if reason == "Unschedulable":
        return explain_kai_unschedulable(message, what) or explain_unschedulable(message, what)
    return explain_scale_up(reason, message, what)


__all__ = [
    "SCHEDULER_EVENT_REASONS",
    "Unschedulable",
    "explain_hami_filtering",
    "explain_kai_unschedulable",
    "explain_scale_up",
    "explain_scheduler_event",
    "explain_unschedulable",
    "parse_unschedulable",
]
