"""The Prometheus source's aggregated answer against a real Prometheus holding real history.

The history is written into Prometheus' TSDB with ``promtool`` (backfill), so a
test asks about any moment of an hour of 30 s scrapes at once, without waiting:
short holes, long holes, stale series, NaN, MIG ratios, busy samples, and an
answer too large to accept. The culler's recording rules are evaluated over
that history by Prometheus' own engine (``promtool tsdb create-blocks-from
rules``), on a grid 7 s after the scrapes, as a rule group with its own offset
would be. Every case is also judged from the raw samples; Prometheus' few
numbers per GPU must lead to the same verdict, with the rule, without it (the
subquery), and with a rule that is not there (the subquery for the servers
that look idle only).
"""

from __future__ import annotations

import math

import pytest

from idle_culler.prometheus_source import AnswerTooLarge, PrometheusSource
from idle_culler.sources import GPU_UTIL, GR_ENGINE_ACTIVE
from idle_culler.targets import POD, ServerTarget
from spawner.core.idle import BUSY, IDLE, PARTIAL, SHORT, STALE, DeviceSeries, judge_gpu_idle, max_gap_for
from tests.support.dcgm_fake_exporter import RunningPrometheus

STEP = 30.0
WINDOW = 3600.0
T = math.floor(1_790_000_000 / STEP) * STEP  # "now" of the tests: a fixed moment in the past
START = T - 2 * WINDOW  # history begins two windows before
GAP = max_gap_for(STEP, 2)


def stamps(start=START, end=T):
    n = int((end - start) / STEP)
    return [start + i * STEP for i in range(n + 1)]


def zeros(skip=lambda t: False, end=T):
    return [(t, 0.0) for t in stamps(end=end) if not skip(t)]


def hole(at: float, missing: int):
    """Drop ``missing`` scrapes in a row starting at ``at`` seconds before T."""
    first = T - at
    return lambda t: first <= t < first + missing * STEP


CASES = {
    # name: (metric, samples, expected status)
    "idle": (GPU_UTIL, zeros(), IDLE),
    "one-missed": (GPU_UTIL, zeros(hole(1800, 1)), IDLE),
    "two-missed": (GPU_UTIL, zeros(hole(1200, 2)), IDLE),
    "two-missed-twice": (GPU_UTIL, zeros(lambda t: hole(3000, 2)(t) or hole(600, 2)(t)), IDLE),
    "three-missed": (GPU_UTIL, zeros(hole(1800, 3)), PARTIAL),
    "hour-hole": (GPU_UTIL, zeros(hole(3300, 100)), PARTIAL),  # longer than Prometheus' 5 min lookback
    "hole-across-start": (GPU_UTIL, zeros(hole(3900, 20)), SHORT),  # 10 min, from before the window start
    "short-hole-across-start": (GPU_UTIL, zeros(hole(3630, 2)), IDLE),
    "busy-once": (GPU_UTIL, [(t, 40.0 if t == T - 900 else 0.0) for t in stamps()], BUSY),
    "busy-before-window": (GPU_UTIL, [(t, 90.0 if t < T - WINDOW - 300 else 0.0) for t in stamps()], IDLE),
    "nan": (GPU_UTIL, [(t, math.nan if t == T - 600 else 0.0) for t in stamps()], PARTIAL),
    "stale": (GPU_UTIL, zeros(end=T - 240), STALE),
    "mig-idle": (GR_ENGINE_ACTIVE, [(t, 0.004) for t in stamps()], IDLE),  # 0.4 % as a 0..1 ratio
    "mig-busy": (GR_ENGINE_ACTIVE, [(t, 0.3 if t == T - 60 else 0.0) for t in stamps()], BUSY),
}


def labels(name: str, metric: str) -> dict[str, str]:
    out = {
        "gpu": "0",
        "UUID": f"GPU-{name}",
        "Hostname": "node-1",
        "namespace": "jhub",
        "pod": f"jupyter-{name}",
        "modelName": "NVIDIA H100 80GB HBM3",
        "container": "notebook",
    }
    if metric == GR_ENGINE_ACTIVE:
        out.update(GPU_I_ID="1", GPU_I_PROFILE="1g.10gb")
    return out


TARGETS = [
    ServerTarget(
        user=name,
        server="",
        team="t",
        profile="p",
        gpu_milli=1000,
        mapping=POD,
        pod=f"jupyter-{name}",
        namespace="jhub",
    )
    for name in CASES
]


@pytest.fixture(scope="module")
def prometheus(tmp_path_factory):
    p = RunningPrometheus(tmp_path_factory.mktemp("prom-history"), [], rule_interval=f"{STEP:g}s")
    p.backfill([(metric, labels(name, metric), samples) for name, (metric, samples, _) in CASES.items()])
    p.start()
    p.backfill_rules(START + 7, T + 1)
    yield p
    p.stop()


def judge(series, now=T):
    return judge_gpu_idle(
        series, now=now, window_seconds=WINDOW, threshold_percent=1.0, max_gap_seconds=GAP, expected_devices=1
    )


#: How holes are measured: the recording rule; no rule (the subquery for every series); a rule
#: Prometheus does not have (the rule part answers nothing, the subquery asks for the idle-looking ones).
HOLES = {"rule": {}, "subquery": {"sample_age_rule": ""}, "missing-rule": {"sample_age_rule": "nope:{metric}:age"}}
#: Without the rule, the subquery measures the holes of the idle-looking series (only).
IDLE_LOOKING = {name for name, (_, _, status) in CASES.items() if status not in (BUSY, SHORT)} - {"nan"}


