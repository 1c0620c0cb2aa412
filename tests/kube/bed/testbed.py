"""A real Kubernetes control plane on loopback for gpulab's tests.

(Over 600 lines on purpose: the bring-up is one ordered sequence, each component waiting
for the one before, and ``scripts/kube-testbed`` runs this one module.)

``scripts/kube-testbed up|down|status`` runs this module. ``up`` starts etcd,
kube-apiserver, kube-controller-manager and kube-scheduler (one pinned
release, built from Go modules by ``scripts/build-kube.sh``) plus the node
agent (``tests/kube/bed/node_agent.py``) that registers fake GPU nodes and plays
their kubelet, CoreDNS (``coredns.py``), JobSet and Kubeflow Trainer
(``training_operators.py``) and Kueue (``kueue.py``), then prints
``KUBECONFIG=<path>`` as its last line. It reuses
a running test bed, and it refuses any address outside 127.0.0.0/8.

The API server runs as a production one would: TLS with a CA of its own,
client-certificate and ServiceAccount-token authentication, RBAC, and the
admission plugins NamespaceLifecycle, ServiceAccount, LimitRanger,
ResourceQuota and Priority besides the defaults. The controller manager runs
every default controller (namespaces, service accounts and their tokens,
quotas, jobs, garbage collection, node lifecycle, disruption), each with its
own ServiceAccount credentials. What the test bed lacks is a container
runtime: the node agent starts a plain process for a pod whose command is
``jupyterhub-singleuser``, runs the containers of the bed's torch image in sandboxes of
their own (``pod_sandbox.py``, on the pod network of ``pod_network.py``), and otherwise
leaves pods Running until a test ends them (``finish_pod``) or evicts them through the
Eviction API.

State (certificates, etcd data, logs, the kubeconfig) lives outside the work
tree, under ``$GPULAB_KUBE_TESTBED_DIR`` (default ``~/.cache/gpulab/testbed``).
"""

from __future__ import annotations

import argparse
import hashlib
import ipaddress
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.kube.bed.pki import kubeconfig_for, make_pki
from tests.kube.bed.scale import heartbeat_plan, node_count, scaled_nodes
from tests.support import REPO
from tests.support.ports import free_port

CACHE = Path(
    os.environ.get("GPULAB_CACHE_DIR") or Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "gpulab"
)
STATE_DIR = Path(os.environ.get("GPULAB_KUBE_TESTBED_DIR") or CACHE / "testbed")
ADDRESS = os.environ.get("GPULAB_KUBE_TESTBED_ADDRESS", "127.0.0.1")
NODES_FILE = Path(__file__).with_name("nodes.yaml")
COMPONENTS = (
    "etcd",
    "kube-apiserver",
    "kube-controller-manager",
    "kube-scheduler",
    "user-scheduler",
    "node-agent",
    "coredns",
    "jobset",
    "trainer",
    "kueue",
)
SERVICE_ACCOUNT_ISSUER = "https://kubernetes.default.svc.cluster.local"
#: The components :meth:`Testbed.restart` restarts in place (their state is in etcd or on disk).
RESTARTABLE = ("etcd", "kube-apiserver")


class TestbedError(RuntimeError):
    """The test bed could not be started; the message says why and what to do."""

    __test__ = False  # not a pytest test class


def log(message: str) -> None:
    print(f"[kube-testbed] {message}", file=sys.stderr, flush=True)


def check_loopback(address: str) -> None:
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        raise TestbedError(
            f"refusing address {address!r}: the test bed listens on a loopback IP only (127.0.0.0/8)"
        ) from None
    if not ip.is_loopback or ip.version != 4:
        raise TestbedError(
            f"refusing address {address}: the test bed listens on 127.0.0.0/8 only, "
            f"never on a network other machines can reach"
        )


