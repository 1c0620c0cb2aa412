"""benchmarks/culler_cycle.py never rots: its --smoke mode runs as a real process.

Checks structure and invariants (one metric query per cycle, every server
judged, nothing culled when every GPU is busy), never timings.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_culler_cycle_benchmark_smoke(tmp_path):
    proc = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "culler_cycle.py"), "--smoke", "--out", str(tmp_path)],
        cwd=ROOT, capture_output=True, text=True, timeout=180,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    doc = json.loads((tmp_path / "culler_cycle.json").read_text())
    assert doc["benchmark"] == "culler_cycle" and doc["smoke"] is True
    assert "stand-in" in doc["standins"]
    servers = doc["parameters"]["servers"]
    assert doc["metric_queries_per_cycle"] == [1]
    assert doc["verdicts_last_cycle"] == {"busy": servers}
    assert len(doc["rows"]) == doc["parameters"]["repeat"]
    for row in doc["rows"]:
        assert row["gpulab_metric_queries"] == 1
        assert row["gpulab_cycle_s"] > 0 and row["idle_culler_cycle_s"] > 0
        # Both cullers listed every user through the same (paginated) hub API.
        assert row["gpulab_hub_requests"] >= 2 and row["idle_culler_hub_requests"] >= 2
    assert doc["ratio_median"] > 0
    assert "One cull cycle over 50 GPU servers" in proc.stdout
