"""Parameter sweeps, the pure part: grid expansion (hypothesis: the count is the product, every
combination exactly once), the refusals and their words, a run's arguments, metrics read back
from a user's file, the best run; and the ``gpulab_run`` helper a run reports metrics with."""

from __future__ import annotations

import itertools
import json
import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

import gpulab_run
from spawner.core import sweeps
from spawner.core.jobspec import JobSpecError
from spawner.core.sweeps import Objective

KEYS = st.from_regex(r"[a-z][a-z0-9_]{0,8}", fullmatch=True).filter(lambda k: not __import__("keyword").iskeyword(k))
SCALARS = st.one_of(
    st.integers(-(10**6), 10**6),
    st.floats(allow_nan=False, allow_infinity=False, width=32),
    st.text(st.characters(min_codepoint=32, max_codepoint=126), max_size=8),
    st.booleans(),
)


def distinct(values: list) -> list:
    out: list = []
    for v in values:
        if not any(type(v) is type(w) and v == w for w in out):
            out.append(v)
    return out


GRIDS = st.dictionaries(KEYS, st.lists(SCALARS, min_size=1, max_size=4).map(distinct), min_size=1, max_size=4)


@given(GRIDS)
def test_a_grid_makes_the_product_of_its_lengths_and_every_combination_once(grid):
    runs = sweeps.expand_grid(grid)
    assert len(runs) == math.prod(len(v) for v in grid.values()) == sweeps.grid_size(grid)
    as_tuples = [tuple((type(r[k]).__name__, repr(r[k])) for k in grid) for r in runs]
    assert len(set(as_tuples)) == len(runs)  # no combination twice
    expected = {tuple((type(v).__name__, repr(v)) for v in combo) for combo in itertools.product(*grid.values())}
    assert set(as_tuples) == expected  # and none missing
    assert all(list(r) == list(grid) for r in runs)  # every run names every key, in the grid's order


@given(GRIDS)
def test_a_valid_grid_validates_to_its_expansion(grid):
    size = sweeps.grid_size(grid)
    plan = sweeps.validate_sweep({"grid": grid}, max_runs=max(size, 1), max_parallel=4)
    assert [dict(r) for r in plan.runs] == sweeps.expand_grid(grid)
    assert plan.max_parallel == min(size, 4)


def test_the_issue_example_makes_six_runs_the_last_key_fastest():
    plan = sweeps.validate_sweep(
        {"grid": {"lr": [1e-4, 3e-4, 1e-3], "seed": [0, 1]}, "max_parallel": 2}, max_runs=100, max_parallel=8
    )
    assert [dict(r) for r in plan.runs][:3] == [
        {"lr": 1e-4, "seed": 0},
        {"lr": 1e-4, "seed": 1},
        {"lr": 3e-4, "seed": 0},
    ]
    assert len(plan.runs) == 6 and plan.max_parallel == 2 and plan.objective is None


def test_an_explicit_list_of_runs_is_kept_in_order():
    runs = [{"lr": 0.1}, {"lr": 0.01, "seed": 3}, {"name": "resnet"}]
    plan = sweeps.validate_sweep(
        {"runs": runs, "objective": {"metric": "loss", "direction": "min"}}, max_runs=10, max_parallel=8
    )
    assert [dict(r) for r in plan.runs] == runs and plan.objective == Objective("loss", "min")


@pytest.mark.parametrize(
    ("body", "words", "status"),
    [
        ({}, "exactly one of grid", 400),
        ({"grid": {"a": [1]}, "runs": [{"a": 1}]}, "exactly one of grid", 400),
        ({"grid": {}}, "grid is empty", 400),
        ({"grid": []}, "grid must be a JSON object", 400),
        ({"grid": {"lr": []}}, "lr has no values", 400),
        ({"grid": {"lr": 0.1}}, "lr must list its values, e.g. [0.1]", 400),
        ({"grid": {"lr": [[0.1, 0.2]]}}, "not a list", 400),
        ({"grid": {"lr": [{"a": 1}]}}, "not dict", 400),
        ({"grid": {"lr": [None]}}, "not null", 400),
        ({"grid": {"lr": [0.1, 0.1]}}, "lists 0.1 twice", 400),
        ({"grid": {"class": [1]}}, "not a Python identifier", 400),
        ({"grid": {"x-y": [1]}}, "not a Python identifier", 400),
        ({"grid": {"s": ["a\nb"]}}, "control characters", 400),
        ({"grid": {"a": list(range(10)), "b": list(range(11))}}, "makes 110 runs; a sweep has at most 100", 413),
        ({"runs": []}, "runs is empty", 400),
        ({"runs": {"a": 1}}, "runs must be a list", 400),
        ({"runs": [1]}, "runs[0] must be an object", 400),
        ({"runs": [{}]}, "runs[0] has no parameters", 400),
        ({"runs": [{"a": 1}, {"a": 1}]}, "runs[1] repeats runs[0]", 400),
        ({"runs": [{"a": 1}] * 0 + [{"a": i} for i in range(101)]}, "lists 101 runs", 413),
        ({"runs": [{"a": [1]}]}, "not a list", 400),
        ({"grid": {"a": [1]}, "max_parallel": 0}, "max_parallel must be a whole number from 1 to 8", 400),
        ({"grid": {"a": [1]}, "max_parallel": 9}, "from 1 to 8", 400),
        ({"grid": {"a": [1]}, "max_parallel": True}, "from 1 to 8", 400),
        ({"grid": {"a": [1]}, "objective": "loss"}, "objective must be", 400),
        ({"grid": {"a": [1]}, "objective": {"metric": "loss", "direction": "up"}}, "'min' or 'max'", 400),
        ({"grid": {"a": [1]}, "objective": {"metric": ""}}, "metric must be", 400),
        ({"grid": {"a": [1]}, "objective": {"metric": "l", "extra": 1}}, "objective must be", 400),
    ],
)
def test_refusals_say_what_is_wrong(body, words, status):
    with pytest.raises(JobSpecError) as e:
        sweeps.validate_sweep(body, max_runs=100, max_parallel=8)
    assert words in str(e.value) and e.value.status == status


