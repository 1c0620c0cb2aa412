"""GPU fragmentation of a node, as in "Beware of Fragmentation" (USENIX ATC '23).

The paper measures how much of a node's free GPU capacity a *target
workload* could not use, and schedules each task where that measure grows
least (fragmentation gradient descent, FGD). The target workload is a set of
task classes with their popularity: a class asks for ``milli`` (a share of
one GPU when ``<= 1000``, else whole GPUs) and may be limited to some GPU
models.

For one class ``m`` on a node with free shares ``f_1..f_k``:

* a share class (``milli <= 1000``): a GPU whose free share is below
  ``milli`` is a fragment for it, and when no GPU fits, every free share is
  (both cases are ``sum(f_i for f_i < milli)``);
* a whole-GPU class (``n`` GPUs): partially used GPUs are fragments, and
  when fewer than ``n`` GPUs are completely free, every free share is;
* a class not allowed on the node's model: every free share is a fragment.

The node's fragmentation is the popularity-weighted sum over classes. Only
GPUs are modelled (the packer places GPUs; CPU and memory are the
scheduler's). Because the share-class term is a sum over single GPUs of
``g(f) = f * W(> f)`` (``W(> f)``: popularity of share classes above ``f``),
the change caused by one placement depends only on the GPU it lands on and
on how many completely free GPUs its node has: :meth:`FragmentationWeights.share_delta`
and :meth:`FragmentationWeights.whole_delta` are O(1), which is what lets the
packer score every candidate of a 1,000-node cluster in microseconds.

Pure code: no I/O.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from .units import MILLI_PER_GPU

#: One GPU, in milli-GPUs.
FULL = MILLI_PER_GPU


@dataclass(frozen=True)
class TaskClass:
    """One kind of request of the target workload."""

    milli: int
    #: Allowed GPU models; empty = any.
    models: frozenset[str] = frozenset()


def _allowed(cls: TaskClass, model: str) -> bool:
    return not cls.models or model in cls.models


class ModelWeights:
    """The workload's popularity tables as seen from one GPU model."""

    __slots__ = ("g", "whole_total", "whole_above", "not_allowed", "fresh_cost")

    def __init__(self, model: str, workload: Mapping[TaskClass, int], max_gpus: int):
        share = [0] * (FULL + 2)
        whole_by_n = [0] * (max_gpus + 2)
        self.whole_total = 0
        self.not_allowed = 0
        for cls, weight in workload.items():
            if not _allowed(cls, model):
                self.not_allowed += weight
            elif cls.milli <= FULL:
                share[cls.milli] += weight
            else:
                n = -(-cls.milli // FULL)
                whole_by_n[min(n, max_gpus + 1)] += weight
                self.whole_total += weight
        # g[x] = x * (popularity of share classes asking for more than x)
        self.g = [0] * (FULL + 1)
        above = 0
        for x in range(FULL, -1, -1):
            self.g[x] = x * above
            above += share[x]
        # whole_above[c] = popularity of whole-GPU classes needing more than c free GPUs
        self.whole_above = [0] * (max_gpus + 2)
        above = 0
        for c in range(max_gpus + 1, -1, -1):
            self.whole_above[c] = above
            above += whole_by_n[c]
        # the part of share_delta on a completely free GPU that depends on the node's count c
        self.fresh_cost = [0] + [
            FULL * ((c - 1) * self.whole_above[c - 1] - c * self.whole_above[c]) for c in range(1, max_gpus + 1)
        ]

    def share_delta(self, free: int, milli: int, full_gpus: int) -> int:
        """Fragmentation change when ``milli <= 1000`` lands on a GPU with ``free`` left.

        ``full_gpus`` is how many GPUs of the node are completely free before.
        """
        delta = self.g[free - milli] - self.g[free] - self.not_allowed * milli
        if free == FULL:
            delta += self.whole_total * (FULL - milli) + self.fresh_cost[full_gpus]
        else:
            delta -= self.whole_total * milli
        return delta

    def whole_delta(self, gpus: int, full_gpus: int) -> int:
        """Fragmentation change when ``gpus`` completely free GPUs of a node are taken."""
        c = full_gpus
        return (
            FULL * ((c - gpus) * self.whole_above[c - gpus] - c * self.whole_above[c]) - self.not_allowed * gpus * FULL
        )


#: Popularities are scaled to integers summing to about this, so that scores are exact
#: and ties (broken by best fit) are real ties, not float noise.
WEIGHT_SCALE = 1_000_000


class FragmentationWeights:
    """Per-model tables of a target workload."""

    def __init__(self, workload: Mapping[TaskClass, float], models: Iterable[str], max_gpus: int):
        total = sum(w for w in workload.values() if w > 0)
        #: Popularity of each class, normalised to sum 1.
        self.workload = {c: w / total for c, w in workload.items() if w > 0} if total else {}
        scaled = {c: max(1, round(p * WEIGHT_SCALE)) for c, p in self.workload.items()}
        self.max_gpus = max_gpus
        self.by_model = {m: ModelWeights(m, scaled, max_gpus) for m in set(models)}


def node_fragmentation(free: Sequence[int], model: str, workload: Mapping[TaskClass, float]) -> float:
    """The node's fragmentation measure, computed directly from the definition.

    The reference the packer's O(1) deltas are tested against; ``workload``
    popularities are used as given (normalise them for comparable values).
    """
    total_free = sum(free)
    full = sum(1 for f in free if f == FULL)
    out = 0.0
    for cls, weight in workload.items():
        if not _allowed(cls, model):
            frag = total_free
        elif cls.milli <= FULL:
            frag = sum(f for f in free if f < cls.milli)
        else:
            frag = total_free if full < -(-cls.milli // FULL) else total_free - full * FULL
        out += weight * frag
    return out
