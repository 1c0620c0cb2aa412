"""The test bed's size: how many fake GPU nodes, and how their kubelets keep up.

The normal tests run the nodes of ``nodes.yaml`` as they are (7: whole,
time-sliced, MIG, HAMi, KAI, CPU). ``GPULAB_KUBE_TESTBED_NODES=1000`` makes
the bed register that many, cycling through the same node kinds (so the
mixture of whole, time-sliced and MIG nodes stays), named
``<kind>-x<n>`` after the originals, which keep their names.

A real kubelet renews its node Lease every 10 s (a 40 s lease) and posts its
full node status every 5 minutes when nothing changes
(``nodeStatusReportFrequency``); the node lifecycle controller marks a node
NotReady after ``--node-monitor-grace-period`` without either. At 1,000 nodes
one agent doing that would make 100 Lease writes a second, which two cores
cannot carry beside everything else; so at scale the bed lengthens the lease
period and the controller's grace period together (:func:`heartbeat_plan`),
and spreads the renewals evenly over the period instead of in bursts.
"""

from __future__ import annotations

import copy
import os
from dataclasses import dataclass
from typing import Any

#: Environment variable: the number of fake nodes (unset or 0: nodes.yaml as it is).
NODES_ENV = "GPULAB_KUBE_TESTBED_NODES"
#: Lease writes per second the bed allows itself at scale (a real kubelet: 0.1 per node).
LEASE_WRITES_PER_SECOND = 10.0


def node_count() -> int:
    """The size asked for in ``$GPULAB_KUBE_TESTBED_NODES`` (0: nodes.yaml as it is)."""
    raw = os.environ.get(NODES_ENV, "").strip()
    if not raw:
        return 0
    try:
        n = int(raw)
    except ValueError:
        raise ValueError(f"{NODES_ENV}={raw!r}: give a whole number of nodes (e.g. 1000), or unset it") from None
    if n < 0 or n > 5000:
        raise ValueError(f"{NODES_ENV}={n}: between 0 (nodes.yaml as it is) and 5000")
    return n


def scaled_nodes(templates: list[dict[str, Any]], total: int) -> list[dict[str, Any]]:
    """``templates`` first, then copies cycling through them until there are ``total``."""
    if total <= len(templates):
        return list(templates)
    out = list(templates)
    i = 0
    while len(out) < total:
        t = templates[i % len(templates)]
        node = copy.deepcopy(t)
        node["name"] = f"{t['name']}-x{i // len(templates) + 1}"
        out.append(node)
        i += 1
    return out


@dataclass(frozen=True)
class Heartbeat:
    """How often the agent writes each node's Lease and status, and the controller's patience."""

    #: Seconds between two renewals of one node's Lease.
    renew_seconds: float
    #: The Lease's ``leaseDurationSeconds``.
    lease_seconds: int
    #: Seconds between two full node status posts of one node.
    status_seconds: float
    #: The controller manager's ``--node-monitor-grace-period`` (None: its default).
    grace_seconds: int | None


def heartbeat_plan(nodes: int) -> Heartbeat:
    """A kubelet's own periods for a small bed; at scale, at most ~10 Lease writes a second."""
    if nodes <= 50:
        return Heartbeat(renew_seconds=10, lease_seconds=40, status_seconds=30, grace_seconds=None)
    renew = max(10.0, nodes / LEASE_WRITES_PER_SECOND)
    return Heartbeat(
        renew_seconds=renew,
        lease_seconds=int(renew * 4),
        status_seconds=max(300.0, renew * 3),
        grace_seconds=int(renew * 5),
    )
