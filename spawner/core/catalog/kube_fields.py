"""Kubernetes scheduling fields a catalog profile may carry: shape checks.

Tolerations and node affinity terms in the shapes KubeSpawner's
``tolerations``, ``node_affinity_required`` and ``node_affinity_preferred``
take (core/v1 Toleration, NodeSelectorTerm, PreferredSchedulingTerm). The
catalog refuses a malformed one with its line, before any pod is built.
Pure code.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from .reader import KeyPath, Reader, kind

#: Fields of a Toleration, a NodeSelectorTerm, a PreferredSchedulingTerm and a requirement.
TOLERATION_KEYS = {"key", "operator", "value", "effect", "tolerationSeconds"}
NODE_TERM_KEYS = {"matchExpressions", "matchFields"}
PREFERRED_TERM_KEYS = {"weight", "preference"}
REQUIREMENT_KEYS = {"key", "operator", "values"}


def check_toleration(t: dict[str, Any]) -> str | None:
    if t.get("operator", "Equal") not in ("Equal", "Exists"):
        return "operator must be Equal or Exists"
    if t.get("effect", "") not in ("", "NoSchedule", "PreferNoSchedule", "NoExecute"):
        return "effect must be NoSchedule, PreferNoSchedule or NoExecute"
    if t.get("operator") == "Exists" and t.get("value"):
        return "a toleration with operator Exists takes no value"
    if not t.get("key") and t.get("operator") != "Exists":
        return "a toleration without a key needs operator Exists"
    if not all(isinstance(t.get(k, ""), str) for k in ("key", "operator", "value", "effect")):
        return "key, operator, value and effect are strings"
    return None


def check_node_term(term: dict[str, Any]) -> str | None:
    if not term:
        return "a node selector term needs matchExpressions or matchFields"
    for field_name in ("matchExpressions", "matchFields"):
        reqs = term.get(field_name, [])
        if not isinstance(reqs, list) or not all(
            isinstance(q, dict)
            and set(q) <= REQUIREMENT_KEYS
            and isinstance(q.get("key"), str)
            and q.get("operator") in ("In", "NotIn", "Exists", "DoesNotExist", "Gt", "Lt")
            and all(isinstance(v, str) for v in q.get("values", []))
            for q in reqs
        ):
            return (
                f"{field_name}: expected a list of {{key, operator (In, NotIn, Exists, DoesNotExist, "
                f"Gt, Lt), values: [strings]}}"
            )
    return None


def check_preferred_term(term: dict[str, Any]) -> str | None:
    w = term.get("weight")
    if isinstance(w, bool) or not isinstance(w, int) or not 1 <= w <= 100:
        return "weight must be a whole number from 1 to 100"
    if not isinstance(term.get("preference"), dict):
        return "preference must be a node selector term"
    return check_node_term(term["preference"])


def read_kube_objects(
    r: Reader, value: Any, path: KeyPath, allowed: set[str], check: Callable[[dict[str, Any]], str | None]
) -> tuple[dict[str, Any], ...]:
    """A list of Kubernetes objects (tolerations, affinity terms): known fields, checked shapes."""
    if value is None:
        return ()
    if not isinstance(value, list):
        r.error(path, f"expected a list, got {kind(value)}")
        return ()
    out = []
    for i, item in enumerate(value):
        d = r.mapping(item, path + (i,), allowed)
        if d is None:
            continue
        problem = check(d)
        if problem:
            r.error(path + (i,), problem)
        else:
            out.append(dict(d))
    return tuple(out)


def read_scheduling(
    r: Reader, spec: Mapping[str, Any], path: KeyPath
) -> tuple[tuple[dict[str, Any], ...], tuple[dict[str, Any], ...], tuple[dict[str, Any], ...]]:
    """A profile's ``(tolerations, node_affinity_required, node_affinity_preferred)``."""
    fields = (
        ("tolerations", TOLERATION_KEYS, check_toleration),
        ("node_affinity_required", NODE_TERM_KEYS, check_node_term),
        ("node_affinity_preferred", PREFERRED_TERM_KEYS, check_preferred_term),
    )
    tolerations, required, preferred = (
        read_kube_objects(r, spec.get(key), path + (key,), allowed, check) for key, allowed, check in fields
    )
    return tolerations, required, preferred
