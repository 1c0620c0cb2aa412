"""What a server was granted: the contract between a spawner and the processes that read it.

A gpulab spawner saves its grant in the hub's spawner state under ``state["gpulab"]``;
the hub API reads it back (:func:`spawner.runtime.granted_share`), and so does the idle
culler, over the hub's REST API (``idle_culler/targets.py``). Both spawners write it
through :meth:`GrantedShare.to_json` and every reader goes through
:meth:`GrantedShare.from_state`, so the two sides cannot drift apart.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

#: The key of the grant in the hub's spawner state.
STATE_KEY = "gpulab"


@dataclass(frozen=True, kw_only=True)
class GrantedShare:
    """One server's grant: its team and profile, the milli-GPUs it holds, whether above quota.

    ``image`` (the image slug chosen) and ``shares`` (``(device index, milli)`` placements)
    are the single server's: ``None`` on Kubernetes, where the pod holds the image and the
    device plugin picks the devices.
    """

    team: str
    profile: str
    milli: int
    over_quota: bool
    image: str | None = None
    shares: tuple[tuple[int, int], ...] | None = None

    @property
    def devices(self) -> tuple[int, ...]:
        """The device indices the server's shares are on (single server), sorted."""
        return tuple(sorted({d for d, _ in self.shares or ()}))

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "team": self.team,
            "profile": self.profile,
            "milli": self.milli,
            "over_quota": self.over_quota,
        }
        if self.image is not None:
            out["image"] = self.image
        if self.shares is not None:
            out["shares"] = [list(s) for s in self.shares]
        return out

    @classmethod
    def from_json(cls, data: Any) -> GrantedShare | None:
        """A saved grant, or ``None`` when ``data`` is not one (an older or foreign state)."""
        if not isinstance(data, Mapping):
            return None
        try:
            shares = data.get("shares")
            return cls(
                team=str(data["team"]),
                profile=str(data["profile"]),
                milli=int(data["milli"]),
                over_quota=bool(data.get("over_quota", False)),
                image=None if data.get("image") is None else str(data["image"]),
                shares=None if shares is None else tuple((int(d), int(m)) for d, m in shares),
            )
        except (KeyError, TypeError, ValueError):
            return None

    @classmethod
    def from_state(cls, state: Any) -> GrantedShare | None:
        """The grant in a spawner's state (as ``get_state()`` or the hub's REST API gives it)."""
        return cls.from_json(state.get(STATE_KEY)) if isinstance(state, Mapping) else None
