"""A pod's sandbox on the test bed: what a kubelet and its CNI plugin give a container,
for pods whose process the node agent really runs.

The bed has no container runtime, so a pod's process runs on the host, in namespaces the
agent makes for it with ``unshare``:

- its own **UTS namespace**, with the pod's hostname (``spec.hostname``, else the pod's
  name), as a kubelet sets it;
- its own **mount namespace**, in which the pod's ``/etc/resolv.conf`` and ``/etc/hosts``
  (written by the agent as the kubelet writes them: ``dnsPolicy: ClusterFirst`` gives the
  cluster DNS and the search path ``<namespace>.svc.<domain> svc.<domain> <domain>`` with
  ``ndots:5``; the hosts file maps the pod IP to its hostname, and to its FQDN when the pod
  has a ``subdomain``) are bind-mounted over the host's, and each volume is mounted at its
  ``mountPath``: a PersistentVolumeClaim's bound hostPath or local PersistentVolume, a
  ``hostPath``, or an ``emptyDir`` in the pod's folder;
- its own **network namespace**, which the agent makes on the bed's bridge
  (``tests/kube/bed/pod_network.py``) and enters with ``ip netns exec`` before this.

A kubelet runs the container as ``runAsUser``; the bed's processes run as the agent's
user (the bed has no user namespaces of its own), which the module's tests state.

Run as ``python -m tests.kube.bed.pod_sandbox SPEC.json`` inside ``ip netns exec NETNS
unshare --mount --uts --propagation private``: it sets the hostname, makes the mounts and execs the container's
command with its environment in its working directory.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from kubernetes_asyncio.client.exceptions import ApiException

#: What a kubelet puts first in every pod's hosts file (pkg/kubelet/kubelet_pods.go, managedHostsHeader).
HOSTS_HEADER = """# Kubernetes-managed hosts file.
127.0.0.1\tlocalhost
::1\tlocalhost ip6-localhost ip6-loopback
fe00::0\tip6-localnet
fe00::0\tip6-mcastprefix
fe00::1\tip6-allnodes
fe00::2\tip6-allrouters
"""


def hostname(pod: dict[str, Any]) -> str:
    """The pod's hostname as the kubelet sets it (``spec.hostname``, else its name, at most 63 characters)."""
    spec = pod.get("spec") or {}
    return (spec.get("hostname") or pod["metadata"]["name"])[:63].rstrip("-.")


def resolv_conf(namespace: str, cluster_dns: str, domain: str) -> str:
    """``dnsPolicy: ClusterFirst``'s resolv.conf (pkg/kubelet/network/dns/dns.go)."""
    return f"search {namespace}.svc.{domain} svc.{domain} {domain}\nnameserver {cluster_dns}\noptions ndots:5\n"


def hosts_file(pod: dict[str, Any], ip: str, domain: str) -> str:
    """The kubelet's managed hosts file for a pod at ``ip``."""
    spec = pod.get("spec") or {}
    name = hostname(pod)
    line = f"{ip}\t{name}"
    if spec.get("subdomain"):
        line = f"{ip}\t{name}.{spec['subdomain']}.{pod['metadata']['namespace']}.svc.{domain}\t{name}"
    return HOSTS_HEADER + line + "\n"


async def claim_paths(core: Any, pod: Any) -> dict[str, str]:
    """Each claim of the pod's and the host folder of the PersistentVolume bound to it
    (``hostPath`` or ``local``), as the kubelet's volume manager finds what to mount."""
    out = {}
    for volume in pod.spec.volumes or []:
        if volume.persistent_volume_claim is None:
            continue
        name = volume.persistent_volume_claim.claim_name
        try:
            claim = await core.read_namespaced_persistent_volume_claim(name, pod.metadata.namespace)
            if not claim.spec.volume_name:
                continue
            pv = await core.read_persistent_volume(claim.spec.volume_name)
        except ApiException as e:
            logging.getLogger("node-agent").warning(
                "pod %s/%s: claim %s: %s", pod.metadata.namespace, pod.metadata.name, name, e.reason
            )
            continue
        source = pv.spec.host_path or pv.spec.local
        if source is not None:
            out[name] = source.path
    return out


def volume_sources(pod: dict[str, Any], pod_dir: Path, claims: dict[str, str]) -> dict[str, str]:
    """Each volume's folder on the host: ``claims`` maps a claim name to its bound
    PersistentVolume's path. A volume of another kind (a ConfigMap, a Secret, a projected
    token) is left out: the bed's processes do not read them."""
    out = {}
    for volume in (pod.get("spec") or {}).get("volumes") or []:
        name = volume["name"]
        if "persistentVolumeClaim" in volume:
            path = claims.get(volume["persistentVolumeClaim"]["claimName"])
            if path:
                out[name] = path
        elif "hostPath" in volume:
            out[name] = volume["hostPath"]["path"]
        elif "emptyDir" in volume:
            folder = pod_dir / "volumes" / name
            folder.mkdir(parents=True, exist_ok=True)
            out[name] = str(folder)
    return out


