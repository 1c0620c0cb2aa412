"""An imitation of dcgm-exporter (and of HAMi's vGPU monitor) for the test bed's fake GPU nodes.

No GPU exists on the test machines, so the GPUs' utilisation is the test's to set
(per pod: what its kernels would keep busy). Everything after that is what the
real exporters do, reproduced from their sources:

**dcgm-exporter** (NVIDIA/dcgm-exporter at d5e5f51, ``internal/pkg/transformation/kubernetes.go``),
which on every collection lists the kubelet's PodResources API and labels each GPU's
series with the pod that holds it. Here that list is the bed's own
(``tests/kube/bed/kubelet_devices.py``, published per node by the node agent), read
at every scrape as dcgm-exporter reads it at every collection:

- only devices of ``nvidia.com/gpu``, ``nvidia.com/mig-*`` and the resources listed in
  ``NVIDIA_RESOURCE_NAMES`` count (``iterateGPUDevices``, ``toDeviceToPod``: "Skipping
  non-NVIDIA resource"), so a time-sliced pod's ``nvidia.com/gpu.shared`` is skipped
  unless that name is listed;
- without ``KUBERNETES_VIRTUAL_GPUS`` (``toDeviceToPod``) the map holds ONE pod per key:
  a replica id ``<uuid>::<n>`` maps its GPU ``<uuid>`` to the pod, and a later pod with
  a replica of the same GPU overwrites the earlier one (the last in the kubelet's list wins);
  ``MIG-<uuid>`` maps the MIG device's GPU instance, ``"<gpu index>-<GI id>"``
  (``deviceinfo.GetGPUInstanceIdentifier``), and ``<uuid>`` without its ``MIG-`` prefix
  (which is no GPU's UUID with today's MIG UUIDs, so it attributes nothing); every id also
  maps to itself;
- with ``KUBERNETES_VIRTUAL_GPUS=true`` (``toDeviceToSharingPods``) every pod holding a
  replica gets its own copy of the GPU's series with ``vgpu="<n>"`` (``Process``); a GPU
  no pod holds keeps its plain series;
- a series is matched on its id of type ``uid`` (the default ``--kubernetes-gpu-id-type``):
  the GPU's UUID, or ``"<gpu>-<GPU_I_ID>"`` for a MIG instance (``collector/types.go``,
  ``GetIDOfType``), and gets ``pod``, ``namespace``, ``container`` (``transformation/const.go``);
- HAMi's vGPU ids ``GPU-<uuid>-<n>`` contain no ``::``, so they map only to themselves,
  which no series' id is: HAMi pods get no labels;
- KAI's GPU fractions request no ``nvidia.com/gpu``; the GPU is held by KAI's
  ``gpu-reservation-<node>-<5 chars>`` pod in ``kai-resource-reservation`` (container
  ``resource-reservation``; NVIDIA/KAI-Scheduler ``pkg/binder/binding/resourcereservation/
  resource_reservation.go``), so the series names that pod.

Series and labels follow ``internal/pkg/rendermetrics/render_metrics.go``: ``gpu``,
``UUID``, ``pci_bus_id``, ``device``, ``modelName``, ``GPU_I_PROFILE`` and ``GPU_I_ID``
for MIG instances, ``Hostname`` (``hostname`` in newer builds), then the attributes.
``DCGM_FI_DEV_GPU_UTIL`` exists for whole GPUs only (a MIG-enabled GPU reports none);
``DCGM_FI_PROF_GR_ENGINE_ACTIVE`` only when the profiling (DCP) counters are on
(``etc/dcp-metrics-included.csv``), per GPU and per MIG instance. Each GPU's memory and
health fields of that default list follow, labelled like its utilisation:
``DCGM_FI_DEV_FB_USED``/``DCGM_FI_DEV_FB_FREE`` (MiB), ``DCGM_FI_DEV_XID_ERRORS`` (the last
Xid, 0: none), ``DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS``/``DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS``
(counters) and ``DCGM_FI_DEV_ROW_REMAP_FAILURE``; the volatile ECC counters
``DCGM_FI_DEV_ECC_SBE_VOL_TOTAL``/``DCGM_FI_DEV_ECC_DBE_VOL_TOTAL`` only when the counters
list turns them on (both default lists carry them commented out).

**HAMi's vGPU monitor** (Project-HAMi/HAMi at 4707fb0, ``cmd/vGPUmonitor/metrics.go``):
per container and vGPU, ``hami_container_device_utilization_ratio{namespace, pod,
container, vdevice_index, device_uuid}`` (the container's own SM utilisation, 0-100,
from HAMi's shared region), ``hami_vgpu_memory_used_bytes`` (same labels, its memory),
and per GPU ``hami_host_gpu_utilization_ratio{node,
device_index, device_uuid, device_type}``. Served at ``/hami/<node>/metrics``.

**kube-state-metrics**' ``kube_pod_labels{namespace, pod, label_<key>}`` (each allowed pod label
as ``label_`` + the key with every character outside ``[a-zA-Z0-9_]`` made ``_``), served at
``/ksm/metrics`` when the test gives the pods' labels: how the culler finds the GPU group of
KAI's reservation pods and fractions.

One HTTP server serves every node's exporter at ``/dcgm/<node>/metrics``;
:func:`scrape_configs` writes the Prometheus jobs for the two ways a cluster scrapes
it: with ``honor_labels`` (gpulab's ServiceMonitor), or as the GPU operator's own
ServiceMonitor does (target labels ``namespace``/``pod``/``container`` of the exporter's
own pod win, and the series' own become ``exported_namespace``/``exported_pod``/
``exported_container``: Prometheus' ``honor_labels: false`` rule).
"""