def pod_ip_prefix(state_dir: Path) -> str:
    """The loopback range a test bed's pods get their IPs from: one per state folder,
    so two test beds on one machine never give two servers the same address."""
    n = int(hashlib.sha256(str(state_dir.resolve()).encode()).hexdigest()[:4], 16)
    return f"127.{100 + n % 150}."


# ---------------------------------------------------------------------------
# State


@dataclass
class Testbed:
    """A running (or recorded) test bed: where it is and how to reach it."""

    __test__ = False  # not a pytest test class

    state_dir: Path
    address: str
    ports: dict[str, int]
    pids: dict[str, int]
    versions: dict[str, str]

    @property
    def server(self) -> str:
        return f"https://{self.address}:{self.ports['apiserver']}"

    @property
    def pki(self) -> Path:
        return self.state_dir / "pki"

    @property
    def kubeconfig(self) -> Path:
        return self.state_dir / "admin.kubeconfig"

    @property
    def ca_file(self) -> Path:
        return self.pki / "ca.crt"

    @property
    def audit_log(self) -> Path:
        return self.state_dir / "logs" / "audit.log"

    def audit_offset(self) -> int:
        """Where the audit log ends now (read the requests after it with ``audit_events``)."""
        try:
            return self.audit_log.stat().st_size
        except OSError:
            return 0

    def audit_events(
        self, offset: int, username: str | None = None, stages: tuple[str, ...] = ("ResponseComplete",)
    ) -> list[dict[str, Any]]:
        """Requests logged after ``offset`` at ``stages`` (completed ones by default; add
        ``ResponseStarted`` to see watches as they begin), optionally only ``username``'s."""
        out = []
        try:
            with open(self.audit_log, "rb") as f:
                f.seek(offset)
                data = f.read()
        except OSError:
            return out
        for line in data.splitlines():
            try:
                event = json.loads(line)
            except ValueError:
                continue
            if event.get("stage") not in stages:
                continue
            if username is None or event.get("user", {}).get("username") == username:
                out.append(event)
        return out

    @property
    def pod_resources_dir(self) -> Path:
        """Each node's PodResources List answer (``<node>.json``), written by the node agent."""
        return self.state_dir / "pod-resources"

    def pod_resources(self, node: str) -> list[dict[str, Any]]:
        """The pods holding devices on ``node``, in the kubelet PodResources API's shape."""
        try:
            return json.loads((self.pod_resources_dir / f"{node}.json").read_text())["podResources"]
        except (OSError, ValueError):
            return []

    def log_file(self, component: str) -> Path:
        return self.state_dir / "logs" / f"{component}.log"

    def save(self) -> None:
        (self.state_dir / "state.json").write_text(
            json.dumps(
                {
                    "address": self.address,
                    "ports": self.ports,
                    "pids": self.pids,
                    "versions": self.versions,
                },
                indent=2,
            )
        )

    @classmethod
    def load(cls, state_dir: Path = STATE_DIR) -> Testbed | None:
        try:
            data = json.loads((state_dir / "state.json").read_text())
        except (OSError, ValueError):
            return None
        return cls(state_dir, data["address"], data["ports"], data["pids"], data.get("versions", {}))

    # -- HTTP as the admin ------------------------------------------------------
    def request(
        self, method: str, path: str, body: Any = None, *, timeout: float = 10, content_type: str = "application/json"
    ) -> Any:
        """One API request as the test bed's admin; returns the decoded JSON (or text)."""
        import requests

        r = requests.request(
            method,
            self.server + path,
            timeout=timeout,
            cert=(str(self.pki / "admin.crt"), str(self.pki / "admin.key")),
            verify=str(self.ca_file),
            data=None if body is None else (body if isinstance(body, str) else json.dumps(body)),
            headers={"Content-Type": content_type},
        )
        if r.status_code >= 400:
            raise TestbedError(f"{method} {path} -> {r.status_code}: {r.text[:500]}")
        return r.json() if r.headers.get("Content-Type", "").startswith("application/json") else r.text

    def ready(self) -> bool:
        try:
            return self.request("GET", "/readyz", timeout=3) == "ok"
        except Exception:
            return False

    def alive(self) -> dict[str, bool]:
        return {name: _pid_alive(pid) for name, pid in self.pids.items()}

    def restart(self, component: str, timeout: float = 120) -> float:
        """Restart ``etcd`` or ``kube-apiserver`` in place, as an operator's rolling restart
        does: SIGTERM (the API server drains its requests and closes its watches; etcd
        flushes), then the same binary with the same arguments (ports, data dir,
        certificates), and wait until the API server is ready again (``/readyz`` checks etcd
        too). Returns the seconds from the signal until ready."""
        if component not in RESTARTABLE:
            raise TestbedError(f"restart {component!r}: only {', '.join(RESTARTABLE)} restart in place")
        pid = self.pids[component]
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().rstrip(b"\0").split(b"\0")
        except OSError:
            raise TestbedError(f"{component} (pid {pid}) is not running: start the bed afresh") from None
        t0 = time.monotonic()
        _stop_group(pid)
        _spawn(self, component, [a.decode() for a in argv])
        _wait(f"kube-apiserver /readyz after restarting {component}", self.ready, timeout, self, component)
        return time.monotonic() - t0


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except OSError:
        return False
    try:  # a zombie is not alive
        return Path(f"/proc/{pid}/stat").read_text().split(") ", 1)[1][0] != "Z"
    except OSError:
        return False


