"""Scale on the real test bed: GPUKubeSpawner beside plain KubeSpawner, in one run.

Run on the test bed at size (``GPULAB_KUBE_TESTBED_NODES=1000 scripts/kube-testbed up``:
1,000 fake GPU nodes, whole / time-sliced / MIG / HAMi / KAI / CPU). The gpulab
chart is installed with ``--teams`` team namespaces (its ResourceQuotas, Roles and
PriorityClasses; ``rbac.clusterWidePodRead`` on). Each hub is a process of its own
with a ServiceAccount of its own, bound by the chart's team Roles (and, for the
cluster-wide variants, its pod-reader ClusterRole), so the **API server's audit
log** attributes every request to one hub. Parts:

* ``watches``: four hubs side by side for ``--window`` seconds: gpulab and plain
  KubeSpawner, each with per-namespace watches (one spawn+stop per team, so plain
  KubeSpawner, whose profiles set the team's namespace, watches there too) and with
  one cluster-wide watch (gpulab: ``ledger_namespaces = ["*"]``; KubeSpawner:
  ``enable_user_namespaces``). Counted: list requests, and watch requests started.
* ``restart``: ``--pods`` running labelled server pods made through the API (the
  shapes gpulab makes: whole, time-sliced, CPU; the chart's priority classes), then a
  fresh hub process that loads every server's saved state and polls them all at once
  (as JupyterHub does at start), then spawns one server: the time until the ledger
  is exact (every team's held GPUs equal what the pods hold) and until that first
  spawn is admitted and Running, and the requests it took. Plain KubeSpawner does the
  same (no ledger).
* ``storm``: ``--storm`` users spawning at once into 10 small teams (quotas below
  demand): POST (``spawner.start()``) to Running p50/p99, refusals and their words,
  and pods over any team's ResourceQuota afterwards (must be 0). Pods run ``sleep``
  rather than a server: hundreds of real servers do not fit in 2 cores, so "reachable
  server" is not measured here (benchmarks/spawn_path.py and the hub tests do that).
* ``page``: the spawn form (``profile_list`` + render) of a user in 3 of 1,000
  teams, before the pods are made (10 pods) and with ``--pods`` running.

    GPULAB_KUBE_TESTBED_NODES=1000 scripts/kube-testbed up
    .venv/bin/python benchmarks/kube_scale.py             # writes benchmarks/results/kube_scale.json
    .venv/bin/python benchmarks/kube_scale.py --smoke     # small and short (the tests)
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import yaml  # noqa: E402
from _common import table, write_result  # noqa: E402

from tests.kube.bed.chart import Z2JH_HUB_RULES, helm  # noqa: E402
from tests.kube.bed.pki import token_kubeconfig  # noqa: E402
from tests.kube.bed.testbed import Testbed, TestbedError, up  # noqa: E402
from tests.support.helm import CHART  # noqa: E402

HERE = Path(__file__).resolve()
#: gpulab's profiles for the bed's node kinds (the chart's sharing: time-slicing, 4 replicas).
PROFILES = [
    {"slug": "cpu", "display_name": "CPU only", "gpus": 0},
    {"slug": "h100-half", "display_name": "0.5 x H100", "gpus": 0.5, "gpu_model": "H100-80GB"},
    {"slug": "h100-1", "display_name": "1 x H100", "gpus": 1, "gpu_model": "H100-80GB", "sharing": "whole"},
]
SHARING = {
    "backend": "timeslice",
    "timeslice": {"resource": "nvidia.com/gpu.shared", "replicas": 4, "fail_requests_greater_than_one": False},
}
TOLERATIONS = [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
#: The hubs of the watches part: (spawner, scope).
HUBS = (("gpulab", "ns"), ("plain", "ns"), ("gpulab", "all"), ("plain", "all"))


def sa_name(spawner: str, scope: str) -> str:
    return f"hub-{spawner}-{scope}"


# ---------------------------------------------------------------------------
# Set-up: the chart with many teams, the hubs' identities, the pods


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

    def install(self, burst: dict[str, float]) -> float:
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
            "gpulab": {"sharing": SHARING, "profiles": PROFILES, "teams": self.team_values(burst)},
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
    with open(tb.audit_log, "rb") as f:
        f.seek(offset)
        data = f.read()
    for line in data.splitlines():
        try:
            e = json.loads(line)
        except ValueError:
            continue
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
        spec_path = bed.tmp / f"spec-{spec['part']}-{i}.json"
        out_path = bed.tmp / f"out-{spec['part']}-{i}.json"
        spec_path.write_text(json.dumps(spec))
        log_file = open(bed.tmp / f"hub-{spec['part']}-{i}.log", "w")
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


def milli(profile: str) -> int:
    return int(float(next(p["gpus"] for p in PROFILES if p["slug"] == profile)) * 1000)  # type: ignore[arg-type]


# ---------------------------------------------------------------------------


def run(args: argparse.Namespace) -> dict[str, Any]:
    def checkpoint(result: dict[str, Any]) -> None:
        """What is measured so far, in case a later part fails."""
        params = {**vars(args), "parts": sorted(args.parts)}
        write_result("kube_scale.partial", {"smoke": args.smoke, "parameters": params, **result}, args.out)

    tb = up()
    nodes = len(tb.request("GET", "/api/v1/nodes")["items"])
    suffix = os.urandom(3).hex()
    tmp = Path(tempfile.mkdtemp(prefix="gpulab-kube-scale-"))
    bed = Bed(tb, args.teams, suffix, tmp)
    storm_teams = list(bed.teams)[-10:]
    # Storm teams' quotas are below their demand (0.75 GPU per user on average): some refusals.
    storm_burst = max(1.0, args.storm * 0.75 / len(storm_teams) / 2)
    burst = {t: storm_burst for t in storm_teams}
    result: dict[str, Any] = {"nodes": nodes, "teams": args.teams, "pods": args.pods, "storm_users": args.storm}
    result["bed_idle"] = bed_usage(tb, args.sample)
    try:
        result["helm_install_s"] = bed.install(burst)
        kubeconfigs = {sa_name(sp, sc): str(bed.identity(sa_name(sp, sc), sc == "all")) for sp, sc in HUBS}
        users = {name: bed.username(name) for name in kubeconfigs}
        teams = [{**t} for t in bed.team_values(burst)]

        def spec(part: str, spawner: str, scope: str, **kw: Any) -> dict[str, Any]:
            return {
                "part": part,
                "spawner": spawner,
                "scope": scope,
                "kubeconfig": kubeconfigs[sa_name(spawner, scope)],
                "hub_namespace": bed.hub_ns,
                "teams": kw.pop("teams", teams),
                "profiles": PROFILES,
                "sharing": SHARING,
                "tolerations": TOLERATIONS,
                **kw,
            }

        if "servers" in args.parts:
            # -- the servers that run (first 10, for the small spawn page; then the rest)
            page_teams = [
                {"name": f"p{i:04d}", "groups": [f"pg{i}"], "guarantee": 1, "burst": 2, "namespace": bed.teams["t000"]}
                for i in range(1000)
            ]
            page_spec = dict(teams=page_teams + teams, page_groups=["pg0", "pg1", "pg2"], page_rounds=args.page_rounds)
            plan = [
                # Teams in turn, each getting the three profiles in turn (about 0.5 GPU a server).
                {
                    "user": f"run{i:05d}",
                    "team": list(bed.teams)[i % (args.teams - 10)],
                    "profile": PROFILES[(i // (args.teams - 10)) % 3]["slug"],
                }
                for i in range(args.pods)
            ]
            granted: dict[str, Any] = {}
            populated, pages = [], []
            made = 0
            for chunk in (plan[:10], plan[10:]):
                if chunk:
                    out = run_hubs(bed, [spec("populate", "gpulab", "ns", servers=chunk)])[0]
                    granted.update(out.pop("granted"))
                    populated.append(out)
                    made += len(chunk)
                pages.append({"pods": made, **run_hubs(bed, [spec("page", "gpulab", "all", **page_spec)])[0]})
            result["page"] = pages
            checkpoint(result)
            result["populate"] = populated
            result["bed_loaded"] = bed_usage(tb, args.sample)

            # -- hub restart with every server running
            servers = [{**srv, "namespace": bed.teams[srv["team"]], "granted": granted[srv["user"]]} for srv in plan]
            expected = {t["name"]: 0 for t in teams}
            for srv in plan:
                expected[srv["team"]] += milli(srv["profile"])
            restart = {}
            for sp, sc in HUBS:
                offset = tb.audit_offset()
                out = run_hubs(bed, [spec("restart", sp, sc, servers=servers, expected_milli=expected)])[0]
                time.sleep(1)
                c = audit_counts(tb, offset, [users[sa_name(sp, sc)]])[users[sa_name(sp, sc)]]
                restart[f"{sp}-{sc}"] = {**out, "requests": dict(c)}
            result["restart"] = restart
            checkpoint(result)

            # -- spawn storm, each spawner alone on the storm teams
            storm = {}
            for sp in ("gpulab", "plain"):
                offset = tb.audit_offset()
                out = run_hubs(bed, [spec("storm", sp, "ns", storm=args.storm, storm_teams=storm_teams)])[0]
                c = audit_counts(tb, offset, [users[sa_name(sp, "ns")]])[users[sa_name(sp, "ns")]]
                out["over_quota_teams"] = [
                    t for t, n in out.get("held_milli_by_team", {}).items() if n > storm_burst * 1000
                ]
                storm[sp] = {**out, "requests": dict(c)}
                wait(
                    lambda: (
                        not any(
                            tb.request("GET", f"/api/v1/namespaces/{bed.teams[t]}/pods")["items"] for t in storm_teams
                        )
                    ),
                    "the storm's pods to be gone",
                    300,
                )
            result["storm"] = storm
            result["storm_burst_gpus"] = storm_burst
            checkpoint(result)
        # -- watches, with every server still running (each hub relists what it watches)
        if "watches" not in args.parts:
            return result
        offset = tb.audit_offset()
        t0 = time.perf_counter()
        outs = run_hubs(bed, [spec("watches", sp, sc, window=args.window) for sp, sc in HUBS])
        time.sleep(1)
        counts = audit_counts(tb, offset, list(users.values()))
        rows = {}
        for (sp, sc), out in zip(HUBS, outs, strict=True):
            c = counts[users[sa_name(sp, sc)]]
            minutes = (out["warm_s"] + out["window_s"]) / 60
            rows[f"{sp}-{sc}"] = {
                **out,
                "lists": c["list"],
                "watches": c["watch-started"],
                "list_watch_per_min": (c["list"] + c["watch-started"]) / minutes,
                "other_requests": sum(n for v, n in c.items() if v not in ("list", "watch", "watch-started")),
            }
        result["watches"] = rows
        result["watches_elapsed_s"] = time.perf_counter() - t0

    finally:
        bed.remove()
    return result


def ratio(a: float, b: float) -> float:
    return a / b if b else float("nan")


def report(result: dict[str, Any]) -> None:
    w = result.get("watches")
    if w:
        _report_watches(result, w)
    if "restart" in result:
        _report_servers(result)
    for name in ("bed_idle", "bed_loaded"):
        b = result.get(name)
        if b:
            print(
                f"\n{name}: RSS MiB {b['rss_mib']} (sum {sum(b['rss_mib'].values())}); "
                f"CPU cores {b['cpu_cores']} (sum {sum(b['cpu_cores'].values()):.2f}); load {b['loadavg']}"
            )


def _report_watches(result: dict[str, Any], w: dict[str, Any]) -> None:
    print(
        table(
            ["hub", "reflectors", "lists", "watches", "list+watch / min", "ratio to KubeSpawner"],
            [
                [
                    k,
                    r["reflectors"],
                    r["lists"],
                    r["watches"],
                    r["list_watch_per_min"],
                    ratio(r["list_watch_per_min"], w[f"plain-{k.split('-')[1]}"]["list_watch_per_min"]),
                ]
                for k, r in w.items()
            ],
            title=f"Watches: {result['teams']} team namespaces, {result['nodes']} nodes (audit log)",
        )
    )


def _report_servers(result: dict[str, Any]) -> None:
    r = result["restart"]
    print()
    print(
        table(
            [
                "hub",
                "servers",
                "objects s",
                "polls s",
                "until ledger s",
                "first spawn",
                "until first Running s",
                "lists",
                "watches",
                "gets",
                "ledger exact",
            ],
            [
                [
                    k,
                    v["servers"],
                    v["spawner_objects_s"],
                    v["polls_s"],
                    v["until_ledger_s"],
                    v["first_spawn"],
                    v["until_first_running_s"],
                    v["requests"].get("list", 0),
                    v["requests"].get("watch-started", 0),
                    v["requests"].get("get", 0),
                    v.get("ledger_exact", "-"),
                ]
                for k, v in r.items()
            ],
            title=f"Hub restart with {result['pods']} running server pods",
        )
    )
    s = result["storm"]
    print()
    print(
        table(
            ["spawner", "users", "running", "refused", "Running p50 s", "Running p99 s", "wall s", "teams over quota"],
            [
                [
                    k,
                    v["users"],
                    v["running"],
                    v["refused"],
                    v["running_p50_s"],
                    v["running_p99_s"],
                    v["wall_s"],
                    len(v["over_quota_teams"]),
                ]
                for k, v in s.items()
            ],
            title=f"Spawn storm: {result['storm_users']} users at once into 10 teams of {result['storm_burst_gpus']:.1f} GPUs",
        )
    )
    for k, v in s.items():
        for text, n in v["refusal_kinds"].items():
            print(f"  {k} refusal x{n}: {text}")
    p = result["page"]
    print()
    print(
        table(
            ["pods", "choices", "page p50 s", "page p99 s", "ratio to the first"],
            [[x["pods"], x["choices"], x["p50_s"], x["p99_s"], ratio(x["p50_s"], p[0]["p50_s"])] for x in p],
            title="Spawn page of a user in 3 of 1,000 teams",
        )
    )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--smoke", action="store_true", help="small and short (used by the tests)")
    ap.add_argument("--teams", type=int, help="team namespaces (default 100; smoke 11: 10 of them the storm's)")
    ap.add_argument("--pods", type=int, help="running server pods for the restart and page parts (default 5000)")
    ap.add_argument("--storm", type=int, help="users spawning at once (default 500)")
    ap.add_argument("--window", type=float, help="seconds the watches are counted (default 660)")
    ap.add_argument("--page-rounds", type=int, help="spawn page renders timed (default 30)")
    ap.add_argument("--sample", type=float, help="seconds the bed's CPU is sampled (default 30)")
    ap.add_argument(
        "--parts",
        default="servers,watches",
        help="servers (pods, page, restart, storm) and/or watches (default both)",
    )
    ap.add_argument("--out", help="directory for the JSON result (default benchmarks/results)")
    args = ap.parse_args(argv)
    args.parts = set(args.parts.split(","))
    smoke = args.smoke
    args.teams = args.teams or (11 if smoke else 100)
    args.pods = args.pods if args.pods is not None else (12 if smoke else 5000)
    args.storm = args.storm or (6 if smoke else 500)
    args.window = args.window if args.window is not None else (2 if smoke else 660)
    args.page_rounds = args.page_rounds or (3 if smoke else 30)
    args.sample = args.sample if args.sample is not None else (1 if smoke else 30)
    t0 = time.perf_counter()
    result = run(args)
    result["elapsed_s"] = time.perf_counter() - t0
    report(result)
    params = {**vars(args), "parts": sorted(args.parts)}
    path = write_result("kube_scale", {"smoke": smoke, "parameters": params, **result}, args.out)
    print(f"\nwrote {path} in {result['elapsed_s']:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