from __future__ import annotations

import json
import re
import threading
import zlib
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from tests.kube.bed.kubelet_devices import gpu_uuid, is_hami_node, mig_instances, physical_gpu
from tests.support.ports import free_port

#: dcgm-exporter's built-in resource name and MIG prefix (internal/pkg/appconfig/const.go).
NVIDIA_RESOURCE_NAME = "nvidia.com/gpu"
NVIDIA_MIG_RESOURCE_PREFIX = "nvidia.com/mig-"
MIG_UUID_PREFIX = "MIG-"
#: Where the GPU operator runs dcgm-exporter, and the names its ServiceMonitor's targets carry.
OPERATOR_NAMESPACE = "gpu-operator"
#: The volatile ECC counters (commented out in dcgm-exporter's default counters lists).
ECC_VOLATILE = {"DCGM_FI_DEV_ECC_SBE_VOL_TOTAL", "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL"}
#: Help text and type of each field served (dcgm-exporter's etc/dcp-metrics-included.csv).
FIELDS = {
    "DCGM_FI_DEV_GPU_UTIL": ("gauge", "GPU utilization (in %)."),
    "DCGM_FI_PROF_GR_ENGINE_ACTIVE": ("gauge", "Ratio of time the graphics engine is active."),
    "DCGM_FI_DEV_FB_FREE": ("gauge", "Framebuffer memory free (in MiB)."),
    "DCGM_FI_DEV_FB_USED": ("gauge", "Framebuffer memory used (in MiB)."),
    "DCGM_FI_DEV_XID_ERRORS": ("gauge", "Value of the last XID error encountered."),
    "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS": ("counter", "Number of remapped rows for uncorrectable errors"),
    "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS": ("counter", "Number of remapped rows for correctable errors"),
    "DCGM_FI_DEV_ROW_REMAP_FAILURE": ("gauge", "Whether remapping of rows has failed"),
    "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL": ("counter", "Total number of single-bit volatile ECC errors."),
    "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL": ("counter", "Total number of double-bit volatile ECC errors."),
}
#: Frame buffer of each fake GPU, MiB (an H100 80GB's as NVML reports it).
FB_TOTAL_MIB = 81559
MODELS = {"NVIDIA-H100-80GB-HBM3": "NVIDIA H100 80GB HBM3", "NVIDIA-A100-SXM4-80GB": "NVIDIA A100-SXM4-80GB"}


