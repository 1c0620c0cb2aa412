"""The test bed's kubelet stand-in: fake GPU nodes without containers.

(Over 600 lines on purpose: a kubelet's pod lifecycle, admission to termination, is one
class; the sandbox and the pod network it uses are modules of their own.)

It registers the nodes of ``tests/kube/bed/nodes.yaml`` (labels, taints, GPU
allocatable as the NVIDIA or HAMi device plugin would publish them), keeps
their Leases and Ready condition fresh so the real node-lifecycle controller
leaves them alone, and plays the node side of every pod the real
kube-scheduler binds to them:

- a bound pod is admitted as the kubelet admits it (``tests/kube/bed/kubelet_devices.py``):
  when the node's allocatable, less what the pods it already admitted hold, cannot
  serve it, the pod fails with ``OutOf<resource>`` and a Warning event, as a kubelet
  rejects a pod two schedulers both bound to the last free GPU; otherwise its
  containers get device ids, published per node in the PodResources API's shape
  (``<state>/pod-resources/<node>.json``), and ``NVIDIA_VISIBLE_DEVICES`` as the
  NVIDIA device plugin sets it;
- an admitted pod becomes Running with a pod IP from a loopback range; when its
  container's command is ``jupyterhub-singleuser`` the agent starts that
  server as a real local process on the pod IP, so a hub can reach it;
- a container of an image the node "has" (``--image-env IMAGE=DIR``: the bed's
  ``gpulab-testbed/torch`` image is the Python environment of
  ``scripts/build-torch-env.sh``) runs its command for real, with that environment first
  on ``PATH``, in a sandbox of its own (``tests/kube/bed/pod_sandbox.py``: its hostname,
  resolv.conf naming the cluster DNS of ``--cluster-dns``, hosts file and volumes, as a
  kubelet gives them), in a network namespace on the bed's bridge with an address of the
  pod subnet (``--pod-network``, ``tests/kube/bed/pod_network.py``, as the CNI bridge
  plugin gives it); its log is ``<work dir>/<namespace>/<pod>/container.log``;
- a process that exits makes the pod Succeeded or Failed with its exit code;
- a container's environment is what a kubelet gives it: the device plugin's variables,
  then the container's own ``env`` with ``configMapKeyRef`` values read from their
  ConfigMaps (KAI's GPU fractions learn their GPU so, from the ConfigMap its binder writes)
  and ``fieldRef`` values read from the pod (a JobSet's or Trainer's node rank),
  recorded in ``<work dir>/<namespace>/<pod>/container-env.json`` as a runtime keeps a
  container's config;
- KAI's GPU reservation pods (container ``resource-reservation``) do what KAI's
  reservation image does once it runs: annotate their own pod with the UUID of the one
  GPU they were given (NVIDIA/KAI-Scheduler v0.20.1 ``cmd/resourcereservation``,
  ``pkg/resourcereservation/patcher/pod_patcher.go``: NVML's only device, so the GPU the
  device plugin allocated), which KAI's binder waits for before it binds a fraction;
- a pod marked for deletion (a user's stop, the scheduler's preemption, an
  eviction) gets its process stopped, a terminal phase with exit code 137
  and whatever conditions the API server set (DisruptionTarget), and is then
  deleted for good, as the kubelet does.

Tests end other pods the way a container would (``tests.kube.bed.cluster``'s
``finish_pod``) or evict them with the real Eviction API.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import shutil
import signal
import sys
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import aiohttp
import yaml
from kubernetes_asyncio import client, config, watch
from kubernetes_asyncio.client.exceptions import ApiException

from tests.kube.bed import pod_sandbox
from tests.kube.bed.kubelet_devices import Admitted, NodeDevices, Rejection, visible_devices
from tests.kube.bed.pod_network import PodNetwork
from tests.kube.bed.pod_sandbox import field_value
from tests.kube.bed.scale import heartbeat_plan, scaled_nodes

log = logging.getLogger("node-agent")
KUBE_VERSION = os.environ.get("GPULAB_KUBE_VERSION", "v1.36.3")
SERVER_COMMANDS = ("jupyterhub-singleuser",)
#: KAI's GPU reservation pods: their container's name and the annotation its program writes
#: (NVIDIA/KAI-Scheduler v0.20.1 pkg/binder/binding/resourcereservation/resource_reservation.go).
KAI_RESERVATION_CONTAINER = "resource-reservation"
KAI_RESERVED_GPU_ANNOTATION = "run.ai/reserve_for_gpu_index"
#: Where, in a pod's folder, the agent records the environment its container started with.
CONTAINER_ENV_FILE = "container-env.json"
#: Where, in a pod's folder, a really run container's output goes (what ``kubectl logs`` shows).
CONTAINER_LOG_FILE = "container.log"
#: Seconds a pod status the API server could not take is tried again (a restart of the
#: API server or etcd takes 10-30 s on the bed).
STATUS_RETRY_SECONDS = 180.0


def now() -> datetime:
    return datetime.now(timezone.utc)


def stamp() -> str:
    return now().strftime("%Y-%m-%dT%H:%M:%SZ")


class NodeAgent:
    def __init__(
        self,
        api: client.ApiClient,
        nodes: list[dict[str, Any]],
        work_dir: Path,
        ip_prefix: str,
        pod_resources_dir: Path | None = None,
        image_envs: dict[str, Path] | None = None,
        cluster_dns: str = "",
        cluster_domain: str = "cluster.local",
        network: PodNetwork | None = None,
    ):
        self.api = api
        self.core = client.CoreV1Api(api)
        self.coord = client.CoordinationV1Api(api)
        self.nodes = nodes
        self.names = {n["name"] for n in nodes}
        self.work_dir = work_dir
        self.ip_prefix = ip_prefix
        self.next_ip = 0
        self.started: dict[str, str] = {}  # pod uid -> pod IP
        self.procs: dict[str, asyncio.subprocess.Process] = {}
        self.finishing: set[str] = set()
        #: Each node's kubelet admission and device manager.
        self.kubelets = {
            n["name"]: NodeDevices(n["name"], n.get("labels", {}), n.get("allocatable", {})) for n in nodes
        }
        self.pod_resources_dir = pod_resources_dir
        #: The images this node "has": each a Python environment its containers run in.
        self.image_envs = image_envs or {}
        self.cluster_dns = cluster_dns
        self.cluster_domain = cluster_domain
        self.network = network
        self.netns: dict[str, str] = {}  # pod uid -> its network namespace
        self.plan = heartbeat_plan(len(nodes))
        for name in self.kubelets:
            self.publish_pod_resources(name)

    def publish_pod_resources(self, node: str) -> None:
        """The node's PodResources List answer, where a reader (a fake dcgm-exporter) finds it."""
        if self.pod_resources_dir is None:
            return
        self.pod_resources_dir.mkdir(parents=True, exist_ok=True)
        path = self.pod_resources_dir / f"{node}.json"
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.kubelets[node].pod_resources(), indent=1))
        tmp.replace(path)

    def release(self, pod: client.V1Pod) -> None:
        kubelet = self.kubelets.get(pod.spec.node_name)
        if kubelet is not None and kubelet.release(pod.metadata.uid):
            self.publish_pod_resources(pod.spec.node_name)

    # -- nodes ---------------------------------------------------------------
    async def register(self) -> None:
        """Create (or update) every node and post its status, a few at a time."""
        gate = asyncio.Semaphore(16)

        async def one(spec: dict[str, Any]) -> None:
            async with gate:
                await self.register_node(spec)

        await asyncio.gather(*(one(spec) for spec in self.nodes))
        log.info("registered %d nodes", len(self.nodes))

    async def register_node(self, spec: dict[str, Any]) -> None:
        body = {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {
                "name": spec["name"],
                "labels": {
                    "kubernetes.io/hostname": spec["name"],
                    "kubernetes.io/os": "linux",
                    "kubernetes.io/arch": "amd64",
                    "type": "gpulab-testbed",
                    **spec.get("labels", {}),
                },
            },
            "spec": {"taints": spec.get("taints", [])},
        }
        try:
            await self.core.create_node(body)
        except ApiException as e:
            if e.status != 409:
                raise
            await self.core.patch_node(
                spec["name"],
                {"metadata": {"labels": body["metadata"]["labels"]}, "spec": {"taints": body["spec"]["taints"]}},
            )
        await self.node_status(spec)
        if len(self.nodes) <= 50:
            log.info("registered node %s", spec["name"])

    async def node_status(self, spec: dict[str, Any]) -> None:
        t = stamp()
        conds = [
            {
                "type": kind,
                "status": "False",
                "reason": f"KubeletHas{reason}",
                "message": msg,
                "lastHeartbeatTime": t,
                "lastTransitionTime": t,
            }
            for kind, reason, msg in (
                ("MemoryPressure", "SufficientMemory", "no memory pressure"),
                ("DiskPressure", "NoDiskPressure", "no disk pressure"),
                ("PIDPressure", "SufficientPID", "enough PIDs"),
            )
        ]
        conds.append(
            {
                "type": "Ready",
                "status": "True",
                "reason": "KubeletReady",
                "message": "gpulab test bed node agent is posting ready status",
                "lastHeartbeatTime": t,
                "lastTransitionTime": t,
            }
        )
        alloc = spec.get("allocatable", {})
        status = {
            "status": {
                "capacity": alloc,
                "allocatable": alloc,
                "conditions": conds,
                "addresses": [
                    {"type": "InternalIP", "address": "127.0.0.1"},
                    {"type": "Hostname", "address": spec["name"]},
                ],
                "nodeInfo": {
                    "kubeletVersion": KUBE_VERSION,
                    "kubeProxyVersion": "",
                    "operatingSystem": "linux",
                    "architecture": "amd64",
                    "containerRuntimeVersion": "none://gpulab-testbed",
                    "kernelVersion": os.uname().release,
                    "osImage": "gpulab test bed",
                    "machineID": spec["name"],
                    "systemUUID": spec["name"],
                    "bootID": spec["name"],
                },
                "daemonEndpoints": {"kubeletEndpoint": {"Port": 0}},
            }
        }
        await self.core.patch_node_status(spec["name"], status)

    async def heartbeat(self) -> None:
        """Each node's Lease every ``renew_seconds`` and its status every ``status_seconds``,
        the nodes' writes spread evenly over the period (tests/kube/bed/scale.py)."""
        plan = self.plan
        gap = plan.renew_seconds / max(1, len(self.nodes))
        every = max(1, round(plan.status_seconds / plan.renew_seconds))
        tick = 0
        while True:
            started = asyncio.get_running_loop().time()
            for i, spec in enumerate(self.nodes):
                try:
                    await self.renew_lease(spec["name"])
                    if tick % every == 0 and tick:
                        await self.node_status(spec)
                except Exception as e:  # keep beating for the other nodes
                    log.warning("heartbeat for %s failed: %s", spec["name"], e)
                if len(self.nodes) > 50:
                    lag = started + (i + 1) * gap - asyncio.get_running_loop().time()
                    if lag > 0:
                        await asyncio.sleep(lag)
            tick += 1
            rest = started + plan.renew_seconds - asyncio.get_running_loop().time()
            await asyncio.sleep(max(0.0, rest))

    async def renew_lease(self, name: str) -> None:
        t = now().isoformat().replace("+00:00", "Z")
        body = {
            "metadata": {"name": name, "namespace": "kube-node-lease"},
            "spec": {"holderIdentity": name, "leaseDurationSeconds": self.plan.lease_seconds, "renewTime": t},
        }
        try:
            await self.coord.patch_namespaced_lease(name, "kube-node-lease", {"spec": body["spec"]})
        except ApiException as e:
            if e.status != 404:
                raise
            await self.coord.create_namespaced_lease("kube-node-lease", body)

    # -- pods ------------------------------------------------------------------
    async def watch_pods(self) -> None:
        while True:
            try:
                pods = await self.core.list_pod_for_all_namespaces(field_selector="spec.nodeName!=")
                for pod in pods.items:
                    await self.on_pod("ADDED", pod)
                rv = pods.metadata.resource_version
                w = watch.Watch()
                async with w.stream(
                    self.core.list_pod_for_all_namespaces,
                    field_selector="spec.nodeName!=",
                    resource_version=rv,
                    timeout_seconds=300,
                    allow_watch_bookmarks=True,
                ) as stream:
                    async for event in stream:
                        if event["type"] == "ERROR":
                            break
                        if event["type"] == "BOOKMARK":
                            continue
                        asyncio.ensure_future(self.guard(self.on_pod(event["type"], event["object"])))
            except Exception as e:
                log.warning("pod watch restarted: %s", e)
                await asyncio.sleep(1)

    async def guard(self, coro) -> None:
        try:
            await coro
        except Exception:
            log.exception("pod handling failed")

    async def on_pod(self, kind: str, pod: client.V1Pod) -> None:
        if pod.spec.node_name not in self.names:
            return
        uid = pod.metadata.uid
        if kind == "DELETED":
            await self.stop_process(uid)
            self.detach(uid)
            self.started.pop(uid, None)
            self.release(pod)
            return
        if pod.metadata.deletion_timestamp is not None:
            if uid not in self.finishing:
                self.finishing.add(uid)
                await self.terminate(pod)
            return
        if pod.status.phase in ("Succeeded", "Failed"):
            self.release(pod)  # a terminal pod holds nothing on its node
            return
        if uid not in self.started and pod.status.phase in (None, "Pending"):
            await self.start(pod)
        elif uid not in self.started and pod.status.phase == "Running":
            # Running before this agent started: count it, as a restarted kubelet does.
            self.kubelets[pod.spec.node_name].adopt(
                uid, pod.metadata.namespace, pod.metadata.name, self.api.sanitize_for_serialization(pod.spec)
            )
            self.started[uid] = pod.status.pod_ip or ""
            self.publish_pod_resources(pod.spec.node_name)

    def pod_ip(self) -> str:
        n = self.next_ip
        self.next_ip += 1
        return f"{self.ip_prefix}{n // 250}.{n % 250 + 2}"

    async def start(self, pod: client.V1Pod) -> None:
        uid = pod.metadata.uid
        self.started[uid] = ""
        # Admission and device allocation in one step, with no await in between: the
        # agent's pods are handled concurrently, a kubelet admits one pod at a time.
        admitted = self.kubelets[pod.spec.node_name].admit(
            uid, pod.metadata.namespace, pod.metadata.name, self.api.sanitize_for_serialization(pod.spec)
        )
        if isinstance(admitted, Rejection):
            await self.reject(pod, admitted)
            return
        self.publish_pod_resources(pod.spec.node_name)
        container = pod.spec.containers[0]
        sandboxed = container.image in self.image_envs and self.network is not None
        if sandboxed:
            self.netns[uid], ip = self.network.attach()
        else:
            ip = self.pod_ip()
        self.started[uid] = ip
        argv = [*(container.command or []), *(container.args or [])]
        env = await self.container_env(pod, container, device_env(admitted, container.name))
        home = self.work_dir / pod.metadata.namespace / pod.metadata.name
        home.mkdir(parents=True, exist_ok=True)
        (home / CONTAINER_ENV_FILE).write_text(json.dumps(env, indent=1))  # the runtime's record of it
        if argv and os.path.basename(argv[0]) in SERVER_COMMANDS:
            await self.start_process(pod, ip, argv, env)
        elif sandboxed:
            await self.run_container(pod, container, ip, argv, env)
        t = stamp()
        conds = [c for c in (pod.status.conditions or []) if c.type == "PodScheduled"]
        status = {
            "phase": "Running",
            "podIP": ip,
            "podIPs": [{"ip": ip}],
            "hostIP": "127.0.0.1",
            "hostIPs": [{"ip": "127.0.0.1"}],
            "startTime": t,
            "conditions": [self.api.sanitize_for_serialization(c) for c in conds]
            + [
                {"type": kind, "status": "True", "lastTransitionTime": t}
                for kind in ("PodReadyToStartContainers", "Initialized", "ContainersReady", "Ready")
            ],
            "containerStatuses": [
                {
                    "name": c.name,
                    "image": c.image,
                    "imageID": f"testbed://{c.image}",
                    "containerID": f"testbed://{uid}/{c.name}",
                    "ready": True,
                    "started": True,
                    "restartCount": 0,
                    "state": {"running": {"startedAt": t}},
                }
                for c in pod.spec.containers
            ],
        }
        await self.write_status(pod, status)
        log.info("pod %s/%s Running on %s at %s", pod.metadata.namespace, pod.metadata.name, pod.spec.node_name, ip)
        if container.name == KAI_RESERVATION_CONTAINER:
            await self.report_reserved_gpu(pod, device_env(admitted, container.name))

    async def report_reserved_gpu(self, pod: client.V1Pod, devices: dict[str, str]) -> None:
        """What KAI's resource-reservation container does at start: put the UUID of its only
        GPU on its own pod (``run.ai/reserve_for_gpu_index``), unless it is there already."""
        gpu = devices.get("NVIDIA_VISIBLE_DEVICES", "")
        if not gpu or "," in gpu:  # KAI's program exits: "found N devices, 1 was expected"
            log.warning("KAI reservation pod %s/%s holds GPUs %r, not exactly one", pod.metadata.namespace,
                        pod.metadata.name, gpu)  # fmt: skip
            return
        if (pod.metadata.annotations or {}).get(KAI_RESERVED_GPU_ANNOTATION):
            return
        patch = {"metadata": {"annotations": {KAI_RESERVED_GPU_ANNOTATION: gpu}}}
        await self.core.patch_namespaced_pod(pod.metadata.name, pod.metadata.namespace, patch)
        log.info("KAI reservation pod %s/%s reports GPU %s", pod.metadata.namespace, pod.metadata.name, gpu)

    async def reject(self, pod: client.V1Pod, rejection: Rejection) -> None:
        """What a kubelet does with a pod it cannot admit: a Warning event, then phase
        Failed with the reason (no DisruptionTarget: nobody disrupted it)."""
        ns, name = pod.metadata.namespace, pod.metadata.name
        log.warning("pod %s/%s rejected on %s: %s", ns, name, pod.spec.node_name, rejection.message)
        t = now().isoformat().replace("+00:00", "Z")
        try:
            await self.core.create_namespaced_event(
                ns,
                {
                    "metadata": {"generateName": f"{name}."},
                    "involvedObject": {"kind": "Pod", "apiVersion": "v1", "namespace": ns, "name": name}
                    | {"uid": pod.metadata.uid},
                    "reason": rejection.reason,
                    "message": rejection.message,
                    "type": "Warning",
                    "source": {"component": "kubelet", "host": pod.spec.node_name},
                    "firstTimestamp": t,
                    "lastTimestamp": t,
                    "count": 1,
                },
            )
        except ApiException as e:  # the event is for readers; the status is what counts
            log.warning("cannot record the rejection event of %s/%s: %s", ns, name, e.reason)
        await self.write_status(pod, rejection.status())

    async def write_status(self, pod: client.V1Pod, status: dict[str, Any]) -> None:
        """Replace the pod's status; while the API server cannot take it (restarting, or its
        authorizer not yet synced after a restart), try again, as the kubelet's status
        manager keeps the status it means to write and syncs it again
        (pkg/kubelet/status/status_manager.go: every ``syncPeriod``, 10 s; 1 s here)."""
        deadline = time.monotonic() + STATUS_RETRY_SECONDS
        while True:
            try:
                return await self._write_status_once(pod, status)
            except (ApiException, aiohttp.ClientError, asyncio.TimeoutError, OSError) as e:
                status_code = getattr(e, "status", None)
                if (status_code is not None and status_code < 500 and status_code != 403) or (
                    time.monotonic() > deadline
                ):
                    raise
                log.warning(
                    "status of %s/%s not written (%s); again in 1 s", pod.metadata.namespace, pod.metadata.name, e
                )
                await asyncio.sleep(1)

    async def _write_status_once(self, pod: client.V1Pod, status: dict[str, Any]) -> None:
        """Replace the pod's status (read-modify-write, retried on conflicts)."""
        ns, name = pod.metadata.namespace, pod.metadata.name
        for _ in range(10):
            try:
                current = await self.core.read_namespaced_pod(name, ns)
            except ApiException as e:
                if e.status == 404:
                    return
                raise
            if current.metadata.uid != pod.metadata.uid:
                return
            body = self.api.sanitize_for_serialization(current)
            keep = [
                c
                for c in body.get("status", {}).get("conditions", [])
                if c["type"] not in {c2["type"] for c2 in status.get("conditions", [])}
            ]
            body["status"] = {**body.get("status", {}), **status}
            if "conditions" in status:
                body["status"]["conditions"] = keep + status["conditions"]
            try:
                await self.core.replace_namespaced_pod_status(name, ns, body)
                return
            except ApiException as e:
                if e.status == 409:
                    continue
                if e.status == 404:
                    return
                raise

    async def container_env(
        self, pod: client.V1Pod, container: client.V1Container, devices: dict[str, str]
    ) -> dict[str, str]:
        """The environment the kubelet gives a container: the device plugin's variables first,
        the container's own after (they win), ``configMapKeyRef`` values read at start."""
        env = dict(devices)
        for item in container.env or []:
            value = item.value
            if value is None:
                value = field_value(pod, item) if item.value_from and item.value_from.field_ref else None
            if value is None:
                value = await self.config_map_value(pod, item)
            if value is not None:
                env[item.name] = value
        return env

    async def run_container(
        self, pod: client.V1Pod, container: client.V1Container, ip: str, argv: list[str], container_env: dict[str, str]
    ) -> None:
        """Run a container of an image this node has, in its sandbox (tests/kube/bed/pod_sandbox.py)."""
        home = self.work_dir / pod.metadata.namespace / pod.metadata.name
        claims = await pod_sandbox.claim_paths(self.core, pod)
        spec = pod_sandbox.sandbox_spec(
            self.as_dict(pod), self.as_dict(container), ip, home, self.image_envs[container.image], container_env,
            argv, claims, self.cluster_dns, self.cluster_domain,
        )  # fmt: skip
        proc = await pod_sandbox.start(spec, home, self.netns[pod.metadata.uid], CONTAINER_LOG_FILE)
        self.procs[pod.metadata.uid] = proc
        log.info("pod %s/%s: running %s in its sandbox", pod.metadata.namespace, pod.metadata.name, argv[:1])
        asyncio.ensure_future(self.guard(self.reap(pod, proc)))

    def detach(self, uid: str) -> None:
        """Take a pod's network namespace down, as the CNI plugin's DEL does."""
        netns = self.netns.pop(uid, None)
        if netns and self.network is not None:
            self.network.detach(netns)

    def as_dict(self, obj: Any) -> dict[str, Any]:
        return self.api.sanitize_for_serialization(obj)

    async def start_process(self, pod: client.V1Pod, ip: str, argv: list[str], container_env: dict[str, str]) -> None:
        home = self.work_dir / pod.metadata.namespace / pod.metadata.name
        env = {"PATH": os.environ.get("PATH", ""), "LANG": "C.UTF-8", **container_env, "HOME": str(home)}
        port = "8888"
        args = []
        for a in argv[1:]:
            if a.startswith("--ip="):
                continue
            if a.startswith("--port="):
                port = a.split("=", 1)[1]
            args.append(a)
        args.append(f"--ip={ip}")
        if os.geteuid() == 0:
            args.append("--allow-root")
        if "JUPYTERHUB_SERVICE_URL" in env:
            from urllib.parse import urlsplit, urlunsplit

            u = urlsplit(env["JUPYTERHUB_SERVICE_URL"])
            env["JUPYTERHUB_SERVICE_URL"] = urlunsplit((u.scheme, f"{ip}:{port}", u.path, u.query, u.fragment))
        exe = shutil.which(argv[0], path=env["PATH"]) or argv[0]
        logf = open(home / "server.log", "ab")
        proc = await asyncio.create_subprocess_exec(
            exe, *args, env=env, cwd=home, stdout=logf, stderr=subprocess_stdout(), start_new_session=True
        )
        logf.close()
        self.procs[pod.metadata.uid] = proc
        asyncio.ensure_future(self.guard(self.reap(pod, proc)))

    async def config_map_value(self, pod: client.V1Pod, item: client.V1EnvVar) -> str | None:
        """An env var's ``configMapKeyRef`` value, read as the kubelet reads it when the container
        starts. (A kubelet holds a container whose required key is missing in
        CreateContainerConfigError; here the variable is left out and the agent logs it.)"""
        ref = item.value_from.config_map_key_ref if item.value_from else None
        if ref is None:
            return None
        try:
            cm = await self.core.read_namespaced_config_map(ref.name, pod.metadata.namespace)
        except ApiException as e:
            cm = None
            if e.status != 404:
                raise
        value = ((cm.data or {}) if cm else {}).get(ref.key)
        if value is None and not ref.optional:
            log.warning("pod %s/%s: ConfigMap %s has no key %s for %s", pod.metadata.namespace, pod.metadata.name,
                        ref.name, ref.key, item.name)  # fmt: skip
        return value

    async def reap(self, pod: client.V1Pod, proc: asyncio.subprocess.Process) -> None:
        code = await proc.wait()
        if pod.metadata.uid in self.finishing or self.procs.get(pod.metadata.uid) is not proc:
            return
        self.procs.pop(pod.metadata.uid, None)
        self.detach(pod.metadata.uid)
        self.release(pod)
        await self.write_status(pod, terminal_status(pod, code, "Completed" if code == 0 else "Error"))

    async def stop_process(self, uid: str, grace: float = 5) -> int | None:
        proc = self.procs.pop(uid, None)
        if proc is None or proc.returncode is not None:
            return None if proc is None else proc.returncode
        try:
            os.killpg(proc.pid, signal.SIGTERM)
            await asyncio.wait_for(proc.wait(), grace)
        except (ProcessLookupError, asyncio.TimeoutError):
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            await proc.wait()
        return proc.returncode

    async def terminate(self, pod: client.V1Pod) -> None:
        await self.stop_process(pod.metadata.uid)
        self.detach(pod.metadata.uid)
        self.release(pod)
        if pod.status.phase not in ("Succeeded", "Failed"):
            await self.write_status(pod, terminal_status(pod, 137, "Error"))
        try:
            await self.core.delete_namespaced_pod(
                pod.metadata.name,
                pod.metadata.namespace,
                grace_period_seconds=0,
                body=client.V1DeleteOptions(
                    grace_period_seconds=0, preconditions=client.V1Preconditions(uid=pod.metadata.uid)
                ),
            )
        except ApiException as e:
            if e.status not in (404, 409):
                raise
        log.info("pod %s/%s terminated", pod.metadata.namespace, pod.metadata.name)


