"""Label/field selectors and resource quantities for the Kubernetes API stand-in (tests only).

Split out of ``tests/kube_api_server.py``; the semantics follow the real API server.
"""

from __future__ import annotations

import collections
import re
from collections.abc import Mapping
from decimal import Decimal
from typing import Any

# --------------------------------------------------------------------------
# Selectors

_SET_RE = re.compile(r"^\s*(!?)([A-Za-z0-9._/-]+)\s*(?:(notin|in)\s*\(([^)]*)\))?\s*$")


def _split_selector(sel: str) -> list[str]:
    parts, depth, cur = [], 0, ""
    for ch in sel:
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append(cur)
            cur = ""
        else:
            cur += ch
    if cur.strip():
        parts.append(cur)
    return parts


def parse_label_selector(sel: str | None):
    """Return a predicate over a label dict; raises ValueError on bad syntax."""
    reqs = []
    for part in _split_selector(sel or ""):
        if "!=" in part:
            k, v = part.split("!=", 1)
            reqs.append(("ne", k.strip(), v.strip()))
        elif "==" in part:
            k, v = part.split("==", 1)
            reqs.append(("eq", k.strip(), v.strip()))
        elif "=" in part:
            k, v = part.split("=", 1)
            reqs.append(("eq", k.strip(), v.strip()))
        else:
            m = _SET_RE.match(part)
            if not m:
                raise ValueError(f"unable to parse requirement: {part!r}")
            neg, key, op, values = m.groups()
            if op:
                reqs.append((op, key, {v.strip() for v in values.split(",") if v.strip()}))
            else:
                reqs.append(("absent" if neg else "exists", key, None))

    tests = {
        "eq": lambda labels, k, v: labels.get(k) == v,
        "ne": lambda labels, k, v: labels.get(k) != v,
        "in": lambda labels, k, v: labels.get(k) in v,
        "notin": lambda labels, k, v: labels.get(k) not in v,
        "exists": lambda labels, k, v: k in labels,
        "absent": lambda labels, k, v: k not in labels,
    }

    def match(labels: Mapping[str, str]) -> bool:
        return all(tests[op](labels, k, v) for op, k, v in reqs)

    return match


def _field(obj: Mapping[str, Any], path: str) -> str:
    cur: Any = obj
    for part in path.split("."):
        if not isinstance(cur, Mapping):
            return ""
        cur = cur.get(part)
    return "" if cur is None else str(cur)


def parse_field_selector(sel: str | None):
    reqs = []
    for part in _split_selector(sel or ""):
        if "!=" in part:
            k, v = part.split("!=", 1)
            reqs.append((False, k.strip(), v.strip()))
        elif "=" in part:
            k, v = part.replace("==", "=").split("=", 1)
            reqs.append((True, k.strip(), v.strip()))
        else:
            raise ValueError(f"invalid field selector: {part!r}")
    return lambda obj: all((_field(obj, k) == v) == eq for eq, k, v in reqs)


# --------------------------------------------------------------------------
# Quantities and quota

_SUFFIX = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60,
           "n": Decimal("1e-9"), "u": Decimal("1e-6"), "m": Decimal("1e-3"),
           "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12, "P": 10**15, "E": 10**18}


def parse_quantity(q: Any) -> Decimal:
    s = str(q).strip()
    for suf in sorted(_SUFFIX, key=len, reverse=True):
        if s.endswith(suf):
            return Decimal(s[: -len(suf)]) * Decimal(_SUFFIX[suf])
    return Decimal(s)


def _fmt_quantity(d: Decimal) -> str:
    return str(int(d)) if d == d.to_integral_value() else format(d.normalize(), "f")


def pod_usage(pod: Mapping[str, Any]) -> dict[str, Decimal]:
    """What a pod counts against a ResourceQuota (requests default from limits)."""
    usage: dict[str, Decimal] = collections.defaultdict(Decimal)
    usage["pods"] += 1
    for c in pod.get("spec", {}).get("containers", []) or []:
        res = c.get("resources") or {}
        limits = res.get("limits") or {}
        requests = {**limits, **(res.get("requests") or {})}
        for name, q in requests.items():
            usage[f"requests.{name}"] += parse_quantity(q)
            if name in ("cpu", "memory"):
                usage[name] += parse_quantity(q)
        for name, q in limits.items():
            if name in ("cpu", "memory"):
                usage[f"limits.{name}"] += parse_quantity(q)
    return usage
