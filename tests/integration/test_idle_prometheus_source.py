"""The Prometheus and dcgm-exporter sources against a real Prometheus scraping a fake exporter.

Covers the Kubernetes join (pod + namespace labels), MIG instances
(``DCGM_FI_PROF_GR_ENGINE_ACTIVE``), both spellings of the host label, the
single-server join (host + device index), exactly one query per cycle, and
"Prometheus down -> the source refuses to answer".
"""

from __future__ import annotations

import asyncio
import time

import pytest

from idle_culler.dcgm_exporter_source import DCGMExporterSource
from idle_culler.prometheus_source import NoSeries, PrometheusSource
from idle_culler.sources import SourceUnavailable
from idle_culler.targets import DEVICE, POD, ServerTarget
from spawner.core.idle import BUSY, IDLE, MISSING, judge_gpu_idle
from tests.support.dcgm_fake_exporter import FakeDCGMExporter, RunningPrometheus

WINDOW = 4.0
GAP = 2.5


def pod_target(name: str, pod: str, namespace: str = "jhub", milli: int = 1000) -> ServerTarget:
    return ServerTarget(
        user=name, server="", team="vision", profile="p", gpu_milli=milli, mapping=POD, pod=pod, namespace=namespace
    )


def device_target(name: str, host: str, devices: tuple[int, ...]) -> ServerTarget:
    return ServerTarget(
        user=name,
        server="",
        team="vision",
        profile="p",
        gpu_milli=1000 * len(devices),
        mapping=DEVICE,
        hostname=host,
        devices=devices,
    )


TARGETS = [
    pod_target("alice", "jupyter-alice"),  # node-old (Hostname), idle
    pod_target("bob", "jupyter-bob"),  # node-new (hostname), idle
    pod_target("carol", "jupyter-carol"),  # node-new, busy
    pod_target("dave", "jupyter-dave", milli=500),  # MIG instance, idle
    pod_target("erin", "jupyter-erin", milli=500),  # MIG instance, busy
    pod_target("frank", "jupyter-frank"),  # no series at all
    pod_target("gina", "jupyter-alice", namespace="team-b"),  # same pod name, other namespace: busy
    pod_target("hana", "jupyter-hana", milli=2000),  # 2 GPUs, only one reported
    device_target("ivan", "node-local", (3,)),  # single server, idle, new label spelling
    device_target("jon", "node-local", (4,)),  # single server, MIG-partitioned device, one instance busy
]
WINDOWS = {t.key: WINDOW for t in TARGETS}
EXPECTED = {
    "alice/": IDLE,
    "bob/": IDLE,
    "carol/": BUSY,
    "dave/": IDLE,
    "erin/": BUSY,
    "frank/": MISSING,
    "gina/": BUSY,
    "hana/": "partial",
    "ivan/": IDLE,
    "jon/": BUSY,
}


@pytest.fixture(scope="module")
def exporter():
    e = FakeDCGMExporter(hostname="node-old", hostname_label="Hostname").start()
    e.set_gpu(0, 0, pod="jupyter-alice", namespace="jhub")
    e.set_gpu(0, 0, pod="jupyter-bob", namespace="jhub", host="node-new", host_label="hostname")
    e.set_gpu(1, 80, pod="jupyter-carol", namespace="jhub", host="node-new", host_label="hostname")
    e.set_mig(2, 1, 0.0, pod="jupyter-dave", namespace="jhub")
    e.set_mig(2, 2, 0.45, pod="jupyter-erin", namespace="jhub", profile="1g.10gb")
    e.set_gpu(5, 97, pod="jupyter-alice", namespace="team-b")
    e.set_gpu(6, 0, pod="jupyter-hana", namespace="jhub")
    e.set_gpu(3, 0, host="node-local", host_label="hostname")
    e.set_mig(4, 0, 0.0, host="node-local", host_label="hostname")
    e.set_mig(4, 1, 0.2, host="node-local", host_label="hostname")
    yield e
    e.stop()


@pytest.fixture(scope="module")
def prometheus(exporter, tmp_path_factory):
    p = RunningPrometheus(tmp_path_factory.mktemp("prom"), [f"127.0.0.1:{exporter.port}"]).start()
    p.wait_for_samples("DCGM_FI_DEV_GPU_UTIL", count=WINDOW + 3)
    yield p
    p.stop()


