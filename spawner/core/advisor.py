"""The profile advisor: a small catalog of GPU sizes that fits recorded demand.

Input: recorded requests (size in milli-GPUs and a weight: how often, or for
how many hours, that size was asked for), the sharing backend and how many
sizes the catalog may have. Output: at most that many sizes, each one the
backend can really give (:func:`givable_sizes`), covering every recorded
request and today's largest size, chosen so that the requests rounded up
to the catalog waste as little GPU as possible (or, given a measure, place
the most work).

Why waste: when a cluster fills, what it can place is its capacity times
the share of each allocation that was asked for (``requested / allocated``),
so the catalog that places the most work is the one with the least
rounding waste, weighted by demand. Every request must still find a size
(the largest size covers the largest request): dropping a size would make
the figure look better by refusing users, which the advisor never does.

The choice is exact (dynamic programming over the sizes worth having: each
recorded request rounded up to what the backend gives), not a heuristic.
Pure code: no I/O.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from .packer import DevicePacker
from .sharing import mig_table, pick_mig_slice, timeslice_effective_milli
from .units import MILLI_PER_GPU

FULL = MILLI_PER_GPU
#: How many sizes a recommended catalog has at most, unless told otherwise.
DEFAULT_MAX_SIZES = 6
#: Grids tried besides the free choice: shares that are multiples of 1/k of a GPU pack GPUs full.
GRID_STEPS = (2, 3, 4, 5, 6, 8, 10)


class AdvisorError(ValueError):
    """The request cannot be answered (the message says what to change)."""


def givable_sizes(
    backend: str, options: Mapping[str, Any] | None = None, model: str | None = None, max_gpus: int = 8
) -> list[int]:
    """Every size (milli-GPUs) ``backend`` can give, shares first, then 1..``max_gpus`` whole GPUs.

    ``whole``: whole GPUs only; ``timeslice``: ``k/R`` of a GPU for the
    configured replicas ``R``; ``mig``: the slices of ``model`` (each counted as
    :func:`spawner.core.sharing.pick_mig_slice` counts it); ``hami``: whole percent;
    ``kai``: any milli-GPU.
    """
    opts = options or {}
    whole = [n * FULL for n in range(1, max_gpus + 1)]
    if backend == "whole":
        shares: list[int] = []
    elif backend == "timeslice":
        replicas = int(opts.get("replicas", 4))
        shares = sorted({timeslice_effective_milli(k * FULL // replicas or 1, replicas)[1] for k in range(1, replicas)})
        if opts.get("fail_requests_greater_than_one"):
            shares = shares[:1]
    elif backend == "mig":
        table = mig_table(model or "", opts)
        if not table:
            raise AdvisorError(
                f"no MIG profiles are known for GPU model {model!r}: give the model of the "
                f"MIG GPUs, or add its profiles under sharing.mig.profiles"
            )
        # What the slice choice can answer, over every share a request may ask for.
        shares = sorted({pick_mig_slice(table, m)[1] for m in range(1, FULL)})
    elif backend == "hami":
        shares = list(range(10, FULL, 10))
    elif backend == "kai":
        shares = list(range(1, FULL))
    else:
        raise AdvisorError(f"unknown sharing backend {backend!r}; expected whole, timeslice, mig, hami or kai")
    return [s for s in shares if 0 < s < FULL] + whole


def round_up(milli: int, sizes: Sequence[int]) -> int | None:
    """The smallest of ``sizes`` (sorted) that holds ``milli``; ``None`` when none does."""
    for s in sizes:
        if s >= milli:
            return s
    return None


@dataclass(frozen=True)
class Advice:
    """A recommended catalog and what it would do to the recorded demand."""

    sizes: tuple[int, ...]
    requested_milli: float
    #: What the recorded demand takes once rounded up to these sizes.
    allocated_milli: float
    #: ``requested / allocated``: the share of an allocation that was asked for.
    efficiency: float
    #: The same for the catalog compared with (``None`` if none was given).
    current_sizes: tuple[int, ...] | None = None
    current_efficiency: float | None = None
    #: Weight of the requests the compared catalog cannot hold at all.
    current_not_offered: float = 0.0
    #: How many least-waste alternatives were compared.
    options_tried: int = 1
    #: What ``evaluate`` measured for the chosen sizes (``None``: chosen by least waste).
    measured: float | None = None
    #: What ``evaluate`` measured for the compared catalog.
    current_measured: float | None = None

    @property
    def predicted_gain(self) -> float | None:
        """Relative gain in work placed on a full cluster over the compared catalog.

        Measured by ``evaluate`` when there was one; else from rounding waste
        (a full cluster places ``capacity * requested / allocated``).
        """
        if self.measured is not None and self.current_measured:
            return self.measured / self.current_measured - 1.0
        if self.current_efficiency in (None, 0):
            return None
        return self.efficiency / self.current_efficiency - 1.0

    def to_dict(self) -> dict[str, Any]:
        return {
            "sizes_milli": list(self.sizes),
            "requested_milli": self.requested_milli,
            "allocated_milli": self.allocated_milli,
            "efficiency": self.efficiency,
            "current_sizes_milli": list(self.current_sizes) if self.current_sizes is not None else None,
            "current_efficiency": self.current_efficiency,
            "current_not_offered": self.current_not_offered,
            "predicted_gain": self.predicted_gain,
            "options_tried": self.options_tried,
            "measured": self.measured,
            "current_measured": self.current_measured,
            "chosen_by": "least rounding waste" if self.measured is None else "most work placed in a fill simulation",
        }


def demand_from(requests: Iterable[tuple[int, float]]) -> dict[int, float]:
    """``{milli: weight}`` from ``(milli, weight)`` pairs (non-positive sizes and weights dropped)."""
    out: dict[int, float] = {}
    for milli, weight in requests:
        if milli > 0 and weight > 0:
            out[int(milli)] = out.get(int(milli), 0.0) + float(weight)
    return out


def efficiency_of(demand: Mapping[int, float], sizes: Sequence[int]) -> tuple[float, float, float]:
    """``(requested, allocated, weight not offered)`` of ``demand`` under ``sizes``.

    Requests no size holds are left out of requested and allocated alike.
    """
    ordered = sorted(sizes)
    req = alloc = lost = 0.0
    for milli, weight in demand.items():
        s = round_up(milli, ordered)
        if s is None:
            lost += weight
            continue
        req += milli * weight
        alloc += s * weight
    return req, alloc, lost


def recommend(
    demand: Mapping[int, float],
    backend: str,
    *,
    max_sizes: int = DEFAULT_MAX_SIZES,
    options: Mapping[str, Any] | None = None,
    model: str | None = None,
    current: Sequence[int] | None = None,
    evaluate: Callable[[list[int]], float] | None = None,
) -> Advice:
    """A catalog of at most ``max_sizes`` givable sizes: least rounding waste, or most work measured.

    ``demand`` maps request sizes (milli-GPUs) to weights. Raises
    :class:`AdvisorError` when there is no demand, when ``max_sizes`` is below
    one, or when some request is larger than anything the backend gives.

    ``evaluate``, when given, measures the work a catalog places (for example
    a packing simulation); the advisor then returns the best-measured of its
    least-waste alternatives instead of the least-waste one.
    """
    if max_sizes < 1:
        raise AdvisorError(f"max_sizes must be at least 1, got {max_sizes}")
    demand = {m: w for m, w in demand.items() if m > 0 and w > 0}
    if not demand:
        raise AdvisorError("no recorded GPU requests to learn from")
    if current:
        # Never shrink what can be asked for: the advice holds today's largest size too
        # (with a weight too small to sway any other choice).
        top = max(current)
        if top > max(demand):
            demand[top] = min(demand.values()) * 1e-9
    largest = max(demand)
    max_gpus = max(1, -(-largest // FULL))
    givable = givable_sizes(backend, options, model, max_gpus=max_gpus)
    # The sizes worth having: each recorded request rounded up to what the backend gives.
    candidates = sorted({s for s in (round_up(m, givable) for m in demand) if s is not None})
    largest_size = round_up(largest, givable)
    if largest_size is None:
        raise AdvisorError(
            f"a recorded request of {largest} milli-GPUs is larger than anything backend {backend!r} gives"
        )
    pools = [candidates]
    for k in GRID_STEPS:
        grid = sorted({s for s in (round_up(-(-FULL * j // k), givable) for j in range(1, k)) if s and s < FULL})
        grid += [s for s in givable if s >= FULL]
        pools.append(sorted({s for s in (round_up(m, grid) for m in demand) if s is not None}))
    options_tried = _catalog_options(demand, pools, max_sizes)
    measured = None
    if evaluate is not None:
        scored = [(evaluate(sizes), -efficiency_of(demand, sizes)[1], sizes) for sizes in options_tried]
        best = max(scored)
        measured, sizes = best[0], best[2]
        # Least waste is only where the search starts: shares that leave no sliver
        # another share fits (0.32 + 0.65 on one GPU) place more work than any grid.
        pool = sorted({c for p in pools for c in p} | set(candidates))
        # Several starts, as single swaps stop at local optima: the least-waste catalog, and
        # shares added one by one from the recorded sizes alone and from every candidate.
        starts = [
            (sizes, measured),
            _forward(sizes, candidates, max_sizes, evaluate),
            _forward(sizes, pool, max_sizes, evaluate),
        ]
        sizes, measured = max(
            (_improve(s, m, pool, largest=largest_size, evaluate=evaluate) for s, m in starts),
            key=lambda found: found[1],
        )
    else:
        sizes = options_tried[0]
    req, alloc, _ = efficiency_of(demand, sizes)
    advice: dict[str, Any] = dict(
        sizes=tuple(sizes),
        requested_milli=req,
        allocated_milli=alloc,
        efficiency=req / alloc,
        options_tried=len(options_tried),
        measured=measured,
    )
    if current is not None:
        creq, calloc, lost = efficiency_of(demand, current)
        advice.update(
            current_sizes=tuple(sorted(current)),
            current_not_offered=lost,
            current_efficiency=creq / calloc if calloc else 0.0,
            current_measured=evaluate(sorted(current)) if evaluate is not None else None,
        )
    return Advice(**advice)


#: Catalogs a local search may measure at most (each one is a packing simulation).
MAX_SEARCH_EVALUATIONS = 600


def _forward(
    start: list[int], pool: Sequence[int], max_sizes: int, evaluate: Callable[[list[int]], float]
) -> tuple[list[int], float]:
    """Keep ``start``'s whole-GPU sizes and add shares one at a time, each the one measured best."""
    sizes = [s for s in start if s >= FULL]
    score = evaluate(sizes)
    while len(sizes) < max_sizes:
        trials = [(evaluate(sorted(sizes + [c])), c) for c in pool if c < FULL and c not in sizes]
        if not trials:
            break
        best_score, best = max(trials)
        if best_score <= score and len(sizes) > 1:
            break
        sizes, score = sorted(sizes + [best]), best_score
    return sizes, score


