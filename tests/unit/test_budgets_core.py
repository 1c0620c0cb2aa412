"""The GPU-hour budget arithmetic (spawner.core.budgets): periods, usage, verdicts, notices."""

from __future__ import annotations

from datetime import date, datetime, timedelta, timezone
from zoneinfo import ZoneInfo

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from spawner.core.budgets import (
    EXHAUSTED,
    OK,
    OVER_QUOTA,
    REFUSE,
    UNITS_PER_MILLI_GPU_HOUR,
    WARNING,
    Budget,
    BudgetError,
    Holding,
    _first_instant,
    admission_verdict,
    budget_from_dict,
    budget_status,
    parse_gpu_hours,
    period_bounds,
    period_words,
    thresholds_due,
    usage_units,
    webhook_body,
)

#: Zones with daylight saving (north and south), one that springs forward at midnight
#: (America/Santiago, Chile), one with a 30-minute change (Australia/Lord_Howe) and UTC.
ZONES = ["UTC", "Europe/Berlin", "America/New_York", "America/Santiago", "Australia/Lord_Howe", "Asia/Kolkata"]

instants = st.datetimes(min_value=datetime(2020, 1, 1), max_value=datetime(2035, 12, 31))
H = timedelta(hours=1)


def local(dt: datetime, zone: str) -> datetime:
    return dt.replace(tzinfo=timezone.utc).astimezone(ZoneInfo(zone))


@settings(max_examples=400, deadline=None)
@given(at=instants, zone=st.sampled_from(ZONES), period=st.sampled_from(["month", "week"]))
def test_a_period_holds_its_instant_and_starts_on_its_first_local_day(at, zone, period):
    start, end = period_bounds(at, period, zone)
    assert start <= at < end
    first = local(start, zone)
    assert (first.day == 1) if period == "month" else (first.weekday() == 0)
    # the instant before the start is still in the previous period's last local day
    before = local(start - timedelta(microseconds=1), zone)
    assert before.date() < first.date()
    # periods tile the time line: the next period starts where this one ends
    assert period_bounds(end, period, zone)[0] == end
    assert period_bounds(start - timedelta(microseconds=1), period, zone)[1] == start


@settings(max_examples=200, deadline=None)
@given(at=instants, zone=st.sampled_from(ZONES))
def test_a_week_is_seven_days_give_or_take_the_daylight_saving_change(at, zone):
    start, end = period_bounds(at, "week", zone)
    assert timedelta(days=7) - 2 * H <= end - start <= timedelta(days=7) + 2 * H


def test_a_month_across_the_spring_change_has_an_hour_less_in_berlin():
    start, end = period_bounds(datetime(2026, 3, 15), "month", "Europe/Berlin")
    assert start == datetime(2026, 2, 28, 23)  # 1 March 00:00 CET
    assert end == datetime(2026, 3, 31, 22)  # 1 April 00:00 CEST
    assert end - start == timedelta(days=31) - H
    assert period_words(start, "month", "Europe/Berlin") == "March 2026"


def test_a_day_whose_midnight_does_not_exist_starts_at_the_first_instant_it_has():
    # Chile sprang forward at midnight on Sunday 2026-09-06 (00:00 -04 became 01:00 -03):
    # that local day begins at 01:00, 04:00 UTC, and the day before ends there.
    first = _first_instant(date(2026, 9, 6), ZoneInfo("America/Santiago"))
    assert first == datetime(2026, 9, 6, 4)
    assert local(first, "America/Santiago").hour == 1
    assert local(first - timedelta(microseconds=1), "America/Santiago").date() == date(2026, 9, 5)


@settings(max_examples=300, deadline=None)
@given(
    spans=st.lists(
        st.tuples(st.integers(0, 2000), st.integers(1, 2000), st.sampled_from([250, 500, 1000])), min_size=1, max_size=6
    ),
    copies=st.integers(1, 3),
)
def test_one_workload_recorded_several_times_counts_once(spans, copies):
    t0 = datetime(2026, 12, 1)
    now = t0 + timedelta(minutes=5000)
    holdings = [
        Holding("notebook:alice/", "vision", "alice", milli, t0 + timedelta(minutes=a), t0 + timedelta(minutes=a + d))
        for a, d, milli in spans
    ]
    once = usage_units(holdings, t0, now, now)
    assert usage_units(holdings * copies, t0, now, now) == once
    # never more than the largest share held the whole union, never less than any one interval
    assert once <= max(m for _, _, m in spans) * (now - t0) // timedelta(microseconds=1)
    assert once >= max(usage_units([h], t0, now, now) for h in holdings)


def test_a_running_server_counts_up_to_now_and_a_job_beside_it_counts_too():
    t0 = datetime(2026, 12, 1, 8)
    server = Holding("notebook:alice/", "vision", "alice", 500, t0, None)
    job = Holding("job:7", "vision", "alice", 2000, t0 + H, t0 + 3 * H)
    now = t0 + 4 * H
    units = usage_units([server, job], t0, now + 10 * H, now)
    assert units == (500 * 4 + 2000 * 2) * UNITS_PER_MILLI_GPU_HOUR
    # the window clips: only what lies in the period counts
    assert usage_units([server], t0 + 2 * H, now, now) == 500 * 2 * UNITS_PER_MILLI_GPU_HOUR