def verdicts(data: dict, now: float) -> dict[str, str]:
    return {
        t.key: judge_gpu_idle(
            data.get(t.key, []),
            now=now,
            window_seconds=WINDOW,
            threshold_percent=1.0,
            max_gap_seconds=GAP,
            expected_devices=t.expected_devices,
        ).status
        for t in TARGETS
    }


async def test_one_query_joins_pods_mig_and_both_host_labels(prometheus):
    source = PrometheusSource(scrape_interval=1.0, prometheus_url=prometheus.url)
    now = time.time()
    data = await source.collect(TARGETS, now, WINDOWS)
    assert source.queries == 1
    assert verdicts(data, now) == EXPECTED
    # The MIG instance is its own device and is read in percent.
    dave = data["dave/"]
    assert [s.device for s in dave] == ["node-old/gpu2/mig1"]
    assert dave[0].labels["GPU_I_PROFILE"] == "3g.40gb"
    assert data["erin/"][0].peak == pytest.approx(45.0)
    assert {s.device for s in data["bob/"]} == {"node-new/gpu0"}


async def test_selector_limits_the_query(prometheus):
    source = PrometheusSource(scrape_interval=1.0, prometheus_url=prometheus.url, series_selector='namespace="team-b"')
    data = await source.collect(TARGETS, time.time(), WINDOWS)
    assert source.queries == 1
    assert [k for k, v in data.items() if v] == ["gina/"]


async def test_no_series_for_any_server_is_a_source_failure(prometheus):
    """An answer without a single series (a broken scrape or selector) is not every server
    losing its data at once: the cycle fails, so no warning is cleared and nothing is reclaimed."""
    source = PrometheusSource(
        scrape_interval=1.0, prometheus_url=prometheus.url, series_selector='namespace="no-such-namespace"'
    )
    with pytest.raises(NoSeries, match=r"no GPU series at all for the \d+ GPU server\(s\).*series_selector"):
        await source.collect(TARGETS, time.time(), WINDOWS)
    assert source.queries == 1


async def test_dcgm_exporter_source_scrapes_directly(exporter):
    source = DCGMExporterSource(exporter_urls=[exporter.url])
    start = time.time()
    data = {}
    # It samples once per cycle, so it needs a window's worth of cycles before anything can be idle.
    while time.time() - start < WINDOW + 1.5:
        now = time.time()
        data = await source.collect(TARGETS, now, WINDOWS)
        if now - start < WINDOW - GAP - 0.1:  # the first sample does not reach back far enough yet
            assert all(s != IDLE for s in verdicts(data, now).values())
        await asyncio.sleep(0.5)
    assert source.queries >= 8
    assert verdicts(data, now) == EXPECTED


async def test_dcgm_exporter_down_is_unavailable():
    source = DCGMExporterSource(exporter_urls=["http://127.0.0.1:9/metrics"], request_timeout=2)
    with pytest.raises(SourceUnavailable):
        await source.collect(TARGETS, time.time(), WINDOWS)


async def test_prometheus_down_is_unavailable_and_its_hole_is_not_idle(prometheus):
    source = PrometheusSource(scrape_interval=1.0, prometheus_url=prometheus.url, request_timeout=3)
    prometheus.stop()
    down_at = time.time()
    try:
        with pytest.raises(SourceUnavailable, match="Prometheus"):
            await source.collect(TARGETS, time.time(), WINDOWS)
        assert source.queries == 1
        await asyncio.sleep(max(0.0, GAP + 0.5 - (time.time() - down_at)))  # an outage longer than the gap
    finally:
        prometheus.start()
    # Back up: until a whole window has passed, the outage's hole keeps every server from being idle.
    deadline = time.time() + 20
    while time.time() < deadline:
        now = time.time()
        data = await source.collect(TARGETS, now, WINDOWS)
        if time.time() > down_at + GAP + 2 and any(s.samples for ss in data.values() for s in ss):
            break
        await asyncio.sleep(0.3)
    else:
        pytest.fail("Prometheus did not scrape again after the restart")
    assert IDLE not in verdicts(data, now).values()
