"""The chart's alerts (helm/gpulab/rules/alerts.rules.yaml), evaluated by Prometheus' own engine.

``promtool test rules`` runs each alert over example series (the metrics the culler, the
hub, dcgm-exporter in both scrape styles and kube-state-metrics export) and compares the
alerts that fire, with their labels, to the expected ones: each alert fires when it
should and stays quiet otherwise. The chart renders the same file as a PrometheusRule.
"""

from __future__ import annotations

import re
import shutil
import subprocess

import yaml

from tests.support import REPO
from tests.support.helm import of_kind, render

ALERTS = REPO / "helm" / "gpulab" / "rules" / "alerts.rules.yaml"

SERIES = [
    # The culler's source failed in every cycle (reason unavailable), then recovered (too-large).
    {"series": 'gpulab_culler_source_failures_total{reason="unavailable"}', "values": "0+1x40"},
    {"series": 'gpulab_culler_source_failures_total{reason="too-large"}', "values": "0 1 1x38"},
    # Two KAI servers unattributed all along; a time-slice one only briefly.
    {"series": 'gpulab_culler_unattributed_servers{reason="kai-reservation-pod"}', "values": "2x40"},
    {"series": 'gpulab_culler_unattributed_servers{reason="timeslice-not-attributed"}', "values": "1x5 0x35"},
    # A GPU pod pending throughout, a CPU pod pending throughout, a GPU pod that started.
    {"series": 'kube_pod_status_phase{namespace="team-a",pod="jupyter-a",phase="Pending"}', "values": "1x40"},
    {"series": 'kube_pod_labels{namespace="team-a",pod="jupyter-a",label_gpulab_io_gpu_milli="500"}', "values": "1x40"},
    {"series": 'kube_pod_status_phase{namespace="team-a",pod="jupyter-cpu",phase="Pending"}', "values": "1x40"},
    {"series": 'kube_pod_labels{namespace="team-a",pod="jupyter-cpu",label_gpulab_io_gpu_milli="0"}', "values": "1x40"},
    {"series": 'kube_pod_status_phase{namespace="team-a",pod="jupyter-b",phase="Pending"}', "values": "1x5 0x35"},
    {
        "series": 'kube_pod_labels{namespace="team-a",pod="jupyter-b",label_gpulab_io_gpu_milli="1000"}',
        "values": "1x40",
    },
    # Team vision holds its whole burst (2 GPUs in + over quota); nlp holds less.
    {"series": 'gpulab_team_gpu_milli{team="vision",state="in-quota"}', "values": "1000x40"},
    {"series": 'gpulab_team_gpu_milli{team="vision",state="over-quota"}', "values": "1000x40"},
    {"series": 'gpulab_team_gpu_milli{team="vision",state="reserved"}', "values": "500x40"},
    {"series": 'gpulab_team_burst_milli{team="vision"}', "values": "2000x40"},
    {"series": 'gpulab_team_gpu_milli{team="nlp",state="in-quota"}', "values": "500x40"},
    {"series": 'gpulab_team_burst_milli{team="nlp"}', "values": "2000x40"},
    # Xid 79 on a GPU a server holds, scraped with honorLabels and the operator's way; an Xid
    # on a GPU no pod holds (the operator's way: only the exporter's own pod label); no Xid.
    {
        "series": 'DCGM_FI_DEV_XID_ERRORS{Hostname="n1",gpu="0",UUID="GPU-a",namespace="team-a",pod="jupyter-a"}',
        "values": "0 79x39",
    },
    {
        "series": 'DCGM_FI_DEV_XID_ERRORS{Hostname="n2",gpu="1",UUID="GPU-b",namespace="gpu-operator",'
        'pod="nvidia-dcgm-exporter-x1",exported_namespace="team-b",exported_pod="jupyter-b"}',
        "values": "0 48x39",
    },
    {
        "series": 'DCGM_FI_DEV_XID_ERRORS{Hostname="n2",gpu="2",UUID="GPU-c",namespace="gpu-operator",'
        'pod="nvidia-dcgm-exporter-x1"}',
        "values": "0 79x39",
    },
    {
        "series": 'DCGM_FI_DEV_XID_ERRORS{Hostname="n1",gpu="3",UUID="GPU-d",namespace="team-a",pod="jupyter-c"}',
        "values": "0x40",
    },
]


