"""The culler's benchmarks never rot: smoke runs, checked for structure and invariants, never timings.

- benchmarks/culler_cycle.py --smoke runs as a real process (real Prometheus with
  backfilled history, stand-in hub API): warn, reclaim and steady cycles beside
  jupyterhub-idle-culler, with and without the recording rules, one metric query per
  cycle, one hub request recording it; then the real JupyterHub's own listing of the
  same servers (its database filled directly), read in full by both cullers.
- benchmarks/idle_trace.py replays a synthetic duty-cycle trace through the
  culler's decision: the reclaim goal and "never a busy reclaim" are correctness
  properties of the decision, so they are asserted here.
"""

from __future__ import annotations

import json
import math
import random
import subprocess
import sys

import pytest

from spawner.core.idle import DeviceSeries, judge_gpu_idle, max_gap_for, summarize
from tests.support import REPO as ROOT

sys.path.insert(0, str(ROOT / "benchmarks"))

import idle_trace  # noqa: E402


@pytest.mark.integration
def test_culler_cycle_benchmark_smoke(tmp_path):
    proc = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "culler_cycle.py"), "--smoke", "--out", str(tmp_path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    doc = json.loads((tmp_path / "culler_cycle.json").read_text())
    assert doc["benchmark"] == "culler_cycle" and doc["smoke"] is True
    assert "real Prometheus" in doc["parts"] and "stand-in hub" in doc["parts"] and "real JupyterHub" in doc["parts"]
    servers = doc["parameters"]["servers"]
    assert doc["parameters"]["holes"] == "both"
    pages = -(-servers // 200)
    for cycles in ("cycles", "cycles_subquery"):
        assert set(doc[cycles]) == {"warn", "reclaim", "steady"}
        for kind, c in doc[cycles].items():
            assert c["wall_ratio"] > 0 and c["cpu_ratio"] > 0, kind
            assert c["cpu_ratio_with_prometheus"] >= c["cpu_ratio"], kind
    for holes in ("rule", "subquery"):
        by_kind = {r["cycle"]: r for r in doc["rows"] if r["holes"] == holes}
        assert by_kind["warn"]["gpulab_warned"] == servers // 2 and by_kind["warn"]["gpulab_reclaimed"] == 0
        assert by_kind["reclaim"]["gpulab_reclaimed"] == servers // 2
        # Listing, idle state, ONE cycle record, then one stop per reclaimed server.
        assert by_kind["reclaim"]["gpulab_hub_requests"] == pages + 2 + servers // 2
        assert by_kind["steady"]["gpulab_hub_requests"] == pages + 1
        # The peer stops by hub activity: every closed tab, busy or not, and no open tab.
        assert by_kind["steady"]["peer_wrong_stops"] == servers // 4
        assert by_kind["steady"]["peer_missed_idle"] == servers // 4
        # A few numbers per GPU, not every sample of the hour.
        assert 0 < by_kind["steady"]["gpulab_answer_bytes"] < 1500 * 5 * servers
    # The real hub served every running server to both cullers' listings.
    listing = doc["real_hub_listing"]
    assert listing["users"] == servers and listing["jupyterhub"]
    (row,) = listing["listings"]
    assert row["gpulab"]["users"] == servers and row["gpulab"]["pages"] == pages
    assert row["gpulab"]["hub_cpu_s"] >= 0 and row["peer"]["wall_s"] > 0
    assert "Cull cycles over 40 GPU servers" in proc.stdout


def test_duty_cycle_trace_has_the_statistics_asked_for():
    traces = [idle_trace.synth_trace(7000 + g, 24) for g in range(20)]
    stats = idle_trace.trace_stats(traces)
    assert 0.55 <= stats["zero_share"] <= 0.8  # about two thirds of the samples at zero
    assert stats["holes"]["1"] > stats["holes"]["3-10"] and stats["holes"]["2"] > stats["holes"]["3-10"]
    assert stats["holes"][">=1h"] >= 1  # a few holes of hours


def test_the_decision_reclaims_95_percent_of_the_idle_time_past_timeout_and_grace_and_never_a_busy_gpu():
    traces = [idle_trace.synth_trace(9000 + g, 24) for g in range(16)]
    for minutes in idle_trace.TIMEOUTS_MIN:
        r = idle_trace.evaluate(traces, minutes, 900.0, missed=2)
        assert r["reclaimable_gpu_hours"] > 1, r
        assert r["share"] >= 0.95, r
        assert r["busy_reclaims"] == 0, r
    # Without the short-hole tolerance, missed scrapes keep restarting the idle clock.
    strict = idle_trace.evaluate(traces, 120, 900.0, missed=0, truth_missed=2)
    assert strict["share"] < idle_trace.evaluate(traces, 120, 900.0, missed=2)["share"]


def test_the_replay_summaries_match_the_raw_sample_rules():
    trace = idle_trace.synth_trace(11, 6)
    gpu = idle_trace.ObservedGPU.of(trace)
    raw = DeviceSeries("gpu", tuple((t, v) for t, v in trace if v is not None))
    rng = random.Random(5)
    gap = max_gap_for(30, 2)
    for _ in range(300):
        now = rng.uniform(600, 6 * 3600)
        window = rng.choice([300.0, 900.0, 1800.0])
        fast = gpu.summary(now - window, now)
        slow = summarize(raw, start=now - window, now=now)
        assert (fast.samples, fast.peak, fast.lead, fast.tail) == (slow.samples, slow.peak, slow.lead, slow.tail)
        assert fast.max_gap == slow.max_gap or (math.isinf(fast.max_gap) and math.isinf(slow.max_gap))
        a = judge_gpu_idle([fast], now=now, window_seconds=window, threshold_percent=1, max_gap_seconds=gap)
        b = judge_gpu_idle([raw], now=now, window_seconds=window, threshold_percent=1, max_gap_seconds=gap)
        assert a.status == b.status
