"""CoreDNS in the test bed: the cluster's DNS, as kubeadm installs it, outside a pod.

A cluster's pods resolve ``<hostname>.<subdomain>.<namespace>.svc.cluster.local`` (the names
JobSet and Trainer give a gang's pods, through a headless Service) through CoreDNS's
``kubernetes`` plugin, which watches Services and EndpointSlices. Here CoreDNS v1.13.1
(``scripts/build-coredns.sh``, from Go modules) runs as a local process with:

- kubeadm's Corefile (``cmd/kubeadm/app/phases/addons/dns/manifests.go`` of Kubernetes
  v1.36.3, ``CoreDNSConfigMap``), less its fixed-port ``prometheus :9153``, with ``health``
  and ``ready`` on free loopback ports, and the plugin's ``endpoint`` and ``kubeconfig``
  (outside a pod the plugin has no in-cluster credentials);
- kubeadm's ``system:coredns`` ClusterRole, binding and ``kube-system/coredns``
  ServiceAccount (``CoreDNSClusterRole``, ``CoreDNSClusterRoleBinding``,
  ``CoreDNSServiceAccount``), whose token it uses;
- one address of its own on port 53 (a resolv.conf names no port): the bed's pod network's
  gateway (``tests/kube/bed/pod_network.py``), which every sandboxed pod reaches. The node
  agent writes it into every pod's resolv.conf, as a kubelet does with ``--cluster-dns``.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import requests

from tests.kube.bed.testbed import REPO, Testbed, TestbedError

CLUSTER_DOMAIN = "cluster.local"
NAMESPACE = "kube-system"
SERVICE_ACCOUNT = "coredns"
#: kubeadm's CoreDNSClusterRole and CoreDNSClusterRoleBinding.
CLUSTER_ROLE = {
    "apiVersion": "rbac.authorization.k8s.io/v1",
    "kind": "ClusterRole",
    "metadata": {"name": "system:coredns"},
    "rules": [
        {"apiGroups": [""], "resources": ["endpoints", "services", "pods", "namespaces"], "verbs": ["list", "watch"]},
        {"apiGroups": ["discovery.k8s.io"], "resources": ["endpointslices"], "verbs": ["list", "watch"]},
    ],
}
CLUSTER_ROLE_BINDING = {
    "apiVersion": "rbac.authorization.k8s.io/v1",
    "kind": "ClusterRoleBinding",
    "metadata": {"name": "system:coredns"},
    "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "system:coredns"},
    "subjects": [{"kind": "ServiceAccount", "name": SERVICE_ACCOUNT, "namespace": NAMESPACE}],
}


def build() -> Path:
    proc = subprocess.run([str(REPO / "scripts" / "build-coredns.sh")], stdout=subprocess.PIPE, text=True)
    if proc.returncode != 0:
        raise TestbedError("scripts/build-coredns.sh failed (see its output above): CoreDNS is built from Go modules")
    return Path(proc.stdout.strip().splitlines()[-1])


def corefile(tb: Testbed, address: str, kubeconfig: Path) -> str:
    """kubeadm's Corefile on this bed (see the module's docstring for what differs)."""
    return f""".:53 {{
    bind {address}
    errors
    health {tb.address}:{tb.ports["coredns-health"]} {{
       lameduck 5s
    }}
    ready {tb.address}:{tb.ports["coredns-ready"]}
    kubernetes {CLUSTER_DOMAIN} in-addr.arpa ip6.arpa {{
       endpoint {tb.server}
       kubeconfig {kubeconfig}
       pods insecure
       fallthrough in-addr.arpa ip6.arpa
       ttl 30
    }}
    forward . /etc/resolv.conf {{
       max_concurrent 1000
    }}
    cache 30 {{
       disable success {CLUSTER_DOMAIN}
       disable denial {CLUSTER_DOMAIN}
    }}
    loadbalance
}}
"""


def start(tb: Testbed, spawn, wait, free_port, address: str) -> None:
    """Install CoreDNS's RBAC into ``tb`` and start it on ``address``:53."""
    from tests.kube.bed.cluster import collection_path
    from tests.kube.bed.kueue import _apply
    from tests.kube.bed.training_operators import _write_kubeconfig

    coredns_dir = build()
    for name in ("coredns-health", "coredns-ready"):
        tb.ports[name] = free_port(tb.address)
    account = {
        "apiVersion": "v1",
        "kind": "ServiceAccount",
        "metadata": {"name": SERVICE_ACCOUNT, "namespace": NAMESPACE},
    }
    try:
        tb.request("POST", collection_path(account), account)
    except TestbedError:
        pass  # kept as it is
    for obj in (CLUSTER_ROLE, CLUSTER_ROLE_BINDING):
        _apply(tb, collection_path(obj), obj)
    work = tb.state_dir / "coredns"
    work.mkdir(exist_ok=True)
    kubeconfig = work / "coredns.kubeconfig"
    _write_kubeconfig(tb, kubeconfig, NAMESPACE, SERVICE_ACCOUNT)
    conf = work / "Corefile"
    conf.write_text(corefile(tb, address, kubeconfig))
    spawn(tb, "coredns", [str(coredns_dir / "bin" / "coredns"), "-conf", str(conf)])

    def ready() -> bool:
        try:
            return requests.get(f"http://{tb.address}:{tb.ports['coredns-ready']}/ready", timeout=2).ok
        except requests.RequestException:
            return False

    wait("CoreDNS's /ready (its kubernetes plugin synced)", ready, 90, tb, "coredns")
    tb.versions["coredns"] = (coredns_dir / ".built").read_text().strip()


__all__ = ["CLUSTER_DOMAIN", "start"]