def test_thresholds_levels_and_each_notice_once():
    b = Budget("vision", 10_000, at_limit=REFUSE)  # 10 GPU-hours
    t0 = datetime(2026, 12, 1)
    h = Holding("job:1", "vision", "bob", 1000, t0, t0 + 7 * H)
    assert budget_status(b, [h], t0 + 8 * H, "UTC").level == OK
    h8 = Holding("job:1", "vision", "bob", 1000, t0, t0 + 8 * H)  # exactly 80 %
    s = budget_status(b, [h8], t0 + 9 * H, "UTC")
    assert s.level == WARNING and s.crossed == (80,)
    assert thresholds_due(s, []) == [80] and thresholds_due(s, [80]) == []
    s = budget_status(b, [Holding("job:1", "vision", "bob", 1000, t0, None)], t0 + 10 * H, "UTC")
    assert s.level == EXHAUSTED and thresholds_due(s, [80]) == [100]
    assert "new GPU work is refused" in s.banner()
    # another team's work never counts
    assert budget_status(b, [Holding("job:2", "nlp", "bob", 8000, t0, None)], t0 + 9 * H, "UTC").used_units == 0


def test_a_user_budget_counts_only_that_users_work():
    t0 = datetime(2026, 12, 1)
    b = Budget("vision", 1000, user="alice")
    hs = [Holding("a", "vision", "alice", 500, t0, t0 + H), Holding("b", "vision", "bob", 4000, t0, t0 + H)]
    assert budget_status(b, hs, t0 + 2 * H, "UTC").used_units == 500 * UNITS_PER_MILLI_GPU_HOUR


def test_the_verdict_at_100_percent_is_the_admins_choice():
    t0 = datetime(2026, 12, 1)
    used = [Holding("a", "vision", "alice", 1000, t0, t0 + 2 * H)]
    over = budget_status(Budget("vision", 1000, at_limit=OVER_QUOTA), used, t0 + 3 * H, "UTC")
    refuse = budget_status(Budget("vision", 1000, at_limit=REFUSE), used, t0 + 3 * H, "UTC")
    assert admission_verdict([over], may_burst=True).action == OVER_QUOTA
    v = admission_verdict([over], may_burst=False)
    assert v.action == REFUSE and "never runs over quota" in v.sentence
    v = admission_verdict([over, refuse], may_burst=True, admin_contact="#gpu-help")
    assert v.action == REFUSE and "resets on 01 Jan 2027 00:00 UTC" in v.sentence and "#gpu-help" in v.sentence
    assert admission_verdict([], may_burst=True).action == "allow"


@pytest.mark.parametrize(
    ("data", "words"),
    [
        ([], "must be an object"),
        ({"team": "vision"}, "'gpu_hours' is required"),
        ({"team": "Vision!", "gpu_hours": 1}, "'team' must be a team name"),
        ({"team": "ghost", "gpu_hours": 1}, "there is no team 'ghost'"),
        ({"team": "vision", "gpu_hours": 0}, "above 0"),
        ({"team": "vision", "gpu_hours": -3}, "above 0"),
        ({"team": "vision", "gpu_hours": "NaN"}, "above 0"),
        ({"team": "vision", "gpu_hours": True}, "not bool"),
        ({"team": "vision", "gpu_hours": 1e12}, "at most"),
        ({"team": "vision", "gpu_hours": "0.0001"}, "finer than a thousandth"),
        ({"team": "vision", "gpu_hours": "9" * 40}, "more than 32 characters"),
        ({"team": "vision", "gpu_hours": 1, "period": "fortnight"}, "'period' must be one of"),
        ({"team": "vision", "gpu_hours": 1, "at_limit": "kill"}, "'at_limit' must be one of"),
        ({"team": "vision", "gpu_hours": 1, "user": "x" * 300}, "'user' must be"),
        ({"team": "vision", "gpu_hours": 1, "user": "a\nb"}, "'user' must be"),
        ({"team": "vision", "gpu_hours": 1, "guarantee": 3}, "unknown budget field"),
    ],
)
def test_a_bad_budget_says_what_to_fix(data, words):
    with pytest.raises(BudgetError, match=words):
        budget_from_dict(data, ["vision"])


def test_gpu_hours_are_exact():
    assert parse_gpu_hours("12.5") == 12_500 and parse_gpu_hours(0.1) == 100 and parse_gpu_hours(3) == 3000
    b = budget_from_dict({"team": "vision", "gpu_hours": "2.25", "user": "alice", "period": "week"}, ["vision"])
    assert b.key == "user:vision/alice" and b.milli_gpu_hours == 2250


def test_the_webhook_body_names_the_budget_period_and_members():
    t0 = datetime(2026, 12, 1)
    s = budget_status(
        Budget("vision", 1000), [Holding("a", "vision", "alice", 1000, t0, None)], t0 + H, "Europe/Berlin"
    )
    body = webhook_body(s, 100, ["alice", "bob"], "https://hub.example.org/hub/")
    assert body["schema"] == "gpulab.budget-threshold/v1" and body["threshold_percent"] == 100
    assert body["id"] == "team:vision@2026-11-30T23:00:00Z#100"
    assert body["budget"]["team"] == "vision" and body["members"] == ["alice", "bob"]
    assert body["period"] == {
        "kind": "month",
        "start": "2026-11-30T23:00:00Z",
        "end": "2026-12-31T23:00:00Z",
        "time_zone": "Europe/Berlin",
        "name": "December 2026",
    }
    assert body["used_gpu_hours"] == 1.0 and body["percent"] == 100.0


def test_the_ledger_records_work_past_a_budget_as_preemptible_even_within_the_guarantee():
    from spawner.core.ledger import Ledger
    from spawner.core.model import Team

    ledger = Ledger([Team("vision", guarantee_milli=4000, burst_milli=8000)])
    d = ledger.reserve("notebook:alice/", "vision", "alice", 1000, preemptible=True)
    assert d.allowed and d.over_quota and ledger.get("notebook:alice/").over_quota
    assert not ledger.reserve("notebook:bob/", "vision", "bob", 1000).over_quota
    # the burst limit still holds for preemptible work
    assert not ledger.reserve("job:1", "vision", "bob", 7000, preemptible=True).allowed
