"""What one culler cycle asks the hub to record: the contract between two processes.

The culler (``idle_culler``) builds these records and sends them in one request,
``POST /hub/api/gpulab/idle/cycle``; the hub (``hub_config/api/idle.py``) reads them back
with :meth:`CycleRecords.from_json`, which refuses a malformed item with a sentence (a
400, and nothing recorded). Both sides use these classes, so a field renamed on one side
is a type error on the other, and the round trip is tested
(``tests/unit/test_idle_cycle.py``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

#: Longest user or server name a record may carry (the hub's column width).
MAX_NAME = 255
#: Longest server session (its start time, as the hub's REST API writes it).
MAX_SESSION = 64
MAX_REASON = 2000
MAX_GRACE_SECONDS = 7 * 86400
#: What a reclaim does: stop the server (the GPU is freed), or shut down its idle kernels.
ACTIONS = ("stop-server", "shutdown-kernel")
Action = Literal["stop-server", "shutdown-kernel"]
MAX_KERNELS = 64


class RecordError(ValueError):
    """A record the hub refuses; the message says which field and what it must be."""


def _name(value: Any, what: str, allow_empty: bool = False) -> str:
    if not isinstance(value, str) or len(value) > MAX_NAME or (not value and not allow_empty):
        raise RecordError(
            f"{what} must be a string of 1-{MAX_NAME} characters"
            if not allow_empty
            else f"{what} must be a string of at most {MAX_NAME} characters"
        )
    return value


def _int(value: Any, what: str, lo: int = 0, hi: int = 10**9) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
        raise RecordError(f"{what} must be an integer between {lo} and {hi}")
    return value


def _number(value: Any, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
        raise RecordError(f"{what} must be a non-negative number")
    return float(value)


def _evidence(item: Mapping[str, Any]) -> dict[str, Any]:
    evidence = item.get("evidence", {})
    if not isinstance(evidence, dict):
        raise RecordError("evidence must be a JSON object")
    return evidence


def _object(item: Any, what: str) -> Mapping[str, Any]:
    if not isinstance(item, dict):
        raise RecordError(f"each of {what} must be a JSON object")
    return item


def target_of(item: Mapping[str, Any]) -> tuple[str, str]:
    """``(user, server)`` of a request body or query, checked."""
    return _name(item.get("user"), "user"), _name(item.get("server", ""), "server", allow_empty=True)


@dataclass(frozen=True, kw_only=True)
class Mark:
    """A hold (data went missing: postpone the reclaim) or a clear (drop the warning)."""

    user: str
    server: str
    session: str = ""
    reason: str = ""

    @classmethod
    def from_json(cls, item: Any, what: str = "holds") -> Mark:
        d = _object(item, what)
        user, server = target_of(d)
        session = d.get("session", "")
        if not isinstance(session, str) or len(session) > MAX_SESSION:
            raise RecordError(f"session must be a string of at most {MAX_SESSION} characters")
        reason = d.get("reason", "")
        if not isinstance(reason, str) or len(reason) > MAX_REASON:
            raise RecordError(f"reason must be a string of at most {MAX_REASON} characters")
        return cls(user=user, server=server, session=session, reason=reason)

    def to_json(self) -> dict[str, Any]:
        return {"user": self.user, "server": self.server, "session": self.session, "reason": self.reason}


@dataclass(frozen=True, kw_only=True)
class ServerRecord(Mark):
    """A record about one GPU server: who holds what, and the evidence of the decision."""

    team: str = ""
    profile: str = ""
    gpu_milli: int = 0
    evidence: Mapping[str, Any] = field(default_factory=dict)

    @classmethod
    def _fields(cls, item: Any, what: str) -> dict[str, Any]:
        mark = Mark.from_json(item, what)
        return {
            **mark.__dict__,
            "team": str(item.get("team") or "")[:MAX_NAME],
            "profile": str(item.get("profile") or "")[:MAX_NAME],
            "gpu_milli": _int(item.get("gpu_milli", 0), "gpu_milli"),
            "evidence": _evidence(item),
        }

    def to_json(self) -> dict[str, Any]:
        return {
            **super().to_json(),
            "team": self.team,
            "profile": self.profile,
            "gpu_milli": self.gpu_milli,
            "evidence": dict(self.evidence),
        }


@dataclass(frozen=True, kw_only=True)
class WarningRecord(ServerRecord):
    """Warn: the server is idle; it is reclaimed after ``grace_seconds`` unless that changes.
    ``renew``: a held warning whose data returned gets a new reclaim time and a fresh grace."""

    grace_seconds: int = 0
    renew: bool = False

    @classmethod
    def from_json(cls, item: Any, what: str = "warnings") -> WarningRecord:
        fields = cls._fields(item, what)
        grace = _int(item.get("grace_seconds"), "grace_seconds", 0, MAX_GRACE_SECONDS)
        renew = item.get("renew", False)
        if not isinstance(renew, bool):
            raise RecordError("renew must be true or false")
        return cls(**fields, grace_seconds=grace, renew=renew)

    def to_json(self) -> dict[str, Any]:
        return {**super().to_json(), "grace_seconds": self.grace_seconds, "renew": self.renew}


@dataclass(frozen=True, kw_only=True)
class ReclaimClaim(ServerRecord):
    """Claim a reclaim before acting on it; the hub grants or refuses each claim on its own."""

    action: Action = "stop-server"
    kernel_ids: tuple[str, ...] = ()
    #: Start of the idle window that justified the warning (epoch seconds).
    idle_since: float = 0.0
    idle_gpu_hours: float = 0.0

    @classmethod
    def from_json(cls, item: Any, what: str = "reclaims") -> ReclaimClaim:
        fields = cls._fields(item, what)
        idle_gpu_hours = _number(item.get("idle_gpu_hours", 0.0), "idle_gpu_hours")
        idle_since = _number(item.get("idle_since", 0.0), "idle_since")
        action = item.get("action", "stop-server")
        if action not in ACTIONS:
            raise RecordError("action must be 'stop-server' or 'shutdown-kernel'")
        kernel_ids: tuple[str, ...] = ()
        if action == "shutdown-kernel":
            ids = item.get("kernel_ids")
            if (
                not isinstance(ids, list)
                or not ids
                or len(ids) > MAX_KERNELS
                or not all(isinstance(k, str) and 0 < len(k) <= 64 for k in ids)
            ):
                raise RecordError("kernel_ids must be a list of kernel id strings")
            kernel_ids = tuple(ids)
        return cls(**fields, action=action, kernel_ids=kernel_ids, idle_since=idle_since, idle_gpu_hours=idle_gpu_hours)

    def to_json(self) -> dict[str, Any]:
        out = {
            **super().to_json(),
            "action": self.action,
            "idle_since": self.idle_since,
            "idle_gpu_hours": self.idle_gpu_hours,
        }
        if self.action == "shutdown-kernel":
            out["kernel_ids"] = list(self.kernel_ids)
        return out


#: Why the culler can find no utilisation of a server (``Unattributed.code``), the gauge's label.
UNATTRIBUTED_CODES = (
    "no-series",
    "timeslice-not-attributed",
    "mig-no-profiling-metrics",
    "hami-no-vgpu-metrics",
    "kai-reservation-pod",
)
#: Most servers one cycle may report as unattributed.
MAX_UNATTRIBUTED = 100_000


@dataclass(frozen=True, kw_only=True)
class Unattributed(Mark):
    """A server the culler can never judge as things are: no series names it, and why
    (``code`` one of :data:`UNATTRIBUTED_CODES`, ``reason`` the sentence users and admins see)."""

    code: str

    @classmethod
    def from_json(cls, item: Any, what: str = "unattributed") -> Unattributed:
        mark = Mark.from_json(item, what)
        code = _object(item, what).get("code")
        if code not in UNATTRIBUTED_CODES:
            raise RecordError(f"code must be one of {', '.join(UNATTRIBUTED_CODES)}")
        if not mark.reason:
            raise RecordError("an unattributed server needs its reason")
        return cls(user=mark.user, server=mark.server, session=mark.session, reason=mark.reason, code=code)

    def to_json(self) -> dict[str, Any]:
        return {**super().to_json(), "code": self.code}


@dataclass(frozen=True)
class CycleRecords:
    """One cycle's records, sent as one request: clears, warnings, holds, then reclaim claims.

    ``unattributed``: every server the culler cannot judge, replacing the hub's list;
    ``None`` when the culler's list is what the hub already has (nothing sent)."""

    warnings: tuple[WarningRecord, ...] = ()
    holds: tuple[Mark, ...] = ()
    clears: tuple[Mark, ...] = ()
    reclaims: tuple[ReclaimClaim, ...] = ()
    unattributed: tuple[Unattributed, ...] | None = None

    @property
    def users(self) -> set[str]:
        """The users the warnings and claims name (each must exist on the hub)."""
        return {r.user for r in (*self.warnings, *self.reclaims)}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> CycleRecords:
        lists: dict[str, list[Any]] = {}
        for key in ("warnings", "holds", "clears", "reclaims"):
            items = data.get(key, [])
            if not isinstance(items, list):
                raise RecordError(f"{key} must be a list")
            lists[key] = items
        unattributed = data.get("unattributed")
        if unattributed is not None and (not isinstance(unattributed, list) or len(unattributed) > MAX_UNATTRIBUTED):
            raise RecordError(f"unattributed must be a list of at most {MAX_UNATTRIBUTED} servers")
        return cls(
            warnings=tuple(WarningRecord.from_json(i) for i in lists["warnings"]),
            holds=tuple(Mark.from_json(i, "holds") for i in lists["holds"]),
            clears=tuple(Mark.from_json(i, "clears") for i in lists["clears"]),
            reclaims=tuple(ReclaimClaim.from_json(i) for i in lists["reclaims"]),
            unattributed=None if unattributed is None else tuple(Unattributed.from_json(i) for i in unattributed),
        )

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "warnings": [r.to_json() for r in self.warnings],
            "holds": [r.to_json() for r in self.holds],
            "clears": [r.to_json() for r in self.clears],
            "reclaims": [r.to_json() for r in self.reclaims],
        }
        if self.unattributed is not None:
            out["unattributed"] = [r.to_json() for r in self.unattributed]
        return out


