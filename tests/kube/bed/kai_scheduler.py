"""NVIDIA's KAI scheduler in the test bed: its CRDs, RBAC and webhooks, and its six
components as local processes against the bed's API server.

KAI normally runs as Deployments that its operator (``cmd/operator``) renders from
the ``Config`` and ``SchedulingShard`` objects of its Helm chart. The test bed has
no container runtime, so the components (``scripts/build-kai.sh``, KAI v0.20.1 from
Go modules) run as processes here, each with the flags the operator gives it and
with the credentials of the ServiceAccount the chart's RBAC binds. Facts read in
NVIDIA/KAI-Scheduler v0.20.1:

- the chart (``deployments/kai-scheduler``, rendered by the real ``helm template`` with
  ``global.gpuSharing=true``) gives the priority classes, the reservation namespace and
  ServiceAccount, the ClusterRoles and their bindings, the default queues, the
  ``default`` SchedulingShard and the ``kai-config`` Config; its Deployments and Jobs
  (the operator, the CRD upgrader) are what this module replaces;
- each component's flags: ``pkg/operator/operands/<component>/resources.go``
  (``buildArgsList``), with the defaults of ``pkg/apis/kai/v1`` (scheduler name
  ``kai-scheduler``, queue label ``kai.scheduler/queue``, node pool label
  ``kai.scheduler/node-pool``);
- the scheduler's configuration: ``pkg/operator/operands/scheduler/resources_for_shard.go``
  (``configMapForShard``: the actions, the plugin tier, the GPU placement plugin and
  ``nodeplacement`` arguments from the shard's ``placementStrategy``);
- fake GPU nodes: the operator starts the binder with ``--fake-gpu-nodes`` when a node
  carries ``run.ai/fake.gpu=true`` (``binder/resources.go``, ``hasFakeGPUNodes``); the
  binder's reservation pods then run ``sleep infinity`` on ``ubuntu``
  (``pkg/binder/binding/resourcereservation/resource_reservation.go``), and the node agent
  plays what their image would report (tests/kube/bed/node_agent.py);
- the admission webhook: ``admission/resources.go`` (``mutating-kai-admission`` and
  ``validating-kai-admission``, paths ``/mutate--v1-pod`` and ``/validate--v1-pod``, every
  namespace but ``kube-system`` and KAI's own, ``failurePolicy: Fail``); its GPU sharing
  plugin gives fraction pods ``NVIDIA_VISIBLE_DEVICES`` from the ConfigMap the binder
  fills, and its runtime plugin sets ``runtimeClassName: nvidia`` on GPU pods, so the
  bed has the ``nvidia`` RuntimeClass the GPU operator creates on GPU clusters.

Where one machine differs from a cluster of pods:

- controller-runtime serves its webhooks on ``:9443`` and no flag of the queue or pod
  group controllers moves it (``cmd/queuecontroller/app/app.go``,
  ``cmd/podgroupcontroller/app/app.go``), so only one of them can serve here: the queue
  controller's Queue validation (``kai-queue-validation-v2``, as
  ``queue_controller/resources.go`` registers it) is served on 9443 and registered; the pod
  group controller runs with ``--enable-podgroup-webhook=false`` (PodGroups are made by KAI's
  own pod grouper). KAI's pod admission webhook takes a port (``--webhook-addr``) and is
  served and registered as KAI's operator registers it. Both use TLS from the bed's CA;
- metrics, health and plugin ports the operator leaves at their defaults get free
  loopback ports (every component would otherwise take ``:8080``/``:8081``), except the
  pod group controller's metrics, which stay on ``:8080`` (see ``READY``): two beds
  cannot run KAI at the same time on one machine, and the second fails with its log;
- controller-runtime's webhook server listens on every interface (its host is not a
  flag), unlike the rest of the bed, which listens on loopback only.

``start`` stops a KAI that an earlier session left, installs everything and starts the
components; ``stop`` ends them and removes KAI's webhooks, so a bed without KAI creates
pods (and Queues) as before. A component that does not come up fails the start with its log.
"""

from __future__ import annotations

import base64
import json
import os
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import requests
import yaml

