"""The test bed side of benchmarks/kube_scale.py: the chart with many teams, each hub's
ServiceAccount and kubeconfig, the API server's audit log counted by hub, the bed's own
memory and CPU, and the hub processes (benchmarks/kube_scale_hub.py).
"""

from __future__ import annotations

import collections
import itertools
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import yaml

from tests.kube.bed.chart import Z2JH_HUB_RULES, helm
from tests.kube.bed.pki import token_kubeconfig
from tests.kube.bed.testbed import Testbed, TestbedError
from tests.support.helm import CHART

HERE = Path(__file__).resolve()
#: Hub processes started so far (their files' names).
_RUNS = itertools.count()


class Bed:
    def __init__(self, tb: Testbed, teams: int, suffix: str, tmp: Path):
        self.tb = tb
        self.suffix = suffix
        self.tmp = tmp
        self.hub_ns = f"scale-hub-{suffix}"
        # The name the docs install under: its PriorityClasses are the ones gpulab names by
        # default. Where a release of that name already made them (the test suite's), another
        # release uses those (priorityClasses.create=false).
        try:
            tb.request("GET", "/apis/scheduling.k8s.io/v1/priorityclasses/gpulab-development")
            self.own_priority_classes = False
            self.release = f"gpulab-scale-{suffix}"
        except TestbedError:
            self.own_priority_classes = True
            self.release = "gpulab"
        self.teams = {f"t{i:03d}": f"scale-t{i:03d}-{suffix}" for i in range(teams)}

    def team_values(self, burst: dict[str, float]) -> list[dict[str, Any]]:
        return [
            {
                "name": t,
                "groups": ["bench"],
                "guarantee": burst.get(t, 40) / 2,
                "burst": burst.get(t, 40),
                "namespace": ns,
            }
            for t, ns in self.teams.items()
        ]

    def install(self, burst: dict[str, float], sharing: dict[str, Any], profiles: list[dict[str, Any]]) -> float:
        """The chart with every team; returns the seconds helm took."""
        tb = self.tb
        tb.request("POST", "/api/v1/namespaces", {"metadata": {"name": self.hub_ns}})
        # The NVIDIA GPU operator's namespace, where the chart puts the time-slicing config.
        try:
            tb.request("POST", "/api/v1/namespaces", {"metadata": {"name": "gpu-operator"}})
        except TestbedError as e:
            if "409" not in str(e):
                raise
        values = {
            "gpulab": {"sharing": sharing, "profiles": profiles, "teams": self.team_values(burst)},
            "rbac": {"clusterWidePodRead": True},
            "priorityClasses": {"create": self.own_priority_classes},
            # A cluster has one time-slicing ConfigMap (the suite's release may own it).
            "timeSlicing": {"create": not exists(tb, "/api/v1/namespaces/gpu-operator/configmaps/gpulab-time-slicing")},
        }
        path = self.tmp / "values.yaml"
        path.write_text(yaml.safe_dump(values))
        t0 = time.perf_counter()
        helm(tb, "install", self.release, str(CHART), "-n", self.hub_ns, "-f", str(path), "--timeout", "600s")
        took = time.perf_counter() - t0
        for ns in self.teams.values():
            wait(lambda ns=ns: quota_ready(tb, ns), f"the ResourceQuota status in {ns}", 300)
        return took

    def identity(self, name: str, cluster_wide: bool) -> Path:
        """A hub ServiceAccount bound as the chart binds its own, and its kubeconfig."""
        tb, ns = self.tb, self.hub_ns
        tb.request("POST", f"/api/v1/namespaces/{ns}/serviceaccounts", {"metadata": {"name": name}})
        rbac = "/apis/rbac.authorization.k8s.io/v1"
        tb.request("POST", f"{rbac}/namespaces/{ns}/roles", {"metadata": {"name": name}, "rules": Z2JH_HUB_RULES})
        subject = [{"kind": "ServiceAccount", "name": name, "namespace": ns}]
        tb.request(
            "POST",
            f"{rbac}/namespaces/{ns}/rolebindings",
            {"metadata": {"name": name}, "subjects": subject, "roleRef": role_ref("Role", name)},
        )
        for team_ns in self.teams.values():
            tb.request(
                "POST",
                f"{rbac}/namespaces/{team_ns}/rolebindings",
                {"metadata": {"name": name}, "subjects": subject, "roleRef": role_ref("Role", "gpulab-hub")},
            )
        if cluster_wide and name.startswith("hub-plain"):
            # KubeSpawner's enable_user_namespaces makes (or finds) the server's namespace
            # itself: it needs that right cluster-wide (z2jh documents the same).
            creator = f"bench-namespace-creator-{self.suffix}"
            tb.request(
                "POST",
                f"{rbac}/clusterroles",
                {
                    "metadata": {"name": creator},
                    "rules": [{"apiGroups": [""], "resources": ["namespaces"], "verbs": ["get", "create"]}],
                },
            )
            tb.request(
                "POST",
                f"{rbac}/clusterrolebindings",
                {
                    "metadata": {"name": f"{name}-ns-{self.suffix}"},
                    "subjects": subject,
                    "roleRef": role_ref("ClusterRole", creator),
                },
            )
        if cluster_wide:
            reader = next(
                r["metadata"]["name"]
                for r in tb.request("GET", f"{rbac}/clusterroles")["items"]
                if r["metadata"]["name"].endswith("-pod-reader") and self.release in r["metadata"]["name"]
            )
            tb.request(
                "POST",
                f"{rbac}/clusterrolebindings",
                {
                    "metadata": {"name": f"{name}-{self.suffix}"},
                    "subjects": subject,
                    "roleRef": role_ref("ClusterRole", reader),
                },
            )
        token = tb.request(
            "POST",
            f"/api/v1/namespaces/{ns}/serviceaccounts/{name}/token",
            {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": {"expirationSeconds": 7200}},
        )["status"]["token"]
        path = self.tmp / f"{name}.kubeconfig"
        path.write_text(yaml.safe_dump(token_kubeconfig(tb.server, tb.ca_file, token, ns)))
        return path

    def username(self, name: str) -> str:
        return f"system:serviceaccount:{self.hub_ns}:{name}"

    def remove(self) -> None:
        helm(self.tb, "uninstall", self.release, "-n", self.hub_ns, "--wait", "--timeout", "600s", check=False)
        for ns in [self.hub_ns, *self.teams.values()]:
            try:
                self.tb.request("DELETE", f"/api/v1/namespaces/{ns}")
            except TestbedError:
                pass
        rbac = "/apis/rbac.authorization.k8s.io/v1"
        for kind in ("clusterrolebindings", "clusterroles"):
            for obj in self.tb.request("GET", f"{rbac}/{kind}")["items"]:
                if obj["metadata"]["name"].endswith(f"-{self.suffix}"):
                    self.tb.request("DELETE", f"{rbac}/{kind}/{obj['metadata']['name']}")


def exists(tb: Testbed, path: str) -> bool:
    try:
        tb.request("GET", path)
        return True
    except TestbedError:
        return False


def role_ref(kind: str, name: str) -> dict[str, str]:
    return {"kind": kind, "name": name, "apiGroup": "rbac.authorization.k8s.io"}


def quota_ready(tb: Testbed, ns: str) -> bool:
    try:
        items = tb.request("GET", f"/api/v1/namespaces/{ns}/resourcequotas")["items"]
    except TestbedError:
        return False
    return bool(items) and all(q.get("status", {}).get("used") is not None for q in items)


def wait(check, what: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.5)
    raise TimeoutError(f"timed out after {timeout:.0f} s waiting for {what}")


# ---------------------------------------------------------------------------
# Counting: the API server's audit log, by ServiceAccount


def audit_counts(tb: Testbed, offset: int, usernames: list[str]) -> dict[str, collections.Counter]:
    """Per user: completed requests by verb, and ``watch-started`` (watches begun, logged at
    ResponseStarted: a watch still open at the end is counted too)."""
    out: dict[str, collections.Counter] = {u: collections.Counter() for u in usernames}
    for e in tb.audit_events(offset, stages=("ResponseStarted", "ResponseComplete")):
        user = e.get("user", {}).get("username")
        if user not in out:
            continue
        if e.get("stage") == "ResponseStarted" and e["verb"] == "watch":
            out[user]["watch-started"] += 1
        elif e.get("stage") == "ResponseComplete":
            out[user][e["verb"]] += 1
    return out


def bed_usage(tb: Testbed, seconds: float) -> dict[str, Any]:
    """The bed's own processes: resident memory now and CPU over ``seconds`` (of one core)."""
    clk = os.sysconf("SC_CLK_TCK")

    def cpu(pid: int) -> float:
        try:
            f = Path(f"/proc/{pid}/stat").read_text().rsplit(") ", 1)[1].split()
            return (int(f[11]) + int(f[12])) / clk
        except (OSError, IndexError):
            return 0.0

    def rss(pid: int) -> int:
        try:
            for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) // 1024
        except OSError:
            pass
        return 0

    before = {n: cpu(p) for n, p in tb.pids.items()}
    time.sleep(seconds)
    return {
        "rss_mib": {n: rss(p) for n, p in tb.pids.items()},
        "cpu_cores": {n: round((cpu(p) - before[n]) / seconds, 3) for n, p in tb.pids.items()},
        "seconds": seconds,
        "loadavg": os.getloadavg(),
    }


def run_hubs(bed: Bed, specs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each spec in a hub process of its own, all at once; their results in order."""
    procs = []
    for i, spec in enumerate(specs):
        # One name per hub of the run (a part runs once per spawner): every hub's log is kept.
        name = f"{spec['part']}-{spec['spawner']}-{spec['scope']}-{i}-{next(_RUNS)}"
        spec_path = bed.tmp / f"spec-{name}.json"
        out_path = bed.tmp / f"out-{name}.json"
        spec_path.write_text(json.dumps(spec))
        log_file = open(bed.tmp / f"hub-{name}.log", "w")
        procs.append(
            (
                subprocess.Popen(
                    [sys.executable, str(HERE.with_name("kube_scale_hub.py")), str(spec_path), str(out_path)],
                    stdout=log_file,
                    stderr=subprocess.STDOUT,
                ),
                out_path,
                log_file,
            )
        )
    results = []
    for proc, out_path, log_file in procs:
        rc = proc.wait()
        log_file.close()
        if rc:
            tail = Path(log_file.name).read_text()[-3000:]
            raise RuntimeError(f"hub process {out_path.name} failed ({rc}):\n{tail}")
        results.append(json.loads(out_path.read_text()))
    return results
