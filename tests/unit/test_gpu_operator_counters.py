"""helm/values-gpu-operator.yaml's dcgm-exporter counters list carries every DCGM field gpulab reads.

The GPU operator mounts ``dcgmExporter.config.data`` as dcgm-exporter's counters list in place
of its default (NVIDIA/gpu-operator ``controllers/object_controls.go``: ``dcgm-metrics.csv``), so a
field missing there is a field no Prometheus ever has: the culler's evidence, a dashboard panel
or an alert would be empty on a real cluster.
"""

from __future__ import annotations

import re

import yaml

from idle_culler.sources import METRICS
from tests.support import REPO, grafana_dashboard

VALUES = yaml.safe_load((REPO / "helm" / "values-gpu-operator.yaml").read_text())


def counters() -> dict[str, str]:
    """Field -> Prometheus type, from the list's CSV lines (dcgm-exporter's format: field, type, help)."""
    out = {}
    for line in VALUES["dcgmExporter"]["config"]["data"].splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            field, kind, _help = (part.strip() for part in line.split(",", 2))
            out[field] = kind
    return out


def fields_read_by_the_chart() -> set[str]:
    exprs = [q.expr for q in grafana_dashboard.queries(grafana_dashboard.load())]
    for path in (REPO / "helm" / "gpulab" / "rules").glob("*.yaml"):
        for group in yaml.safe_load(path.read_text())["groups"]:
            exprs += [rule["expr"] for rule in group["rules"]]
    return {m for e in exprs for m in re.findall(r"\bDCGM_FI_[A-Z0-9_]+", e)}


def test_the_counters_list_has_every_field_the_culler_dashboard_and_alerts_read():
    listed = counters()
    needed = {m for m in METRICS if m.startswith("DCGM_FI_")} | fields_read_by_the_chart()
    assert {"DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_XID_ERRORS"} <= needed
    assert needed - set(listed) == set(), "add these to dcgmExporter.config.data"
    # The ECC panel's increase() needs counters; the list says so.
    assert listed["DCGM_FI_DEV_ECC_DBE_VOL_TOTAL"] == listed["DCGM_FI_DEV_ECC_SBE_VOL_TOTAL"] == "counter"


def test_the_operator_creates_the_list_it_is_told_to_mount():
    config = VALUES["dcgmExporter"]["config"]
    assert config["create"] is True and config["name"]
