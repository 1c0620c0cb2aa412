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
    return (
        f"No node in this cluster offers {what} (of {_nodes(u.total)}: {detail}). The server waits "
        f"in case a node is added; otherwise stop it and pick another profile, or ask an admin."
    )


__all__ = ["Unschedulable", "explain_unschedulable", "parse_unschedulable"]