def device_env(admitted: Admitted, container: str) -> dict[str, str]:
    """What the NVIDIA device plugin's Allocate answers for a container's GPUs (envvar strategy)."""
    ids = [d for resource, held in admitted.devices.get(container, {}).items() for d in held]
    return {"NVIDIA_VISIBLE_DEVICES": visible_devices(ids)} if ids else {}


def subprocess_stdout() -> int:
    return asyncio.subprocess.STDOUT


def terminal_status(pod: client.V1Pod, exit_code: int, reason: str) -> dict[str, Any]:
    """What a kubelet reports when a pod's only container has exited."""
    t = stamp()
    started = t
    for cs in pod.status.container_statuses or []:
        if cs.state and cs.state.running and cs.state.running.started_at:
            started = cs.state.running.started_at.strftime("%Y-%m-%dT%H:%M:%SZ")
    return {
        "phase": "Succeeded" if exit_code == 0 else "Failed",
        "conditions": [
            {
                "type": kind,
                "status": "False",
                "reason": "PodCompleted" if exit_code == 0 else "PodFailed",
                "lastTransitionTime": t,
            }
            for kind in ("Ready", "ContainersReady")
        ],
        "containerStatuses": [
            {
                "name": c.name,
                "image": c.image,
                "imageID": f"testbed://{c.image}",
                "containerID": f"testbed://{pod.metadata.uid}/{c.name}",
                "ready": False,
                "started": False,
                "restartCount": 0,
                "state": {
                    "terminated": {"exitCode": exit_code, "reason": reason, "startedAt": started, "finishedAt": t}
                },
            }
            for c in pod.spec.containers
        ],
    }