@dataclass(frozen=True, kw_only=True)
class ClaimAnswer:
    """The hub's answer to one reclaim claim."""

    user: str
    server: str
    accepted: bool
    message: str

    def to_json(self) -> dict[str, Any]:
        return {"user": self.user, "server": self.server, "accepted": self.accepted, "message": self.message}

    @classmethod
    def from_json(cls, item: Mapping[str, Any]) -> ClaimAnswer:
        return cls(
            user=str(item.get("user", "")),
            server=str(item.get("server", "")),
            accepted=bool(item.get("accepted")),
            message=str(item.get("message", "")),
        )


@dataclass(frozen=True)
class CycleResult:
    """What the hub recorded of a cycle: how many clears, warnings and holds changed a record,
    and the answer to each claim, in the order of the claims."""

    clears: int = 0
    warnings: int = 0
    holds: int = 0
    reclaims: tuple[ClaimAnswer, ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {
            "clears": self.clears,
            "warnings": self.warnings,
            "holds": self.holds,
            "reclaims": [a.to_json() for a in self.reclaims],
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> CycleResult:
        return cls(
            clears=int(data.get("clears", 0)),
            warnings=int(data.get("warnings", 0)),
            holds=int(data.get("holds", 0)),
            reclaims=tuple(ClaimAnswer.from_json(a) for a in data.get("reclaims", [])),
        )
