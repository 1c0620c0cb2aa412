"""The cull decision (spawner/core/idle.py): pure functions, checked directly."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from spawner.core.idle import (
    BUSY,
    IDLE,
    MISSING,
    PARTIAL,
    SHORT,
    STALE,
    DeviceSeries,
    DeviceSummary,
    IdleWarning,
    KeepalivePolicy,
    KeepaliveRefused,
    Step,
    gpu_hours_freed,
    grant_keepalive,
    idle_gpu_hours_observed,
    idle_timeout_for,
    judge_gpu_idle,
    max_gap_for,
    next_step,
    summarize,
)
from spawner.core.model import Profile, Team

NOW = 10_000.0


def series(device="n/gpu0", values=None, start=NOW - 600, step=30.0, end=NOW):
    if values is None:
        n = int((end - start) / step) + 1
        values = [0.0] * n
    return DeviceSeries(device, tuple((start + i * step, v) for i, v in enumerate(values)))


def judge(ss, expected=None, window=600, gap=90, threshold=1.0, started_at=None):
    return judge_gpu_idle(
        ss,
        now=NOW,
        window_seconds=window,
        threshold_percent=threshold,
        max_gap_seconds=gap,
        expected_devices=expected,
        started_at=started_at,
    )


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
S = "2026-01-01T00:00:00.000000Z"  # the running session
OLD = "2025-12-31T23:00:00.000000Z"  # an earlier session of the same server


@pytest.mark.parametrize(
    "verdict, warning, keepalive, step",
    [
        (IDLE_V, None, None, Step.WARN),
        (BUSY_V, None, None, Step.NOTHING),
        (MISSING_V, None, None, Step.NOTHING),
        (IDLE_V, IdleWarning(NOW - 10, NOW + 50, S), None, Step.WAIT),
        (IDLE_V, IdleWarning(NOW - 60, NOW, S), None, Step.RECLAIM),
        (BUSY_V, IdleWarning(NOW - 60, NOW, S), None, Step.CLEAR),
        (MISSING_V, IdleWarning(NOW - 60, NOW, S), None, Step.HOLD),
        (MISSING_V, IdleWarning(NOW - 60, NOW, S, held=True), None, Step.WAIT),  # already on hold
        (IDLE_V, IdleWarning(NOW - 60, NOW - 30, S, held=True), None, Step.REWARN),  # data back: fresh grace
        (BUSY_V, IdleWarning(NOW - 60, NOW, S, held=True), None, Step.CLEAR),
        (IDLE_V, None, NOW + 5, Step.NOTHING),
        (IDLE_V, IdleWarning(NOW - 60, NOW, S), NOW + 5, Step.CLEAR),
        (IDLE_V, None, NOW - 5, Step.WARN),
        (IDLE_V, IdleWarning(NOW - 60, NOW, OLD), None, Step.VOID),  # restarted: never reclaimed on old grace
        (IDLE_V, IdleWarning(NOW - 60, NOW, OLD), NOW + 5, Step.VOID),
    ],
)
def test_state_machine(verdict, warning, keepalive, step):
    assert next_step(verdict, warning, keepalive, NOW, S) is step


@given(
    st.sampled_from([IDLE_V, BUSY_V, MISSING_V]),
    st.booleans(),
    st.booleans(),
    st.floats(min_value=-1000, max_value=1000),
    st.one_of(st.none(), st.floats(min_value=-100, max_value=100)),
)
def test_reclaim_only_when_idle_in_this_session_after_an_unheld_grace(
    verdict, same_session, held, reclaim_in, keepalive_in
):
    warning = IdleWarning(NOW - 100, NOW + reclaim_in, S if same_session else OLD, held)
    step = next_step(verdict, warning, None if keepalive_in is None else NOW + keepalive_in, NOW, S)
    if step is Step.RECLAIM:
        assert verdict.idle and same_session and not held and warning.reclaim_at <= NOW
        assert keepalive_in is None or NOW + keepalive_in <= NOW


def test_keepalive_is_capped():
    policy = KeepalivePolicy(max_uses=2, extends_seconds=100)
    used, until = grant_keepalive(policy, 0, None, NOW)
    assert (used, until) == (1, NOW + 100)
    used, until = grant_keepalive(policy, used, until, NOW + 10)
    assert (used, until) == (2, NOW + 110)
    with pytest.raises(KeepaliveRefused, match="2 of 2"):
        grant_keepalive(policy, used, until, NOW + 20)


def test_idle_gpu_hours_observed_before_the_reclaim():
    assert idle_gpu_hours_observed(500, 0, 7200) == 1.0
    assert idle_gpu_hours_observed(4000, 0, 900) == 1.0
    assert idle_gpu_hours_observed(0, 0, 7200) == 0.0
    assert idle_gpu_hours_observed(1000, 10, 5) == 0.0


def test_gpu_hours_freed_run_until_the_user_holds_a_gpu_again_or_now():
    assert gpu_hours_freed(2000, 0, 3600, 7200) == 2.0  # came back after an hour
    assert gpu_hours_freed(2000, 0, None, 1800) == 1.0  # not back yet: until now
    assert gpu_hours_freed(1000, 0, 9000, 3600) == 1.0  # "next" in the future never counts
    assert gpu_hours_freed(1000, 100, 50, 3600) == 0.0
    assert gpu_hours_freed(0, 0, None, 3600) == 0.0


# -- session-true evidence ------------------------------------------------


def test_a_server_younger_than_its_timeout_is_never_idle_whatever_the_gpu_did_before():
    v = judge([series()], started_at=NOW - 60)  # the GPU idled for the whole window, the server for 60 s
    assert not v.idle and v.status == SHORT and "started 60s ago" in v.reason
    assert judge([series()], started_at=NOW - 600).idle


@given(st.floats(min_value=NOW - 5000, max_value=NOW))
def test_idle_needs_a_session_at_least_as_old_as_the_window(started_at):
    assert judge([series()], started_at=started_at).idle == (started_at <= NOW - 600)


# -- short holes are unknown, long ones are not idle -------------------------


def test_max_gap_for_counts_missed_scrapes():
    assert max_gap_for(30, 2) == 105.0
    assert max_gap_for(15, 0) == 22.5


@given(st.integers(min_value=0, max_value=119), st.integers(min_value=1, max_value=6))
def test_a_hole_of_up_to_max_missed_samples_is_unknown_not_busy(at, length):
    # 30 s scrapes over an hour; tolerance: 2 missed scrapes in a row.
    full = series(values=[0.0] * 121, start=NOW - 3600, step=30.0)
    kept = tuple(p for i, p in enumerate(full.samples) if not at < i <= at + length)
    v = judge([DeviceSeries(full.device, kept)], window=3600, gap=max_gap_for(30, 2))
    if at + length < 120:  # inside: a hole of length + 1 intervals between two samples
        assert v.idle == (length <= 2)
    else:  # at the end: the newest sample's age counts (older than 105 s: a stale series)
        assert v.idle == ((120 - at) * 30 <= 105)
    if not v.idle:
        assert v.missing_data and v.status != BUSY


@given(
    st.lists(
        st.tuples(
            st.floats(min_value=NOW - 700, max_value=NOW + 50),
            st.one_of(st.floats(min_value=0, max_value=3), st.just(math.nan)),
        ),
        max_size=40,
    ),
    st.floats(min_value=1, max_value=200),
)
def test_summary_and_raw_samples_are_judged_alike(samples, gap):
    raw = DeviceSeries("n/gpu0", tuple(samples))
    summary = summarize(raw, start=NOW - 600, now=NOW)
    a = judge([raw], gap=gap)
    b = judge([summary], gap=gap)
    assert (a.idle, a.status) == (b.idle, b.status)
    if a.idle:  # idle is proven: every sample in the window at or below the threshold, no wide hole
        inside = [v for t, v in samples if NOW - 600 <= t <= NOW]
        assert inside and all(v <= 1.0 for v in inside)


def test_a_summary_with_an_unknown_wide_hole_is_not_idle():
    s = DeviceSummary("n/gpu0", samples=100, peak=0.0, mean=math.nan, lead=0.0, tail=1.0, max_gap=math.inf)
    v = judge([s])
    assert v.status == PARTIAL and "long hole" in v.reason


def test_a_summary_without_a_sample_at_the_window_start_says_so():
    # Prometheus' ``timestamp(x offset w)`` answers nothing after a staleness marker (a failed
    # scrape) or before the series' birth: the summary's lead is unknown, not a length.
    s = DeviceSummary("n/gpu0", samples=100, peak=0.0, mean=math.nan, lead=math.inf, tail=1.0, max_gap=30.0)
    v = judge([s])
    assert v.status == SHORT and not v.idle
    assert "no sample at the window's start" in v.reason and "unbounded" not in v.reason


def test_a_summary_without_a_sample_now_says_so():
    s = DeviceSummary("n/gpu0", samples=100, peak=0.0, mean=math.nan, lead=0.0, tail=math.inf, max_gap=30.0)
    v = judge([s])
    assert v.status == STALE and "no sample now" in v.reason and "unbounded" not in v.reason


def test_evidence_is_strict_json_even_for_prometheus_summaries():
    import json

    s = DeviceSummary("n/gpu0", samples=121, peak=0.0, mean=math.nan, lead=0.0, tail=3.0, max_gap=30.0)
    v = judge([s])
    assert v.idle
    json.dumps(v.evidence, allow_nan=False)  # raises on NaN / inf
