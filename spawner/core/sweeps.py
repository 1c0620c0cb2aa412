"""Parameter sweeps, the pure part: a grid or a list of runs, each run's parameters, the best run.

A sweep is one submission that becomes many jobs: its body is a job's (notebook or
script, profile, class ...) plus either

- ``grid``: ``{"lr": [1e-4, 3e-4, 1e-3], "seed": [0, 1]}`` -> the product, 6 runs, in the
  order of :func:`itertools.product` (the last key varies fastest), or
- ``runs``: an explicit list of parameter objects, ``[{"lr": 1e-4}, {"lr": 1e-3, "seed": 1}]``;

``max_parallel`` (how many of its runs may be admitted at once) and, optionally,
``objective`` (``{"metric": "loss", "direction": "min"}``: which run is best).

Each run is a job of its own, admitted by the ledger when the sweep's cap allows it
(the jobs service's sweep scheduler, :mod:`hub_config.jobs.sweeps`). Its parameters
reach a notebook as papermill parameters (over the submission's own) and a script as
arguments after its own, ``--lr 0.0001 --seed 0`` (:func:`parameter_args`); both find
them in ``GPULAB_JOB_PARAMETERS`` (JSON) too. A run reports metrics in a JSON file
beside its log (:func:`metrics_path`), which :func:`parse_metrics` reads back.
"""

from __future__ import annotations

import itertools
import json
import keyword
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import Any

from .jobprogram import JobSpecError
from .jobstates import CANCELLED, FINAL_STATES

#: The keys a sweep submission adds to a job's.
SWEEP_KEYS = frozenset({"grid", "runs", "max_parallel", "objective"})
#: A run the sweep has not admitted yet (no job exists for it).
WAITING = "waiting"
#: The states of a sweep as a whole.
ACTIVE, DONE = "active", "done"
SWEEP_STATES = (ACTIVE, DONE, CANCELLED)
DIRECTIONS = ("min", "max")
MAX_KEY_LEN = 64
MAX_STRING_VALUE_LEN = 256
#: Most metrics one run reports, and the longest metric name.
MAX_METRICS = 64
MAX_METRIC_NAME_LEN = 64
#: The suffix of a run's metrics file, beside its log.
METRICS_SUFFIX = ".metrics.json"

Scalar = str | int | float | bool


@dataclass(frozen=True)
class Objective:
    """Which metric makes a run the best, and whether less or more is better."""

    metric: str
    direction: str = "min"

    def to_json(self) -> dict[str, str]:
        return {"metric": self.metric, "direction": self.direction}


@dataclass(frozen=True)
class SweepPlan:
    """A validated sweep: each run's parameters (in run order), the cap, the objective."""

    runs: tuple[Mapping[str, Scalar], ...]
    max_parallel: int
    objective: Objective | None = None
    #: The grid as submitted (``None`` for an explicit list), kept to show what was asked.
    grid: Mapping[str, tuple[Scalar, ...]] | None = None


def expand_grid(grid: Mapping[str, Sequence[Scalar]]) -> list[dict[str, Scalar]]:
    """Every combination of the grid's values once, keys in the grid's order (the last varies fastest)."""
    keys = list(grid)
    return [dict(zip(keys, values, strict=True)) for values in itertools.product(*(grid[k] for k in keys))]


def grid_size(grid: Mapping[str, Sequence[Any]]) -> int:
    """How many runs a grid makes (the product of its lists' lengths), without making them."""
    return math.prod(len(v) for v in grid.values())


def _check_key(key: Any, where: str) -> str:
    if not isinstance(key, str) or not key.isidentifier() or keyword.iskeyword(key) or len(key) > MAX_KEY_LEN:
        raise JobSpecError(
            f"{where}: parameter name {str(key)[:40]!r} is not a Python identifier of at most {MAX_KEY_LEN} "
            "characters (it becomes a papermill parameter, or a script's --name)"
        )
    return key


