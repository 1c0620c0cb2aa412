"""Which series belong to which Kubernetes server, however Prometheus scraped them, and why
a server no series names is never reclaimed (the reasons the culler gives).

On the real control plane with dcgm-exporter's own attribution: tests/kube/test_kube_cluster_idle.py.
"""

from __future__ import annotations

import pytest

from idle_culler.attribution import REASONS, is_unattributed, shares_whole_gpu, unattributed_code
from idle_culler.sources import GPU_UTIL, HAMI_CONTAINER_UTIL, index_series, pod_of, series_for_targets
from idle_culler.targets import DEVICE, POD, ServerTarget
from spawner.core.idle_cycle import UNATTRIBUTED_CODES

SAMPLES = [(1.0, 0.0), (2.0, 0.0)]


def target(sharing: str, milli: int = 250, **kw) -> ServerTarget:
    fields = dict(user="u", server="", team="t", profile="p", gpu_milli=milli, mapping=POD, pod="jupyter-u")
    return ServerTarget(**{**fields, "namespace": "team-a", "sharing": sharing, "started_at": 0.0, **kw})


def test_exported_labels_name_the_workload_when_prometheus_did_not_honour_the_exporters():
    # The GPU operator's ServiceMonitor: the target's namespace/pod (the exporter's own pod) win.
    operator = {"namespace": "gpu-operator", "pod": "nvidia-dcgm-exporter-x", "exported_namespace": "team-a"}
    assert pod_of({**operator, "exported_pod": "jupyter-u"}) == ("team-a", "jupyter-u")
    assert pod_of({"namespace": "team-a", "pod": "jupyter-u"}) == ("team-a", "jupyter-u")
    # A GPU no pod holds carries only the target's labels: it names the exporter, no server.
    assert pod_of(operator) == ("gpu-operator", "nvidia-dcgm-exporter-x")


def test_each_scrape_style_and_hamis_per_container_series_join_the_same_server():
    dcgm = {"__name__": GPU_UTIL, "Hostname": "n1", "gpu": "0", "UUID": "GPU-1"}
    hami = {"__name__": HAMI_CONTAINER_UTIL, "device_uuid": "GPU-2", "vdevice_index": "0"}
    raw = [
        ({**dcgm, "namespace": "team-a", "pod": "jupyter-u"}, SAMPLES),
        ({**dcgm, "gpu": "1", "namespace": "gpu-operator", "pod": "exp", "exported_namespace": "team-b"}, SAMPLES),
        ({**dcgm, "gpu": "1", "exported_pod": "jupyter-v", "exported_namespace": "team-b"}, SAMPLES),
        (
            {**hami, "namespace": "kube-system", "pod": "hami-x", "exported_namespace": "team-c", "exported_pod": "w"},
            SAMPLES,
        ),
    ]
    by_pod, by_device = index_series(raw)
    u, v = target("whole", 1000), target("whole", 1000, user="v", namespace="team-b", pod="jupyter-v")
    w = target("hami", user="w", namespace="team-c", pod="w")
    found = series_for_targets([u, v, w], by_pod, by_device)
    assert [s.device for s in found["u/"]] == ["n1/gpu0"]
    assert [s.device for s in found["v/"]] == ["n1/gpu1"]
    assert [(s.device, s.labels["device_uuid"]) for s in found["w/"]] == [("hami/GPU-2/vgpu0", "GPU-2")]
    assert ("", "GPU-2") not in by_device and ("hami", "GPU-2") not in by_device  # not a local device


@pytest.mark.parametrize(
    ("sharing", "milli", "code"),
    [
        ("whole", 1000, "no-series"),
        ("timeslice", 250, "timeslice-not-attributed"),
        ("timeslice", 1000, "no-series"),  # whole GPUs under the time-slicing backend are plain nvidia.com/gpu
        ("mig", 250, "mig-no-profiling-metrics"),
        ("hami", 250, "hami-no-vgpu-metrics"),
        ("hami", 1000, "hami-no-vgpu-metrics"),  # HAMi serves whole GPUs as vGPU ids too
        ("kai", 250, "kai-reservation-pod"),
        ("kai", 1000, "no-series"),  # a whole KAI GPU is the pod's own nvidia.com/gpu
        ("", 500, "no-series"),
    ],
)
def test_the_reason_follows_the_backend_and_size(sharing, milli, code):
    assert unattributed_code(target(sharing, milli)) == code
    assert code in UNATTRIBUTED_CODES and REASONS[code]


def test_only_a_pod_server_old_enough_and_without_any_series_is_unattributed():
    t = target("kai")
    assert is_unattributed(t, 0, now=400, after_seconds=300)
    assert not is_unattributed(t, 1, now=400, after_seconds=300)  # partial or stale data is another matter
    assert not is_unattributed(t, 0, now=200, after_seconds=300)  # a young pod's first scrapes may be missing
    assert not is_unattributed(target("kai", started_at=None), 0, now=400, after_seconds=300)
    local = ServerTarget(user="u", server="", team="t", profile="p", gpu_milli=1000, mapping=DEVICE, started_at=0.0)
    assert not is_unattributed(local, 0, now=400, after_seconds=300)
    assert shares_whole_gpu(target("timeslice")) and not shares_whole_gpu(target("timeslice", 1000))
    assert shares_whole_gpu(target("kai")) and not shares_whole_gpu(target("hami"))