async def amain(args: argparse.Namespace) -> None:
    await config.load_kube_config(config_file=args.kubeconfig)
    nodes = scaled_nodes(yaml.safe_load(Path(args.nodes).read_text())["nodes"], args.nodes_total)
    work = Path(args.work_dir)
    work.mkdir(parents=True, exist_ok=True)
    async with client.ApiClient() as api:
        image_envs = {image: Path(folder) for image, _, folder in (i.partition("=") for i in args.image_env)}
        agent = NodeAgent(
            api,
            nodes,
            work,
            args.pod_ip_prefix,
            Path(args.pod_resources_dir) if args.pod_resources_dir else None,
            image_envs,
            args.cluster_dns,
            args.cluster_domain,
            PodNetwork(args.pod_network, args.pod_bridge) if args.pod_network else None,
        )
        await agent.register()
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        tasks = [asyncio.ensure_future(agent.heartbeat()), asyncio.ensure_future(agent.watch_pods())]
        await stop.wait()
        for t in tasks:
            t.cancel()
        for uid in list(agent.procs):
            await agent.stop_process(uid, grace=3)


def main() -> None:
    p = argparse.ArgumentParser(description="gpulab test bed node agent")
    p.add_argument("--kubeconfig", required=True)
    p.add_argument("--nodes", required=True)
    p.add_argument("--work-dir", required=True)
    p.add_argument("--pod-ip-prefix", default="127.77.")
    p.add_argument(
        "--nodes-total", type=int, default=0, help="register this many nodes, cycling through --nodes (0: as listed)"
    )
    p.add_argument("--pod-resources-dir", help="where each node's PodResources List answer is written (JSON)")
    p.add_argument(
        "--image-env", action="append", default=[], help="IMAGE=DIR: containers of IMAGE run in the Python at DIR"
    )
    p.add_argument("--cluster-dns", default="", help="the cluster DNS address pods' resolv.conf names")
    p.add_argument("--cluster-domain", default="cluster.local", help="the cluster's DNS domain")
    p.add_argument("--pod-network", default="", help="the subnet of sandboxed pods (tests/kube/bed/pod_network.py)")
    p.add_argument("--pod-bridge", default="", help="the host's bridge of the pod network")
    args = p.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s", stream=sys.stdout)
    asyncio.run(amain(args))


if __name__ == "__main__":
    main()