def _check_scalar(value: Any, where: str) -> Scalar:
    """A parameter value: a string, a whole or finite number, or true/false; nothing nested, no null."""
    if isinstance(value, bool | int):
        return value
    if isinstance(value, float):
        if not math.isfinite(value):
            raise JobSpecError(f"{where}: {value!r} is not a finite number")
        return value
    if isinstance(value, str):
        if len(value) > MAX_STRING_VALUE_LEN or any(ord(c) < 32 for c in value):
            raise JobSpecError(
                f"{where}: a string value is longer than {MAX_STRING_VALUE_LEN} or has control characters"
            )
        return value
    what = "null" if value is None else ("a list" if isinstance(value, list) else type(value).__name__)
    raise JobSpecError(
        f"{where}: values must be strings, numbers or true/false, not {what}; "
        "a grid lists each parameter's values, e.g. {'lr': [0.0001, 0.001]}"
    )


def _same(a: Scalar, b: Scalar) -> bool:
    """Equal as parameters: ``1`` and ``True`` are different values (JSON keeps them apart)."""
    return type(a) is type(b) and a == b


def _grid(data: Any, max_runs: int, help_cap: str) -> dict[str, tuple[Scalar, ...]]:
    if not isinstance(data, dict):
        raise JobSpecError("grid must be a JSON object of parameter name -> list of values, e.g. {'lr': [0.1, 0.01]}")
    if not data:
        raise JobSpecError("grid is empty: name at least one parameter and its values, e.g. {'lr': [0.1, 0.01]}")
    grid: dict[str, tuple[Scalar, ...]] = {}
    for key, values in data.items():
        name = _check_key(key, "grid")
        if not isinstance(values, list):
            raise JobSpecError(f"grid: {name} must list its values, e.g. [{_check_scalar(values, 'grid ' + name)!r}]")
        if not values:
            raise JobSpecError(f"grid: {name} has no values, so the grid has no runs; list at least one")
        checked = tuple(_check_scalar(v, f"grid {name}") for v in values)
        for i, v in enumerate(checked):
            if any(_same(v, w) for w in checked[:i]):
                raise JobSpecError(f"grid: {name} lists {v!r} twice (every combination runs once)")
        grid[name] = checked
    size = grid_size(grid)
    if size > max_runs:
        raise JobSpecError(f"the grid makes {size} runs; a sweep has at most {max_runs} ({help_cap})", 413)
    return grid


def _runs(data: Any, max_runs: int, help_cap: str) -> list[dict[str, Scalar]]:
    if not isinstance(data, list):
        raise JobSpecError("runs must be a list of parameter objects, e.g. [{'lr': 0.1}, {'lr': 0.01}]")
    if not data:
        raise JobSpecError("runs is empty: list at least one run's parameters")
    if len(data) > max_runs:
        raise JobSpecError(f"runs lists {len(data)} runs; a sweep has at most {max_runs} ({help_cap})", 413)
    runs: list[dict[str, Scalar]] = []
    for i, run in enumerate(data):
        where = f"runs[{i}]"
        if not isinstance(run, dict):
            raise JobSpecError(f"{where} must be an object of parameter name -> value")
        if not run:
            raise JobSpecError(f"{where} has no parameters")
        checked = {_check_key(k, where): _check_scalar(v, f"{where} {k}") for k, v in run.items()}
        for j, earlier in enumerate(runs):
            if earlier.keys() == checked.keys() and all(_same(earlier[k], checked[k]) for k in checked):
                raise JobSpecError(f"{where} repeats runs[{j}] (every run's parameters differ)")
        runs.append(checked)
    return runs


def _objective(data: Any) -> Objective | None:
    if data is None:
        return None
    if not isinstance(data, dict) or set(data) - {"metric", "direction"}:
        raise JobSpecError("objective must be {'metric': NAME, 'direction': 'min' or 'max'}")
    metric = data.get("metric")
    if not isinstance(metric, str) or not metric or len(metric) > MAX_METRIC_NAME_LEN:
        raise JobSpecError(f"objective: metric must be a metric's name, at most {MAX_METRIC_NAME_LEN} characters")
    direction = data.get("direction", "min")
    if direction not in DIRECTIONS:
        raise JobSpecError(f"objective: direction must be 'min' or 'max', not {str(direction)[:20]!r}")
    return Objective(metric, direction)