def test_hamis_metric_is_asked_for_only_when_a_hami_server_can_exist():
    from idle_culler.prometheus_source import PrometheusSource
    from idle_culler.sources import GR_ENGINE_ACTIVE, METRICS, metrics_for

    assert metrics_for({"whole", "timeslice", "mig", "kai"}) == (GPU_UTIL, GR_ENGINE_ACTIVE)
    assert metrics_for({"whole", "hami"}) == metrics_for({""}) == metrics_for(None) == METRICS
    source = PrometheusSource()
    assert HAMI_CONTAINER_UTIL not in source.query([3600.0], metrics=metrics_for({"whole"}))
    query = source.query([3600.0], metrics=METRICS)
    assert f"max_over_time({HAMI_CONTAINER_UTIL}[3600s])" in query
    # Each metric is reduced to its own labels: HAMi's vGPU, dcgm-exporter's GPU, and the pod either way.
    assert "max by (namespace,pod,exported_namespace,exported_pod,device_uuid,vdevice_index)" in query
    assert "max by (namespace,pod,exported_namespace,exported_pod,Hostname,hostname,gpu,GPU_I_ID" in query


def test_kais_gpu_groups_are_joined_only_when_configured_and_the_query_parses(tmp_path):
    import shutil
    import subprocess

    import yaml

    from idle_culler.prometheus_source import PrometheusSource

    source = PrometheusSource()
    assert not source.kai_for({"kai"}) and "kube_pod_labels" not in source.query([60.0], kai=source.kai_for(None))
    source.kai_reservation_namespace = "kai-resource-reservation"
    assert source.kai_for({"kai", "whole"}) and source.kai_for(None) and not source.kai_for({"whole", "hami"})
    query = source.query([60.0], kai=True)
    assert 'kube_pod_labels{namespace="kai-resource-reservation",label_runai_gpu_group!=""}' in query
    assert "group_right (Hostname,hostname,gpu,GPU_I_ID,GPU_I_PROFILE,UUID)" in query
    # Prometheus' own parser, through promtool (the bed evaluates it: tests/kube/test_kube_cluster_idle.py).
    rules = tmp_path / "q.yaml"
    rules.write_text(yaml.safe_dump({"groups": [{"name": "q", "rules": [{"record": "gpulab:q", "expr": query}]}]}))
    promtool = shutil.which("promtool") or "/usr/bin/promtool"
    proc = subprocess.run([promtool, "check", "rules", str(rules)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_an_unattributed_server_is_logged_once_per_session_counted_every_cycle_and_sent_when_the_hub_differs(caplog):
    import logging

    from idle_culler.hub import CycleBatch
    from idle_culler.metrics import CullerMetrics
    from idle_culler.plan import CycleSummary, HubRead
    from idle_culler.unattributed_report import UnattributedReport

    log = logging.getLogger("test-unattributed")
    metrics = CullerMetrics()
    report = UnattributedReport(log, metrics)
    t = target("kai", 1000)

    def cycle(started_at: float, hub_has: list | None) -> tuple[CycleBatch, CycleSummary]:
        batch, summary = CycleBatch(), CycleSummary()
        server = target("kai", 1000, started_at=started_at, started=f"session-{started_at:g}")
        read = HubRead([], {}, {}, {}, {}, set(), 400.0 + started_at, hub_has)
        report.report([server], {server.key: []}, read, batch, summary, after_seconds=300)
        return batch, summary

    with caplog.at_level(logging.WARNING, logger="test-unattributed"):
        batch, summary = cycle(0.0, None)
        assert summary.unattributed == {t.key: "no-series"}
        assert batch.unattributed is not None and [u.code for u in batch.unattributed] == ["no-series"]
        sent = [u.to_json() for u in batch.unattributed]
        again, _ = cycle(0.0, sent)  # the hub has the list now: nothing to send, nothing logged again
        assert again.unattributed is None
        assert len([r for r in caplog.records if "idle GPU reclaim is off" in r.getMessage()]) == 1
        cycle(50.0, sent)  # the server restarted: its new session is told again
        assert len([r for r in caplog.records if "idle GPU reclaim is off" in r.getMessage()]) == 2
    gauge = metrics.unattributed.labels("no-series")
    assert gauge._value.get() == 1


def test_a_utilisation_source_must_collect():
    import inspect

    from idle_culler.app import SOURCES
    from idle_culler.sources import UtilisationSource

    class Forgetful(UtilisationSource):
        """A source that does not say how it collects."""

    with pytest.raises(TypeError, match="abstract method collect"):
        Forgetful()
    assert all(not inspect.isabstract(cls) for cls in SOURCES.values())