from tests.kube.bed.pki import issue_cert, token_kubeconfig
from tests.kube.bed.testbed import REPO, Testbed, TestbedError, _pid_alive, _tail
from tests.support.ports import free_port

#: KAI's own namespace (its chart's release namespace) and defaults of pkg/apis/kai/v1.
NAMESPACE = "kai-scheduler"
SCHEDULER_NAME = "kai-scheduler"
QUEUE_LABEL_KEY = "kai.scheduler/queue"
NODEPOOL_LABEL_KEY = "kai.scheduler/node-pool"
FAKE_GPU_NODE_LABEL = "run.ai/fake.gpu"
#: The reservation namespace, ServiceAccount and app label: the chart's global.resourceReservation.
RESERVATION = {"namespace": "kai-resource-reservation", "serviceAccount": "kai-resource-reservation"}
RESERVATION_APP_LABEL = "kai-resource-reservation"
SCALE_ADJUST_NAMESPACE = "kai-scale-adjust"
ADMISSION_SERVICE = "kai-admission"  # the chart's admission.name: the webhook's name is its Service's DNS name
MUTATING_WEBHOOK = "mutating-kai-admission"
VALIDATING_WEBHOOK = "validating-kai-admission"
#: The queue controller's webhook: controller-runtime's fixed port, the operator's names.
QUEUE_WEBHOOK_PORT = 9443
QUEUE_WEBHOOK = "kai-queue-validation-v2"
GPU_RUNTIME_CLASS = "nvidia"
#: Each component and the chart's ClusterRole that its ServiceAccount is bound to.
COMPONENT_ROLES = {
    "admission": "kai-admission",
    "queuecontroller": "queuecontroller",
    "podgroupcontroller": "kai-podgroup-controller",
    "podgrouper": "kai-podgrouper",
    "binder": "kai-binder",
    "scheduler": "kai-scheduler",
}
#: KAI's cluster-scoped kinds (the scope of each of its CRDs).
CLUSTER_SCOPED_KINDS = {"Config", "SchedulingShard", "Queue"}
#: Kinds of the chart the operator's place or the CRD upgrader's: not installed here.
NOT_INSTALLED = {"Deployment", "Job"}


class KaiError(TestbedError):
    """KAI could not be installed or started in the test bed; the message says why."""

    __test__ = False


def build() -> Path:
    proc = subprocess.run([str(REPO / "scripts" / "build-kai.sh")], stdout=subprocess.PIPE, text=True)
    if proc.returncode != 0:
        raise KaiError("scripts/build-kai.sh failed (see its output above): KAI is built from Go modules")
    return Path(proc.stdout.strip().splitlines()[-1])


def version(kai_dir: Path) -> str:
    return (kai_dir / ".built").read_text().strip()