def validate_sweep(
    data: Mapping[str, Any], *, max_runs: int, max_parallel: int, help_cap: str = "c.GPULabSweeps.max_runs"
) -> SweepPlan:
    """The sweep keys of a submission (``grid`` or ``runs``, ``max_parallel``, ``objective``), checked;
    :class:`JobSpecError` says which and why. ``max_parallel`` is the most a sweep may ask for."""
    has = [k for k in ("grid", "runs") if k in data]
    if len(has) != 1:
        raise JobSpecError(
            "a sweep names exactly one of grid (e.g. {'lr': [0.0001, 0.001], 'seed': [0, 1]}: every combination) "
            "or runs (a list of parameter objects)"
        )
    grid: dict[str, tuple[Scalar, ...]] | None = None
    if has[0] == "grid":
        grid = _grid(data["grid"], max_runs, help_cap)
        runs = expand_grid(grid)
    else:
        runs = _runs(data["runs"], max_runs, help_cap)
    cap = data.get("max_parallel")
    if cap is None:
        cap = min(len(runs), max_parallel)
    elif isinstance(cap, bool) or not isinstance(cap, int) or cap < 1 or cap > max_parallel:
        raise JobSpecError(
            f"max_parallel must be a whole number from 1 to {max_parallel} (c.GPULabSweeps.max_parallel)"
        )
    return SweepPlan(tuple(runs), int(cap), _objective(data.get("objective")), grid)


def format_value(value: Scalar) -> str:
    """A parameter as a command-line word: ``0.0001``, ``3``, ``true``, a string as it is."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return repr(value)  # the shortest text that reads back as the same float
    return str(value)


def parameter_args(parameters: Mapping[str, Scalar]) -> list[str]:
    """A run's parameters as a script's arguments: ``{"lr": 0.0001, "seed": 0}`` -> ``--lr 0.0001 --seed 0``."""
    out: list[str] = []
    for key, value in parameters.items():
        out += [f"--{key}", format_value(value)]
    return out


def metrics_path(log_path: str) -> str:
    """A job's metrics file beside its log: ``<dir>/runs/<name>-<stamp>.metrics.json``."""
    base = log_path[: -len(".log")] if log_path.endswith(".log") else log_path
    return str(PurePosixPath(base + METRICS_SUFFIX))


def parse_metrics(data: bytes) -> tuple[dict[str, float], str]:
    """``(metrics, problem)`` from a run's metrics file, whatever its owner wrote there.

    The file is a JSON object of metric name -> number (the ``gpulab_run`` helper writes it so);
    entries that are not finite numbers are left out, and ``problem`` says so (``""``: none).
    """
    try:
        raw = json.loads(data.decode("utf-8"), parse_constant=lambda name: None)
    except (UnicodeDecodeError, ValueError, RecursionError):
        return {}, "the metrics file is not JSON"
    if not isinstance(raw, dict):
        return {}, "the metrics file is not a JSON object of name -> number"
    metrics: dict[str, float] = {}
    skipped = 0
    for key, value in raw.items():
        number = value if isinstance(value, int | float) and not isinstance(value, bool) else None
        if number is None or not math.isfinite(number) or len(key) > MAX_METRIC_NAME_LEN or len(metrics) >= MAX_METRICS:
            skipped += 1
            continue
        metrics[key] = number
    problem = f"{skipped} entr{'y' if skipped == 1 else 'ies'} of the metrics file left out (not finite numbers, "
    problem += f"names over {MAX_METRIC_NAME_LEN} characters, or more than {MAX_METRICS} metrics)"
    return metrics, problem if skipped else ""


def best_run(metrics: Sequence[Mapping[str, float] | None], objective: Objective | None) -> int | None:
    """The index of the best run by the objective (the first of equals), ``None`` while none reported it."""
    if objective is None:
        return None
    best: int | None = None
    for i, m in enumerate(metrics):
        value = (m or {}).get(objective.metric)
        if value is None:
            continue
        if best is None:
            best = i
            continue
        current = (metrics[best] or {})[objective.metric]
        if (value < current) if objective.direction == "min" else (value > current):
            best = i
    return best


def sweep_state(run_states: Sequence[str], cancelled: bool) -> str:
    """``cancelled`` once cancelled, ``done`` when every run is final, else ``active``."""
    if cancelled:
        return CANCELLED
    return DONE if all(s in FINAL_STATES for s in run_states) else ACTIVE


def count_states(run_states: Sequence[str]) -> dict[str, int]:
    """How many runs are in each state (only the states that occur)."""
    counts: dict[str, int] = {}
    for s in run_states:
        counts[s] = counts.get(s, 0) + 1
    return counts
