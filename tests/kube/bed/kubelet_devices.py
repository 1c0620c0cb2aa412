"""The kubelet's admission and device accounting, for the test bed's node agent.

A kubelet admits a pod the scheduler bound to it only if the node's allocatable
still covers it, counting the pods it has already admitted (its own view, not
the scheduler's): two schedulers that do not see each other's bindings can
both bind the last free GPU, and the kubelet then rejects the later pod. This
module does that accounting the way the kubelet does, as documented in
Kubernetes v1.36's sources:

- ``pkg/kubelet/lifecycle/predicate.go``: the rejection's reason is
  ``OutOf<resource>`` (``OutOfcpu``, ``OutOfmemory``, ``OutOfpods``,
  ``OutOfnvidia.com/gpu``) and its message
  ``Node didn't have enough resource: <resource>, requested: N, used: N, capacity: N``;
  ``pkg/kubelet/kubelet.go`` (``rejectPod``) then sets phase ``Failed``, that
  reason, and ``Pod was rejected: <message>``, and records a Warning event; no
  DisruptionTarget condition (a Job counts such a pod against ``backoffLimit``);
- a pod's request is the larger of its app containers' sum and its largest init
  container, per resource (the scheduler's and kubelet's rule); extended resources
  are integers with requests equal to limits;
- the device manager hands each container the device ids of its extended
  resources from the device plugin's list, and publishes them in the
  PodResources API (``k8s.io/kubelet/pkg/apis/podresources/v1``:
  ``ListPodResourcesResponse{pod_resources: [{name, namespace, containers:
  [{name, devices: [{resource_name, device_ids}]}]}]}``), which dcgm-exporter
  reads to label each GPU's series with the pod that holds it. :func:`pod_resources`
  writes that shape (protobuf's JSON field names).

Device ids follow the NVIDIA device plugin (replicas of a time-sliced GPU spread over
the GPUs, :func:`choose_devices`): ``GPU-<uuid>`` for whole GPUs,
``GPU-<uuid>::<n>`` for the n-th time-slicing replica of a GPU, ``MIG-<uuid>``
for MIG instances; on HAMi's nodes (labelled ``gpu=on``, as HAMi's install guide
has them labelled) HAMi's device plugin registers ``GPU-<uuid>-<n>``, the n-th vGPU
slot of a GPU (Project-HAMi/HAMi ``pkg/device-plugin/nvidiadevice/nvinternal/rm/devices.go``,
``GetPluginDevices``: ``fmt.Sprintf("%v-%v", dev.ID, i)``). MIG instances sit on the
node's GPUs after its whole ones (:func:`mig_instances`, what NVML would say of
each: parent GPU, GPU instance id, profile). The environment it returns from ``Allocate`` is
``NVIDIA_VISIBLE_DEVICES=<uuids>`` (envvar strategy). The kubelet puts the
plugin's variables before the container's own (``kubelet_pods.go``,
``GenerateRunContainerOptions``), so a container's own value wins.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from spawner.core.units import parse_cpu, parse_memory

#: Resources the kubelet counts in milli-units (cpu) or bytes; the rest are integers.
_CORE = ("pods", "cpu", "memory")
#: Extended resources a device plugin serves with device ids (the rest are only counted).
DEVICE_RESOURCE_PREFIXES = ("nvidia.com/gpu", "nvidia.com/mig-")
DEVICE_RESOURCE_EXCLUDED = ("nvidia.com/gpumem", "nvidia.com/gpucores")


def quantity(resource: str, value: Any) -> int:
    """A quantity as the kubelet's message counts it: cpu in millicores, memory in bytes."""
    if resource == "cpu":
        return round(parse_cpu(value) * 1000)
    if resource == "memory":
        return parse_memory(value)
    return int(str(value))


def is_device_resource(resource: str) -> bool:
    return resource.startswith(DEVICE_RESOURCE_PREFIXES) and not resource.startswith(DEVICE_RESOURCE_EXCLUDED)


def pod_requests(spec: Mapping[str, Any]) -> dict[str, int]:
    """What the pod asks the node for: app containers summed, init containers' maximum
    per resource, one pod slot. ``spec`` is the pod's spec (API JSON)."""

    def container_requests(c: Mapping[str, Any]) -> dict[str, int]:
        resources = c.get("resources") or {}
        merged = {**(resources.get("limits") or {}), **(resources.get("requests") or {})}
        return {k: quantity(k, v) for k, v in merged.items()}

    total: dict[str, int] = {}
    for c in spec.get("containers") or []:
        for k, v in container_requests(c).items():
            total[k] = total.get(k, 0) + v
    for c in spec.get("initContainers") or []:
        for k, v in container_requests(c).items():
            total[k] = max(total.get(k, 0), v)
    total["pods"] = 1
    return total