def test_true_and_one_are_different_values():
    plan = sweeps.validate_sweep({"grid": {"flag": [True, 1, 1.0]}}, max_runs=10, max_parallel=8)
    assert [r["flag"] for r in plan.runs] == [True, 1, 1.0]


def test_a_runs_parameters_become_a_scripts_arguments():
    assert sweeps.parameter_args({"lr": 1e-4, "seed": 0, "amp": True, "opt": "adam"}) == [
        "--lr",
        "0.0001",
        "--seed",
        "0",
        "--amp",
        "true",
        "--opt",
        "adam",
    ]
    assert sweeps.format_value(1e-5) == "1e-05" and float(sweeps.format_value(3e-4)) == 3e-4


def test_metrics_path_is_beside_the_log():
    assert sweeps.metrics_path("exp/runs/lr-r0-20261201-1.log") == "exp/runs/lr-r0-20261201-1.metrics.json"


@pytest.mark.parametrize(
    ("data", "metrics", "problem"),
    [
        (b'{"loss": 0.5, "acc": 1}', {"loss": 0.5, "acc": 1}, ""),
        (b'{"loss": "low", "acc": true, "ok": 2}', {"ok": 2}, "2 entries"),
        (b'{"loss": NaN, "x": Infinity}', {}, "2 entries"),
        (b"[1, 2]", {}, "not a JSON object"),
        (b"\xff\xfe", {}, "not JSON"),
        (b'{"loss": 0.5', {}, "not JSON"),
        (json.dumps({"m" * 65: 1, "a": 1}).encode(), {"a": 1}, "1 entry"),
        (json.dumps({f"m{i}": i for i in range(70)}).encode(), {f"m{i}": i for i in range(64)}, "6 entries"),
    ],
)
def test_metrics_are_read_back_whatever_the_file_holds(data, metrics, problem):
    got, said = sweeps.parse_metrics(data)
    assert got == metrics and problem in said and (said == "") == (problem == "")


def test_the_best_run_by_the_objective_first_of_equals():
    metrics = [{"loss": 0.3}, None, {"loss": 0.1, "acc": 0.5}, {"acc": 0.9}, {"loss": 0.1}]
    assert sweeps.best_run(metrics, Objective("loss", "min")) == 2
    assert sweeps.best_run(metrics, Objective("loss", "max")) == 0
    assert sweeps.best_run(metrics, Objective("acc", "max")) == 3
    assert sweeps.best_run(metrics, Objective("f1", "max")) is None
    assert sweeps.best_run(metrics, None) is None


def test_sweep_state():
    assert sweeps.sweep_state(["succeeded", "failed"], cancelled=False) == "done"
    assert sweeps.sweep_state(["succeeded", "waiting"], cancelled=False) == "active"
    assert sweeps.sweep_state(["running"], cancelled=True) == "cancelled"


def test_the_helper_merges_metrics_into_the_file_atomically(tmp_path, monkeypatch):
    path = tmp_path / "runs" / "x.metrics.json"
    monkeypatch.setenv("GPULAB_METRICS_FILE", str(path))
    monkeypatch.setenv("GPULAB_JOB_PARAMETERS", json.dumps({"lr": 0.001}))
    assert gpulab_run.parameters() == {"lr": 0.001}
    gpulab_run.log_metrics(loss=0.5, step=1)
    assert gpulab_run.log_metrics({"loss": 0.25}) == {"loss": 0.25, "step": 1.0}
    assert json.loads(path.read_text()) == {"loss": 0.25, "step": 1.0}
    assert sorted(p.name for p in path.parent.iterdir()) == ["x.metrics.json"]  # no temporary file left
    assert sweeps.parse_metrics(path.read_bytes()) == ({"loss": 0.25, "step": 1.0}, "")
    for bad in ({"loss": float("nan")}, {"loss": "low"}, {"ok": True}):
        with pytest.raises(ValueError, match="finite number"):
            gpulab_run.log_metrics(bad)
    assert json.loads(path.read_text()) == {"loss": 0.25, "step": 1.0}  # a refused call wrote nothing


def test_the_helper_outside_a_job_only_returns(monkeypatch, tmp_path):
    monkeypatch.delenv("GPULAB_METRICS_FILE", raising=False)
    monkeypatch.delenv("GPULAB_JOB_PARAMETERS", raising=False)
    monkeypatch.chdir(tmp_path)
    assert gpulab_run.log_metrics(loss=1) == {"loss": 1.0} and gpulab_run.parameters() == {}
    assert list(tmp_path.iterdir()) == []
