"""Kueue in the test bed: its CRDs, webhooks and controller manager, outside a pod.

Kueue normally runs as a Deployment behind a Service, with its webhook
certificates mounted by the kubelet. Here the controller manager
(``scripts/build-kueue.sh``, from Go modules) runs as a local process:

- its webhook server listens on 127.0.0.1 with a certificate signed by the
  test bed's CA, and every webhook and CRD conversion ``clientConfig`` of the
  release's manifests is rewritten from the in-cluster Service to that
  loopback URL with the CA bundle (internal certificate management off);
- the ``batch/job``, ``jobset.x-k8s.io/jobset`` and ``trainer.kubeflow.org/trainjob``
  integrations are on (JobSet and Trainer run in the bed:
  ``tests/kube/bed/training_operators.py``), and only the webhooks of what runs are
  registered: a registered webhook nobody serves would refuse, with
  ``failurePolicy: Fail``, every object of its kind in the cluster;
- Kueue reads its metrics certificate from the fixed path
  ``/etc/kueue/metrics/certs`` when internal certificate management is off,
  so the test bed writes one there (the machines run as root);
- the on-demand visibility API server (an aggregated API) is switched off;
- fair sharing is on, as a platform team running departments turns it on: in the
  v1beta2 Configuration its presence enables it (``fairSharing:
  {preemptionStrategies: [...]}``; v1beta1's ``enable`` field is gone,
  sigs.k8s.io/kueue v0.17.0 apis/config/v1beta2/configuration_types.go), so a
  ClusterQueue's ``fairSharing.weight`` (the chart renders a team's
  ``fair_share_weight``) orders admission between borrowing queues of a cohort and
  picks the preemption victims (the queue furthest over its weighted share first).
"""

from __future__ import annotations

import copy
import subprocess
from pathlib import Path
from typing import Any

import yaml

KUEUE_METRICS_CERTS = Path("/etc/kueue/metrics/certs")
#: The integrations the bed turns on: the kinds whose controllers run in it.
INTEGRATIONS = ("batch/job", "jobset.x-k8s.io/jobset", "trainer.kubeflow.org/trainjob")
#: Kueue's fair-sharing preemption strategies, in its documented default order
#: (kueue.sigs.k8s.io/docs/concepts/preemption/#fair-sharing): a preemptor takes from a
#: queue only while its own share with the new workload stays at or below the victim
#: queue's share without the victim, then (if that frees too little) strictly below the
#: victim queue's share before.
FAIR_SHARING_PREEMPTION = ("LessThanOrEqualToFinalShare", "LessThanInitialShare")
#: Webhook paths served with those integrations enabled.
SERVED_WEBHOOK_PREFIXES = (
    "/mutate-kueue-x-k8s-io-",
    "/validate-kueue-x-k8s-io-",
    "/mutate-batch-v1-job",
    "/validate-batch-v1-job",
    "/mutate-jobset-x-k8s-io-",
    "/validate-jobset-x-k8s-io-",
    "/mutate-trainer-kubeflow-org-",
    "/validate-trainer-kubeflow-org-",
)


def build() -> Path:
    from tests.kube.bed.testbed import REPO, TestbedError

    proc = subprocess.run([str(REPO / "scripts" / "build-kueue.sh")], stdout=subprocess.PIPE, text=True)
    if proc.returncode != 0:
        raise TestbedError("scripts/build-kueue.sh failed (see its output above): Kueue is built from Go modules")
    return Path(proc.stdout.strip().splitlines()[-1])


def _serving_cert(pki: Path, name: str, address: str) -> tuple[Path, Path]:
    from tests.kube.bed.pki import issue_cert

    crt, key = pki / f"{name}.crt", pki / f"{name}.key"
    if not crt.exists():
        issue_cert(pki, name, f"/CN={name}", f"subjectAltName=IP:{address},DNS:localhost\nextendedKeyUsage=serverAuth")
    return crt, key


def _client_config(url: str, ca_bundle: str) -> dict[str, Any]:
    return {"url": url, "caBundle": ca_bundle}


def crds(kueue_dir: Path, webhook_url: str, ca_bundle: str) -> list[dict[str, Any]]:
    """The release's CRDs; those with a conversion patch convert through the loopback webhook."""
    base = kueue_dir / "config" / "crd"
    converted = set()
    for patch in (base / "patches").glob("webhook_in_*.yaml"):
        converted.add(yaml.safe_load(patch.read_text())["metadata"]["name"])
    listed = yaml.safe_load((base / "kustomization.yaml").read_text())
    enabled = {p["path"] for p in listed.get("patches", [])}
    out = []
    for path in sorted((base / "bases").glob("*.yaml")):
        crd = yaml.safe_load(path.read_text())
        name = crd["metadata"]["name"]
        patch_file = f"patches/webhook_in_{name.split('.')[0]}.yaml"
        if name in converted and patch_file in enabled:
            crd["spec"]["conversion"] = {
                "strategy": "Webhook",
                "webhook": {
                    "clientConfig": _client_config(webhook_url + "/convert", ca_bundle),
                    "conversionReviewVersions": ["v1"],
                },
            }
        out.append(crd)
    return out


def webhook_configurations(kueue_dir: Path, webhook_url: str, ca_bundle: str) -> list[dict[str, Any]]:
    """The release's webhook configurations, only the served webhooks, pointed at loopback."""
    out = []
    for doc in yaml.safe_load_all((kueue_dir / "config" / "webhook" / "manifests.yaml").read_text()):
        if not doc:
            continue
        doc = copy.deepcopy(doc)
        doc["metadata"]["name"] = "kueue-" + doc["metadata"]["name"]
        hooks = []
        for hook in doc.get("webhooks", []):
            path = hook["clientConfig"]["service"]["path"]
            if not path.startswith(SERVED_WEBHOOK_PREFIXES):
                continue
            hook["clientConfig"] = _client_config(webhook_url + path, ca_bundle)
            # As the release's kustomization does: never Kueue's or the system's own namespaces.
            hook["namespaceSelector"] = {
                "matchExpressions": [
                    {
                        "key": "kubernetes.io/metadata.name",
                        "operator": "NotIn",
                        "values": ["kube-system", "kueue-system"],
                    }
                ]
            }
            hooks.append(hook)
        doc["webhooks"] = hooks
        out.append(doc)
    return out


