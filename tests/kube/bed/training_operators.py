"""JobSet and Kubeflow Trainer in the test bed: their CRDs, RBAC, webhooks and controller
managers, outside a pod.

Both normally run as Deployments behind a webhook Service, with certificates their own
code rotates into a Secret that the kubelet mounts. Here the controller managers
(``scripts/build-jobset.sh``: JobSet v0.11.1, ``scripts/build-trainer.sh``: Trainer
v2.2.0, from Go modules) run as local processes against the bed's API server, each with
the credentials of the ServiceAccount its release's RBAC binds. What is applied is what
the releases' kustomizations apply, read from the release files the build scripts keep:

- JobSet (``config/default/kustomization.yaml``: namespace ``jobset-system``, name prefix
  ``jobset-``): the CRD of ``config/components/crd/bases``, whose conversion webhook
  (``crd/patches/webhook_in_jobsets.yaml``) is pointed at the loopback URL; every file of
  ``config/components/rbac`` (the ``manager-role`` ClusterRole bound to the
  ``controller-manager`` ServiceAccount, the secrets and leader election Roles, the
  metrics auth proxy roles); ``config/components/webhook/manifests.yaml`` with its two
  patches (``patches/{mutating,validating}-patch.yaml``: the pod webhooks only for pods
  labelled ``jobset.sigs.k8s.io/jobset-name``); ``controller_manager_config.yaml`` with
  internal certificate management off and leader election off (one replica);
- Trainer (``manifests/overlays/manager/kustomization.yaml``: namespace
  ``kubeflow-system``): the CRDs of ``manifests/base/crds``; ``manifests/base/rbac`` (the
  ``kubeflow-trainer-controller-manager`` ClusterRole and ServiceAccount, the public
  ConfigMap's Role for every authenticated user) and the ``kubeflow-trainer-public``
  ConfigMap the overlay generates; ``manifests/base/webhook/manifests.yaml`` with its
  patches (``patch_mutating.yaml``, ``patch_validating.yaml``: the names
  ``defaulter.trainer.kubeflow.org`` and ``validator.trainer.kubeflow.org``, which the
  controller's own certificate manager would look up); ``controller_manager_config.yaml``
  with ``certManagement.enable: false``.

Where one machine differs from a cluster: every webhook ``clientConfig`` is rewritten from
the in-cluster Service to the loopback URL with the bed's CA bundle, and the serving
certificates are signed by the bed's CA. Trainer's webhook server reads its certificate
from controller-runtime's default folder (``$TMPDIR/k8s-webhook-server/serving-certs``: its
configuration has no ``certDir``), so the process gets a ``TMPDIR`` of its own; JobSet's
configuration takes ``webhook.certDir``. The torch ``ClusterTrainingRuntime`` is not
installed here: gpulab's chart ships it (``helm/gpulab/templates/training-runtimes.yaml``)
and the chart tests install it as ``helm install`` would.
"""

from __future__ import annotations

import base64
import copy
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import requests
import yaml

JOBSET_NAMESPACE = "jobset-system"
JOBSET_PREFIX = "jobset-"
JOBSET_SERVICE_ACCOUNT = JOBSET_PREFIX + "controller-manager"
TRAINER_NAMESPACE = "kubeflow-system"
TRAINER_SERVICE_ACCOUNT = "kubeflow-trainer-controller-manager"
#: The webhook configurations' names after the release's patches (Trainer's cert manager's names).
TRAINER_WEBHOOK_NAMES = {
    "MutatingWebhookConfiguration": "defaulter.trainer.kubeflow.org",
    "ValidatingWebhookConfiguration": "validator.trainer.kubeflow.org",
}
#: Kinds kustomize puts in its namespace (the rest of the RBAC is cluster-scoped).
NAMESPACED_KINDS = {"ServiceAccount", "Role", "RoleBinding", "ConfigMap"}
PORTS = (
    "jobset-webhook",
    "jobset-health",
    "jobset-metrics",
    "trainer-webhook",
    "trainer-health",
    "trainer-metrics",
)