@pytest.mark.parametrize("holes", list(HOLES))
async def test_few_numbers_per_gpu_give_the_verdicts_of_the_raw_samples(prometheus, holes):
    source = PrometheusSource(prometheus_url=prometheus.url, scrape_interval=STEP, **HOLES[holes])
    data = await source.collect(TARGETS, T, {t.key: WINDOW for t in TARGETS}, threshold_percent=1.0)
    # One more query, for two-missed-twice only: its four missing samples could be one hole of
    # failed scrapes (which no recorded age shows); the check finds two tolerated ones.
    assert source.queries == (3 if holes == "missing-rule" else 2)
    assert source.last_subquery_series == (len(IDLE_LOOKING) if holes == "missing-rule" else 0)
    assert source.last_stale_checked_series == 1
    got = {t.user: judge(data[t.key]).status for t in TARGETS}
    assert got == {name: expected for name, (_, _, expected) in CASES.items()}
    # The same rules on the raw samples agree case by case.
    for name, (metric, samples, expected) in CASES.items():
        scale = 100.0 if metric == GR_ENGINE_ACTIVE else 1.0
        raw = DeviceSeries("node-1/gpu0", tuple((t, v * scale) for t, v in samples))
        assert judge([raw]).status == expected, name
    # A few numbers per GPU: one element per stat, not one per sample.
    assert source.last_answer_bytes < 1200 * 6 * len(CASES)
    idle = data["idle/"][0]
    assert idle.samples == WINDOW / STEP + 1 and idle.peak == 0.0 and idle.max_gap <= STEP
    assert data["mig-busy/"][0].peak == pytest.approx(30.0)
    assert data["two-missed/"][0].max_gap == pytest.approx(3 * STEP)


async def test_each_server_is_judged_over_its_own_window(prometheus):
    source = PrometheusSource(prometheus_url=prometheus.url, scrape_interval=STEP)
    # busy-once peaked 900 s before T: busy over an hour, idle over ten minutes -- in the same query.
    windows = {"busy-once/": WINDOW, "three-missed/": 600.0, "idle/": 1800.0}
    targets = [t for t in TARGETS if t.key in windows]
    data = await source.collect(targets, T, windows)
    assert source.queries == 2  # the hour's answer holds two-missed-twice too: its stale-hole check
    assert judge(data["busy-once/"]).status == BUSY
    assert (
        judge_gpu_idle(
            data["three-missed/"], now=T, window_seconds=600, threshold_percent=1.0, max_gap_seconds=GAP
        ).status
        == IDLE
    )  # its hole is outside the short window
    assert data["idle/"][0].samples == 1800 / STEP + 1  # both ends of the range count


async def test_an_answer_larger_than_the_cap_reclaims_nothing_and_says_what_to_change(prometheus):
    source = PrometheusSource(prometheus_url=prometheus.url, scrape_interval=STEP, max_answer_bytes=2048)
    with pytest.raises(AnswerTooLarge, match="series_selector.*max_answer_bytes"):
        await source.collect(TARGETS, T, {t.key: WINDOW for t in TARGETS})
    assert source.last_answer_bytes > 2048


@pytest.fixture(scope="module")
def new_rule_prometheus(tmp_path_factory):
    """The same history, but the recording rules were installed only 40 minutes before T."""
    p = RunningPrometheus(tmp_path_factory.mktemp("prom-new-rule"), [], rule_interval=f"{STEP:g}s")
    p.backfill([(GPU_UTIL, labels(name, GPU_UTIL), CASES[name][1]) for name in NEW_RULE_CASES])
    p.start()
    p.backfill_rules(T - 2400 + 7, T + 1)
    yield p
    p.stop()


NEW_RULE_CASES = ("idle", "three-missed", "busy-once")


async def test_a_rule_younger_than_the_window_leaves_the_holes_to_the_subquery(new_rule_prometheus):
    targets = [t for t in TARGETS if t.user in NEW_RULE_CASES]
    source = PrometheusSource(prometheus_url=new_rule_prometheus.url, scrape_interval=STEP)
    # An hour: the rule ran for 40 minutes of it, so the idle-looking series are measured by the subquery.
    data = await source.collect(targets, T, {t.key: WINDOW for t in targets}, threshold_percent=1.0)
    assert (source.queries, source.last_subquery_series) == (2, 2)
    assert {t.user: judge(data[t.key]).status for t in targets} == {
        "idle": IDLE,
        "three-missed": PARTIAL,
        "busy-once": BUSY,
    }
    # Twenty minutes: the rule covers it (three-missed's hole is older), one query.
    source = PrometheusSource(prometheus_url=new_rule_prometheus.url, scrape_interval=STEP)
    data = await source.collect(targets, T, {t.key: 1200.0 for t in targets}, threshold_percent=1.0)
    assert (source.queries, source.last_subquery_series) == (1, 0)
    assert {
        t.user: judge_gpu_idle(
            data[t.key], now=T, window_seconds=1200, threshold_percent=1.0, max_gap_seconds=GAP
        ).status
        for t in targets
    } == {"idle": IDLE, "three-missed": IDLE, "busy-once": BUSY}