def is_hami_node(labels: Mapping[str, str]) -> bool:
    """HAMi's device plugin serves the node (HAMi's install guide labels its GPU nodes ``gpu=on``)."""
    return labels.get("gpu") == "on"


def gpu_uuid(node: str, index: int) -> str:
    """The UUID NVML would report for GPU ``index`` of a fake node."""
    return f"GPU-{uuid.uuid5(uuid.NAMESPACE_URL, f'gpulab-testbed/{node}/gpu/{index}')}"


def device_ids(node: str, labels: Mapping[str, str], allocatable: Mapping[str, Any]) -> dict[str, list[str]]:
    """The device plugin's device list per resource for a node of tests/kube/bed/nodes.yaml."""
    gpus = int(labels.get("nvidia.com/gpu.count") or 0)
    out: dict[str, list[str]] = {}
    for resource, value in allocatable.items():
        if not is_device_resource(resource):
            continue
        n = quantity(resource, value)
        if resource.startswith("nvidia.com/mig-"):
            out[resource] = [
                f"MIG-{uuid.uuid5(uuid.NAMESPACE_URL, f'gpulab-testbed/{node}/{resource}/{i}')}" for i in range(n)
            ]
        elif n > gpus > 0 and n % gpus == 0:
            per = n // gpus
            # HAMi's vGPU slots "<uuid>-<n>"; the NVIDIA device plugin's time-slicing replicas "<uuid>::<n>".
            sep = "-" if is_hami_node(labels) else "::"
            out[resource] = [f"{gpu_uuid(node, g)}{sep}{r}" for g in range(gpus) for r in range(per)]
        else:
            out[resource] = [gpu_uuid(node, i) for i in range(n)]
    return out


@dataclass(frozen=True)
class MigInstance:
    """What NVML says of a MIG device: its parent GPU (index and UUID), GPU instance id, profile."""

    gpu: int
    parent_uuid: str
    gpu_instance: int
    profile: str


#: Compute slices of one MIG-capable GPU (7 on A100/H100).
MIG_COMPUTE_SLICES = 7


def mig_instances(node: str, labels: Mapping[str, str], allocatable: Mapping[str, Any]) -> dict[str, MigInstance]:
    """The node's MIG devices by id: packed onto GPUs after the node's whole ones, in the
    device plugin's order, seven compute slices a GPU, GPU instance ids from 1 on each."""
    devices = device_ids(node, labels, allocatable)
    whole = len(devices.get("nvidia.com/gpu", ()))
    out: dict[str, MigInstance] = {}
    gpu, used, gi = whole, 0, 0
    for resource in sorted(r for r in devices if r.startswith("nvidia.com/mig-")):
        profile = resource.removeprefix("nvidia.com/mig-")
        slices = int(profile.split("g", 1)[0])
        for mig in devices[resource]:
            if used + slices > MIG_COMPUTE_SLICES:
                gpu, used, gi = gpu + 1, 0, 0
            used, gi = used + slices, gi + 1
            out[mig] = MigInstance(gpu, gpu_uuid(node, gpu), gi, profile)
    return out


def physical_gpu(device: str) -> str:
    """The GPU a device id names: a time-slicing replica's or a HAMi vGPU slot's GPU, else itself."""
    if "::" in device:
        return device.split("::", 1)[0]
    if device.startswith("GPU-") and device.count("-") == 6:  # GPU-<8-4-4-4-12 uuid>-<n>
        return device.rsplit("-", 1)[0]
    return device


def choose_devices(devices: list[str], taken: set[str], n: int) -> list[str]:
    """The ``n`` devices a container gets. Replicas of time-sliced GPUs go to the GPU
    with the fewest replicas in use, as the NVIDIA device plugin's preferred
    allocation for shared resources distributes them (k8s-device-plugin,
    internal/rm/allocate.go); whole GPUs and MIG instances in the plugin's order."""
    free = [d for d in devices if d not in taken]
    if not free or physical_gpu(free[0]) == free[0]:
        return free[:n]
    load: dict[str, int] = {}
    for d in devices:
        base = physical_gpu(d)
        load[base] = load.get(base, 0) + (d in taken)
    out: list[str] = []
    for _ in range(min(n, len(free))):
        pick = min((d for d in free if d not in out), key=lambda d: load[physical_gpu(d)])
        load[physical_gpu(pick)] += 1
        out.append(pick)
    return out