def _build(script: str) -> Path:
    from tests.kube.bed.testbed import REPO, TestbedError

    proc = subprocess.run([str(REPO / "scripts" / script)], stdout=subprocess.PIPE, text=True)
    if proc.returncode != 0:
        raise TestbedError(f"scripts/{script} failed (see its output above): it builds from Go modules")
    return Path(proc.stdout.strip().splitlines()[-1])


def build_jobset() -> Path:
    return _build("build-jobset.sh")


def build_trainer() -> Path:
    return _build("build-trainer.sh")


def version(built: Path) -> str:
    return (built / ".built").read_text().strip()


def _docs(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def json_patch_replace(doc: dict[str, Any], ops: list[dict[str, Any]]) -> dict[str, Any]:
    """``doc`` with the RFC 6902 ``replace`` operations applied (the only kind the releases'
    webhook patches use; any other is refused, so a release that changes them is noticed)."""
    out = copy.deepcopy(doc)
    for op in ops:
        if op.get("op") != "replace":
            raise ValueError(f"unsupported JSON patch operation {op!r}")
        *parents, last = [p.replace("~1", "/").replace("~0", "~") for p in op["path"].lstrip("/").split("/")]
        target: Any = out
        for part in parents:
            target = target[int(part)] if isinstance(target, list) else target[part]
        if isinstance(target, list):
            target[int(last)] = copy.deepcopy(op["value"])
        else:
            target[last] = copy.deepcopy(op["value"])
    return out


def kustomize_rbac(docs: list[dict[str, Any]], namespace: str, prefix: str = "") -> list[dict[str, Any]]:
    """RBAC documents as kustomize's ``namespace`` and ``namePrefix`` transform them: names
    prefixed, namespaced kinds in ``namespace``, role references and ServiceAccount subjects
    following (``system:*`` groups are left alone)."""
    out = []
    for doc in docs:
        doc = copy.deepcopy(doc)
        meta = doc["metadata"]
        meta["name"] = prefix + meta["name"]
        if doc["kind"] in NAMESPACED_KINDS:
            meta["namespace"] = namespace
        if "roleRef" in doc:
            doc["roleRef"]["name"] = prefix + doc["roleRef"]["name"]
        for subject in doc.get("subjects") or []:
            if subject.get("kind") == "ServiceAccount":
                subject["name"] = prefix + subject["name"]
                subject["namespace"] = namespace
        out.append(doc)
    return out


def jobset_rbac(jobset_dir: Path) -> list[dict[str, Any]]:
    rbac = jobset_dir / "config" / "rbac"
    listed = yaml.safe_load((rbac / "kustomization.yaml").read_text())["resources"]
    docs = [d for name in listed for d in _docs(rbac / name)]
    return kustomize_rbac(docs, JOBSET_NAMESPACE, JOBSET_PREFIX)


def trainer_rbac(trainer_dir: Path) -> list[dict[str, Any]]:
    rbac = trainer_dir / "config" / "rbac"
    listed = yaml.safe_load((rbac / "kustomization.yaml").read_text())["resources"]
    docs = [d for name in listed for d in _docs(rbac / name)]
    version_literal = {"kubeflow_trainer_version": version(trainer_dir)}
    public = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "kubeflow-trainer-public"},
        "data": version_literal,
    }
    return kustomize_rbac([*docs, public], TRAINER_NAMESPACE)


def _loopback_hooks(doc: dict[str, Any], url: str, ca_bundle: str) -> dict[str, Any]:
    for hook in doc.get("webhooks", []):
        hook["clientConfig"] = {"url": url + hook["clientConfig"]["service"]["path"], "caBundle": ca_bundle}
    return doc


def jobset_webhooks(jobset_dir: Path, url: str, ca_bundle: str) -> list[dict[str, Any]]:
    """JobSet's webhook configurations as its kustomization renders them, pointed at loopback."""
    webhook = jobset_dir / "config" / "webhook"
    patches = {
        "MutatingWebhookConfiguration": yaml.safe_load((webhook / "patches" / "mutating-patch.yaml").read_text()),
        "ValidatingWebhookConfiguration": yaml.safe_load((webhook / "patches" / "validating-patch.yaml").read_text()),
    }
    out = []
    for doc in _docs(webhook / "manifests.yaml"):
        doc = json_patch_replace(doc, patches[doc["kind"]])
        doc["metadata"]["name"] = JOBSET_PREFIX + doc["metadata"]["name"]
        out.append(_loopback_hooks(doc, url, ca_bundle))
    return out