@dataclass(frozen=True)
class ExporterSettings:
    """The dcgm-exporter settings that decide what its series say (pkg/cmd/app.go)."""

    #: ``NVIDIA_RESOURCE_NAMES`` (``--nvidia-resource-names``): more resources to attribute.
    resource_names: tuple[str, ...] = ()
    #: ``KUBERNETES_VIRTUAL_GPUS`` (``--kubernetes-virtual-gpus``): one series per sharing pod.
    virtual_gpus: bool = False
    #: The DCP profiling counters (``DCGM_FI_PROF_*``) collected: needs a GPU and driver that
    #: support them, and pauses while someone profiles with Nsight.
    profiling: bool = True
    #: ``Hostname`` in older builds, ``hostname`` in newer ones.
    hostname_label: str = "Hostname"
    #: The volatile ECC counters are in the counters list (``DCGM_EXPORTER_COLLECTORS``).
    ecc: bool = False

    @classmethod
    def from_env(cls, env: Iterable[Mapping[str, str]], **kw: Any) -> ExporterSettings:
        """The settings a container ``env`` list gives dcgm-exporter (urfave/cli reads a string
        slice from the environment split at commas, a bool with strconv.ParseBool)."""
        values = {e["name"]: str(e.get("value", "")) for e in env}
        names = tuple(n.strip() for n in values.get("NVIDIA_RESOURCE_NAMES", "").split(",") if n.strip())
        virtual = values.get("KUBERNETES_VIRTUAL_GPUS", "false").lower() in ("1", "t", "true")
        return cls(resource_names=names, virtual_gpus=virtual, **kw)

    @classmethod
    def from_operator_values(cls, values: Mapping[str, Any], **kw: Any) -> ExporterSettings:
        """The settings the GPU operator's ``dcgmExporter`` values give: its ``env``, and the
        counters list of ``config.data`` (the ConfigMap the operator mounts as dcgm-metrics.csv,
        replacing dcp-metrics-included.csv) when it creates one."""
        data = str((values.get("config") or {}).get("data") or "")
        fields = {line.split(",", 1)[0].strip() for line in data.splitlines() if not line.lstrip().startswith("#")}
        return cls.from_env(values.get("env") or [], ecc=ECC_VOLATILE <= fields, **kw)


@dataclass
class Node:
    """One fake GPU node as NVML would describe it."""

    name: str
    labels: Mapping[str, str]
    allocatable: Mapping[str, Any]
    gpus: int = field(init=False)
    migs: dict[str, Any] = field(init=False)

    def __post_init__(self) -> None:
        self.migs = mig_instances(self.name, self.labels, self.allocatable)
        whole = int(self.labels.get("nvidia.com/gpu.count") or 0)
        self.gpus = max([whole] + [m.gpu + 1 for m in self.migs.values()])

    @property
    def model(self) -> str:
        product = self.labels.get("nvidia.com/gpu.product", "")
        return MODELS.get(product, product.replace("-", " "))

    @property
    def mig_gpus(self) -> set[int]:
        return {m.gpu for m in self.migs.values()}