def visible_devices(ids: Iterable[str]) -> str:
    """``NVIDIA_VISIBLE_DEVICES`` for the devices a container got: the GPU of a replica."""
    seen: list[str] = []
    for device in ids:
        base = physical_gpu(device)
        if base not in seen:
            seen.append(base)
    return ",".join(seen)


@dataclass
class Rejection:
    reason: str
    message: str

    def status(self) -> dict[str, Any]:
        """The pod status a kubelet writes when it rejects a pod at admission."""
        return {"phase": "Failed", "reason": self.reason, "message": f"Pod was rejected: {self.message}"}


@dataclass
class Admitted:
    """One pod the node admitted: what it counts and the devices of each container."""

    namespace: str
    name: str
    requests: dict[str, int]
    devices: dict[str, dict[str, list[str]]] = field(default_factory=dict)  # container -> resource -> ids


class NodeDevices:
    """One node's admission and device manager state."""

    def __init__(self, node: str, labels: Mapping[str, str], allocatable: Mapping[str, Any]):
        self.node = node
        self.allocatable = {k: quantity(k, v) for k, v in allocatable.items()}
        self.devices = device_ids(node, labels, allocatable)
        self.pods: dict[str, Admitted] = {}  # pod uid -> what it holds

    def used(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for pod in self.pods.values():
            for k, v in pod.requests.items():
                out[k] = out.get(k, 0) + v
        return out

    def check(self, requests: Mapping[str, int]) -> Rejection | None:
        """The kubelet's fit check: pods, cpu, memory, then the other resources."""
        used = self.used()
        order = [r for r in _CORE if r in requests] + sorted(r for r in requests if r not in _CORE)
        for resource in order:
            want = requests[resource]
            if want <= 0:
                continue
            capacity = self.allocatable.get(resource, 0)
            if capacity == 0 and resource not in _CORE and "/" in resource:
                # An extended resource the node does not have at all: the kubelet drops it
                # from the check (removeMissingExtendedResources); the scheduler never binds such a pod.
                continue
            have = used.get(resource, 0)
            if want + have > capacity:
                return Rejection(
                    f"OutOf{resource}",
                    f"Node didn't have enough resource: {resource}, requested: {want}, used: {have}, "
                    f"capacity: {capacity}",
                )
        return None

    def admit(self, uid: str, namespace: str, name: str, spec: Mapping[str, Any]) -> Rejection | Admitted:
        """Admit the pod and give its containers devices, or say why not."""
        requests = pod_requests(spec)
        rejected = self.check(requests)
        if rejected is not None:
            return rejected
        return self.adopt(uid, namespace, name, spec, requests)

    def adopt(
        self, uid: str, namespace: str, name: str, spec: Mapping[str, Any], requests: dict[str, int] | None = None
    ) -> Admitted:
        """Count a pod without checking (one already running when the agent starts)."""
        if uid in self.pods:
            return self.pods[uid]
        pod = Admitted(namespace, name, requests or pod_requests(spec))
        taken = {d for p in self.pods.values() for c in p.devices.values() for ids in c.values() for d in ids}
        for c in spec.get("containers") or []:
            resources = c.get("resources") or {}
            merged = {**(resources.get("limits") or {}), **(resources.get("requests") or {})}
            for resource, value in merged.items():
                if resource not in self.devices:
                    continue
                ids = choose_devices(self.devices[resource], taken, quantity(resource, value))
                taken.update(ids)
                pod.devices.setdefault(c["name"], {})[resource] = ids
        self.pods[uid] = pod
        return pod

    def release(self, uid: str) -> bool:
        return self.pods.pop(uid, None) is not None

    def pod_resources(self) -> dict[str, Any]:
        """The PodResources API's List response for this node (protobuf JSON names)."""
        return {
            "podResources": [
                {
                    "name": p.name,
                    "namespace": p.namespace,
                    "containers": [
                        {
                            "name": container,
                            "devices": [
                                {"resourceName": resource, "deviceIds": ids} for resource, ids in sorted(held.items())
                            ],
                        }
                        for container, held in sorted(p.devices.items())
                    ],
                }
                for p in sorted(self.pods.values(), key=lambda p: (p.namespace, p.name))
            ]
        }