RULES = {r["alert"]: r for g in yaml.safe_load(ALERTS.read_text())["groups"] for r in g["rules"]}


def annotations(name: str, labels: dict[str, str], value: str) -> dict[str, str]:
    """The alert's annotations as Prometheus fills in ``$labels.x`` and ``$value``."""
    out = {}
    for key, text in RULES[name]["annotations"].items():
        text = text.replace("{{ $value }}", value)
        for label in re.findall(r"\{\{ \$labels\.(\w+) \}\}", text):
            text = text.replace(f"{{{{ $labels.{label} }}}}", labels.get(label, ""))
        out[key] = text
    return out


def alert(name: str, at: str, *fired: tuple[dict[str, str], str]) -> dict:
    """``fired``: each alert's labels and the ``$value`` its annotations show."""
    return {
        "eval_time": at,
        "alertname": name,
        "exp_alerts": [
            {"exp_labels": labels, "exp_annotations": annotations(name, labels, value)} for labels, value in fired
        ],
    }


CASES = [
    alert("GPULabCullerSourceFailing", "5m"),  # not yet for 10 minutes
    alert("GPULabCullerSourceFailing", "25m", ({"severity": "warning", "reason": "unavailable"}, "")),
    alert("GPULabServersUnattributed", "20m"),
    alert("GPULabServersUnattributed", "35m", ({"severity": "warning", "reason": "kai-reservation-pod"}, "2")),
    alert("GPULabGPUPodPending", "10m"),
    alert("GPULabGPUPodPending", "20m", ({"severity": "warning", "namespace": "team-a", "pod": "jupyter-a"}, "")),
    alert("GPULabTeamAtBurst", "35m", ({"severity": "info", "team": "vision"}, "")),
    alert(
        "GPULabXidOnServerGPU",
        "2m",
        (
            {
                "severity": "critical",
                "Hostname": "n1",
                "gpu": "0",
                "UUID": "GPU-a",
                "namespace": "team-a",
                "pod": "jupyter-a",
            },
            "79",
        ),
        (
            {
                "severity": "critical",
                "Hostname": "n2",
                "gpu": "1",
                "UUID": "GPU-b",
                "exported_namespace": "team-b",
                "exported_pod": "jupyter-b",
            },
            "48",
        ),
    ),
]


def test_each_alert_fires_when_it_should_and_only_then(tmp_path):
    test = {
        "rule_files": [str(ALERTS)],
        "evaluation_interval": "1m",
        "tests": [{"interval": "1m", "input_series": SERIES, "alert_rule_test": CASES}],
    }
    path = tmp_path / "alerts.test.yaml"
    path.write_text(yaml.safe_dump(test))
    promtool = shutil.which("promtool") or "/usr/bin/promtool"
    proc = subprocess.run([promtool, "test", "rules", str(path)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert set(RULES) == {c["alertname"] for c in CASES}, "every alert has its case"


def test_the_chart_installs_the_alerts_file_as_a_prometheus_rule():
    assert not [d for d in of_kind(render("default"), "PrometheusRule") if d["metadata"]["name"] == "gpulab-alerts"]
    docs = render(
        "default", ("monitoring.alerts.enabled=true", "monitoring.alerts.labels.release=kube-prometheus-stack")
    )
    (rule,) = [d for d in of_kind(docs, "PrometheusRule") if d["metadata"]["name"] == "gpulab-alerts"]
    assert rule["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    assert rule["spec"] == yaml.safe_load(ALERTS.read_text())