def chart_objects(kai_dir: Path) -> list[dict[str, Any]]:
    """KAI's chart as ``helm install`` would apply it (GPU sharing on), less what its operator runs."""
    from tests.support.helm import helm_binary

    proc = subprocess.run(
        [helm_binary(), "template", "kai-scheduler", str(kai_dir / "chart"), "--namespace", NAMESPACE]
        + ["--set", "global.gpuSharing=true"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    if proc.returncode != 0:
        raise KaiError(f"helm template of KAI's chart failed: {proc.stderr[-2000:]}")
    return [d for d in yaml.safe_load_all(proc.stdout) if d and d["kind"] not in NOT_INSTALLED]


def service_accounts(objects: list[dict[str, Any]]) -> dict[str, str]:
    """Each component's ServiceAccount, as the chart's ClusterRoleBindings name it."""
    by_role = {d["roleRef"]["name"]: d["subjects"][0]["name"] for d in objects if d["kind"] == "ClusterRoleBinding"}
    missing = [c for c, role in COMPONENT_ROLES.items() if role not in by_role]
    if missing:
        raise KaiError(f"KAI's chart binds no ServiceAccount for {missing}: its RBAC changed")
    return {c: by_role[role] for c, role in COMPONENT_ROLES.items()}


#: The plugin tier ``configMapForShard`` writes before the placement plugins, in its order.
SCHEDULER_PLUGINS = (
    "predicates", "proportion", "priority", "nodeavailability", "resourcetype", "podaffinity", "elastic",
    "kubeflow", "ray", "subgrouporder", "taskorder", "nominatednode", "dynamicresources", "minruntime",
    "topology", "snapshot",
)  # fmt: skip


def scheduler_configuration(shard: dict[str, Any]) -> dict[str, Any]:
    """The scheduler's config.yaml for a SchedulingShard, as the operator writes its ConfigMap
    (``configMapForShard``: binpack keeps consolidation; the GPU plugin is ``gpu`` + the
    strategy less ``bin``; ``gpusharingorder`` with binpack; no minRuntime, kValue or usage DB
    unless the shard sets them, which the chart's default shard does not)."""
    spec = shard.get("spec") or {}
    placement = spec.get("placementStrategy") or {"gpu": "binpack", "cpu": "binpack"}
    unsupported = sorted(set(spec) - {"partitionLabelValue", "placementStrategy"})
    if unsupported:
        raise KaiError(f"the SchedulingShard sets {unsupported}, which the test bed does not render")
    actions = ["allocate"]
    if "spread" not in (placement["gpu"], placement["cpu"]):
        actions.append("consolidation")
    actions += ["reclaim", "preempt", "stalegangeviction"]
    plugins: list[dict[str, Any]] = [{"name": name} for name in SCHEDULER_PLUGINS]
    plugins.append({"name": "gpu" + placement["gpu"].replace("bin", "", 1)})
    plugins.append({"name": "nodeplacement", "arguments": {"gpu": placement["gpu"], "cpu": placement["cpu"]}})
    if placement["gpu"] == "binpack":
        plugins.append({"name": "gpusharingorder"})
    return {"actions": ", ".join(actions), "tiers": [{"plugins": plugins}]}


def queue_webhook_configuration(url: str, ca_bundle: str) -> dict[str, Any]:
    """The queue controller's Queue validation as KAI's operator registers it (v2 only:
    ``constants.QueueValidatedVersions``), pointed at the local queue controller."""
    return {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingWebhookConfiguration",
        "metadata": {"name": QUEUE_WEBHOOK, "labels": {"app": "queuecontroller"}},
        "webhooks": [
            {
                "name": "queue-validation.kai.scheduler",
                "admissionReviewVersions": ["v1"],
                "sideEffects": "None",
                "failurePolicy": "Fail",
                "clientConfig": {"url": url + "/validate-scheduling-run-ai-v2-queue", "caBundle": ca_bundle},
                "rules": [
                    {
                        "operations": ["CREATE", "UPDATE"],
                        "apiGroups": ["scheduling.run.ai"],
                        "apiVersions": ["v2"],
                        "resources": ["queues"],
                        "scope": "Cluster",
                    }
                ],
            }
        ],
    }


def webhook_configurations(url: str, ca_bundle: str) -> list[dict[str, Any]]:
    """KAI's pod webhooks as its operator registers them, pointed at the local admission server."""
    name = f"{ADMISSION_SERVICE}.{NAMESPACE}.svc"
    common = {
        "name": name,
        "admissionReviewVersions": ["v1"],
        "sideEffects": "None",
        "failurePolicy": "Fail",
        "namespaceSelector": {
            "matchExpressions": [
                {"key": "kubernetes.io/metadata.name", "operator": "NotIn", "values": ["kube-system", NAMESPACE]}
            ]
        },
    }
    rule = {"apiGroups": [""], "apiVersions": ["v1"], "resources": ["pods"], "scope": "Namespaced"}
    return [
        {
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "MutatingWebhookConfiguration",
            "metadata": {"name": MUTATING_WEBHOOK, "labels": {"app": ADMISSION_SERVICE}},
            "webhooks": [
                common
                | {
                    "clientConfig": {"url": url + "/mutate--v1-pod", "caBundle": ca_bundle},
                    "rules": [{"operations": ["CREATE"], **rule}],
                    "reinvocationPolicy": "IfNeeded",
                }
            ],
        },
        {
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "ValidatingWebhookConfiguration",
            "metadata": {"name": VALIDATING_WEBHOOK, "labels": {"app": ADMISSION_SERVICE}},
            "webhooks": [
                common
                | {
                    "clientConfig": {"url": url + "/validate--v1-pod", "caBundle": ca_bundle},
                    "rules": [{"operations": ["CREATE", "UPDATE"], **rule}],
                }
            ],
        },
    ]


def component_args(
    name: str, ports: dict[str, int], address: str, config: dict[str, Any], fake_gpu_nodes: bool, conf_file: Path
) -> list[str]:
    """A component's flags: the operator's (``buildArgsList`` of each operand), plus the
    addresses that a shared host needs (see the module's docstring)."""

    def at(port: str) -> str:
        return f"{address}:{ports[f'{name}-{port}']}"

    if name == "admission":
        return [
            f"--scheduler-name={SCHEDULER_NAME}",
            f"--webhook-addr={ports['admission-webhook']}",
            f"--health-probe-bind-address={at('probe')}",
            f"--metrics-bind-address={at('metrics')}",
            *(["--gpu-sharing-enabled=true"] if config["admission"].get("gpuSharing") else []),
            f"--gpu-pod-runtime-class-name={config['admission'].get('gpuPodRuntimeClassName', GPU_RUNTIME_CLASS)}",
        ]
    if name == "binder":
        image = config["binder"]["service"]["image"]
        reservation_image = config["binder"]["resourceReservation"]["image"]["name"]
        return [
            f"--scheduler-name={SCHEDULER_NAME}",
            f"--resource-reservation-namespace={RESERVATION['namespace']}",
            f"--resource-reservation-service-account={RESERVATION['serviceAccount']}",
            f"--resource-reservation-app-label={RESERVATION_APP_LABEL}",
            f"--resource-reservation-pod-image={image['repository']}/{reservation_image}:{image['tag']}",
            f"--scale-adjust-namespace={config['nodeScaleAdjuster']['args']['nodeScaleNamespace']}",
            f"--health-probe-bind-address={at('probe')}",
            f"--metrics-bind-address={at('metrics')}",
            "--cdi-enabled=false",
            *(["--fake-gpu-nodes"] if fake_gpu_nodes else []),
        ]
    if name == "podgrouper":
        return [
            f"--scheduler-name={SCHEDULER_NAME}",
            f"--queue-label-key={QUEUE_LABEL_KEY}",
            f"--nodepool-label-key={NODEPOOL_LABEL_KEY}",
            f"--health-probe-bind-address={at('probe')}",
            f"--metrics-bind-address={at('metrics')}",
        ]
    if name == "podgroupcontroller":
        return [
            f"--scheduler-name={SCHEDULER_NAME}",
            f"--health-probe-bind-address={at('probe')}",
            f"--metrics-bind-address={at('metrics')}",
            "--enable-podgroup-webhook=false",
        ]
    if name == "queuecontroller":
        return [f"--queue-label-key={QUEUE_LABEL_KEY}", f"--metrics-listen-address={at('metrics')}"]
    if name == "scheduler":
        shard_partition = ""  # the chart's default shard: every node without a node pool label
        return [
            f"--scheduler-conf={conf_file}",
            f"--scheduler-name={SCHEDULER_NAME}",
            f"--namespace={NAMESPACE}",
            f"--nodepool-label-key={NODEPOOL_LABEL_KEY}",
            f"--partition-label-value={shard_partition}",
            f"--resource-reservation-app-label={RESERVATION_APP_LABEL}",
            f"--listen-address={at('metrics')}",
            f"--plugin-server-port={ports['scheduler-plugins']}",
        ]
    raise KaiError(f"unknown KAI component {name}")


#: The local ports the components get (``<component>-<use>``).
PORTS = (
    "admission-webhook", "admission-probe", "admission-metrics", "binder-probe", "binder-metrics",
    "podgrouper-probe", "podgrouper-metrics", "podgroupcontroller-probe", "podgroupcontroller-metrics",
    "queuecontroller-metrics", "scheduler-metrics", "scheduler-plugins",
)  # fmt: skip
#: How each component shows it is up: a path on one of its ports.
#: (Only the admission server registers a readiness check: the webhook server's start.)
READY = {
    "admission": ("probe", "/readyz"),
    "binder": ("metrics", "/metrics"),
    "podgrouper": ("metrics", "/metrics"),
    # v0.20.1's pod group controller never hands its metrics address to its manager
    # (cmd/podgroupcontroller/app/app.go), which then serves controller-runtime's default :8080.
    "podgroupcontroller": ("fixed-8080", "/metrics"),
    "queuecontroller": ("metrics", "/metrics"),
    "scheduler": ("metrics", "/metrics"),
}


@dataclass
class Kai:
    """A running KAI in a test bed: its version, ports, processes and what it installed."""

    tb: Testbed
    version: str
    ports: dict[str, int]
    pids: dict[str, int]

    @property
    def state_file(self) -> Path:
        return state_file(self.tb.state_dir)

    def save(self) -> None:
        self.state_file.write_text(json.dumps({"version": self.version, "ports": self.ports, "pids": self.pids}))

    def log(self, component: str) -> Path:
        return self.tb.log_file(f"kai-{component}")

    def alive(self) -> dict[str, bool]:
        return {name: _pid_alive(pid) for name, pid in self.pids.items()}

    def check(self) -> None:
        """Fail with the log of any component that has exited."""
        for name, up in self.alive().items():
            if not up:
                raise KaiError(f"KAI's {name} exited; {self.log(name)} ends with:\n{_tail(self.log(name))}")


def state_file(state_dir: Path) -> Path:
    return state_dir / "kai-state.json"


def _apply(tb: Testbed, obj: dict[str, Any]) -> None:
    from tests.kube.bed.cluster import collection_path

    if obj["kind"] in CLUSTER_SCOPED_KINDS:  # the chart's Config carries its release namespace
        obj = {**obj, "metadata": {k: v for k, v in obj["metadata"].items() if k != "namespace"}}
    collection = collection_path(obj, obj["metadata"].get("namespace"))
    name = obj["metadata"]["name"]
    try:
        current = tb.request("GET", f"{collection}/{name}")
    except TestbedError:
        tb.request("POST", collection, obj)
        return
    if obj["kind"] in ("Namespace", "ServiceAccount", "PriorityClass"):
        return  # kept as they are (a PriorityClass's value is immutable)
    obj = {**obj, "metadata": {**obj["metadata"], "resourceVersion": current["metadata"]["resourceVersion"]}}
    tb.request("PUT", f"{collection}/{name}", obj)


def _established(tb: Testbed, name: str) -> bool:
    crd = tb.request("GET", f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{name}")
    return any(
        c["type"] == "Established" and c["status"] == "True" for c in crd.get("status", {}).get("conditions", [])
    )


def _wait(what: str, check: Callable[[], bool], timeout: float, kai: Kai | None = None) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if kai is not None:
            kai.check()
        try:
            if check():
                return
        except KaiError:
            raise
        except (TestbedError, requests.RequestException):
            pass
        time.sleep(0.3)
    raise KaiError(f"timed out after {timeout:.0f} s waiting for {what}")


def _token(tb: Testbed, service_account: str) -> str:
    review = tb.request(
        "POST",
        f"/api/v1/namespaces/{NAMESPACE}/serviceaccounts/{service_account}/token",
        {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": {"expirationSeconds": 86400}},
    )
    return review["status"]["token"]


def serve_kueue_topology_v1alpha1(tb: Testbed, kai_dir: Path) -> None:
    """KAI v0.20.1's scheduler waits for its informer of Kueue's ``Topology`` at
    ``kueue.x-k8s.io/v1alpha1`` before its first scheduling cycle
    (``pkg/scheduler/cache/cache.go``, ``WaitForCacheSync``), and KAI's CRD upgrader installs
    its copy of that CRD (``deployments/external-crds``) only where the CRD does not exist
    (``deployments/crd-upgrader/apply-crds.sh``). Kueue v0.17 installs the CRD with
    v1beta1 and v1beta2 only, so beside it KAI never schedules a pod (its log repeats
    "failed to list *v1alpha1.Topology"; NVIDIA/KAI-Scheduler#652 is the same hang without
    Kueue). What a platform engineer does about it, done here: serve KAI's v1alpha1
    version in Kueue's CRD as well (not stored; the CRD's conversion is ``None`` and the
    three versions have the same fields)."""
    name = "topologies.kueue.x-k8s.io"
    path = f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{name}"
    ours = yaml.safe_load((kai_dir / "external-crds" / "kueue.x-k8s.io_topologies.yaml").read_text())
    try:
        crd = tb.request("GET", path)
    except TestbedError:
        _apply(tb, ours)  # no Kueue: KAI's CRD upgrader installs its own
        return
    if any(v["name"] == "v1alpha1" for v in crd["spec"]["versions"]):
        return
    (v1alpha1,) = [{**v, "storage": False} for v in ours["spec"]["versions"] if v["name"] == "v1alpha1"]
    crd["spec"]["versions"].append(v1alpha1)
    tb.request("PUT", path, crd)
    _wait("Kueue's Topology CRD to serve v1alpha1", lambda: _established(tb, name), 30)


def install(tb: Testbed, kai_dir: Path, admission_url: str) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """KAI's CRDs, chart objects, the ``nvidia`` RuntimeClass and its pod webhooks; returns the
    chart's objects and its ``kai-config`` Config."""
    ca_bundle = base64.b64encode(tb.ca_file.read_bytes()).decode()
    names = []
    for path in sorted((kai_dir / "crds").glob("*.yaml")):
        for crd in yaml.safe_load_all(path.read_text()):
            if crd:
                _apply(tb, crd)
                names.append(crd["metadata"]["name"])
    _wait("KAI's CRDs to be established", lambda: all(_established(tb, n) for n in names), 60)
    serve_kueue_topology_v1alpha1(tb, kai_dir)
    objects = chart_objects(kai_dir)
    accounts = service_accounts(objects)
    _apply(tb, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}})
    _apply(tb, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": SCALE_ADJUST_NAMESPACE}})
    # The ServiceAccounts the operator creates for its Deployments, named by the chart's bindings.
    for account in accounts.values():
        _apply(
            tb, {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": account, "namespace": NAMESPACE}}
        )
    order = ["Namespace", "ServiceAccount", "ClusterRole", "ClusterRoleBinding", "RoleBinding", "PriorityClass"]
    for obj in sorted(objects, key=lambda d: order.index(d["kind"]) if d["kind"] in order else len(order)):
        _apply(tb, obj)
    # What the NVIDIA GPU operator installs on a GPU cluster, and KAI's admission names.
    _apply(
        tb,
        {"apiVersion": "node.k8s.io/v1", "kind": "RuntimeClass", "metadata": {"name": GPU_RUNTIME_CLASS}}
        | {"handler": GPU_RUNTIME_CLASS},
    )
    for hooks in webhook_configurations(admission_url, ca_bundle):
        _apply(tb, hooks)
    # Registered once the queue controller serves it (start): a Queue meanwhile would be refused.
    config = next(d for d in objects if d["kind"] == "Config")
    return objects, config["spec"]


def start(tb: Testbed) -> Kai:
    """Install KAI into ``tb`` and start its components (a KAI an earlier session left is stopped first)."""
    stop(tb)
    kai_dir = build()
    ports = {name: free_port(tb.address) for name in PORTS}
    kai = Kai(tb, version(kai_dir), ports, {})
    work = tb.state_dir / "kai"
    work.mkdir(exist_ok=True)
    # controller-runtime reads its webhook certificate from $TMPDIR/k8s-webhook-server/serving-certs.
    crt, key = issue_cert(
        tb.pki, "kai-webhooks", "/CN=kai-webhooks",
        f"subjectAltName=IP:{tb.address},DNS:localhost\nextendedKeyUsage=serverAuth",
    )  # fmt: skip
    for component in ("admission", "queuecontroller"):
        certs = work / f"{component}-tmp" / "k8s-webhook-server" / "serving-certs"
        certs.mkdir(parents=True, exist_ok=True)
        (certs / "tls.crt").write_bytes(crt.read_bytes())
        (certs / "tls.key").write_bytes(key.read_bytes())
    objects, config = install(tb, kai_dir, f"https://{tb.address}:{ports['admission-webhook']}")
    accounts = service_accounts(objects)
    shard = next(d for d in objects if d["kind"] == "SchedulingShard")
    conf_file = work / "scheduler-config.yaml"
    conf_file.write_text(yaml.safe_dump(scheduler_configuration(shard)))
    nodes = tb.request("GET", f"/api/v1/nodes?labelSelector={FAKE_GPU_NODE_LABEL}%3Dtrue")["items"]
    for name in COMPONENT_ROLES:
        kubeconfig = work / f"{name}.kubeconfig"
        kubeconfig.write_text(yaml.safe_dump(token_kubeconfig(tb.server, tb.ca_file, _token(tb, accounts[name]))))
        os.chmod(kubeconfig, 0o600)
        argv = [str(kai_dir / "bin" / name), *component_args(name, ports, tb.address, config, bool(nodes), conf_file)]
        if name not in ("scheduler", "queuecontroller", "podgroupcontroller"):
            argv.append(f"--kubeconfig={kubeconfig}")
        env = {**os.environ, "KUBECONFIG": str(kubeconfig), "TMPDIR": str(work / f"{name}-tmp")}
        Path(env["TMPDIR"]).mkdir(exist_ok=True)
        with open(kai.log(name), "ab") as out:
            proc = subprocess.Popen(
                argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                start_new_session=True, env=env, cwd=work,
            )  # fmt: skip
        kai.pids[name] = proc.pid
        kai.save()
    try:
        for name, (port, path) in READY.items():
            url = f"http://{tb.address}:{8080 if port == 'fixed-8080' else ports[f'{name}-{port}']}{path}"
            _wait(f"KAI's {name} at {url}", lambda url=url: requests.get(url, timeout=2).ok, 90, kai)
        ca_bundle = base64.b64encode(tb.ca_file.read_bytes()).decode()
        queue_url = f"https://{tb.address}:{QUEUE_WEBHOOK_PORT}"
        _wait(f"the queue controller's webhook at {queue_url}", lambda: _serves_tls(queue_url, tb.ca_file), 60, kai)
        _apply(tb, queue_webhook_configuration(queue_url, ca_bundle))
    except BaseException:
        stop(tb)
        raise
    return kai


def _serves_tls(url: str, ca_file: Path) -> bool:
    try:
        requests.get(url + "/", verify=str(ca_file), timeout=2)
        return True
    except requests.exceptions.SSLError as e:
        raise KaiError(f"{url} serves a certificate the bed's CA did not sign: {e}") from None
    except requests.RequestException:
        return False


def stop(tb: Testbed) -> None:
    """End a KAI of this bed and remove its pod webhooks (pods are created without KAI again)."""
    stop_processes(tb.state_dir)
    if tb.ready():
        for kind, name in (
            ("mutatingwebhookconfigurations", MUTATING_WEBHOOK),
            ("validatingwebhookconfigurations", VALIDATING_WEBHOOK),
            ("validatingwebhookconfigurations", QUEUE_WEBHOOK),
        ):
            try:
                tb.request("DELETE", f"/apis/admissionregistration.k8s.io/v1/{kind}/{name}")
            except TestbedError:
                pass


def stop_processes(state_dir: Path) -> None:
    """End the KAI components recorded in ``state_dir`` (testbed.down calls this too)."""
    try:
        pids = json.loads(state_file(state_dir).read_text())["pids"]
    except (OSError, ValueError, KeyError):
        return
    for pid in pids.values():
        if _pid_alive(pid):
            try:
                os.killpg(pid, signal.SIGTERM)
            except OSError:
                pass
    deadline = time.monotonic() + 15
    for pid in pids.values():
        while _pid_alive(pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        if _pid_alive(pid):
            try:
                os.killpg(pid, signal.SIGKILL)
            except OSError:
                pass
    state_file(state_dir).unlink(missing_ok=True)


@pytest.fixture(scope="module")
def kai_scheduler(kube_testbed: Testbed) -> Iterator[Kai]:
    """KAI running in the test bed for the tests of one module, then stopped."""
    try:
        kai = start(kube_testbed)
    except TestbedError as e:
        pytest.fail(f"KAI could not start in the test bed: {e}", pytrace=False)
    yield kai
    stop(kube_testbed)


__all__ = ["Kai", "kai_scheduler", "start", "stop"]
