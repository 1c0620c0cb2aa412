"""The test bed's certificates and kubeconfigs.

One CA (openssl) signs the API server's serving certificate and every client
certificate: the admin, the controller manager, the scheduler and the node
agent; :func:`issue_cert` also signs Kueue's webhook certificate.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Any


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def issue_cert(pki: Path, name: str, subject: str, extensions: str) -> tuple[Path, Path]:
    """``<name>.crt`` and ``<name>.key`` in ``pki``, signed by its CA, with ``extensions`` (openssl syntax)."""
    (pki / f"{name}.ext").write_text(extensions + "\n")
    _openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{name}.key", "-out", f"{name}.csr",
             "-subj", subject, cwd=pki)  # fmt: skip
    _openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial",
             "-out", f"{name}.crt", "-days", "3650", "-extfile", f"{name}.ext", cwd=pki)  # fmt: skip
    return pki / f"{name}.crt", pki / f"{name}.key"


def make_pki(pki: Path, address: str) -> None:
    if (pki / "done").exists():
        return
    pki.mkdir(parents=True, exist_ok=True)
    os.chmod(pki, 0o700)
    _openssl(
        "req",
        "-x509",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-keyout",
        "ca.key",
        "-out",
        "ca.crt",
        "-days",
        "3650",
        "-subj",
        "/CN=gpulab-testbed-ca",
        cwd=pki,
    )
    _openssl("genrsa", "-out", "sa.key", "2048", cwd=pki)
    _openssl("rsa", "-in", "sa.key", "-pubout", "-out", "sa.pub", cwd=pki)
    sans = (
        f"IP:{address},IP:10.96.0.1,DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,"
        "DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local"
    )
    certs = {
        # name: (subject, extensions)
        "apiserver": ("/CN=kube-apiserver", f"subjectAltName={sans}\nextendedKeyUsage=serverAuth"),
        "admin": ("/O=system:masters/CN=gpulab-testbed-admin", "extendedKeyUsage=clientAuth"),
        "controller-manager": ("/CN=system:kube-controller-manager", "extendedKeyUsage=clientAuth"),
        "scheduler": ("/CN=system:kube-scheduler", "extendedKeyUsage=clientAuth"),
        # The node agent updates node status, leases and pod status for several
        # nodes, so it is an admin too (a kubelet per node would be system:node:<name>).
        "node-agent": ("/O=system:masters/CN=gpulab-testbed-node-agent", "extendedKeyUsage=clientAuth"),
    }
    for name, (subject, ext) in certs.items():
        issue_cert(pki, name, subject, ext)
    (pki / "done").write_text("ok\n")


def kubeconfig_for(pki: Path, server: str, user: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Config",
        "current-context": "gpulab-testbed",
        "clusters": [
            {"name": "gpulab-testbed", "cluster": {"server": server, "certificate-authority": str(pki / "ca.crt")}}
        ],
        "users": [
            {
                "name": user,
                "user": {"client-certificate": str(pki / f"{user}.crt"), "client-key": str(pki / f"{user}.key")},
            }
        ],
        "contexts": [{"name": "gpulab-testbed", "context": {"cluster": "gpulab-testbed", "user": user}}],
    }


def token_kubeconfig(server: str, ca_file: str | Path, token: str, namespace: str = "default") -> dict[str, Any]:
    """A kubeconfig that authenticates with a ServiceAccount token (what a hub pod has)."""
    return {
        "apiVersion": "v1",
        "kind": "Config",
        "current-context": "sa",
        "clusters": [{"name": "gpulab-testbed", "cluster": {"server": server, "certificate-authority": str(ca_file)}}],
        "users": [{"name": "sa", "user": {"token": token}}],
        "contexts": [{"name": "sa", "context": {"cluster": "gpulab-testbed", "user": "sa", "namespace": namespace}}],
    }
