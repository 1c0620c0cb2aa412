"""Faults at size on the real test bed: the API server and etcd restarted during a spawn
storm, and the hub killed while servers run and spawns are in flight.

Run on the bed at size (``GPULAB_KUBE_TESTBED_NODES=1000 scripts/kube-testbed up``). The
set-up is benchmarks/kube_scale.py's: the gpulab chart with ``--teams`` team namespaces,
a hub ServiceAccount bound by the chart's Roles and its cluster-wide pod read (the hub
watches pods once for all namespaces, the configuration section 9 recommends at scale),
and ``--pods`` running server pods made through the API with GPUKubeSpawner's own
manifests (kube_scale_hub.py's ``populate``). Then, with those pods running:

* ``apiserver`` / ``etcd``: ``--storm`` GPUKubeSpawner spawns at once into 10 small teams
  (quotas below demand), and kube-apiserver (or etcd) restarted in place
  (:meth:`Testbed.restart`) once the storm's first pods exist. Measured: the restart,
  the storm's wall time, every spawn's outcome (running, or refused, and whether each
  refusal is a sentence for the user), pods without a server, teams over quota, the
  seconds until the ledger was exact again, and the hub's list and watch requests during
  the fault (the API server's audit log) against its informers' own counts.
* ``hub``: a hub process (tests/kube/bed/fault_hub.py) starting ``--in-flight`` spawns
  is killed (SIGKILL) once their first pods exist; a fresh hub loads what JupyterHub's
  database would hold (the ``--pods`` servers' saved states, the in-flight servers' rows
  without state) and polls every server at once, as JupyterHub's start does. Measured:
  until every poll returned (the ledger rebuilt), orphan pods (a pod holding quota that no
  running server owns), whether the ledger is exact, until the first new spawn runs, and
  the requests it took.

    GPULAB_KUBE_TESTBED_NODES=1000 scripts/kube-testbed up
    .venv/bin/python benchmarks/kube_faults.py            # writes benchmarks/results/kube_faults.json
    .venv/bin/python benchmarks/kube_faults.py --smoke    # tiny: the hub part only (the tests)
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import percentile, write_result  # noqa: E402
from kube_scale import PROFILES, SHARING, TOLERATIONS, Bed, bed_usage, run_hubs, wait  # noqa: E402
from kubernetes_asyncio.config import kube_config  # noqa: E402
from kubespawner import KubeSpawner  # noqa: E402

from spawner.runtime import set_runtime  # noqa: E402
from tests.kube.bed import fault_hub  # noqa: E402
from tests.kube.bed import faults as fs  # noqa: E402
from tests.kube.bed.testbed import Testbed, up  # noqa: E402
from tests.support import REPO  # noqa: E402

HUB = "hub-faults"


def say(message: str) -> None:
    print(f"[kube_faults] {time.strftime('%H:%M:%S')} {message}", file=sys.stderr, flush=True)


GROUPS = ["bench"]


class Run:
    """The bed, the chart's teams and the hub's identity, for every part."""

    def __init__(self, tb: Testbed, args: argparse.Namespace, tmp: Path):
        self.tb, self.args, self.tmp = tb, args, tmp
        self.bed = Bed(tb, args.teams, os.urandom(3).hex(), tmp)
        self.storm_teams = list(self.bed.teams)[-min(10, args.teams) :]
        # Quotas below the storm's demand (0.75 GPU per user on average): some refusals.
        self.storm_burst = float(max(1, round(args.storm * 0.75 / len(self.storm_teams) / 2)))  # whole GPUs
        self.burst = {t: self.storm_burst for t in self.storm_teams}
        self.teams = self.bed.team_values(self.burst)
        self.username = self.bed.username(HUB)
        self.kubeconfig = ""

    def spec(self) -> dict[str, Any]:
        """The hub's catalog and identity (tests/kube/bed/fault_hub.py's spec)."""
        return {
            "teams": self.teams,
            "profiles": PROFILES,
            "sharing": SHARING,
            "hub_namespace": self.bed.hub_ns,
            "kubeconfig": self.kubeconfig,
            "all_namespaces": True,
            "start_timeout": 300,
        }

    def team_namespaces(self) -> dict[str, str]:
        return dict(self.bed.teams)

    def over_quota(self, held: dict[str, int]) -> list[str]:
        burst = {t["name"]: t["burst"] * 1000 for t in self.teams}
        return [t for t, n in held.items() if n > burst.get(t, 0)]


def server(user: str, team: str, profile: str) -> dict[str, Any]:
    return {"user": user, "team": team, "profile": profile, "groups": GROUPS}


# ---------------------------------------------------------------------------


def populate(run: Run) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """``--pods`` running servers (kube_scale_hub.py's ``populate``) over the teams that are
    not the storm's; each server's saved state written where the restarted hub reads it."""
    args, bed = run.args, run.bed
    others = [t for t in bed.teams if t not in run.storm_teams] or list(bed.teams)
    plan = [
        server(f"run{bed.suffix}-{i:05d}", others[i % len(others)], PROFILES[(i // len(others)) % 3]["slug"])
        for i in range(args.pods)
    ]
    if not plan:
        return [], {}
    spec = {
        "part": "populate",
        "spawner": "gpulab",
        "scope": "all",
        "kubeconfig": run.kubeconfig,
        "hub_namespace": bed.hub_ns,
        "teams": run.teams,
        "profiles": PROFILES,
        "sharing": SHARING,
        "tolerations": TOLERATIONS,
        "servers": plan,
    }
    out = run_hubs(bed, [spec])[0]
    granted = out.pop("granted")
    states = run.tmp / "hub"
    states.mkdir(exist_ok=True)
    for srv in plan:
        # What JupyterHub saved after each start (kube_scale_hub.py's restart part builds the same).
        state = {
            "pod_name": f"jupyter-{srv['user']}",
            "namespace": bed.teams[srv["team"]],
            "kubespawner_version": "7.1",
            "gpulab": granted[srv["user"]],
        }
        (states / f"state-{srv['user']}.json").write_text(json.dumps(state))
    return plan, out


async def storm_fault(run: Run, component: str) -> dict[str, Any]:
    """``--storm`` spawns at once, ``component`` restarted once the first pods exist."""
    args, tb = run.args, run.tb
    set_runtime(None)
    config = fault_hub.hub_config(run.spec())
    warm = fault_hub.make_spawner(config, server("warm", run.storm_teams[0], "cpu"))
    await warm.refresh_ledger()  # a running hub: its informers are up
    before = fs.informer_counts(KubeSpawner.reflectors)
    profiles = [p["slug"] for p in PROFILES if p["slug"] != "cpu"]
    plan = [
        server(
            f"s{run.bed.suffix}-{component[:4]}-{i:04d}",
            run.storm_teams[i % len(run.storm_teams)],
            profiles[i % len(profiles)],
        )
        for i in range(args.storm)
    ]
    spawners = [fault_hub.make_spawner(config, srv) for srv in plan]
    storm_ns = [run.bed.teams[t] for t in run.storm_teams]

    def storm_pods() -> int:
        return sum(len(tb.request("GET", f"/api/v1/namespaces/{ns}/pods")["items"]) for ns in storm_ns)

    offset = tb.audit_offset()
    t0 = time.perf_counter()
    done_at: dict[int, float] = {}

    async def one(i: int, s: Any) -> Any:
        try:
            return await s.start()
        finally:
            done_at[i] = time.perf_counter()

    tasks = [asyncio.ensure_future(one(i, s)) for i, s in enumerate(spawners)]
    while storm_pods() < min(3, args.storm) and not all(t.done() for t in tasks):
        await asyncio.sleep(0.1)
    t_fault = time.perf_counter()
    in_flight = sum(not t.done() for t in tasks)
    say(f"restarting {component} with {in_flight} of {args.storm} spawns in flight")
    restart_s = await asyncio.to_thread(tb.restart, component)
    say(f"{component} ready again after {restart_s:.1f} s")
    results = await asyncio.gather(*tasks, return_exceptions=True)
    t_storm = time.perf_counter()
    outcome = fs.outcomes(spawners, results)
    truth = await fs.wait_ledger_exact(warm, lambda: fs.held_by_team(tb, run.team_namespaces()), 300)
    t_exact = time.perf_counter()
    after = fs.informer_counts(KubeSpawner.reflectors)
    requests = fs.list_watch_requests(tb, offset, run.username)
    owned = {s.user.name: s for s, r in zip(spawners, results, strict=True) if isinstance(r, str)}
    orphans = fs.orphans(tb, {t: run.bed.teams[t] for t in run.storm_teams}, owned)
    running_s = sorted(done_at[i] - t0 for i, r in enumerate(results) if isinstance(r, str))
    refusals = list(outcome["refused"].values())
    out = {
        "component": component,
        "users": args.storm,
        "in_flight_at_fault": in_flight,
        "fault_after_s": t_fault - t0,
        "restart_s": restart_s,
        "storm_wall_s": t_storm - t0,
        "recovered_after_fault_s": t_storm - t_fault,
        "ledger_exact_after_storm_s": t_exact - t_storm,
        "running": len(outcome["running"]),
        "running_p50_s": percentile(running_s, 50),
        "running_p99_s": percentile(running_s, 99),
        "refused": len(refusals),
        "refusals_not_sentences": [w for w in refusals if not fs.is_sentence(w)],
        "refusal_kinds": dict(collections.Counter(refusals).most_common(8)),
        "pods_without_a_server": orphans,
        "teams_over_quota": run.over_quota(truth),
        "informers_before": {"/".join(map(str, k)): v for k, v in before.items()},
        "informers_after": {"/".join(map(str, k)): v for k, v in after.items()},
        "requests": {f"{v} {r}": n for (v, r), n in sorted(requests.items())},
    }
    await asyncio.gather(*(s.stop(now=True) for s in owned.values()), return_exceptions=True)
    await KubeSpawner._stop_all_reflectors()
    # The next storm starts from empty teams: their pods gone, and their ResourceQuota's usage
    # back to 0 (the quota controller recounts after the deletes; admission refuses until then).
    deadline = time.monotonic() + 300
    while (storm_pods() or not quotas_empty(tb, storm_ns)) and time.monotonic() < deadline:
        await asyncio.sleep(1)
    return out


def quotas_empty(tb: Testbed, namespaces: list[str]) -> bool:
    for ns in namespaces:
        for q in tb.request("GET", f"/api/v1/namespaces/{ns}/resourcequotas")["items"]:
            if any(str(v) not in ("0", "0m") for v in (q.get("status", {}).get("used") or {}).values()):
                return False
    return True


async def hub_fault(run: Run, populated: list[dict[str, Any]]) -> dict[str, Any]:
    """A hub process killed with ``--in-flight`` spawns under way, then a fresh hub start."""
    args, tb = run.args, run.tb
    out_dir = run.tmp / "hub"
    out_dir.mkdir(exist_ok=True)
    teams = [t for t in run.bed.teams if t not in run.storm_teams] or list(run.bed.teams)
    in_flight = [
        server(f"fly{run.bed.suffix}-{i:04d}", teams[i % len(teams)], ["cpu", "h100-half"][i % 2])
        for i in range(args.in_flight)
    ]
    spec = {**run.spec(), "running": [], "in_flight": in_flight}
    (run.tmp / "fault-hub.json").write_text(json.dumps(spec))
    log = open(run.tmp / "fault-hub.log", "w")
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.kube.bed.fault_hub", str(run.tmp / "fault-hub.json"), str(out_dir)],
        cwd=REPO,
        env={**os.environ, "KUBECONFIG": run.kubeconfig, "PYTHONPATH": str(REPO)},
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    fly = {s["user"] for s in in_flight}
    fly_ns = sorted({run.bed.teams[s["team"]] for s in in_flight})

    def fly_pods() -> set[str]:
        names = set()
        for ns in fly_ns:
            for p in tb.request("GET", f"/api/v1/namespaces/{ns}/pods?labelSelector=gpulab.io/user")["items"]:
                user = p["metadata"]["labels"].get("gpulab.io/user")
                if user in fly:
                    names.add(user)
        return names

    try:
        deadline = time.monotonic() + 600
        while not (out_dir / "in-flight.started").exists() and proc.poll() is None and time.monotonic() < deadline:
            await asyncio.sleep(0.2)
        # Killed once a third of the in-flight spawns have their pod.
        while len(fly_pods()) < max(1, args.in_flight // 3) and proc.poll() is None and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        log.close()
    with_pod = fly_pods()
    say(f"hub killed: {len(with_pod)} of {args.in_flight} in-flight spawns had a pod; a fresh hub starts")
    unsaved = [s["user"] for s in in_flight if not (out_dir / f"state-{s['user']}.json").exists()]
    set_runtime(None)
    await KubeSpawner._stop_all_reflectors()
    config = fault_hub.hub_config(run.spec())
    offset = tb.audit_offset()
    t0 = time.perf_counter()
    after = await fs.restart_hub(config, populated + in_flight, out_dir)
    t_polls = time.perf_counter()
    orphans = fs.orphans(tb, run.team_namespaces(), after["owned"])
    probe = fault_hub.make_spawner(config, server("probe", teams[0], "cpu"))
    try:
        await fs.wait_ledger_exact(probe, lambda: fs.held_by_team(tb, run.team_namespaces()), 120)
        exact = True
    except AssertionError:
        exact = False
    t_exact = time.perf_counter()
    first = fault_hub.make_spawner(config, server("first-after-restart", teams[0], "h100-half"))
    try:
        await first.start()
        first_spawn = "Running"
    except Exception as e:
        first_spawn = fs.user_words(e)
    t_first = time.perf_counter()
    requests = fs.list_watch_requests(tb, offset, run.username)
    if first_spawn == "Running":
        await first.stop(now=True)
    fly_owned = [u for u in after["owned"] if u in fly]
    out = {
        "servers_running": len(populated),
        "in_flight": len(in_flight),
        "in_flight_with_a_pod_at_kill": len(with_pod),
        "in_flight_unsaved_at_kill": len(unsaved),
        "until_polls_done_s": t_polls - t0,
        "until_ledger_exact_s": t_exact - t0,
        "until_first_running_s": t_first - t0,
        "first_spawn": first_spawn,
        "ledger_exact": exact,
        "owned": len(after["owned"]),
        "in_flight_owned": len(fly_owned),
        "in_flight_gone": len(in_flight) - len(fly_owned),
        "stopped_at_start": len(after["stopped"]),
        "poll_errors": after["poll_errors"][:5],
        "orphans": orphans[:20],
        "orphan_count": len(orphans),
        "requests": {f"{v} {r}": n for (v, r), n in sorted(requests.items())},
    }
    await asyncio.gather(*(s.stop(now=True) for u, s in after["owned"].items() if u in fly), return_exceptions=True)
    await KubeSpawner._stop_all_reflectors()
    return out


async def run_parts(run: Run, populated: list[dict[str, Any]], result: dict[str, Any]) -> None:
    os.environ["KUBECONFIG"] = run.kubeconfig
    kube_config.KUBE_CONFIG_DEFAULT_LOCATION = run.kubeconfig
    for component, part in (("kube-apiserver", "apiserver"), ("etcd", "etcd")):
        if part in run.args.parts:
            result.setdefault("storms", {})[part] = await storm_fault(run, component)
            checkpoint(run.args, result)
    if "hub" in run.args.parts:
        result["hub"] = await hub_fault(run, populated)


def checkpoint(args: argparse.Namespace, result: dict[str, Any]) -> None:
    params = {**vars(args), "parts": sorted(args.parts)}
    write_result("kube_faults.partial", {"smoke": args.smoke, "parameters": params, **result}, args.out)


def run(args: argparse.Namespace) -> dict[str, Any]:
    tb = up()
    tmp = Path(tempfile.mkdtemp(prefix="gpulab-kube-faults-"))
    r = Run(tb, args, tmp)
    nodes = len(tb.request("GET", "/api/v1/nodes")["items"])
    result: dict[str, Any] = {
        "nodes": nodes,
        "teams": args.teams,
        "pods": args.pods,
        "storm_users": args.storm,
        "in_flight": args.in_flight,
        "storm_burst_gpus": r.storm_burst,
        "loadavg_at_start": os.getloadavg(),
    }
    # A cluster-wide watch counts every labelled pod: an earlier run's (its namespaces are
    # deleted in the background, 5,000 pods take minutes) would fill this run's teams.
    wait(
        lambda: not tb.request("GET", "/api/v1/pods?labelSelector=gpulab.io/gpu-milli&limit=1")["items"],
        "an earlier run's server pods to be gone",
        900,
    )
    try:
        result["helm_install_s"] = r.bed.install(r.burst, SHARING, PROFILES)
        r.kubeconfig = str(r.bed.identity(HUB, cluster_wide=True))
        t0 = time.perf_counter()
        say(f"chart installed with {args.teams} teams; making {args.pods} running server pods")
        populated, result["populate"] = populate(r)
        result["populate_s"] = time.perf_counter() - t0
        if args.sample:
            result["bed_loaded"] = bed_usage(tb, args.sample)
        asyncio.run(run_parts(r, populated, result))
    finally:
        result["loadavg_at_end"] = os.getloadavg()
        r.bed.remove()
    return result


def report(result: dict[str, Any]) -> None:
    for name, s in result.get("storms", {}).items():
        print(
            f"{name} restarted during a storm of {s['users']} ({s['in_flight_at_fault']} in flight): "
            f"restart {s['restart_s']:.1f} s, storm {s['storm_wall_s']:.1f} s, "
            f"{s['running']} running (p50 {s['running_p50_s']:.1f} s, p99 {s['running_p99_s']:.1f} s), "
            f"{s['refused']} refused ({len(s['refusals_not_sentences'])} not a sentence), "
            f"{len(s['pods_without_a_server'])} pods without a server, "
            f"{len(s['teams_over_quota'])} teams over quota, ledger exact {s['ledger_exact_after_storm_s']:.1f} s "
            f"after the storm; requests {s['requests']}"
        )
    h = result.get("hub")
    if h:
        print(
            f"hub killed with {h['servers_running']} servers running and {h['in_flight']} spawns in flight "
            f"({h['in_flight_with_a_pod_at_kill']} with a pod): polls {h['until_polls_done_s']:.1f} s, "
            f"ledger exact {h['ledger_exact']} at {h['until_ledger_exact_s']:.1f} s, first spawn "
            f"{h['first_spawn']} at {h['until_first_running_s']:.1f} s; {h['orphan_count']} orphans; "
            f"in flight: {h['in_flight_owned']} owned, {h['in_flight_gone']} gone; requests {h['requests']}"
        )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--smoke", action="store_true", help="tiny, the hub part only (the suite's smoke test)")
    ap.add_argument("--teams", type=int, help="team namespaces (default 100; smoke 2)")
    ap.add_argument("--pods", type=int, help="running server pods (default 5000; smoke 4)")
    ap.add_argument("--storm", type=int, help="users spawning at once in each storm (default 300)")
    ap.add_argument("--in-flight", type=int, help="spawns under way when the hub is killed (default 100; smoke 4)")
    ap.add_argument("--sample", type=float, help="seconds the loaded bed's CPU is sampled (default 10; smoke 0)")
    ap.add_argument("--parts", help="apiserver, etcd and/or hub (default all; smoke: hub)")
    ap.add_argument("--out", help="directory for the JSON result (default benchmarks/results)")
    args = ap.parse_args(argv)
    smoke = args.smoke
    args.teams = args.teams or (2 if smoke else 100)
    args.pods = args.pods if args.pods is not None else (4 if smoke else 5000)
    args.storm = args.storm or (6 if smoke else 300)
    args.in_flight = args.in_flight or (4 if smoke else 100)
    args.sample = args.sample if args.sample is not None else (0 if smoke else 10)
    args.parts = set((args.parts or ("hub" if smoke else "apiserver,etcd,hub")).split(","))
    t0 = time.perf_counter()
    result = run(args)
    result["elapsed_s"] = time.perf_counter() - t0
    report(result)
    params = {**vars(args), "parts": sorted(args.parts)}
    path = write_result("kube_faults", {"smoke": smoke, "parameters": params, **result}, args.out)
    print(f"\nwrote {path} in {result['elapsed_s']:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