def configuration(ports: dict[str, int], address: str, cert_dir: Path) -> dict[str, Any]:
    return {
        "apiVersion": "config.kueue.x-k8s.io/v1beta2",
        "kind": "Configuration",
        "namespace": "kueue-system",
        "health": {"healthProbeBindAddress": f"{address}:{ports['kueue-health']}"},
        "metrics": {"bindAddress": f"{address}:{ports['kueue-metrics']}"},
        "webhook": {"port": ports["kueue-webhook"], "host": address, "certDir": str(cert_dir)},
        "visibilityServer": {"bindAddress": address, "bindPort": ports["kueue-visibility"]},
        "leaderElection": {"leaderElect": False},
        "internalCertManagement": {"enable": False},
        "manageJobsWithoutQueueName": False,
        "integrations": {"frameworks": list(INTEGRATIONS)},
        "clientConnection": {"qps": 100, "burst": 200},
        "fairSharing": {"preemptionStrategies": list(FAIR_SHARING_PREEMPTION)},
    }


def start(tb, spawn, wait, free_port) -> None:
    """Install Kueue's CRDs and webhooks into ``tb`` and start its controller manager."""
    import base64

    import requests

    kueue_dir = build()
    for name in ("kueue-webhook", "kueue-health", "kueue-metrics", "kueue-visibility"):
        tb.ports[name] = free_port(tb.address)
    pki = tb.pki
    crt, key = _serving_cert(pki, "kueue-webhook", tb.address)
    cert_dir = tb.state_dir / "kueue-certs"
    cert_dir.mkdir(exist_ok=True)
    for src, dst in ((crt, "tls.crt"), (key, "tls.key")):
        (cert_dir / dst).write_bytes(src.read_bytes())
    try:
        KUEUE_METRICS_CERTS.mkdir(parents=True, exist_ok=True)
        for src, dst in ((crt, "tls.crt"), (key, "tls.key")):
            (KUEUE_METRICS_CERTS / dst).write_bytes(src.read_bytes())
    except OSError as e:
        from tests.kube.bed.testbed import TestbedError

        raise TestbedError(
            f"Kueue reads its metrics certificate from {KUEUE_METRICS_CERTS}, which cannot be "
            f"written here ({e}); run the test bed as root"
        ) from None
    ca_bundle = base64.b64encode(tb.ca_file.read_bytes()).decode()
    url = f"https://{tb.address}:{tb.ports['kueue-webhook']}"
    if tb.request("GET", "/api/v1/namespaces?fieldSelector=metadata.name=kueue-system")["items"] == []:
        tb.request("POST", "/api/v1/namespaces", {"metadata": {"name": "kueue-system"}})
    names = []
    for crd in crds(kueue_dir, url, ca_bundle):
        _apply(tb, "/apis/apiextensions.k8s.io/v1/customresourcedefinitions", crd)
        names.append(crd["metadata"]["name"])
    # Kueue sets up its indexes at start: the kinds must be served by then.
    wait("Kueue's CRDs to be established", lambda: all(_established(tb, n) for n in names), 60, tb, "kube-apiserver")
    for hooks in webhook_configurations(kueue_dir, url, ca_bundle):
        plural = hooks["kind"].lower() + "s"
        _apply(tb, f"/apis/admissionregistration.k8s.io/v1/{plural}", hooks)
    config_file = tb.state_dir / "kueue-config.yaml"
    config_file.write_text(yaml.safe_dump(configuration(tb.ports, tb.address, cert_dir)))
    spawn(
        tb,
        "kueue",
        [
            str(kueue_dir / "bin" / "kueue"),
            f"--config={config_file}",
            "--feature-gates=VisibilityOnDemand=false",
            "--zap-log-level=info",
        ],
        env={"KUBECONFIG": str(tb.kubeconfig)},
    )

    def ready() -> bool:
        try:
            return requests.get(f"http://{tb.address}:{tb.ports['kueue-health']}/readyz", timeout=2).ok
        except requests.RequestException:
            return False

    wait("Kueue's /readyz", ready, 120, tb, "kueue")
    # The conversion webhook answers: a v1beta1 list goes through it.
    wait(
        "Kueue's conversion webhook", lambda: _lists(tb, "/apis/kueue.x-k8s.io/v1beta1/clusterqueues"), 60, tb, "kueue"
    )


def _established(tb, name: str) -> bool:
    crd = tb.request("GET", f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{name}")
    return any(
        c["type"] == "Established" and c["status"] == "True" for c in (crd.get("status") or {}).get("conditions") or []
    )


def _lists(tb, path: str) -> bool:
    try:
        tb.request("GET", path, timeout=5)
        return True
    except Exception:
        return False


def _apply(tb, collection: str, obj: dict[str, Any]) -> None:
    """Create, or replace what an earlier test bed left (same name)."""
    name = obj["metadata"]["name"]
    try:
        current = tb.request("GET", f"{collection}/{name}")
    except Exception:
        tb.request("POST", collection, obj)
        return
    obj = {**obj, "metadata": {**obj["metadata"], "resourceVersion": current["metadata"]["resourceVersion"]}}
    tb.request("PUT", f"{collection}/{name}", obj)


__all__ = ["start"]
