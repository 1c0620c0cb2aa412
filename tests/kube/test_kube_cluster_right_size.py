"""The right-size line on Kubernetes: each session's GPU memory peak and utilisation p95, read
from the real Prometheus at the session's end, on the real control plane.

A hub configured as Zero to JupyterHub configures it (tests/kube/bed/z2jh_hub_config.py) with
GPUKubeSpawner starts alice's servers; the scheduler binds their pods to the fake H100 nodes
and the node agent runs them, handing out device ids as the device plugin does and publishing
the kubelet's PodResources view. The imitation of dcgm-exporter (tests/kube/bed/dcgm_exporter.py,
which follows dcgm-exporter's sources) labels each GPU's series with the pod holding it; the
test sets what the pods' kernels use (11 GiB of frame buffer, 18 % busy: no GPU exists here).
The real Prometheus scrapes it twice, as gpulab's ServiceMonitor does (``honorLabels``: the
series keep ``pod``/``namespace``) and as the GPU operator's own does (``exported_pod``/
``exported_namespace``), so each GPU's series is there in both label styles.

Three sessions of 1 × H100 run; the hub restarts in the middle of them; Prometheus is down
when they end, so the hub cannot measure them: the spawn page and ``/gpulab/me`` show no line
(unknown, not "0 GiB"). Once Prometheus is back the waiting sessions are measured, and both
show the line with its evidence, the figures Prometheus holds for those pods; so does the
JupyterLab sidebar of her next 1 × H100 server, in Chromium.
"""

from __future__ import annotations

import html
import json
import re
import sqlite3

import yaml

from tests.kube.bed.chart import Release
from tests.kube.bed.cluster import Cluster
from tests.kube.bed.dcgm_exporter import ExporterSettings, FakeKubeDCGMExporter
from tests.kube.bed.testbed import NODES_FILE
from tests.kube.bed.z2jh_hub_config import bed_hub
from tests.support import REPO
from tests.support.browser import CHROMIUM, CHROMIUM_ARGS
from tests.support.dcgm_fake_exporter import RunningPrometheus
from tests.support.faults import wait_until
from tests.support.kube_spawner import chart_team
from tests.support.lab import open_gpu_sidebar

OPERATOR_VALUES = yaml.safe_load((REPO / "helm" / "values-gpu-operator.yaml").read_text())
SERVERS = ("s1", "s2", "s3")
#: The GPUs' used + free frame buffer (the imitation's FB_TOTAL_MIB, an H100 80GB's as NVML
#: reports it): the chart's catalog declares no memory for H100-80GB, so "of" is this.
LINE = (
    "Last 3 sessions of 1 × H100: peak 11 GiB of 79.6 GiB GPU memory, utilisation p95 18 %: 0.5 × H100 would have done"
)


def both_scrape_styles(exporter: FakeKubeDCGMExporter) -> list[dict]:
    """gpulab's ServiceMonitor (honorLabels) and the GPU operator's, as two jobs of one Prometheus."""
    ours = exporter.scrape_configs(True)
    operator = [{**job, "job_name": f"{job['job_name']}-operator"} for job in exporter.scrape_configs(False)]
    return [j for j in ours + operator if j["job_name"].startswith("dcgm")]


def lab_sidebar_says(hub, user: str, choice: str, profile_label: str, text: str) -> None:
    """Log in, start ``choice`` from the spawn page and read the GPU sidebar's right-size note."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 900})
            page.set_default_timeout(60_000)
            panel = open_gpu_sidebar(page, hub.url, user, choice, profile_label, field="profile")
            note = panel.locator(".gpulab-right-size")
            note.wait_for()
            assert note.inner_text() == text
        finally:
            browser.close()


def right_size_of(hub, user: str, slug: str) -> str:
    return next(p["right_size"] for t in hub.me(user)["teams"] for p in t["profiles"] if p["slug"] == slug)


def recorded(hub) -> list[tuple]:
    """The hub's session GPU records (gpulab's database, read-only), by pod."""
    # Beside the hub's own SQLite file, in its working folder (hub_config/config/setup.py).
    with sqlite3.connect(f"file:{hub.workdir / 'gpulab.sqlite'}?mode=ro", uri=True) as db:
        return db.execute(
            "SELECT namespace, pod, state, peak_memory_mib, device_memory_mib, util_p95, samples, devices "
            "FROM gpulab_session_gpu ORDER BY pod"
        ).fetchall()


def test_the_spawn_page_names_a_smaller_profile_from_prometheus_and_nothing_while_it_is_away(
    tmp_path, release: Release, kube: Cluster
):
    vision = chart_team(release, "vision")
    ns = release.team_ns(vision)
    nodes = yaml.safe_load(NODES_FILE.read_text())["nodes"]
    settings = ExporterSettings.from_env(OPERATOR_VALUES["dcgmExporter"]["env"])
    exporter = FakeKubeDCGMExporter(kube.tb.pod_resources_dir, nodes, settings).start()
    prom = RunningPrometheus(tmp_path / "prometheus", [], scrape_configs=both_scrape_styles(exporter)).start()
    extra = f"""
