"""Failed scrapes against a real Prometheus: holes no recorded age can see.

When a scrape of a target fails, Prometheus writes a staleness marker for each of the
target's series (prometheus/prometheus scrape/scrape.go: "A failed scrape is the same as an
empty scrape, we still call sl.append to trigger stale markers"), and an instant selector
answers nothing after a marker (docs, "Querying basics", "Staleness"). The recording rule's
``time() - timestamp(x)`` and the subquery's steps are instant selectors: during a run of
failed scrapes they record nothing, so a hole made of failed scrapes never shows as a large
age. These tests make the exporter answer 503 (as one that times out or restarts) while a
real Prometheus scrapes it every second, with and without the recording rules.
"""

from __future__ import annotations

import asyncio
import math
import time

import pytest

from idle_culler.prometheus_source import PrometheusSource
from idle_culler.targets import POD, ServerTarget
from spawner.core.idle import IDLE, PARTIAL, judge_gpu_idle, max_gap_for
from tests.support.dcgm_fake_exporter import FakeDCGMExporter, RunningPrometheus

WINDOW = 8.0
GAP = max_gap_for(1.0, 2)  # 3.5 s: two missed scrapes in a row are unknown, not a break
TARGET = ServerTarget(
    user="alice",
    server="",
    team="vision",
    profile="p",
    gpu_milli=1000,
    mapping=POD,
    pod="jupyter-alice",
    namespace="jh",
)
#: Holes from the recording rule, and from the subquery (no rule).
HOLES = {"rule": {}, "subquery": {"sample_age_rule": ""}}


@pytest.fixture
def scraped(tmp_path):
    exporter = FakeDCGMExporter(hostname="node-flaky").start()
    exporter.set_gpu(0, 0, pod="jupyter-alice", namespace="jh")
    prometheus = RunningPrometheus(tmp_path / "prom", [f"127.0.0.1:{exporter.port}"]).start()
    try:
        prometheus.wait_for_clean_window(WINDOW + 2, timeout=60)
        yield exporter, prometheus
    finally:
        prometheus.stop()
        exporter.stop()


async def verdict(prometheus: RunningPrometheus, holes: str, at: float):
    source = PrometheusSource(prometheus_url=prometheus.url, scrape_interval=1.0, **HOLES[holes])
    source.max_gap_seconds = GAP
    data = await source.collect([TARGET], at, {TARGET.key: WINDOW}, threshold_percent=1.0)
    v = judge_gpu_idle(
        data[TARGET.key], now=at, window_seconds=WINDOW, threshold_percent=1.0, max_gap_seconds=GAP, expected_devices=1
    )
    return v, source


async def wait_until(t: float) -> None:
    await asyncio.sleep(max(0.0, t - time.time()))


async def test_a_run_of_failed_scrapes_is_a_hole_not_idle(scraped):
    exporter, prometheus = scraped
    began = time.time()
    exporter.fail_scrapes(seconds=5.0)  # five or six failed scrapes: a 6-7 s hole, wider than the 3.5 s allowed
    await wait_until(began + 7.2)
    at = float(math.floor(time.time()))  # the window starts 0.8-1.8 s before the first failed scrape
    assert len(exporter.failed_at) >= 4
    for holes in HOLES:
        v, source = await verdict(prometheus, holes, at)
        assert v.status == PARTIAL and not v.idle, (holes, v.reason)
        assert "long hole" in v.reason, v.reason
        assert source.last_stale_checked_series == 1 and source.queries >= 2


async def test_one_failed_scrape_is_unknown_not_a_break_even_at_the_windows_start(scraped):
    """One failed scrape is a 2 s hole, within the 3.5 s allowed, wherever it falls; at the
    window's start its staleness marker hides the sample before it from an instant selector."""
    exporter, prometheus = scraped
    exporter.fail_scrapes(count=1)
    deadline = time.time() + 5
    while not exporter.failed_at and time.time() < deadline:
        await asyncio.sleep(0.05)
    assert exporter.failed_at, "Prometheus never scraped the exporter"
    failed = exporter.failed_at[0]
    # The window starts just after the failed scrape (its marker), before the next good one;
    # then a window with the failed scrape in its middle.
    starts_after = float(math.ceil(failed)) + WINDOW
    inside = float(math.ceil(failed)) + WINDOW / 2
    await wait_until(starts_after + 0.5)
    assert len(exporter.failed_at) == 1
    for holes in HOLES:
        for at in (starts_after, inside):
            v, _ = await verdict(prometheus, holes, at)
            assert v.status == IDLE and v.idle, (holes, at - failed, v.reason)
