"""Which GPU nodes a pod may use, by the pool of its sharing backend.

A HAMi node advertises ``nvidia.com/gpu`` (its vGPU slots) exactly like a
whole-GPU node, but only HAMi's scheduler can place a pod there: HAMi's device
plugin allocates from the annotations that scheduler writes, and fails any other
pod at the kubelet (UnexpectedAdmissionError; HAMi
pkg/device-plugin/nvidiadevice/nvinternal/plugin/server.go). HAMi marks its
nodes with the label ``gpu=on`` (its install guide: "label your GPU nodes for
scheduling with HAMi"; its chart's device-plugin node selector). So:

- HAMi pods select ``gpu=on``;
- every other pod that requests ``nvidia.com/gpu`` (whole GPUs under any
  backend) keeps off those nodes with a required node affinity
  ``gpu NotIn [on]`` (which nodes without the label satisfy).

Time-sliced and MIG fractions need no rule: HAMi nodes do not advertise their
resources. Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

#: HAMi's node label (its install guide and chart).
HAMI_NODE_LABEL = ("gpu", "on")
#: The resource HAMi's device plugin advertises, shared with whole-GPU nodes.
HAMI_SHARED_RESOURCE = "nvidia.com/gpu"


def pool_selector(backend: str) -> dict[str, str]:
    """Node labels a pod of ``backend`` must have."""
    return {HAMI_NODE_LABEL[0]: HAMI_NODE_LABEL[1]} if backend == "hami" else {}


def pool_exclusions(backend: str, resources: Iterable[str]) -> tuple[dict[str, Any], ...]:
    """Node selector requirements that keep a non-HAMi pod asking for ``nvidia.com/gpu``
    off HAMi's nodes."""
    if backend == "hami" or HAMI_SHARED_RESOURCE not in set(resources):
        return ()
    key, value = HAMI_NODE_LABEL
    return ({"key": key, "operator": "NotIn", "values": [value]},)


def and_node_affinity(
    terms: Sequence[Mapping[str, Any]], requirements: Sequence[Mapping[str, Any]]
) -> list[dict[str, Any]]:
    """NodeSelectorTerms (OR'ed, KubeSpawner's ``node_affinity_required``) that also require
    every one of ``requirements``: added to each term, or one term of their own."""
    if not requirements:
        return [dict(t) for t in terms]
    if not terms:
        return [{"matchExpressions": [dict(r) for r in requirements]}]
    out = []
    for term in terms:
        t = dict(term)
        t["matchExpressions"] = [*t.get("matchExpressions", []), *(dict(r) for r in requirements)]
        out.append(t)
    return out