# ---------------------------------------------------------------------------
# Up / down


def build() -> Path:
    """The bin folder with etcd and the Kubernetes binaries (built once, then reused)."""
    proc = subprocess.run([str(REPO / "scripts" / "build-kube.sh")], stdout=subprocess.PIPE, text=True)
    if proc.returncode != 0:
        raise TestbedError(
            "scripts/build-kube.sh failed (see its output above): the test bed's binaries "
            "are built from Go modules and need Go >= 1.26 and the Go module proxy"
        )
    return Path(proc.stdout.strip().splitlines()[-1])


#: The image whose containers the node agent runs for real: the Python of scripts/build-torch-env.sh.
TORCH_IMAGE_REPOSITORY = "gpulab-testbed/torch"


def build_torch_env() -> Path:
    """The training pods' Python environment (torch with gloo), installed once, then reused."""
    proc = subprocess.run([str(REPO / "scripts" / "build-torch-env.sh")], stdout=subprocess.PIPE, text=True)
    if proc.returncode != 0:
        raise TestbedError("scripts/build-torch-env.sh failed (see its output above): it installs torch from PyPI")
    return Path(proc.stdout.strip().splitlines()[-1])


def torch_image(torch_env: Path) -> str:
    """The image name the bed's nodes "have" for ``torch_env`` (its torch version as the tag)."""
    return f"{TORCH_IMAGE_REPOSITORY}:{torch_env.name}"


def _spawn(tb: Testbed, name: str, argv: list[str], env: dict[str, str] | None = None) -> None:
    logf = tb.log_file(name)
    logf.parent.mkdir(parents=True, exist_ok=True)
    with open(logf, "ab") as out:
        proc = subprocess.Popen(
            argv,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            env={**os.environ, **(env or {})},
            cwd=tb.state_dir,
        )
    tb.pids[name] = proc.pid
    tb.save()


