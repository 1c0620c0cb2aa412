"""The device packer: places GPU requests on physical devices.

Two scorings. Best fit: a request below one GPU goes to the device whose free
share fits it most tightly, so partially used devices fill up before fresh
ones are touched; when it needs a fresh device, or N whole GPUs (N completely
free devices of one model on one node), it goes to the node left with the
least free GPU (best fit at node level), so empty nodes stay empty for large
requests. FGD (fragmentation gradient descent, :mod:`spawner.core.fragmentation`):
the candidate that grows the fragmentation of the expected workload least,
ties broken by best fit. No device ever holds more than 1000 milli-GPUs.

The same packer serves the single-server spawner (one node), the single-server
job runner and the capacity benchmark (thousands of nodes), so lookups are
indexed (distinct free shares per model; nodes by their count of free
devices) rather than scanned: a query costs in the number of distinct free
shares, not in the number of devices.
"""

from __future__ import annotations

import bisect
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from .fragmentation import FULL, FragmentationWeights, ModelWeights, TaskClass

__all__ = ["FULL", "SCORINGS", "DevicePacker", "GPUDevice", "PackingError", "Placement", "devices_from_inventory"]


@dataclass(frozen=True)
class GPUDevice:
    index: int
    model: str
    memory_mib: int = 0
    uuid: str = ""
    node: str = "local"
    #: ``nvml`` when detected from the driver, ``declared`` when from config.
    source: str = "declared"
    #: The minor number of its device node ``/dev/nvidia<minor>`` (NVML's; ``None``: its index).
    minor: int | None = None


@dataclass(frozen=True)
class Placement:
    key: str
    node: str
    #: ``(device index, milli)`` pairs.
    shares: tuple[tuple[int, int], ...]

    @property
    def device_indices(self) -> tuple[int, ...]:
        return tuple(i for i, _ in self.shares)

    @property
    def milli(self) -> int:
        return sum(m for _, m in self.shares)


class PackingError(ValueError):
    pass


SCORINGS = ("bestfit", "fgd")


class _NodeGroup:
    """The devices of one GPU model on one node (multi-GPU requests stay inside one)."""

    __slots__ = ("node", "model", "full", "partial_free")

    def __init__(self, node: str, model: str):
        self.node = node
        self.model = model
        #: Completely free devices, in index order of arrival.
        self.full: dict[int, None] = {}
        #: Sum of the free shares of the devices that are not completely free.
        self.partial_free = 0


class _ModelIndex:
    """The free capacity of one GPU model, indexed for the queries the packer asks."""

    __slots__ = ("values", "bucket", "by_full", "by_node_free", "max_full")

    def __init__(self) -> None:
        #: Sorted distinct free shares of partly used devices (0 < free < FULL).
        self.values: list[int] = []
        #: free share -> ordered set of the partly used devices with it.
        self.bucket: dict[int, dict[int, None]] = {}
        #: c >= 1 completely free devices -> sorted (partial free, node) of the node groups with c.
        self.by_full: dict[int, list[tuple[int, str]]] = {}
        #: Sorted (free GPU of the node group, node) of the groups with a completely free device.
        self.by_node_free: list[tuple[int, str]] = []
        #: The most devices of this model on one node.
        self.max_full = 0

    def add_group(self, group: _NodeGroup) -> None:
        c = len(group.full)
        if c:
            lst = self.by_full.get(c)
            if lst is None:
                lst = self.by_full[c] = []
            bisect.insort(lst, (group.partial_free, group.node))
            bisect.insort(self.by_node_free, (c * FULL + group.partial_free, group.node))

    def drop_group(self, group: _NodeGroup) -> None:
        c = len(group.full)
        if c:
            lst = self.by_full[c]
            del lst[bisect.bisect_left(lst, (group.partial_free, group.node))]
            if not lst:
                del self.by_full[c]
            nf = self.by_node_free
            del nf[bisect.bisect_left(nf, (c * FULL + group.partial_free, group.node))]

    def add_free(self, idx: int, free: int) -> None:
        b = self.bucket.get(free)
        if b is None:
            b = self.bucket[free] = {}
            bisect.insort(self.values, free)
        b[idx] = None

    def drop_free(self, idx: int, free: int) -> None:
        b = self.bucket[free]
        del b[idx]
        if not b:
            del self.bucket[free]
            del self.values[bisect.bisect_left(self.values, free)]