def trainer_webhooks(trainer_dir: Path, url: str, ca_bundle: str) -> list[dict[str, Any]]:
    """Trainer's webhook configurations as its kustomization names them, pointed at loopback."""
    out = []
    for doc in _docs(trainer_dir / "config" / "webhook" / "manifests.yaml"):
        doc = copy.deepcopy(doc)
        doc["metadata"]["name"] = TRAINER_WEBHOOK_NAMES[doc["kind"]]
        out.append(_loopback_hooks(doc, url, ca_bundle))
    return out


def jobset_crds(jobset_dir: Path, url: str, ca_bundle: str) -> list[dict[str, Any]]:
    out = []
    for path in sorted((jobset_dir / "crds").glob("*.yaml")):
        for crd in _docs(path):
            # config/components/crd/patches/webhook_in_jobsets.yaml
            crd["spec"]["conversion"] = {
                "strategy": "Webhook",
                "webhook": {
                    "clientConfig": {"url": url + "/convert", "caBundle": ca_bundle},
                    "conversionReviewVersions": ["v1"],
                },
            }
            out.append(crd)
    return out


def trainer_crds(trainer_dir: Path) -> list[dict[str, Any]]:
    return [crd for path in sorted((trainer_dir / "crds").glob("*.yaml")) for crd in _docs(path)]


def jobset_configuration(jobset_dir: Path, ports: dict[str, int], address: str, cert_dir: Path) -> dict[str, Any]:
    config = yaml.safe_load((jobset_dir / "config" / "manager" / "controller_manager_config.yaml").read_text())
    config.update(
        {
            "leaderElection": {"leaderElect": False},
            "internalCertManagement": {"enable": False},
            "webhook": {"port": ports["jobset-webhook"], "host": address, "certDir": str(cert_dir)},
            "metrics": {"bindAddress": f"{address}:{ports['jobset-metrics']}"},
            "health": {"healthProbeBindAddress": f"{address}:{ports['jobset-health']}"},
        }
    )
    return config


def trainer_configuration(trainer_dir: Path, ports: dict[str, int], address: str) -> dict[str, Any]:
    config = yaml.safe_load((trainer_dir / "config" / "manager" / "controller_manager_config.yaml").read_text())
    config["health"]["healthProbeBindAddress"] = f"{address}:{ports['trainer-health']}"
    config["metrics"]["bindAddress"] = f"{address}:{ports['trainer-metrics']}"
    config["webhook"] = {"port": ports["trainer-webhook"], "host": address}
    config["leaderElection"] = {"leaderElect": False}
    config["certManagement"] = {"enable": False}
    return config