def _improve(
    sizes: list[int], score: float, pool: Sequence[int], *, largest: int | None, evaluate: Callable[[list[int]], float]
) -> tuple[list[int], float]:
    """Local search on the measured work: swap one size for another candidate while that helps.

    The largest size stays (it covers the largest request), so every catalog
    tried covers the whole demand and holds only givable sizes. First
    improvement, until no swap helps or the evaluation budget is spent.
    """
    best, best_score, evaluations = list(sizes), score, 0
    improved = True
    while improved and evaluations < MAX_SEARCH_EVALUATIONS:
        improved = False
        for i, old in enumerate(best):
            if old == largest:
                continue
            for new in pool:
                if new in best or (largest is not None and new > largest):
                    continue
                trial = sorted(best[:i] + [new] + best[i + 1 :])
                evaluations += 1
                value = evaluate(trial)
                if value > best_score:
                    best, best_score, improved = trial, value, True
                    break
                if evaluations >= MAX_SEARCH_EVALUATIONS:
                    break
            if improved or evaluations >= MAX_SEARCH_EVALUATIONS:
                break
    return best, best_score


def _catalog_options(demand: Mapping[int, float], pools: list[list[int]], max_sizes: int) -> list[list[int]]:
    """Least-waste catalogs from each candidate pool and each choice of multi-GPU sizes; least waste first.

    Waste alone would round a rare 2-GPU request up to 8 GPUs to free a slot
    for one more share, and prefers shares such as 0.47 and 0.81 that leave
    slivers no request fits, where a grid (quarters, fifths...) packs GPUs
    full. Which places more work depends on packing, which an ``evaluate``
    callback can measure on these alternatives.
    """
    out: list[list[int]] = []
    for candidates in pools:
        largest = candidates[-1]
        multi = [c for c in candidates if c > FULL and c != largest]
        shares = [c for c in candidates if c <= FULL]
        for mask in range(1 << len(multi)):
            kept = [m for b, m in enumerate(multi) if mask >> b & 1]
            if len(kept) + 1 > max_sizes:
                continue
            option = _best_sizes(demand, sorted({*shares, *kept, largest}), max_sizes, forced=set(kept))
            if option is not None and option not in out:
                out.append(option)
    out.sort(key=lambda sizes: efficiency_of(demand, sizes)[1])
    return out