class DevicePacker:
    """Placement of milli-GPU requests on a fixed set of devices.

    ``scoring="bestfit"``: the device whose free share fits most tightly, and
    for a fresh device (or whole GPUs) the node left with the least free GPU.
    ``scoring="fgd"``: the placement that grows the fragmentation of the
    target ``workload`` least (:mod:`spawner.core.fragmentation`), ties broken by
    best fit. Without a ``workload`` the packer learns it from the requests
    it is asked to place.
    """

    def __init__(
        self,
        devices: Iterable[GPUDevice],
        *,
        scoring: str = "bestfit",
        workload: Mapping[TaskClass, float] | None = None,
    ):
        if scoring not in SCORINGS:
            raise PackingError(f"unknown scoring {scoring!r}; expected one of {', '.join(SCORINGS)}")
        self.scoring = scoring
        self.devices: dict[int, GPUDevice] = {}
        for d in devices:
            if d.index in self.devices:
                raise PackingError(f"duplicate device index {d.index}")
            self.devices[d.index] = d
        self._used: dict[int, int] = {i: 0 for i in self.devices}
        self._used_total = 0
        self._placements: dict[str, Placement] = {}
        self._groups: dict[tuple[str, str], _NodeGroup] = {}
        self._group_of: dict[int, _NodeGroup] = {}
        self._index: dict[str, _ModelIndex] = {}
        for d in self.devices.values():
            group = self._groups.get((d.node, d.model))
            if group is None:
                group = self._groups[(d.node, d.model)] = _NodeGroup(d.node, d.model)
            self._group_of[d.index] = group
            group.full[d.index] = None
            if d.model not in self._index:
                self._index[d.model] = _ModelIndex()
        for group in self._groups.values():
            mi = self._index[group.model]
            mi.add_group(group)
            mi.max_full = max(mi.max_full, len(group.full))
        self._fixed_workload = workload is not None
        self._seen: dict[TaskClass, float] = dict(workload or {})
        self._weights: FragmentationWeights | None = None
        self._stale = 0

    # -- index maintenance -------------------------------------------------

    def _set_free(self, idx: int, old: int, new: int) -> None:
        group = self._group_of[idx]
        mi = self._index[group.model]
        mi.drop_group(group)
        if old == FULL:
            del group.full[idx]
        else:
            group.partial_free -= old
            if old:
                mi.drop_free(idx, old)
        if new == FULL:
            group.full[idx] = None
        else:
            group.partial_free += new
            if new:
                mi.add_free(idx, new)
        mi.add_group(group)

    def _use(self, idx: int, milli: int) -> None:
        free = FULL - self._used[idx]
        if milli > free:
            raise PackingError(f"device {idx} has {free} milli free, cannot take {milli}")
        self._used[idx] += milli
        self._used_total += milli
        self._set_free(idx, free, free - milli)

    def _unuse(self, idx: int, milli: int) -> None:
        free = FULL - self._used[idx]
        self._used[idx] -= milli
        self._used_total -= milli
        self._set_free(idx, free, free + milli)

    # -- the target workload (fgd) -------------------------------------------

    def _learn(self, milli: int, models: Collection[str] | None) -> None:
        cls = TaskClass(milli, frozenset(models or ()))
        if cls not in self._seen:
            self._weights = None  # a new class: rebuild now
        self._seen[cls] = self._seen.get(cls, 0.0) + 1.0
        self._stale += 1
        if self._stale >= 256:  # popularity drifts slowly: rebuild now and then
            self._weights = None

    def _fragmentation(self) -> FragmentationWeights:
        if self._weights is None:
            self._stale = 0
            max_gpus = max((mi.max_full for mi in self._index.values()), default=0)
            self._weights = FragmentationWeights(self._seen, self._index.keys(), max_gpus)
        return self._weights

    # -- queries -----------------------------------------------------------

    def _models(self, models: Collection[str] | None) -> list[tuple[str, _ModelIndex]]:
        return [(m, mi) for m, mi in self._index.items() if not models or m in models]

    def find(self, milli: int, models: Collection[str] | None = None) -> tuple[str, tuple[tuple[int, int], ...]] | None:
        """Where would ``milli`` go now? ``None`` if it fits nowhere."""
        if milli <= 0:
            return ("", ())
        if milli > FULL and milli % FULL:
            raise PackingError(f"{milli} milli-GPUs: requests above one GPU must be whole GPUs")
        weights = self._fragmentation().by_model if self.scoring == "fgd" else None
        if milli <= FULL:
            return self._find_share(milli, self._models(models), weights)
        return self._find_whole(milli // FULL, self._models(models), weights)

    def _find_share(
        self, milli: int, models: list[tuple[str, _ModelIndex]], weights: Mapping[str, ModelWeights] | None
    ) -> tuple[str, tuple[tuple[int, int], ...]] | None:
        # Candidates are scored by (fragmentation growth, free share left on the device,
        # free GPU left on the node); best fit uses the last two only.
        best: tuple[int, int, int] | None = None
        where: tuple[_ModelIndex, int] | None = None  # a partly used device's (index, free share)
        fresh: tuple[str, int, str] | None = None  # (model, c, node): a free device of a node group
        for model, mi in models:
            values = mi.values
            pos = bisect.bisect_left(values, milli)
            if weights is None:
                if pos < len(values):
                    key = (0, values[pos] - milli, 0)
                    if best is None or key < best:
                        best, where, fresh = key, (mi, values[pos]), None
                if mi.by_node_free:
                    left, node = mi.by_node_free[0]
                    key = (0, FULL - milli, left - milli)
                    if best is None or key < best:
                        group = self._groups[(node, model)]
                        best, where, fresh = key, None, (model, len(group.full), node)
                continue
            w = weights[model]
            if pos < len(values):
                # the growth on a partly used device depends only on its free share;
                # min() keeps the first (tightest) of equal scores
                g = w.g
                free = min(values[pos:], key=lambda f: g[f - milli] - g[f]) if len(values) - pos > 1 else values[pos]
                key = (w.share_delta(free, milli, 0), free - milli, 0)
                if best is None or key < best:
                    best, where, fresh = key, (mi, free), None
            if mi.by_full:
                base = w.share_delta(FULL, milli, 1) - w.fresh_cost[1]
                for c, lst in mi.by_full.items():
                    key = (base + w.fresh_cost[c], FULL - milli, c * FULL + lst[0][0])
                    if best is None or key < best:
                        best, where, fresh = key, None, (model, c, lst[0][1])
        if where is not None:
            idx = next(iter(where[0].bucket[where[1]]))
        elif fresh is not None:
            idx = next(iter(self._groups[(fresh[2], fresh[0])].full))
        else:
            return None
        return (self.devices[idx].node, ((idx, milli),))

    def _find_whole(
        self, need: int, models: list[tuple[str, _ModelIndex]], weights: Mapping[str, ModelWeights] | None
    ) -> tuple[str, tuple[tuple[int, int], ...]] | None:
        best: tuple[int, int] | None = None
        choice: tuple[str, str] | None = None
        for model, mi in models:
            w = weights[model] if weights is not None else None
            for c, lst in mi.by_full.items():
                if c < need:
                    continue
                key = (w.whole_delta(need, c) if w is not None else 0, (c - need) * FULL + lst[0][0])
                if best is None or key < best:
                    best, choice = key, (lst[0][1], model)
        if choice is None:
            return None
        group = self._groups[choice]
        return (group.node, tuple((i, FULL) for i in list(group.full)[:need]))

    def can_place(self, milli: int, models: Collection[str] | None = None) -> bool:
        return self.find(milli, models) is not None

    # -- changes -----------------------------------------------------------

    def place(self, key: str, milli: int, models: Collection[str] | None = None) -> Placement | None:
        """Place ``milli`` for ``key``; ``None`` when no device can take it."""
        if key in self._placements:
            raise PackingError(f"{key} is already placed")
        if self.scoring == "fgd" and not self._fixed_workload and milli > 0:
            self._learn(milli, models)
        found = self.find(milli, models)
        if found is None:
            return None
        node, shares = found
        for idx, m in shares:
            self._use(idx, m)
        placement = Placement(key, node, shares)
        self._placements[key] = placement
        return placement

    def adopt(self, key: str, shares: Iterable[tuple[int, int]]) -> Placement:
        """Record a placement that already exists (re-adoption after restart)."""
        shares = tuple((int(i), int(m)) for i, m in shares)
        self.release(key)
        for idx, m in shares:
            if idx not in self.devices:
                raise PackingError(f"unknown device {idx}")
            if m <= 0 or self._used[idx] + m > FULL:
                raise PackingError(f"device {idx} cannot take {m} more milli-GPUs")
        for idx, m in shares:
            self._use(idx, m)
        node = self.devices[shares[0][0]].node if shares else ""
        placement = Placement(key, node, shares)
        self._placements[key] = placement
        return placement

    def release(self, key: str) -> Placement | None:
        placement = self._placements.pop(key, None)
        if placement is not None:
            for idx, m in placement.shares:
                self._unuse(idx, m)
        return placement

    # -- reading -----------------------------------------------------------

    def fewest_to_free(
        self, candidates: Iterable[str], milli: int, models: Collection[str] | None = None
    ) -> list[str] | None:
        """The first of ``candidates`` (in their order) whose release would let ``milli`` be placed;
        ``None`` when releasing all of them would not. A what-if: every placement is kept."""
        released: list[Placement] = []
        try:
            for key in candidates:
                placement = self.release(key)
                if placement is None:
                    continue
                released.append(placement)
                if self.can_place(milli, models):
                    return [p.key for p in released]
            return None
        finally:
            for placement in released:
                self.adopt(placement.key, placement.shares)

    def placement(self, key: str) -> Placement | None:
        return self._placements.get(key)

    def placements(self) -> list[Placement]:
        return list(self._placements.values())

    def used(self, idx: int) -> int:
        return self._used[idx]

    def total_milli(self, models: Collection[str] | None = None) -> int:
        if not models:
            return FULL * len(self.devices)
        return sum(FULL for d in self.devices.values() if not models or d.model in models)

    def free_milli(self, models: Collection[str] | None = None) -> int:
        if not models:
            return FULL * len(self.devices) - self._used_total
        return sum(FULL - self._used[i] for i, d in self.devices.items() if not models or d.model in models)


def devices_from_inventory(specs: Iterable[Any], node: str = "local") -> list[GPUDevice]:
    """Expand declared ``DeviceSpec`` rows (model, count, memory) into devices."""
    out: list[GPUDevice] = []
    for spec in specs:
        for _ in range(spec.count):
            out.append(GPUDevice(len(out), spec.model, spec.memory_mib, node=node, source="declared"))
    return out