def _token(tb, namespace: str, service_account: str) -> str:
    review = tb.request(
        "POST",
        f"/api/v1/namespaces/{namespace}/serviceaccounts/{service_account}/token",
        {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": {"expirationSeconds": 86400 * 7}},
    )
    return review["status"]["token"]


def _write_kubeconfig(tb, path: Path, namespace: str, service_account: str) -> None:
    import os

    from tests.kube.bed.pki import token_kubeconfig

    token = _token(tb, namespace, service_account)
    path.write_text(yaml.safe_dump(token_kubeconfig(tb.server, tb.ca_file, token, namespace)))
    os.chmod(path, 0o600)


def _ready(url: str) -> Callable[[], bool]:
    def check() -> bool:
        try:
            return requests.get(url, timeout=2).ok
        except requests.RequestException:
            return False

    return check


def start(tb, spawn, wait, free_port) -> None:
    """Install JobSet and Trainer into ``tb`` and start their controller managers
    (before Kueue, whose JobSet and TrainJob integrations need the kinds served)."""
    from tests.kube.bed.cluster import collection_path
    from tests.kube.bed.kueue import _apply, _established, _serving_cert

    jobset_dir, trainer_dir = build_jobset(), build_trainer()
    for name in PORTS:
        tb.ports[name] = free_port(tb.address)
    ca_bundle = base64.b64encode(tb.ca_file.read_bytes()).decode()
    crt, key = _serving_cert(tb.pki, "training-webhooks", tb.address)
    jobset_url = f"https://{tb.address}:{tb.ports['jobset-webhook']}"
    trainer_url = f"https://{tb.address}:{tb.ports['trainer-webhook']}"

    def apply(obj: dict[str, Any]) -> None:
        _apply(tb, collection_path(obj), obj)

    for ns in (JOBSET_NAMESPACE, TRAINER_NAMESPACE):
        if tb.request("GET", f"/api/v1/namespaces?fieldSelector=metadata.name={ns}")["items"] == []:
            tb.request("POST", "/api/v1/namespaces", {"metadata": {"name": ns}})
    crds = [*jobset_crds(jobset_dir, jobset_url, ca_bundle), *trainer_crds(trainer_dir)]
    for crd in crds:
        apply(crd)
    names = [c["metadata"]["name"] for c in crds]
    wait("JobSet's and Trainer's CRDs", lambda: all(_established(tb, n) for n in names), 60, tb, "kube-apiserver")
    for obj in [*jobset_rbac(jobset_dir), *trainer_rbac(trainer_dir)]:
        if obj["kind"] == "ServiceAccount":
            try:
                tb.request("POST", collection_path(obj), obj)
            except Exception:
                pass  # kept as it is (its tokens stay valid)
            continue
        apply(obj)
    for hooks in [
        *jobset_webhooks(jobset_dir, jobset_url, ca_bundle),
        *trainer_webhooks(trainer_dir, trainer_url, ca_bundle),
    ]:
        apply(hooks)

    work = tb.state_dir / "training-operators"
    jobset_certs = work / "jobset-certs"
    trainer_tmp = work / "trainer-tmp"
    trainer_certs = trainer_tmp / "k8s-webhook-server" / "serving-certs"
    for folder in (jobset_certs, trainer_certs):
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "tls.crt").write_bytes(crt.read_bytes())
        (folder / "tls.key").write_bytes(key.read_bytes())
    jobset_conf, trainer_conf = work / "jobset-config.yaml", work / "trainer-config.yaml"
    jobset_conf.write_text(yaml.safe_dump(jobset_configuration(jobset_dir, tb.ports, tb.address, jobset_certs)))
    trainer_conf.write_text(yaml.safe_dump(trainer_configuration(trainer_dir, tb.ports, tb.address)))
    _write_kubeconfig(tb, work / "jobset.kubeconfig", JOBSET_NAMESPACE, JOBSET_SERVICE_ACCOUNT)
    _write_kubeconfig(tb, work / "trainer.kubeconfig", TRAINER_NAMESPACE, TRAINER_SERVICE_ACCOUNT)
    spawn(
        tb,
        "jobset",
        [str(jobset_dir / "bin" / "jobset"), f"--config={jobset_conf}", "--zap-log-level=info"],
        env={"KUBECONFIG": str(work / "jobset.kubeconfig"), "TMPDIR": str(work)},
    )
    spawn(
        tb,
        "trainer",
        [str(trainer_dir / "bin" / "trainer-controller-manager"), f"--config={trainer_conf}", "--zap-log-level=info"],
        env={"KUBECONFIG": str(work / "trainer.kubeconfig"), "TMPDIR": str(trainer_tmp)},
    )
    wait("JobSet's /readyz", _ready(f"http://{tb.address}:{tb.ports['jobset-health']}/readyz"), 90, tb, "jobset")
    wait("Trainer's /readyz", _ready(f"http://{tb.address}:{tb.ports['trainer-health']}/readyz"), 90, tb, "trainer")
    tb.versions["jobset"] = version(jobset_dir)
    tb.versions["trainer"] = version(trainer_dir)


__all__ = ["start"]