c.JupyterHub.allow_named_servers = True
c.GPULabSessionMetrics.prometheus_url = {prom.url!r}
c.GPULabSessionMetrics.scrape_interval = 1  # the test's Prometheus scrapes every second
c.GPULabSessionMetrics.settle_seconds = 3
c.GPULabSessionMetrics.check_interval = 2
"""
    hub = bed_hub(tmp_path / "hub", release.hub_namespace, release.hub_kubeconfig, release.catalog_yaml(), None, extra)
    try:
        hub.start()
        assert hub.api("POST", "/users", json={"usernames": ["alice"]}).status_code in (201, 409)
        for name in SERVERS:
            r = hub.api("POST", f"/users/alice/servers/{name}", data=json.dumps({"team": vision, "profile": "h100-1"}))
            assert r.status_code in (201, 202), r.text
        for name in SERVERS:
            hub.wait_server("alice", name, timeout=180)
        pods = [p["metadata"]["name"] for p in kube.pods(ns, "gpulab.io/user=alice")]
        assert len(pods) == 3, pods
        for pod in pods:  # what alice's kernels use of each H100
            exporter.set_memory(ns, pod, 11 * 1024)
            exporter.set_activity(ns, pod, 18)
        assert right_size_of(hub, "alice", "h100-1") == ""  # nothing measured yet
        # Each running session is tied to its pod, as dcgm-exporter names it.
        wait_until(lambda: len(recorded(hub)) == 3, 30, "the sessions' pods recorded")
        assert [r[:3] for r in recorded(hub)] == [(ns, pod, "pending") for pod in sorted(pods)]

        # The hub restarts mid-session: the sessions' intervals and pods stay recorded.
        hub.restart()
        for name in SERVERS:
            assert hub.wait_server("alice", name)["ready"]
        for pod in pods:
            # some 30 s of each session's GPU in Prometheus (most of it at 11 GiB)
            prom.wait_for_samples(f'DCGM_FI_DEV_FB_USED{{pod="{pod}"}}', count=30, timeout=90)

        # Prometheus goes away; the sessions end: they cannot be measured now.
        prom.stop()
        for name in SERVERS:
            r = hub.api("DELETE", f"/users/alice/servers/{name}")
            assert r.status_code in (202, 204), r.text
        for name in SERVERS:
            hub.wait_server("alice", name, ready=False, timeout=90)
        wait_until(
            lambda: "cannot read sessions' GPU use from Prometheus" in hub.log_tail(400),
            60,
            "the hub trying Prometheus and saying it is away",
        )
        page = html.unescape(hub.spawn_page(hub.login("alice")).content.decode())
        assert "would have done" not in page  # unknown: no line, never a peak of 0 GiB
        assert right_size_of(hub, "alice", "h100-1") == ""

        # Prometheus is back (its data kept): the waiting sessions are measured.
        prom.start()
        line = wait_until(lambda: right_size_of(hub, "alice", "h100-1"), 90, "the right-size line", interval=1)
        assert line == LINE, hub.log_tail(80)
        page = html.unescape(hub.spawn_page(hub.login("alice")).content.decode())
        # On 1 × H100's card in each of alice's teams (vision, nlp: the evidence is hers, per
        # profile), on no 0.5 × H100 card.
        assert page.count(LINE) == page.count("would have done") == 2
        assert right_size_of(hub, "alice", "h100-half") == ""
        # Advice only: nothing was started or changed for alice.
        assert hub.api("GET", "/users/alice").json()["servers"] == {}
        rows = recorded(hub)
        assert [r[:3] for r in rows] == [(ns, pod, "measured") for pod in sorted(pods)], rows
        assert all(r[3] == 11 * 1024 and r[4] == 81559 and r[5] == 18 and r[6] >= 20 for r in rows), rows
        # Each session's figures are of its one H100, as dcgm-exporter's labels name it.
        for row in rows:
            (gpu,) = row[7].split("; ")
            assert re.fullmatch(r"gpu-h100-whole-\d/gpu\d NVIDIA H100 80GB HBM3 GPU-\S+", gpu), row

        # The JupyterLab sidebar of alice's next 1 × H100 server, in Chromium: the same line.
        lab_sidebar_says(hub, "alice", f"{vision}:h100-1", "1 × H100", LINE + ". Pick it next time on the spawn page.")
    finally:
        hub.api("DELETE", "/users/alice/server")
        for name in SERVERS:
            hub.api("DELETE", f"/users/alice/servers/{name}")
        hub.close()
        prom.stop()
        exporter.stop()