def _wait(what: str, check, timeout: float, tb: Testbed, component: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return
        pid = tb.pids.get(component)
        if pid and not _pid_alive(pid):
            raise TestbedError(
                f"{component} exited while waiting for {what}; its log "
                f"{tb.log_file(component)} ends with:\n{_tail(tb.log_file(component))}"
            )
        time.sleep(0.3)
    raise TestbedError(
        f"timed out after {timeout:.0f} s waiting for {what}; "
        f"see {tb.log_file(component)}:\n{_tail(tb.log_file(component))}"
    )


def _tail(path: Path, lines: int = 15) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def _write_yaml(path: Path, data: Any) -> None:
    import yaml

    path.write_text(yaml.safe_dump(data, sort_keys=False))
    os.chmod(path, 0o600)


def up(address: str = ADDRESS, state_dir: Path = STATE_DIR) -> Testbed:
    """Start the test bed, or return the one already running.

    A start that fails stops what it started (the logs stay for reading).
    """
    try:
        return _up(address, state_dir)
    except BaseException:
        down(state_dir)
        raise


def _up(address: str, state_dir: Path) -> Testbed:
    check_loopback(address)
    existing = Testbed.load(state_dir)
    if (
        existing
        and existing.address == address
        and all(existing.alive().values())
        and set(existing.pids) == set(COMPONENTS)
        and existing.ready()
        and existing.versions.get("nodes") == _nodes_digest()
        and existing.versions.get("user-scheduler") == _digest(user_scheduler_config(state_dir))
    ):
        return existing
    if existing:
        log("a previous test bed is not (fully) running: stopping what is left of it")
        down(state_dir)
    bin_dir = build()
    torch_env = build_torch_env()
    state_dir.mkdir(parents=True, exist_ok=True)
    os.chmod(state_dir, 0o700)
    versions = dict(line.split("=", 1) for line in (bin_dir / "VERSIONS").read_text().split())
    # A running test bed whose node list changed since it started is started afresh.
    versions["nodes"] = _nodes_digest()
    versions["user-scheduler"] = _digest(user_scheduler_config(state_dir))
    ports = {
        name: free_port(address)
        for name in ("etcd", "etcd-peer", "apiserver", "controller-manager", "scheduler", "user-scheduler")
    }
    tb = Testbed(state_dir, address, ports, {}, versions)
    make_pki(tb.pki, address)
    pki = tb.pki
    for user in ("admin", "controller-manager", "scheduler", "node-agent"):
        _write_yaml(state_dir / f"{user}.kubeconfig", kubeconfig_for(pki, tb.server, user))

    # Audit every request a ServiceAccount makes (the hub's, the controllers'):
    # tests and benchmarks count a spawner's requests per user from this log.
    audit_policy = state_dir / "audit-policy.yaml"
    _write_yaml(
        audit_policy,
        {
            "apiVersion": "audit.k8s.io/v1",
            "kind": "Policy",
            "omitStages": ["RequestReceived"],
            "rules": [
                # The bodies of pod creates: tests assert on exactly what a spawner sent.
                {
                    "level": "Request",
                    "userGroups": ["system:serviceaccounts"],
                    "verbs": ["create"],
                    "resources": [{"group": "", "resources": ["pods"]}],
                },
                {"level": "Metadata", "userGroups": ["system:serviceaccounts"]},
                {"level": "None"},
            ],
        },
    )
    tb.audit_log.unlink(missing_ok=True)
    etcd_data = state_dir / "etcd"
    shutil.rmtree(etcd_data, ignore_errors=True)
    etcd_url = f"http://{address}:{ports['etcd']}"
    peer_url = f"http://{address}:{ports['etcd-peer']}"
    _spawn(
        tb,
        "etcd",
        [
            str(bin_dir / "etcd"),
            "--name",
            "testbed",
            "--data-dir",
            str(etcd_data),
            "--listen-client-urls",
            etcd_url,
            "--advertise-client-urls",
            etcd_url,
            "--listen-peer-urls",
            peer_url,
            "--initial-advertise-peer-urls",
            peer_url,
            "--initial-cluster",
            f"testbed={peer_url}",
            "--log-level",
            "warn",
            # Test data: losing it on a crash is fine, and fsync dominates on shared disks.
            "--unsafe-no-fsync",
        ],
    )
    _spawn(
        tb,
        "kube-apiserver",
        [
            str(bin_dir / "kube-apiserver"),
            f"--etcd-servers={etcd_url}",
            f"--bind-address={address}",
            f"--advertise-address={address}",
            f"--secure-port={ports['apiserver']}",
            # The `kubernetes` Service's endpoints would be this loopback address, which
            # Endpoints validation refuses; nothing in the tests dials the Service.
            "--endpoint-reconciler-type=none",
            f"--tls-cert-file={pki / 'apiserver.crt'}",
            f"--tls-private-key-file={pki / 'apiserver.key'}",
            f"--client-ca-file={pki / 'ca.crt'}",
            f"--service-account-issuer={SERVICE_ACCOUNT_ISSUER}",
            f"--service-account-key-file={pki / 'sa.pub'}",
            f"--service-account-signing-key-file={pki / 'sa.key'}",
            "--service-cluster-ip-range=10.96.0.0/16",
            "--authorization-mode=Node,RBAC",
            "--enable-admission-plugins=NamespaceLifecycle,ServiceAccount,LimitRanger,ResourceQuota,"
            "Priority,DefaultTolerationSeconds,NodeRestriction",
            "--allow-privileged=true",
            "--profiling=false",
            "--max-requests-inflight=800",
            "--max-mutating-requests-inflight=400",
            f"--audit-policy-file={audit_policy}",
            f"--audit-log-path={tb.audit_log}",
            "--audit-log-maxsize=200",
            "--audit-log-maxbackup=1",
            "--audit-log-mode=blocking",
        ],
    )
    _wait("kube-apiserver /readyz", tb.ready, 120, tb, "kube-apiserver")
    # At scale the node agent renews Leases less often: the controller waits as much longer.
    plan = heartbeat_plan(max(node_count(), 1))
    grace = [f"--node-monitor-grace-period={plan.grace_seconds}s"] if plan.grace_seconds else []
    _spawn(
        tb,
        "kube-controller-manager",
        [
            str(bin_dir / "kube-controller-manager"),
            f"--kubeconfig={state_dir / 'controller-manager.kubeconfig'}",
            f"--authentication-kubeconfig={state_dir / 'controller-manager.kubeconfig'}",
            f"--authorization-kubeconfig={state_dir / 'controller-manager.kubeconfig'}",
            f"--bind-address={address}",
            f"--secure-port={ports['controller-manager']}",
            f"--service-account-private-key-file={pki / 'sa.key'}",
            f"--root-ca-file={pki / 'ca.crt'}",
            f"--cluster-signing-cert-file={pki / 'ca.crt'}",
            f"--cluster-signing-key-file={pki / 'ca.key'}",
            "--use-service-account-credentials=true",
            "--leader-elect=false",
            "--kube-api-qps=200",
            "--kube-api-burst=400",
            # Quota usage is what admission checks against: recompute it promptly.
            "--resource-quota-sync-period=15s",
            "--concurrent-job-syncs=10",
            *grace,
        ],
    )
    _spawn(
        tb,
        "kube-scheduler",
        [
            str(bin_dir / "kube-scheduler"),
            f"--kubeconfig={state_dir / 'scheduler.kubeconfig'}",
            f"--authentication-kubeconfig={state_dir / 'scheduler.kubeconfig'}",
            f"--authorization-kubeconfig={state_dir / 'scheduler.kubeconfig'}",
            f"--bind-address={address}",
            f"--secure-port={ports['scheduler']}",
            "--leader-elect=false",
            "--kube-api-qps=200",
            "--kube-api-burst=400",
        ],
    )
    # z2jh's user-scheduler beside the default one: the same kube-scheduler binary with
    # the KubeSchedulerConfiguration z2jh renders from its values and gpulab's overlay.
    user_scheduler = state_dir / "user-scheduler.yaml"
    _write_yaml(user_scheduler, user_scheduler_config(state_dir))
    _spawn(
        tb,
        "user-scheduler",
        [
            str(bin_dir / "kube-scheduler"),
            f"--config={user_scheduler}",
            f"--authentication-kubeconfig={state_dir / 'scheduler.kubeconfig'}",
            f"--authorization-kubeconfig={state_dir / 'scheduler.kubeconfig'}",
            "--authentication-skip-lookup=true",
            f"--bind-address={address}",
            f"--secure-port={ports['user-scheduler']}",
        ],
    )
    from tests.kube.bed import coredns, pod_network

    subnet, bridge = pod_network.bed_subnet(state_dir)
    _spawn(
        tb,
        "node-agent",
        [
            sys.executable,
            "-m",
            "tests.kube.bed.node_agent",
            "--kubeconfig",
            str(state_dir / "node-agent.kubeconfig"),
            "--nodes",
            str(NODES_FILE),
            "--work-dir",
            str(state_dir / "pods"),
            "--pod-ip-prefix",
            pod_ip_prefix(state_dir),
            "--pod-resources-dir",
            str(tb.pod_resources_dir),
            "--image-env",
            f"{torch_image(torch_env)}={torch_env}",
            "--cluster-dns",
            pod_network.gateway(subnet),
            "--pod-network",
            subnet,
            "--pod-bridge",
            bridge,
            "--cluster-domain",
            coredns.CLUSTER_DOMAIN,
            "--nodes-total",
            str(node_count()),
        ],
        env={
            "PYTHONPATH": str(REPO),
            # The agent runs pods' jupyterhub-singleuser from this virtualenv.
            "PATH": f"{Path(sys.executable).parent}:{os.environ.get('PATH', '')}",
        },
    )
    _wait(
        "the default ServiceAccount (controller manager up)",
        lambda: _exists(tb, "/api/v1/namespaces/default/serviceaccounts/default"),
        120,
        tb,
        "kube-controller-manager",
    )
    _wait(
        "every test bed node Ready (node agent up)",
        lambda: _nodes_ready(tb),
        120 + node_count() / 10,
        tb,
        "node-agent",
    )
    _wait("the scheduler's /healthz", lambda: _healthz(tb, ports["scheduler"]), 60, tb, "kube-scheduler")
    _wait("the user-scheduler's /healthz", lambda: _healthz(tb, ports["user-scheduler"]), 60, tb, "user-scheduler")
    from tests.kube.bed import kueue, training_operators

    coredns.start(tb, _spawn, _wait, free_port, pod_network.gateway(subnet))
    training_operators.start(tb, _spawn, _wait, free_port)
    kueue.start(tb, _spawn, _wait, free_port)
    tb.versions["kueue"] = kueue.build().name
    tb.save()
    return tb


def user_scheduler_config(state_dir: Path) -> dict[str, Any]:
    """z2jh's user-scheduler configuration (tests/kube/bed/z2jh_hub_config.py) for release
    ``jhub`` with gpulab's overlay, on this test bed: its scheduler credentials, and no
    leader election (one replica here; z2jh runs two that elect a leader)."""
    from tests.kube.bed import z2jh_hub_config as z2jh

    config = z2jh.user_scheduler_config(z2jh.RELEASE, "default", z2jh.release_values())
    if config is None:
        raise TestbedError("helm/values-jupyterhub.yaml turns z2jh's user-scheduler off; the test bed runs it")
    config["leaderElection"] = {"leaderElect": False}
    config["clientConnection"] = {"kubeconfig": str(state_dir / "scheduler.kubeconfig"), "qps": 200, "burst": 400}
    return config


def _digest(data: Any) -> str:
    return "sha256:" + hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()[:16]


def _nodes_digest() -> str:
    """The nodes, their number and the code that plays their kubelet: a running bed whose
    any changed is restarted."""
    h = hashlib.sha256(NODES_FILE.read_bytes())
    h.update(str(node_count()).encode())
    for name in ("node_agent.py", "kubelet_devices.py", "pod_sandbox.py", "pod_network.py"):
        h.update(NODES_FILE.with_name(name).read_bytes())
    return "sha256:" + h.hexdigest()[:16]


def _exists(tb: Testbed, path: str) -> bool:
    try:
        tb.request("GET", path, timeout=3)
        return True
    except Exception:
        return False


def _nodes_ready(tb: Testbed) -> bool:
    import yaml

    want = {n["name"] for n in scaled_nodes(yaml.safe_load(NODES_FILE.read_text())["nodes"], node_count())}
    try:
        nodes = tb.request("GET", "/api/v1/nodes", timeout=3)["items"]
    except Exception:
        return False
    ready = {
        n["metadata"]["name"]
        for n in nodes
        if any(c["type"] == "Ready" and c["status"] == "True" for c in n.get("status", {}).get("conditions", []))
    }
    return want <= ready


def _healthz(tb: Testbed, port: int) -> bool:
    import requests
    import urllib3

    # The scheduler serves /healthz with a certificate it made itself at start.
    urllib3.disable_warnings(urllib3.exceptions.InsecureRequestWarning)
    try:
        return requests.get(f"https://{tb.address}:{port}/healthz", verify=False, timeout=2).text == "ok"
    except Exception:
        return False


def _stop_group(pid: int, grace: float = 15) -> None:
    """SIGTERM the process group ``pid`` leads, SIGKILL it after ``grace`` seconds."""
    if not _pid_alive(pid):
        return
    try:
        os.killpg(pid, signal.SIGTERM)
    except OSError:
        pass
    deadline = time.monotonic() + grace
    while _pid_alive(pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    if _pid_alive(pid):
        try:
            os.killpg(pid, signal.SIGKILL)
        except OSError:
            pass


def down(state_dir: Path = STATE_DIR) -> None:
    from tests.kube.bed.kai_scheduler import stop_processes as stop_kai

    stop_kai(state_dir)  # KAI's components, when a test started them
    tb = Testbed.load(state_dir)
    if tb is None:
        return
    # Stop the node agent first so that it kills the processes it started.
    for name in reversed(COMPONENTS):
        pid = tb.pids.get(name)
        if pid:
            _stop_group(pid)
    from tests.kube.bed import pod_network

    pod_network.remove(pod_network.bed_subnet(state_dir)[1])
    (state_dir / "state.json").unlink(missing_ok=True)
    shutil.rmtree(state_dir / "etcd", ignore_errors=True)
    (state_dir / "logs" / "audit.log").unlink(missing_ok=True)
    shutil.rmtree(state_dir / "pods", ignore_errors=True)
    shutil.rmtree(state_dir / "pod-resources", ignore_errors=True)


def status(state_dir: Path = STATE_DIR) -> int:
    tb = Testbed.load(state_dir)
    if tb is None:
        print("not running")
        return 1
    alive = tb.alive()
    for name in COMPONENTS:
        print(
            f"{name:26} {'running' if alive.get(name) else 'stopped'}  pid {tb.pids.get(name, '-')}  "
            f"log {tb.log_file(name)}"
        )
    ready = tb.ready()
    print(f"{'api server':26} {tb.server}  {'ready' if ready else 'NOT ready'}")
    for k, v in tb.versions.items():
        print(f"{k:26} {v}")
    if ready:
        print(f"{'/version':26} {tb.request('GET', '/version')['gitVersion']}")
    print(f"KUBECONFIG={tb.kubeconfig}")
    return 0 if ready and all(alive.values()) else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="scripts/kube-testbed", description=__doc__.split("\n\n")[0])
    parser.add_argument("command", choices=("up", "down", "status"))
    args = parser.parse_args(argv)
    try:
        if args.command == "up":
            tb = up()
            print(f"KUBECONFIG={tb.kubeconfig}")
            return 0
        if args.command == "down":
            down()
            return 0
        return status()
    except TestbedError as e:
        log(f"error: {e}")
        return 1


if __name__ == "__main__":
    sys.exit(main())