def sandbox_spec(
    pod: dict[str, Any],
    container: dict[str, Any],
    ip: str,
    pod_dir: Path,
    image_env: Path,
    container_env: dict[str, str],
    argv: list[str],
    claims: dict[str, str],
    cluster_dns: str,
    domain: str,
) -> dict[str, Any]:
    """Everything :func:`enter` needs: the container's command and environment, with the
    image's Python environment first on ``PATH``; the pod's resolv.conf and hosts file are
    written into its folder."""
    ns = pod["metadata"]["namespace"]
    path = f"{image_env / 'bin'}:/usr/local/bin:/usr/bin:/bin"
    env = {"PATH": path, "LANG": "C.UTF-8", "HOSTNAME": hostname(pod), **container_env}
    (pod_dir / "resolv.conf").write_text(resolv_conf(ns, cluster_dns, domain))
    (pod_dir / "hosts").write_text(hosts_file(pod, ip, domain))
    sources = volume_sources(pod, pod_dir, claims)
    mounts = []
    for m in container.get("volumeMounts") or []:
        source = sources.get(m["name"])
        if source is None:
            continue
        if m.get("subPath"):
            source = str(Path(source) / m["subPath"])
            Path(source).mkdir(parents=True, exist_ok=True)  # the kubelet makes a missing subPath
        mounts.append({"source": source, "target": m["mountPath"], "readOnly": bool(m.get("readOnly"))})
    return {
        "hostname": hostname(pod),
        "binds": [
            {"source": str(pod_dir / "resolv.conf"), "target": "/etc/resolv.conf", "readOnly": True},
            {"source": str(pod_dir / "hosts"), "target": "/etc/hosts", "readOnly": True},
        ],
        "mounts": mounts,
        "workingDir": container.get("workingDir") or str(pod_dir),
        "argv": argv,
        "env": env,
    }


def field_value(pod: Any, item: Any) -> str | None:
    """An env var's ``fieldRef`` value, as the kubelet resolves it (pkg/fieldpath: the pod's
    name, namespace, uid, a label or annotation, its node, service account and IP)."""
    path = item.value_from.field_ref.field_path
    meta = pod.metadata
    for prefix, values in (("metadata.labels", meta.labels), ("metadata.annotations", meta.annotations)):
        if path.startswith(prefix + "['") and path.endswith("']"):
            return (values or {}).get(path[len(prefix) + 2 : -2], "")
    simple = {
        "metadata.name": meta.name,
        "metadata.namespace": meta.namespace,
        "metadata.uid": meta.uid,
        "spec.nodeName": pod.spec.node_name,
        "spec.serviceAccountName": pod.spec.service_account_name,
        "status.podIP": pod.status.pod_ip if pod.status else None,
    }
    if path not in simple:
        logging.getLogger("node-agent").warning(
            "pod %s/%s: fieldRef %s is not resolved by the bed's agent", meta.namespace, meta.name, path
        )
    return simple.get(path)


async def start(spec: dict[str, Any], pod_dir: Path, netns: str, log_name: str) -> asyncio.subprocess.Process:
    """Start the container of ``spec`` in the network namespace ``netns`` and new mount and
    UTS namespaces (its own session, so a stop signals all of it); output to ``log_name``."""
    spec_file = pod_dir / "sandbox.json"
    spec_file.write_text(json.dumps(spec, indent=1))
    with open(pod_dir / log_name, "ab") as out:
        return await asyncio.create_subprocess_exec(
            "ip", "netns", "exec", netns, "unshare", "--mount", "--uts", "--propagation", "private", "--",
            sys.executable, "-m", "tests.kube.bed.pod_sandbox", str(spec_file),
            env={"PATH": os.environ.get("PATH", ""), "PYTHONPATH": os.environ.get("PYTHONPATH", "")},
            cwd=pod_dir, stdout=out, stderr=asyncio.subprocess.STDOUT, stdin=asyncio.subprocess.DEVNULL,
            start_new_session=True,
        )  # fmt: skip


def _mount(*args: str) -> None:
    subprocess.run(["mount", *args], check=True)


def _make_mountpoint(target: Path) -> None:
    """A missing mount point is made as a container's root file system would have it: on a
    tmpfs over its nearest existing ancestor (never the host's ``/``), so nothing is
    created on the host."""
    if target.exists():
        return
    ancestor = target.parent
    while not ancestor.exists():
        ancestor = ancestor.parent
    if ancestor == Path("/"):
        raise SystemExit(f"pod sandbox: cannot mount at {target}: name a path under an existing folder")
    _mount("-t", "tmpfs", "tmpfs", str(ancestor))
    target.mkdir(parents=True, exist_ok=True)


def enter(spec: dict[str, Any]) -> None:
    """Inside the new namespaces: hostname, mounts, then exec the container's command."""
    subprocess.run(["hostname", spec["hostname"]], check=True)
    for bind in spec["binds"]:
        _mount("--bind", bind["source"], bind["target"])
    for m in spec["mounts"]:
        target = Path(m["target"])
        _make_mountpoint(target)
        _mount("--bind", m["source"], str(target))
        if m["readOnly"]:
            _mount("-o", "remount,bind,ro", str(target))
    os.chdir(spec["workingDir"])
    argv = spec["argv"]
    os.execvpe(argv[0], argv, spec["env"])


def main() -> None:
    enter(json.loads(Path(sys.argv[1]).read_text()))


if __name__ == "__main__":
    main()
