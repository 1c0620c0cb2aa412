"""GPU idle culling on the real control plane, for every sharing backend, as dcgm-exporter labels it.

The pods are the product's (each profile's resources from spawner.core.sharing), placed
by the real scheduler and admitted by the bed's kubelet-like node agent, which hands out
device ids as each device plugin does and publishes the kubelet's PodResources view
(tests/kube/bed/kubelet_devices.py). HAMi's and KAI's pods are bound to their node as
their own schedulers bind them (the bed runs neither). An imitation of dcgm-exporter and
of HAMi's vGPU monitor (tests/kube/bed/dcgm_exporter.py, with the sources it follows)
labels the series from that view, per dcgm-exporter setting; the real Prometheus scrapes
it with ``honor_labels`` or as the GPU operator's ServiceMonitor does (``exported_*``); the
real culler runs its cycles against a stand-in hub API around gpulab's own idle store
(tests/support/idle_hub_standin.py).

Each test is one dcgm-exporter setting and one scrape style: the culler warns and then
reclaims the idle servers it has evidence for, never a busy one (nor an idle time-slice
beside a busy one: its series is the whole GPU's), and reports every server it cannot
see with its reason: a warning log, ``gpulab_culler_unattributed_servers{reason}`` and
"idle GPU reclaim is off for this server" in the idle API's view. One more test: a busy
server past its profile's maximum lifetime is warned and reclaimed, a keep-alive on the hub's
records notwithstanding, while one within its lifetime is kept.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterator
from dataclasses import dataclass, replace
from datetime import datetime, timezone
from pathlib import Path

import pytest
import yaml

from idle_culler.app import GPUIdleCuller
from idle_culler.attribution import REASONS
from idle_culler.plan import CycleSummary
from spawner.core.catalog import Catalog, catalog_from_dict
from spawner.core.idle import BUSY, LIFETIME, KeepaliveRefused
from spawner.core.sharing import gpu_tolerations, pod_gpu_spec
from tests.kube.bed.cluster import Cluster
from tests.kube.bed.dcgm_exporter import ExporterSettings, FakeKubeDCGMExporter
from tests.kube.bed.testbed import NODES_FILE, Testbed
from tests.support import REPO
from tests.support.dcgm_fake_exporter import RunningPrometheus
from tests.support.idle_hub_standin import IdleHubStandin, StandinServer, standin_culler

WINDOW = 8  # seconds: the idle timeout of every profile here
OPERATOR_VALUES = yaml.safe_load((REPO / "helm" / "values-gpu-operator.yaml").read_text())
TEAM = "vision"
KAI_NAMESPACE = "kai-resource-reservation"  # KAI's constants.DefaultResourceReservationName
KAI_NODE = "gpu-h100-whole-1"
HAMI_NODE = "gpu-h100-hami"

CATALOG = {
    "sharing": {"backend": "whole", "timeslice": {"replicas": 4, "resource": "nvidia.com/gpu.shared"}},
    "profiles": [
        {"slug": "whole", "display_name": "1 H100", "gpus": 1, "gpu_model": "H100-80GB", "sharing": "whole"},
        {"slug": "ts", "display_name": "1/4 H100", "gpus": 0.25, "gpu_model": "H100-80GB", "sharing": "timeslice"},
        {"slug": "mig", "display_name": "A100 2g", "gpus": 0.25, "gpu_model": "A100-80GB", "sharing": "mig"},
        {"slug": "hami", "display_name": "HAMi 1/4", "gpus": 0.25, "gpu_model": "H100-80GB", "sharing": "hami"},
        {"slug": "kai", "display_name": "KAI 1/4", "gpus": 0.25, "gpu_model": "H100-80GB", "sharing": "kai"},
    ],
    "teams": [{"name": TEAM, "display_name": "Vision", "users": ["u"], "guarantee": 8, "burst": 16}],
}
POOLS = {"whole": "whole", "ts": "timeslice", "mig": "mig"}
#: dcgm-exporter settings, each with whether HAMi's vGPU monitor is scraped too, and whether
#: kube-state-metrics exports KAI's GPU group label and the culler joins through it.
SETTINGS = {
    "operator-default": (ExporterSettings(), True, False),
    "shared-listed": (ExporterSettings(resource_names=("nvidia.com/gpu.shared",)), False, False),
    # What gpulab ships and documents: helm/values-gpu-operator.yaml, HAMi's monitor, KAI's groups.
    "virtual-gpus": (ExporterSettings.from_env(OPERATOR_VALUES["dcgmExporter"]["env"]), True, True),
    "no-profiling": (ExporterSettings(profiling=False, hostname_label="hostname"), True, False),
}
GPU_GROUP = "runai-gpu-group"  # KAI's constants.GPUGroup
STYLES = {"honor-labels": True, "service-monitor": False}
TIMESLICE_PODS = 9  # 8 GPUs: the ninth replica shares a GPU with the first


def product_pod(name: str, profile: str, catalog: Catalog, **spec) -> dict:
    """A notebook pod with ``profile``'s GPU resources, as the spawner asks for them."""
    gpu = pod_gpu_spec(catalog.profiles[profile], catalog.sharing, catalog.teams[TEAM])
    resources = {k: v for k, v in (("limits", dict(gpu.limits)), ("requests", dict(gpu.requests))) if v}
    selector = dict(gpu.node_selector)
    if profile in POOLS:
        selector["gpulab.io/pool"] = POOLS[profile]
    return {
        "metadata": {"name": name, "labels": dict(gpu.labels), "annotations": dict(gpu.annotations)},
        "spec": {
            "containers": [{"name": "notebook", "image": "registry.example.com/nb:1", "resources": resources}],
            "tolerations": [dict(t) for t in gpu_tolerations(gpu)]
            or [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
            **({"nodeSelector": selector} if "nodeName" not in spec else {}),
            **spec,
        },
    }


@dataclass
class Bed:
    ns: str
    catalog: Catalog
    servers: list[StandinServer]
    #: Pod name -> what the test expects of it: "idle", "busy", "beside-busy" (idle, on a busy GPU).
    roles: dict[str, str]
    prometheus: dict[tuple[str, str], RunningPrometheus]


@pytest.fixture(scope="module")
def bed(kube_testbed: Testbed, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Bed]:
    kube = Cluster(kube_testbed, tmp_path_factory.mktemp("idle-cluster"))
    kube._cluster_scoped = []
    catalog = catalog_from_dict(CATALOG)
    ns = kube.namespace("idle")
    if kube.maybe_get(f"/api/v1/namespaces/{KAI_NAMESPACE}") is None:
        kube.create("/api/v1/namespaces", {"metadata": {"name": KAI_NAMESPACE}})
        kube.namespaces.append(KAI_NAMESPACE)
        kube.wait(lambda: kube.maybe_get(f"/api/v1/namespaces/{KAI_NAMESPACE}/serviceaccounts/default"), "SA", 30)
    exporters: list[FakeKubeDCGMExporter] = []
    proms: dict[tuple[str, str], RunningPrometheus] = {}
    try:
        pods = {
            "whole-idle": product_pod("whole-idle", "whole", catalog),
            "whole-busy": product_pod("whole-busy", "whole", catalog),
            "mig-idle": product_pod("mig-idle", "mig", catalog),
            "mig-busy": product_pod("mig-busy", "mig", catalog),
            # hami-scheduler binds HAMi's pods itself (the bed runs none): straight to the node.
            "hami-idle": product_pod("hami-idle", "hami", catalog, nodeName=HAMI_NODE),
            "hami-busy": product_pod("hami-busy", "hami", catalog, nodeName=HAMI_NODE),
        }
        # The time-slices' placement (and dcgm-exporter's one pod per GPU) depends on every
        # replica in use: start on an empty time-sliced node (earlier tests' pods are gone).
        kube.wait(lambda: not kube.tb.pod_resources("gpu-h100-timeslice"), "an empty time-sliced node", 120)
        for i in range(TIMESLICE_PODS):
            pods[f"ts-{i}"] = product_pod(f"ts-{i}", "ts", catalog)
        for name, body in pods.items():
            kube.create(f"/api/v1/namespaces/{ns}/pods", body)
            if name.startswith("ts-"):  # one at a time: the device plugin spreads replicas in admission order
                kube.wait_pod(ns, name, "Running", 60)
        # KAI's binder: a reservation pod holds one whole GPU of the node for the fraction's
        # GPU group, and the fraction's pod (no GPU request) joins the group (KAI-Scheduler
        # pkg/binder/binding/resourcereservation/resource_reservation.go).
        reservations = {}
        for fraction in ("kai-idle", "kai-busy"):
            group = f"{ns}-{fraction}"
            reservation = f"gpu-reservation-{KAI_NODE}-{fraction[4]}{kube.suffix[:4]}"
            reservations[fraction] = (KAI_NAMESPACE, reservation)
            kube.create(
                f"/api/v1/namespaces/{KAI_NAMESPACE}/pods",
                {
                    "metadata": {"name": reservation, "labels": {"app": "kai-resource-reservation", GPU_GROUP: group}},
                    "spec": {
                        "nodeName": KAI_NODE,
                        "containers": [
                            {
                                "name": "resource-reservation",
                                "image": "registry.example.com/kai/resource-reservation:v0.20.1",
                                "resources": {"limits": {"nvidia.com/gpu": "1"}, "requests": {"nvidia.com/gpu": "1"}},
                            }
                        ],
                        "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
                    },
                },
            )
            kai = product_pod(fraction, "kai", catalog, nodeName=KAI_NODE)
            kai["metadata"]["labels"][GPU_GROUP] = group
            kube.create(f"/api/v1/namespaces/{ns}/pods", kai)
        for name in pods.keys() | set(reservations):
            kube.wait_pod(ns, name, "Running", 90)
        for namespace, reservation in reservations.values():
            kube.wait_pod(namespace, reservation, "Running", 60)
        # kube-state-metrics with metricLabelsAllowlist pods=[runai-gpu-group].
        grouped = [
            (p["metadata"]["namespace"], p["metadata"]["name"], {GPU_GROUP: p["metadata"]["labels"][GPU_GROUP]})
            for n in (ns, KAI_NAMESPACE)
            for p in kube.pods(n)
            if GPU_GROUP in (p["metadata"].get("labels") or {})
        ]

        # The time-slices: the pair sharing a GPU is one busy pod and one idle beside it; one
        # pod alone on its GPU is busy; the others are idle alone. The idle one of the pair
        # is the last in the kubelet's list (dcgm-exporter's one pod per GPU without
        # KUBERNETES_VIRTUAL_GPUS), so that setting labels the GPU with the idle pod.
        ts_node = kube.tb.pod_resources("gpu-h100-timeslice")
        by_gpu: dict[str, list[str]] = {}
        for p in ts_node:
            if p["namespace"] == ns:
                (device,) = p["containers"][0]["devices"][0]["deviceIds"]
                by_gpu.setdefault(device.split("::")[0], []).append(p["name"])
        (pair,) = [names for names in by_gpu.values() if len(names) == 2]
        alone = sorted(n for names in by_gpu.values() if len(names) == 1 for n in names)
        roles = {"whole-idle": "idle", "whole-busy": "busy", "mig-idle": "idle", "mig-busy": "busy"}
        roles |= {"hami-idle": "idle", "hami-busy": "busy", "kai-idle": "idle", "kai-busy": "busy"}
        roles |= {pair[0]: "pair-busy", pair[1]: "beside-busy", alone[0]: "busy"} | {n: "idle" for n in alone[1:]}

        nodes = yaml.safe_load(NODES_FILE.read_text())["nodes"]
        for setting, (settings, hami, kai_groups) in SETTINGS.items():
            labels = (lambda: grouped) if kai_groups else None
            exporter = FakeKubeDCGMExporter(kube.tb.pod_resources_dir, nodes, settings, pod_labels=labels).start()
            exporters.append(exporter)
            for name, role in roles.items():
                runs_on = reservations.get(name)
                exporter.set_activity(ns, name, 60 if role in ("busy", "pair-busy") else 0, runs_on)
            for style, honor in STYLES.items():
                jobs = [j for j in exporter.scrape_configs(honor) if hami or j["job_name"] != "hami"]
                workdir = tmp_path_factory.mktemp(f"prom-{setting}-{style}")
                proms[(setting, style)] = RunningPrometheus(workdir, [], scrape_configs=jobs).start()
        for prom in proms.values():
            prom.wait_for_samples("DCGM_FI_DEV_GPU_UTIL", count=WINDOW + 3, timeout=60)
            prom.wait_for_every_target(count=WINDOW + 3, timeout=60)

        started = datetime.fromtimestamp(time.time() - 3600, timezone.utc).isoformat().replace("+00:00", "Z")
        profile_of = {"whole": "whole", "mig": "mig", "hami": "hami", "kai": "kai", "ts": "ts"}
        servers = [
            StandinServer(
                user=name,
                pod=name,
                namespace=ns,
                profile=profile_of[name.split("-")[0]],
                team=TEAM,
                milli=catalog.profiles[profile_of[name.split("-")[0]]].gpu_milli,
                started=started,
            )
            for name in roles
        ]
        yield Bed(ns, catalog, servers, roles, proms)
    finally:
        for prom in proms.values():
            prom.stop()
        for exporter in exporters:
            exporter.stop()
        kube.cleanup()


def culler(hub: IdleHubStandin, prometheus_url: str, kai_groups: bool) -> GPUIdleCuller:
    namespace = KAI_NAMESPACE if kai_groups else ""
    return standin_culler(
        hub, prometheus_url, timeout=WINDOW, unattributed_after=60, kai_reservation_namespace=namespace
    )


def expected(setting: str, pod: str, role: str) -> str:
    """What the culler must do with ``pod`` under ``setting``: reclaim, keep, or an unattributed reason code."""
    settings, hami_scraped, kai_groups = SETTINGS[setting]
    backend = pod.split("-")[0]
    if backend == "kai" and not kai_groups:
        return "kai-reservation-pod"
    if backend == "hami" and not hami_scraped:
        return "hami-no-vgpu-metrics"
    if backend == "mig" and not settings.profiling:
        return "mig-no-profiling-metrics"
    if backend == "ts":
        if "nvidia.com/gpu.shared" not in settings.resource_names:
            return "timeslice-not-attributed"
        if role == "pair-busy" and not settings.virtual_gpus:
            return "timeslice-not-attributed"  # one pod per GPU: the GPU is labelled with its neighbour
    # "beside-busy": idle, but its series is the GPU's, which its neighbour keeps busy.
    return "reclaim" if role == "idle" else "keep"


async def two_cycles(app: GPUIdleCuller) -> tuple[CycleSummary, CycleSummary]:
    """A warning cycle, then one after the grace (0 s) is over on the hub's clock too."""
    first = await app.cycle()
    await asyncio.sleep(1.1)
    second = await app.cycle()
    await app.hub_client.close()
    return first, second


class Lines(logging.Handler):
    """The culler's log lines (its logger does not propagate to pytest's capture)."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


def cycles_on_clean_data(
    bed: Bed, setting: str, style: str, tmp_path: Path, attempts: int = 3
) -> tuple[IdleHubStandin, GPUIdleCuller, Lines, CycleSummary, CycleSummary]:
    """The two cycles over a window in which Prometheus scraped every exporter at every interval.

    On a loaded machine a scrape of the bed's exporters (Python, in this process) can time out;
    Prometheus then marks that target's series stale and the culler rightly holds its servers
    (no sample at the window's start). Decisions are what this test checks, so the cycles run
    again on a new hub whenever Prometheus' own ``up`` shows such a scrape across their windows."""
    prom = bed.prometheus[(setting, style)]
    for attempt in range(1, attempts + 1):
        prom.wait_for_clean_window(WINDOW + 2, timeout=60)
        workdir = tmp_path / f"hub-{attempt}"
        workdir.mkdir()
        hub = IdleHubStandin(workdir, bed.catalog, on_stop=lambda s: None).start()
        for s in bed.servers:
            hub.add(s)
        app = culler(hub, prom.url, SETTINGS[setting][2])
        log = Lines()
        app.log.addHandler(log)
        first, second = asyncio.run(two_cycles(app))
        if prom.scraped_cleanly(WINDOW + 3) or attempt == attempts:
            return hub, app, log, first, second
        hub.stop()
    raise AssertionError("unreachable")


@pytest.mark.parametrize("style", list(STYLES))
@pytest.mark.parametrize("setting", list(SETTINGS))
def test_the_culler_reclaims_idle_keeps_busy_and_reports_unattributed_servers(
    bed: Bed, setting: str, style: str, tmp_path: Path
):
    hub, app, log, first, second = cycles_on_clean_data(bed, setting, style, tmp_path)
    try:
        want = {p: expected(setting, p, r) for p, r in bed.roles.items()}
        reclaim = sorted(p for p, w in want.items() if w == "reclaim")
        keep = sorted(p for p, w in want.items() if w == "keep")
        unattributed = {p: w for p, w in want.items() if w not in ("reclaim", "keep")}
        assert sorted(k.rstrip("/") for k in first.warned) == reclaim, first
        assert sorted(hub.stopped) == reclaim, (second, first.verdicts)
        assert all(first.verdicts[f"{p}/"] == BUSY for p in keep), first.verdicts
        assert {k.rstrip("/"): v for k, v in first.unattributed.items()} == unattributed
        # Said loudly once per server: one warning line each, the gauge by reason, the idle API's view.
        for pod, code in unattributed.items():
            lines = [line for line in log.lines if line.startswith(f"{pod}/ ")]
            assert len(lines) == 1 and "idle GPU reclaim is off for this server" in lines[0], log.lines
            view = hub.view(pod)["reclaim_off"]
            assert view["code"] == code and view["reason"] == REASONS[code]
        gauge = app.metrics.render().decode()
        for code in set(unattributed.values()):
            n = sum(1 for c in unattributed.values() if c == code)
            assert f'gpulab_culler_unattributed_servers{{reason="{code}"}} {n:.1f}' in gauge
        for pod in reclaim + keep:
            assert hub.view(pod)["reclaim_off"] is None
        # The list went to the hub once; the second cycle found it there and sent nothing more.
        sent = [c for c in hub.cycles if "unattributed" in c]
        assert len(sent) == 1 and len(sent[0]["unattributed"]) == len(unattributed)
    finally:
        hub.stop()


def test_a_busy_server_past_its_lifetime_is_reclaimed_whatever_its_keepalive(bed: Bed, tmp_path: Path):
    """The same culler code as on one server: the pods started an hour ago; whole-busy's profile
    allows 30 minutes, mig-busy's a day. Both are busy and both were kept alive (before the
    lifetime was set: the keep-alives reach an hour ahead on the hub's records)."""
    extra = [
        {"slug": "whole-30m", "display_name": "1 H100, 30m", "gpus": 1, "gpu_model": "H100-80GB", "sharing": "whole"},
        {"slug": "mig-1d", "display_name": "A100 2g, 1d", "gpus": 0.25, "gpu_model": "A100-80GB", "sharing": "mig"},
    ]
    catalog = catalog_from_dict({**CATALOG, "profiles": CATALOG["profiles"] + extra})
    lifetimes = {"whole-30m": "30m", "mig-1d": "1d"}
    limited = catalog_from_dict(
        {**CATALOG, "profiles": CATALOG["profiles"] + [{**p, "max_lifetime": lifetimes[p["slug"]]} for p in extra]}
    )
    by_pod = {s.pod: s for s in bed.servers}
    old = replace(by_pod["whole-busy"], profile="whole-30m")
    young = replace(by_pod["mig-busy"], profile="mig-1d")
    hub = IdleHubStandin(tmp_path, catalog, on_stop=lambda s: None).start()
    try:
        for s in (old, young):
            hub.add(s)
            hub.store.keep_alive(s.user, "", s.started, {"team": s.team, "profile": s.profile}, s.user)
        hub.catalog = limited  # the admin sets the lifetimes now
        with pytest.raises(KeepaliveRefused, match="cannot extend this server past its maximum lifetime"):
            hub.store.keep_alive(old.user, "", old.started, {}, old.user, hub.lifetime(old.user))
        app = culler(hub, bed.prometheus[("virtual-gpus", "honor-labels")].url, True)
        first, second = asyncio.run(two_cycles(app))
        assert first.warned == ["whole-busy/"] and first.verdicts["whole-busy/"] == LIFETIME, first
        assert first.verdicts["mig-busy/"] == BUSY, first.verdicts
        assert hub.stopped == ["whole-busy"], (second, first.verdicts)
        assert hub.view("whole-busy")["reclaimed"]["message"].startswith("Your GPU was reclaimed at")
        assert "maximum lifetime (30m of profile whole-30m)" in hub.view("whole-busy")["reclaimed"]["message"]
        assert hub.view("mig-busy")["warning"] is None and hub.view("mig-busy")["keepalive"]["used"] == 1
    finally:
        hub.stop()