def _best_sizes(
    demand: Mapping[int, float], candidates: list[int], max_sizes: int, forced: Collection[int] = frozenset()
) -> list[int] | None:
    """Exact least allocation: DP over "the largest size chosen so far is candidate j".

    ``cost[k][j]``: least allocation of the demand up to candidate ``j`` with
    ``k`` sizes, the largest being ``candidates[j]``. The largest candidate
    (it covers the largest request) and the ``forced`` ones are always chosen.
    """
    n = len(candidates)
    weight_at = [0.0] * n
    for milli, weight in demand.items():
        size = round_up(milli, candidates)
        assert size is not None, "the largest candidate covers the largest request"
        weight_at[candidates.index(size)] += weight
    prefix = [0.0]
    for w in weight_at:
        prefix.append(prefix[-1] + w)

    def span(i: int, j: int) -> float:  # demand of candidates i+1..j, all rounded up to candidates[j]
        return (prefix[j + 1] - prefix[i + 1]) * candidates[j]

    k_max = min(max_sizes, n)
    inf = float("inf")
    cost = [[inf] * n for _ in range(k_max + 1)]
    back = [[-1] * n for _ in range(k_max + 1)]
    first_forced = min((candidates.index(f) for f in forced), default=n)
    for j in range(min(n, first_forced + 1)):
        cost[1][j] = span(-1, j)
    for k in range(2, k_max + 1):
        for j in range(k - 1, n):
            for i in range(k - 2, j):
                # skipping a forced size between i and j is not allowed
                if cost[k - 1][i] == inf or any(candidates[x] in forced for x in range(i + 1, j)):
                    continue
                c = cost[k - 1][i] + span(i, j)
                if c < cost[k][j]:
                    cost[k][j], back[k][j] = c, i
    last = n - 1
    k_best = min(range(1, k_max + 1), key=lambda k: (cost[k][last], k))
    if cost[k_best][last] == inf:
        return None
    sizes = []
    j, k = last, k_best
    while j >= 0 and k >= 1:
        sizes.append(candidates[j])
        j, k = back[k][j], k - 1
    return sorted(sizes)


def fill_work(
    requests: Sequence[tuple[int, frozenset[str]]],
    devices: Sequence[Any],
    sizes: Sequence[int],
    max_failures: int = 200,
    scoring: str = "bestfit",
) -> int:
    """Work placed (requested milli-GPUs) when ``requests`` are rounded up to ``sizes`` and packed.

    The measure of the paper that published the Alibaba trace: requests in
    their order (cycling through them again if they run out), nothing
    leaves, until ``max_failures`` placements in a row fail. A request no
    size holds is skipped. ``devices`` are :class:`spawner.core.packer.GPUDevice`.
    """
    ordered = sorted(sizes)
    packer = DevicePacker(devices, scoring=scoring)
    offered = [(m, models, a) for m, models in requests if (a := round_up(m, ordered)) is not None]
    if not offered:
        return 0
    placed = failures = n = 0
    while failures < max_failures and n < 50 * len(offered):
        milli, models, alloc = offered[n % len(offered)]
        if packer.place(str(n), alloc, models or None) is not None:
            placed += milli
            failures = 0
        else:
            failures += 1
        n += 1
    return placed
