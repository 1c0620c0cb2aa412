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
  demand), gpulab's hub and then plain KubeSpawner's: POST (``spawner.start()``) to
  Running p50/p99, refusals and their words, GPUs the pods hold per team against the
  team's burst (over: must be 0), and **orphans**: pods that live although their
  spawn was reported failed. Each storm's leftovers are deleted and waited for before
  the next part. Pods run ``sleep`` rather than a server: hundreds of real servers do
  not fit in 2 cores.
* ``reachable``: the same two storms at ``--reachable`` users (default 40) whose pods
  run the real ``jupyterhub-singleuser`` (the node agent starts it on the pod IP):
  POST to Running and POST to a server that answers HTTP, p50/p99.
* ``page``: the spawn form (``profile_list`` + render) of a user in 3 of 1,000
  teams, before the pods are made (10 pods) and with ``--pods`` running.

    GPULAB_KUBE_TESTBED_NODES=1000 scripts/kube-testbed up
    .venv/bin/python benchmarks/kube_scale.py             # writes benchmarks/results/kube_scale.json
    .venv/bin/python benchmarks/kube_scale.py --parts storm --storm 500   # the storms alone
    .venv/bin/python benchmarks/kube_scale.py --smoke     # small and short (the tests)
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import table, write_result  # noqa: E402
from kube_scale_bed import Bed, audit_counts, bed_usage, run_hubs, wait  # noqa: E402

from tests.kube.bed.testbed import TestbedError, up  # noqa: E402

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


def milli(profile: str) -> int:
    return int(float(next(p["gpus"] for p in PROFILES if p["slug"] == profile)) * 1000)  # type: ignore[arg-type]


# ---------------------------------------------------------------------------


def storm_once(
    bed: Bed,
    spec: Any,
    users: dict[str, str],
    sp: str,
    n: int,
    storm_teams: list[str],
    burst: float,
    real: bool = False,
) -> dict[str, Any]:
    """One spawner's storm in a hub process of its own, counted by the audit log; then every
    pod left in the storm's namespaces (a server the hub stopped, or an orphan: a pod whose
    spawn was reported failed) is deleted and waited for, so the next storm starts empty."""
    tb = bed.tb
    offset = tb.audit_offset()
    out = run_hubs(bed, [spec("storm", sp, "ns", storm=n, storm_teams=storm_teams, real_servers=real)])[0]
    c = audit_counts(tb, offset, [users[sa_name(sp, "ns")]])[users[sa_name(sp, "ns")]]
    out["over_quota_teams"] = [t for t, m in out["pods_milli_by_team"].items() if m > burst * 1000]
    namespaces = [bed.teams[t] for t in storm_teams]

    def left() -> list[tuple[str, str]]:
        return [
            (ns, p["metadata"]["name"])
            for ns in namespaces
            for p in tb.request("GET", f"/api/v1/namespaces/{ns}/pods")["items"]
        ]

    out["pods_left_after_stop"] = len(remaining := left())
    for ns, name in remaining:
        try:
            tb.request("DELETE", f"/api/v1/namespaces/{ns}/pods/{name}?gracePeriodSeconds=0")
        except TestbedError:
            pass  # gone meanwhile
    wait(lambda: not left(), f"the {len(remaining)} pods {sp}'s storm left to be gone", 600)
    return {**out, "requests": dict(c)}


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
    result["hub_logs"] = str(tmp)  # each hub process's log, kept after the run
    result["bed_idle"] = bed_usage(tb, args.sample)
    try:
        result["helm_install_s"] = bed.install(burst, SHARING, PROFILES)
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
            page_spec = dict(
                teams=page_teams + teams,
                page_groups=["pg0", "pg1", "pg2"],
                page_rounds=args.page_rounds,
                profile=args.profile_page,
            )
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

        if "storm" in args.parts:
            result["storm"] = {
                sp: storm_once(bed, spec, users, sp, args.storm, storm_teams, storm_burst) for sp in ("gpulab", "plain")
            }
            result["storm_burst_gpus"] = storm_burst
            checkpoint(result)
        if "reachable" in args.parts:
            result["storm_reachable"] = {
                sp: storm_once(bed, spec, users, sp, args.reachable, storm_teams, storm_burst, real=True)
                for sp in ("gpulab", "plain")
            }
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
    for key in ("storm", "storm_reachable"):
        if key in result:
            _report_storm(result, key)
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


def _report_storm(result: dict[str, Any], key: str) -> None:
    s = result[key]
    real = key == "storm_reachable"
    print()
    print(
        table(
            [
                "spawner",
                "users",
                "running",
                "refused",
                "Running p50 s",
                "Running p99 s",
                "wall s",
                "teams over quota",
                "orphan pods",
                "creates",
                *(["reachable p50 s", "reachable p99 s", "never reachable"] if real else []),
            ],
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
                    v["orphans"],
                    v["requests"].get("create", 0),
                    *([v.get("reachable_p50_s"), v.get("reachable_p99_s"), v.get("never_reachable")] if real else []),
                ]
                for k, v in s.items()
            ],
            title=f"Spawn storm{' of real servers' if real else ''}: {next(iter(s.values()))['users']} users at once "
            f"into 10 teams of {result['storm_burst_gpus']:.1f} GPUs",
        )
    )
    for k, v in s.items():
        for text, n in sorted(v["refusal_kinds"].items(), key=lambda kv: -kv[1]):
            print(f"  {k} refusal x{n}: {text}")


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
    ap.add_argument("--reachable", type=int, help="users of the storm of real servers, part reachable (default 40)")
    ap.add_argument("--window", type=float, help="seconds the watches are counted (default 660)")
    ap.add_argument(
        "--profile-page", action="store_true", help="also run the page rounds under cProfile (kept in the result)"
    )
    ap.add_argument("--page-rounds", type=int, help="spawn page renders timed (default 30)")
    ap.add_argument("--sample", type=float, help="seconds the bed's CPU is sampled (default 30)")
    ap.add_argument(
        "--parts",
        default="servers,storm,watches",
        help="comma-separated: servers (the pods, the spawn page, hub restarts), storm (both "
        "spawners' storms, no other pods needed), reachable (both storms with real servers), "
        "watches (default servers,storm,watches)",
    )
    ap.add_argument("--out", help="directory for the JSON result (default benchmarks/results)")
    args = ap.parse_args(argv)
    args.parts = set(args.parts.split(","))
    smoke = args.smoke
    args.teams = args.teams or (11 if smoke else 100)
    args.pods = args.pods if args.pods is not None else (12 if smoke else 5000)
    args.storm = args.storm or (6 if smoke else 500)
    args.reachable = args.reachable or (2 if smoke else 40)
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
