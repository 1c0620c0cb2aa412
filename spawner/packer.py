"""The device packer: places GPU requests on physical devices.

A request below one GPU goes to the device whose free share fits it most
tightly (best fit), so partially used devices fill up before fresh ones are
touched and whole GPUs stay available for whole-GPU work. A request of N whole
GPUs takes N completely free devices on one node, on the node with the fewest
free devices that still fits (best fit again, at node level). No device ever
holds more than 1000 milli-GPUs.

The same packer serves the single-server spawner (one node), the single-server
job runner and the capacity benchmark (thousands of nodes), so lookups are
indexed by free share rather than scanned.
"""

from __future__ import annotations

import bisect
from collections.abc import Collection, Iterable
from dataclasses import dataclass

FULL = 1000


@dataclass(frozen=True)
class GPUDevice:
    index: int
    model: str
    memory_mib: int = 0
    uuid: str = ""
    node: str = "local"
    #: ``nvml`` when detected from the driver, ``declared`` when from config.
    source: str = "declared"


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


class DevicePacker:
    """Best-fit placement of milli-GPU requests on a fixed set of devices."""

    def __init__(self, devices: Iterable[GPUDevice]):
        self.devices: dict[int, GPUDevice] = {}
        for d in devices:
            if d.index in self.devices:
                raise PackingError(f"duplicate device index {d.index}")
            self.devices[d.index] = d
        self._used: dict[int, int] = {i: 0 for i in self.devices}
        self._placements: dict[str, Placement] = {}
        # (model, free) -> ordered set of device indices; plus sorted free values per model.
        self._bucket: dict[tuple[str, int], dict[int, None]] = {}
        self._free_values: dict[str, list[int]] = {}
        # node -> model -> ordered set of fully free device indices.
        self._node_free: dict[str, dict[str, dict[int, None]]] = {}
        for d in self.devices.values():
            self._index(d.index, FULL)

    # -- index maintenance -------------------------------------------------

    def _index(self, idx: int, free: int) -> None:
        d = self.devices[idx]
        b = self._bucket.setdefault((d.model, free), {})
        if not b:
            bisect.insort(self._free_values.setdefault(d.model, []), free)
        b[idx] = None
        if free == FULL:
            self._node_free.setdefault(d.node, {}).setdefault(d.model, {})[idx] = None

    def _unindex(self, idx: int, free: int) -> None:
        d = self.devices[idx]
        b = self._bucket[(d.model, free)]
        del b[idx]
        if not b:
            del self._bucket[(d.model, free)]
            values = self._free_values[d.model]
            values.pop(bisect.bisect_left(values, free))
        if free == FULL:
            del self._node_free[d.node][d.model][idx]

    def _use(self, idx: int, milli: int) -> None:
        free = FULL - self._used[idx]
        if milli > free:
            raise PackingError(f"device {idx} has {free} milli free, cannot take {milli}")
        self._unindex(idx, free)
        self._used[idx] += milli
        self._index(idx, free - milli)

    def _unuse(self, idx: int, milli: int) -> None:
        free = FULL - self._used[idx]
        self._unindex(idx, free)
        self._used[idx] -= milli
        self._index(idx, free + milli)

    # -- queries -----------------------------------------------------------

    def _models(self, models: Collection[str] | None) -> list[str]:
        known = self._free_values.keys()
        return [m for m in known if not models or m in models]

    def find(self, milli: int, models: Collection[str] | None = None) -> tuple[str, tuple[tuple[int, int], ...]] | None:
        """Where would ``milli`` go now? ``None`` if it fits nowhere."""
        if milli <= 0:
            return ("", ())
        if milli <= FULL:
            best: tuple[int, int] | None = None  # (free, idx)
            for model in self._models(models):
                values = self._free_values[model]
                pos = bisect.bisect_left(values, milli)
                if pos < len(values):
                    free = values[pos]
                    if best is None or free < best[0]:
                        idx = next(iter(self._bucket[(model, free)]))
                        best = (free, idx)
            if best is None:
                return None
            idx = best[1]
            return (self.devices[idx].node, ((idx, milli),))
        if milli % FULL:
            raise PackingError(f"{milli} milli-GPUs: requests above one GPU must be whole GPUs")
        need = milli // FULL
        choice: tuple[int, str, list[int]] | None = None
        for node, by_model in self._node_free.items():
            for model, free_set in by_model.items():
                if models and model not in models:
                    continue
                n = len(free_set)
                if n >= need and (choice is None or n < choice[0]):
                    choice = (n, node, list(free_set)[:need])
                    if n == need:
                        break
        if choice is None:
            return None
        return (choice[1], tuple((i, FULL) for i in choice[2]))

    def can_place(self, milli: int, models: Collection[str] | None = None) -> bool:
        return self.find(milli, models) is not None

    # -- changes -----------------------------------------------------------

    def place(self, key: str, milli: int, models: Collection[str] | None = None) -> Placement | None:
        """Place ``milli`` for ``key``; ``None`` when no device can take it."""
        if key in self._placements:
            raise PackingError(f"{key} is already placed")
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

    def placement(self, key: str) -> Placement | None:
        return self._placements.get(key)

    def placements(self) -> list[Placement]:
        return list(self._placements.values())

    def used(self, idx: int) -> int:
        return self._used[idx]

    def total_milli(self, models: Collection[str] | None = None) -> int:
        return sum(FULL for d in self.devices.values() if not models or d.model in models)

    def free_milli(self, models: Collection[str] | None = None) -> int:
        return sum(
            FULL - self._used[i] for i, d in self.devices.items() if not models or d.model in models
        )

    def fully_free_devices(self, models: Collection[str] | None = None) -> int:
        return sum(
            1 for i, d in self.devices.items() if self._used[i] == 0 and (not models or d.model in models)
        )


def devices_from_inventory(specs: Iterable, node: str = "local") -> list[GPUDevice]:
    """Expand declared ``DeviceSpec`` rows (model, count, memory) into devices."""
    out: list[GPUDevice] = []
    for spec in specs:
        for _ in range(spec.count):
            out.append(GPUDevice(len(out), spec.model, spec.memory_mib, node=node, source="declared"))
    return out
