"""The cull decision (spawner/idle.py): pure functions, checked directly."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from spawner.idle import (
    BUSY, IDLE, MISSING, PARTIAL, SHORT, STALE, DeviceSeries, IdleWarning, KeepalivePolicy, KeepaliveRefused,
    Step, grant_keepalive, idle_timeout_for, judge_gpu_idle, next_step, reclaimed_gpu_hours,
)
from spawner.model import Profile, Team

NOW = 10_000.0


def series(device="n/gpu0", values=None, start=NOW - 600, step=30.0, end=NOW):
    if values is None:
        n = int((end - start) / step) + 1
        values = [0.0] * n
    return DeviceSeries(device, tuple((start + i * step, v) for i, v in enumerate(values)))


def judge(ss, expected=None, window=600, gap=90, threshold=1.0):
    return judge_gpu_idle(ss, now=NOW, window_seconds=window, threshold_percent=threshold,
                          max_gap_seconds=gap, expected_devices=expected)


def test_all_zero_over_the_window_is_idle():
    v = judge([series()], expected={"n/gpu0"})
    assert v.idle and v.status == IDLE
    assert v.evidence["devices"]["n/gpu0"][0]["max"] == 0.0


def test_one_busy_sample_is_busy():
    values = [0.0] * 21
    values[7] = 35.0
    v = judge([series(values=values)])
    assert not v.idle and v.status == BUSY and "35%" in v.reason


def test_threshold_is_inclusive():
    assert judge([series(values=[1.0] * 21)], threshold=1.0).idle
    assert not judge([series(values=[1.0] * 20 + [1.01])], threshold=1.0).idle


def test_no_series_is_missing():
    v = judge([])
    assert not v.idle and v.status == MISSING and v.missing_data


def test_missing_device_is_partial():
    v = judge([series("n/gpu0")], expected={"n/gpu0", "n/gpu1"})
    assert v.status == PARTIAL and "n/gpu1" in v.reason
    assert judge([series("n/gpu0")], expected=2).status == PARTIAL
    assert judge([series("n/gpu0"), series("n/gpu1")], expected=2).idle


def test_stale_series_is_not_idle():
    v = judge([series(end=NOW - 200)])
    assert v.status == STALE and not v.idle


def test_short_history_is_not_idle():
    v = judge([series(start=NOW - 300)])
    assert v.status == SHORT and not v.idle


def test_hole_in_the_samples_is_not_idle():
    s = series()
    holed = DeviceSeries(s.device, tuple(p for p in s.samples if not (NOW - 400 < p[0] < NOW - 200)))
    assert judge([holed]).status == PARTIAL


def test_nan_is_not_idle():
    assert judge([series(values=[0.0] * 20 + [math.nan])]).status == PARTIAL


def test_busy_beats_missing_data_in_the_reason():
    v = judge([series(values=[90.0] * 21)], expected=2)
    assert v.status == BUSY


@given(st.lists(st.floats(min_value=0, max_value=100, allow_nan=False), min_size=21, max_size=21))
def test_idle_iff_every_sample_at_or_below_threshold(values):
    v = judge([series(values=values)], threshold=5.0)
    assert v.idle == all(x <= 5.0 for x in values)


@given(st.lists(st.integers(min_value=0, max_value=19), max_size=20, unique=True))
def test_any_dropped_sample_makes_it_not_idle(dropped):
    # Samples every 30 s from 10 s into the window; a 35 s gap allowance tolerates none missing.
    full = series(values=[0.0] * 20, start=NOW - 590)
    kept = tuple(p for i, p in enumerate(full.samples) if i not in dropped)
    v = judge([DeviceSeries(full.device, kept)], gap=35)
    assert v.idle == (not dropped)
    if dropped:
        assert v.missing_data


def test_timeout_shorter_of_profile_and_team_wins():
    p = Profile("h100-4", "4 × H100", gpu_milli=4000, idle_timeout_seconds=1800)
    t = Team("vision", idle_timeout_seconds=3600)
    assert idle_timeout_for(p, t, 99) == (1800, "profile h100-4")
    t2 = Team("strict", idle_timeout_seconds=600)
    assert idle_timeout_for(p, t2, 99) == (600, "team strict")
    assert idle_timeout_for(Profile("x", "x"), t, 99) == (3600, "team vision")
    assert idle_timeout_for(p, Team("none"), 99) == (1800, "profile h100-4")
    assert idle_timeout_for(None, None, 99) == (99, "default")


IDLE_V = judge([series()])
BUSY_V = judge([series(values=[50.0] * 21)])
MISSING_V = judge([])


@pytest.mark.parametrize("verdict, warning, keepalive, step", [
    (IDLE_V, None, None, Step.WARN),
    (BUSY_V, None, None, Step.NOTHING),
    (MISSING_V, None, None, Step.NOTHING),
    (IDLE_V, IdleWarning(NOW - 10, NOW + 50), None, Step.WAIT),
    (IDLE_V, IdleWarning(NOW - 60, NOW), None, Step.RECLAIM),
    (BUSY_V, IdleWarning(NOW - 60, NOW), None, Step.CLEAR),
    (MISSING_V, IdleWarning(NOW - 60, NOW), None, Step.HOLD),
    (IDLE_V, None, NOW + 5, Step.NOTHING),
    (IDLE_V, IdleWarning(NOW - 60, NOW), NOW + 5, Step.CLEAR),
    (IDLE_V, None, NOW - 5, Step.WARN),
])
def test_state_machine(verdict, warning, keepalive, step):
    assert next_step(verdict, warning, keepalive, NOW) is step


def test_keepalive_is_capped():
    policy = KeepalivePolicy(max_uses=2, extends_seconds=100)
    used, until = grant_keepalive(policy, 0, None, NOW)
    assert (used, until) == (1, NOW + 100)
    used, until = grant_keepalive(policy, used, until, NOW + 10)
    assert (used, until) == (2, NOW + 110)
    with pytest.raises(KeepaliveRefused, match="2 of 2"):
        grant_keepalive(policy, used, until, NOW + 20)


def test_reclaimed_gpu_hours():
    assert reclaimed_gpu_hours(500, 0, 7200) == 1.0
    assert reclaimed_gpu_hours(4000, 0, 900) == 1.0
    assert reclaimed_gpu_hours(0, 0, 7200) == 0.0
    assert reclaimed_gpu_hours(1000, 10, 5) == 0.0