class FakeKubeDCGMExporter:
    """dcgm-exporter on each fake GPU node (and HAMi's monitor on HAMi's), from the bed's
    PodResources view; the test sets each pod's activity with :meth:`set_activity`."""

    def __init__(
        self,
        pod_resources_dir: Path,
        nodes: Iterable[Mapping[str, Any]],
        settings: ExporterSettings,
        pod_labels: Callable[[], list[tuple[str, str, dict[str, str]]]] | None = None,
        kube_state: Callable[[], str] | None = None,
    ):
        """``pod_labels``: every pod's (namespace, name, allowed labels), for kube-state-metrics;
        ``kube_state``: more of kube-state-metrics' exposition text to serve beside them."""
        self.pod_labels = pod_labels
        self.kube_state = kube_state
        self.pod_resources_dir = Path(pod_resources_dir)
        self.settings = settings
        self.nodes = {
            n["name"]: Node(n["name"], n.get("labels") or {}, n.get("allocatable") or {})
            for n in nodes
            if int((n.get("labels") or {}).get("nvidia.com/gpu.count") or 0)
        }
        self._activity: dict[tuple[str, str], tuple[float, tuple[str, str] | None]] = {}
        self._memory: dict[tuple[str, str], float] = {}
        #: (node, gpu) -> field -> value, for the health fields a test sets (Xid, ECC, remapping).
        self._health: dict[tuple[str, int], dict[str, float]] = {}
        self._lock = threading.Lock()
        self.port = free_port()
        self.base = f"127.0.0.1:{self.port}"
        exporter = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):  # noqa: N802 (http.server API)
                parts = self.path.strip("/").split("/")
                if parts == ["ksm", "metrics"] and exporter.pod_labels is not None:
                    exporter._send(self, exporter.render_ksm())
                    return
                if len(parts) != 3 or parts[2] != "metrics" or parts[1] not in exporter.nodes:
                    self.send_error(404)
                    return
                if parts[0] == "dcgm":
                    body = exporter.render_dcgm(parts[1])
                elif parts[0] == "hami" and is_hami_node(exporter.nodes[parts[1]].labels):
                    body = exporter.render_hami(parts[1])
                else:
                    self.send_error(404)
                    return
                exporter._send(self, body)

            def log_message(self, *args):
                pass

        self._httpd = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        self._thread = threading.Thread(target=self._httpd.serve_forever, daemon=True)

    @staticmethod
    def _send(handler: BaseHTTPRequestHandler, body: str) -> None:
        data = body.encode()
        handler.send_response(200)
        handler.send_header("Content-Type", "text/plain; version=0.0.4")
        handler.send_header("Content-Length", str(len(data)))
        handler.end_headers()
        handler.wfile.write(data)

    def render_ksm(self) -> str:
        out = [
            "# HELP kube_pod_labels Kubernetes labels converted to Prometheus labels.",
            "# TYPE kube_pod_labels gauge",
        ]
        for namespace, name, labels in self.pod_labels() if self.pod_labels else []:
            extra = {"label_" + re.sub(r"[^a-zA-Z0-9_]", "_", k): v for k, v in sorted(labels.items())}
            out.append(f"kube_pod_labels{{{_labels({'namespace': namespace, 'pod': name, **extra})}}} 1")
        return "\n".join(out) + "\n" + (self.kube_state() if self.kube_state else "")

    def start(self) -> FakeKubeDCGMExporter:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()

    # -- what the test sets: how busy each pod keeps its GPU ---------------------------

    def set_activity(self, namespace: str, pod: str, percent: float, runs_on: tuple[str, str] | None = None) -> None:
        """``pod`` keeps its devices ``percent`` busy. ``runs_on``: the (namespace, pod) whose
        devices it uses when it holds none itself (a KAI fraction runs on its reservation pod's GPU)."""
        with self._lock:
            self._activity[(namespace, pod)] = (float(percent), runs_on)

    def set_memory(self, namespace: str, pod: str, mib: float) -> None:
        """``pod`` holds ``mib`` of frame buffer on each GPU it runs on."""
        with self._lock:
            self._memory[(namespace, pod)] = float(mib)

    def set_health(self, node: str, gpu: int, **fields: float) -> None:
        """Health fields of one GPU, by name without ``DCGM_FI_DEV_`` (``XID_ERRORS=79``, ``ECC_DBE_VOL_TOTAL=2``)."""
        with self._lock:
            self._health.setdefault((node, gpu), {}).update({f"DCGM_FI_DEV_{k}": float(v) for k, v in fields.items()})

    # -- the kubelet's view ------------------------------------------------------------

    def pod_resources(self, node: str) -> list[dict[str, Any]]:
        try:
            return json.loads((self.pod_resources_dir / f"{node}.json").read_text())["podResources"]
        except (OSError, ValueError, KeyError):
            return []

    def _counts(self, resource: str) -> bool:
        """iterateGPUDevices / toDeviceToPod: which resources' devices are attributed."""
        return (
            resource == NVIDIA_RESOURCE_NAME
            or resource in self.settings.resource_names
            or resource.startswith(NVIDIA_MIG_RESOURCE_PREFIX)
        )

    def _metric_id_of(self, node: Node, device: str) -> list[str]:
        """The map keys one device id adds (toDeviceToPod / toDeviceToSharingPods), in order."""
        keys: list[str] = []
        if device.startswith(MIG_UUID_PREFIX):
            mig = node.migs.get(device)
            if mig is not None:
                keys.append(f"{mig.gpu}-{mig.gpu_instance}")
            keys.append(device[len(MIG_UUID_PREFIX) :])
        elif "::" in device:
            keys.append(device.split("::", 1)[0])
        keys.append(device)
        return keys

    def attribution(self, node_name: str) -> dict[str, list[dict[str, str]]]:
        """Series id -> the pods (``pod``, ``namespace``, ``container``, maybe ``vgpu``) it is labelled with."""
        node = self.nodes[node_name]
        out: dict[str, list[dict[str, str]]] = {}
        for pod in self.pod_resources(node_name):
            for container in pod.get("containers") or []:
                for held in container.get("devices") or []:
                    if not self._counts(held.get("resourceName", "")):
                        continue
                    for device in held.get("deviceIds") or []:
                        info = {"pod": pod["name"], "namespace": pod["namespace"], "container": container["name"]}
                        if self.settings.virtual_gpus and "::" in device:
                            info["vgpu"] = device.split("::", 1)[1]  # getSharedGPU
                        for key in self._metric_id_of(node, device):
                            if self.settings.virtual_gpus:
                                out.setdefault(key, []).append(info)
                            else:
                                out[key] = [info]  # one pod per key: the last one wins
        return out

    # -- the hardware: each GPU as busy as the pods running on it ----------------------

    def _devices_of(self, node: str, namespace: str, pod: str) -> list[str]:
        for p in self.pod_resources(node):
            if (p["namespace"], p["name"]) == (namespace, pod):
                return [d for c in p.get("containers") or [] for h in c.get("devices") or [] for d in h["deviceIds"]]
        return []

    def busy(self, node_name: str) -> dict[str, float]:
        """Utilisation (percent) per GPU UUID and per MIG device id: the sum of what the pods on it do."""
        with self._lock:
            activity = {k: (percent, runs_on) for k, (percent, runs_on) in self._activity.items()}
        return self._per_device(node_name, activity, cap=100.0)

    def memory_used(self, node_name: str) -> dict[str, float]:
        """Frame buffer used (MiB) per GPU UUID and MIG device id: the sum of the pods' on it."""
        with self._lock:
            memory = {k: (mib, self._activity.get(k, (0.0, None))[1]) for k, mib in self._memory.items()}
        return self._per_device(node_name, memory, cap=FB_TOTAL_MIB)

    def _per_device(
        self, node_name: str, amounts: Mapping[tuple[str, str], tuple[float, tuple[str, str] | None]], cap: float
    ) -> dict[str, float]:
        out: dict[str, float] = {}
        for (namespace, pod), (amount, runs_on) in amounts.items():
            devices = self._devices_of(node_name, namespace, pod)
            if not devices and runs_on is not None:
                devices = self._devices_of(node_name, *runs_on)
            for device in {physical_gpu(d) for d in devices}:
                out[device] = min(cap, out.get(device, 0.0) + amount)
        return out

    def container_busy(self, node_name: str) -> list[tuple[dict[str, str], float]]:
        """HAMi's per-container view: each container's own SM use of each vGPU it holds."""
        with self._lock:
            activity = {k: percent for k, (percent, _) in self._activity.items()}
        return self._per_container(node_name, activity)

    def container_memory(self, node_name: str) -> list[tuple[dict[str, str], float]]:
        """HAMi's per-container view: each container's own memory (bytes) of each vGPU it holds."""
        with self._lock:
            memory = {k: mib * 1024 * 1024 for k, mib in self._memory.items()}
        return self._per_container(node_name, memory)

    def _per_container(
        self, node_name: str, amounts: Mapping[tuple[str, str], float]
    ) -> list[tuple[dict[str, str], float]]:
        rows = []
        for p in self.pod_resources(node_name):
            amount = amounts.get((p["namespace"], p["name"]), 0.0)
            for c in p.get("containers") or []:
                devices = [d for h in c.get("devices") or [] for d in h["deviceIds"]]
                for i, device in enumerate(devices):
                    labels = {
                        "namespace": p["namespace"],
                        "pod": p["name"],
                        "container": c["name"],
                        "vdevice_index": str(i),
                        "device_uuid": physical_gpu(device)[:40],
                    }
                    rows.append((labels, amount))
        return rows

    # -- /metrics ---------------------------------------------------------------------

    def series(self, node_name: str) -> list[tuple[str, dict[str, str], float]]:
        """``(metric, labels, value)`` of every series this node's dcgm-exporter would serve now."""
        node = self.nodes[node_name]
        s = self.settings
        busy = self.busy(node_name)
        memory = self.memory_used(node_name)
        with self._lock:
            health = {gpu: dict(fields) for (n, gpu), fields in self._health.items() if n == node_name}
        pods = self.attribution(node_name)
        host = {s.hostname_label: node_name}
        rows: list[tuple[str, dict[str, str], float]] = []

        def emit(metric: str, base: dict[str, str], ident: str, value: float) -> None:
            attributed = pods.get(ident) or []
            if not attributed:
                rows.append((metric, base, value))
            for info in attributed if s.virtual_gpus else attributed[-1:]:
                rows.append((metric, {**base, **info}, value))

        for gpu in range(node.gpus):
            uuid = gpu_uuid(node_name, gpu)
            base = {
                "gpu": str(gpu),
                "UUID": uuid,
                "pci_bus_id": f"00000000:{0x18 + gpu:02X}:00.0",
                "device": f"nvidia{gpu}",
                "modelName": node.model,
                **host,
                "DCGM_FI_DRIVER_VERSION": "570.133.20",
            }
            used = memory.get(uuid, 0.0)
            fields = {
                "DCGM_FI_DEV_FB_USED": used,
                "DCGM_FI_DEV_FB_FREE": FB_TOTAL_MIB - used,
                "DCGM_FI_DEV_XID_ERRORS": 0.0,
                "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS": 0.0,
                "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS": 0.0,
                "DCGM_FI_DEV_ROW_REMAP_FAILURE": 0.0,
                **({m: 0.0 for m in sorted(ECC_VOLATILE)} if s.ecc else {}),
            }
            for metric, value in {**fields, **health.get(gpu, {})}.items():
                if metric in fields:
                    emit(metric, base, uuid, value)
            if gpu in node.mig_gpus:
                continue  # a MIG-enabled GPU has no GPU_UTIL; its instances follow
            util = busy.get(uuid, 0.0)
            emit("DCGM_FI_DEV_GPU_UTIL", base, uuid, round(util))
            if s.profiling:
                emit("DCGM_FI_PROF_GR_ENGINE_ACTIVE", base, uuid, util / 100)
        if s.profiling:
            for mig_id, mig in sorted(node.migs.items(), key=lambda kv: (kv[1].gpu, kv[1].gpu_instance)):
                base = {
                    "gpu": str(mig.gpu),
                    "UUID": mig.parent_uuid,
                    "pci_bus_id": f"00000000:{0x18 + mig.gpu:02X}:00.0",
                    "device": f"nvidia{mig.gpu}",
                    "modelName": node.model,
                    "GPU_I_PROFILE": mig.profile,
                    "GPU_I_ID": str(mig.gpu_instance),
                    **host,
                    "DCGM_FI_DRIVER_VERSION": "570.133.20",
                }
                emit(
                    "DCGM_FI_PROF_GR_ENGINE_ACTIVE", base, f"{mig.gpu}-{mig.gpu_instance}", busy.get(mig_id, 0.0) / 100
                )
        return rows

    def render_dcgm(self, node_name: str) -> str:
        rows = self.series(node_name)
        out = []
        for metric, (kind, help_text) in FIELDS.items():
            mine = [(labels, v) for m, labels, v in rows if m == metric]
            if not mine:
                continue
            out += [f"# HELP {metric} {help_text}", f"# TYPE {metric} {kind}"]
            for labels, v in mine:
                value = f"{v:.6f}" if metric.startswith("DCGM_FI_PROF") else f"{int(v)}"
                out.append(f"{metric}{{{_labels(labels)}}} {value}")
        return "\n".join(out) + "\n"

    def render_hami(self, node_name: str) -> str:
        node = self.nodes[node_name]
        busy = self.busy(node_name)
        out = [
            "# HELP hami_host_gpu_utilization_ratio GPU core utilization ratio (0-100)",
            "# TYPE hami_host_gpu_utilization_ratio gauge",
        ]
        for gpu in range(node.gpus):
            uuid = gpu_uuid(node_name, gpu)
            labels = {"node": node_name, "device_index": str(gpu), "device_uuid": uuid, "device_type": node.model}
            out.append(f"hami_host_gpu_utilization_ratio{{{_labels(labels)}}} {busy.get(uuid, 0.0):g}")
        out += [
            "# HELP hami_container_device_utilization_ratio Container device SM utilization ratio",
            "# TYPE hami_container_device_utilization_ratio gauge",
        ]
        for labels, percent in self.container_busy(node_name):
            out.append(f"hami_container_device_utilization_ratio{{{_labels(labels)}}} {percent:g}")
        out += [
            "# HELP hami_vgpu_memory_used_bytes vGPU device memory usage in bytes",
            "# TYPE hami_vgpu_memory_used_bytes gauge",
        ]
        for labels, used in self.container_memory(node_name):
            out.append(f"hami_vgpu_memory_used_bytes{{{_labels(labels)}}} {int(used)}")
        return "\n".join(out) + "\n"

    # -- how Prometheus scrapes it ----------------------------------------------------

    def scrape_configs(self, honor_labels: bool) -> list[dict[str, Any]]:
        """Prometheus scrape jobs for every node's exporters.

        ``honor_labels=True``: gpulab's ServiceMonitor (``honorLabels: true``), the series keep
        ``pod``/``namespace``. ``False``: the GPU operator's own ServiceMonitor, whose targets
        carry the exporter pod's ``namespace``, ``pod``, ``container``, ``service`` and
        ``endpoint`` (the Prometheus Operator's relabelling of a ServiceMonitor endpoint), so
        the series' own labels are renamed ``exported_*``.
        """
        jobs = []
        for job, prefix, app in (("dcgm", "dcgm", "nvidia-dcgm-exporter"), ("hami", "hami", "hami-device-plugin")):
            targets = []
            for name, node in sorted(self.nodes.items()):
                if prefix == "hami" and not is_hami_node(node.labels):
                    continue
                # Each node's exporter is its own pod, so its own instance (pod IP:port there):
                # without it every target's ``up`` would be one series.
                port = 9400 if prefix == "dcgm" else 9394
                labels = {"__metrics_path__": f"/{prefix}/{name}/metrics", "instance": f"{name}.{prefix}:{port}"}
                if not honor_labels:
                    labels.update(
                        namespace=OPERATOR_NAMESPACE if prefix == "dcgm" else "kube-system",
                        pod=f"{app}-{zlib.crc32(name.encode()) % 100000:05d}",
                        container=app,
                        service=app,
                        endpoint="gpu-metrics" if prefix == "dcgm" else "monitorport",
                    )
                targets.append({"targets": [self.base], "labels": labels})
            if targets:
                jobs.append({"job_name": job, "honor_labels": honor_labels, "static_configs": targets})
        if self.pod_labels is not None:
            # kube-prometheus-stack scrapes kube-state-metrics with honorLabels.
            ksm = {"targets": [self.base], "labels": {"__metrics_path__": "/ksm/metrics"}}
            jobs.append({"job_name": "kube-state-metrics", "honor_labels": True, "static_configs": [ksm]})
        return jobs


def _labels(d: Mapping[str, str]) -> str:
    return ",".join(f'{k}="{v}"' for k, v in d.items())
