"""Faults on the real control plane: the API server and etcd restarted during a spawn
storm, and the hub restarted while servers run and spawns are in flight.

The control plane is the bed's own (tests/kube/bed/testbed.py): etcd and kube-apiserver
are real processes, restarted in place by :meth:`Testbed.restart` (same ports, data dir
and certificates), as an operator's rolling restart does. The spawners are
GPUKubeSpawner objects as the hub holds them, built as KubeSpawner's own tests build
them (tests/support/kube_spawner.py), talking to the API server as the chart's hub
ServiceAccount; the real scheduler places their pods and the node agent plays the
kubelet. Pods run ``sleep`` (the node agent reports them Running) so that tens of
servers fit the machine; reaching a server is the hub tests' part.

What every fault must leave: each spawn either runs (its pod Running, owned by the
spawner that started it) or is refused with a sentence written for the user; no team's
pods over its burst limit; the ledger exact (each team's held GPUs equal what its pods
hold); and the pod informer resumed from where it was, listing again at most once.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

from kubespawner import KubeSpawner

from spawner.core import labels as gl
from spawner.runtime import set_runtime
from tests.kube.bed import fault_hub
from tests.kube.bed import faults as fs
from tests.kube.bed.chart import Release
from tests.kube.bed.cluster import Cluster
from tests.support import REPO
from tests.support.kube_spawner import chart_config, chart_team, spawner_for

#: Users in the storm: a third CPU-only, the rest half a GPU into crowd (burst 6 GPUs):
#: 20 ask for 10 GPUs, so 8 are refused by the ledger.
STORM = 30
#: Seconds between two users' clicks: the storm arrives over 7.5 s.
ARRIVAL_SECONDS = 0.25


def storm_config(release: Release):
    config = chart_config(release)
    config.KubeSpawner.cmd = list(fault_hub.SLEEP)
    config.KubeSpawner.start_timeout = 120
    config.KubeSpawner.delete_grace_period = 0
    return config


async def _storm_through(release: Release, kube: Cluster, component: str) -> dict[str, Any]:
    """``STORM`` spawns at once; ``component`` restarted once the first pods are created."""
    crowd = chart_team(release, "crowd")
    ns = release.team_ns(crowd)
    config = storm_config(release)
    # A running hub: its informers are up before the storm (as kube_scale's storm warms them).
    warm = spawner_for(config, "warm", {"team": crowd, "profile": "cpu"}, groups=("crowd",))
    await warm.refresh_ledger()
    informers_before = fs.informer_counts(KubeSpawner.reflectors)
    plan = [(f"storm{i:02d}", "cpu" if i % 3 == 0 else "h100-half") for i in range(STORM)]
    spawners = [spawner_for(config, u, {"team": crowd, "profile": p}, groups=("crowd",)) for u, p in plan]
    offset = kube.tb.audit_offset()

    async def arrive(i: int, s: KubeSpawner) -> str:
        # Users click over a few seconds, so that some spawns come while the fault lasts.
        await asyncio.sleep(i * ARRIVAL_SECONDS)
        return await s.start()

    tasks = [asyncio.ensure_future(arrive(i, s)) for i, s in enumerate(spawners)]
    # The fault while the storm is under way: after the first pods exist, before most run.
    await asyncio.to_thread(kube.wait, lambda: len(kube.pods(ns)) >= 3, "the storm's first pods", 60, 0.05)
    in_flight = sum(not t.done() for t in tasks)
    restart_s = await asyncio.to_thread(kube.tb.restart, component)
    results = await asyncio.gather(*tasks, return_exceptions=True)
    outcome = fs.outcomes(spawners, results)
    try:
        # The ledger, as the hub's next spawn page reads it, against the pods the cluster holds.
        truth = await fs.wait_ledger_exact(warm, lambda: fs.held_by_team(kube, release.teams), 60)
        informers_after = fs.informer_counts(KubeSpawner.reflectors)
        requests = fs.list_watch_requests(kube.tb, offset, f"system:serviceaccount:{release.hub_namespace}:hub")
        pods = kube.pods(ns)
        return {
            "ns": ns,
            "restart_s": restart_s,
            "in_flight": in_flight,
            "outcome": outcome,
            "truth": truth,
            "pods": pods,
            "before": informers_before,
            "after": informers_after,
            "requests": requests,
            "spawners": spawners,
            "results": results,
        }
    finally:
        await asyncio.gather(
            *(s.stop(now=True) for s, r in zip(spawners, results, strict=True) if isinstance(r, str)),
            return_exceptions=True,
        )


def _assert_storm_survived(release: Release, run: dict[str, Any]) -> None:
    outcome = run["outcome"]
    assert run["in_flight"] > 0, "the fault came after the storm: nothing to show"
    print(
        f"restart {run['restart_s']:.1f} s with {run['in_flight']} spawns in flight: "
        f"{len(outcome['running'])} running, {len(outcome['refused'])} refused "
        f"({sorted(set(outcome['refused'].values()))}); informers {run['before']} -> {run['after']}; "
        f"hub requests {run['requests']}"
    )
    # Every spawn ended one way or the other, and every refusal is a sentence for the user.
    assert len(outcome["running"]) + len(outcome["refused"]) == STORM, outcome
    bad = {u: words for u, words in outcome["refused"].items() if not fs.is_sentence(words)}
    assert not bad, bad
    # Back within KubeSpawner's create retries (k8s_api_request_retry_timeout, 30 s): a create
    # that lost the connection was tried again, so no spawn ends for the API server's absence.
    if run["restart_s"] < 20:
        lost = {u: words for u, words in outcome["refused"].items() if "lost its connection" in words}
        assert not lost, lost
    # Every pod in the team's namespace belongs to a server that runs: no pod without its server.
    running_pods = {
        spawner.pod_name for spawner, r in zip(run["spawners"], run["results"], strict=True) if isinstance(r, str)
    }
    live = {p["metadata"]["name"] for p in run["pods"] if not p["metadata"].get("deletionTimestamp")}
    assert live == running_pods, {
        "pods without a server": live - running_pods,
        "servers without a pod": running_pods - live,
    }
    for p in run["pods"]:
        if p["metadata"]["name"] in running_pods:
            assert p["status"].get("phase") == "Running", (p["metadata"]["name"], p["status"].get("phase"))
    # No team over its burst limit, and the ledger exactly what the pods hold.
    for team in release.values["gpulab"]["teams"]:
        assert run["truth"].get(team["name"], 0) <= team["burst"] * 1000, (team["name"], run["truth"])
    # The informer resumed: one list before, at most one more after the restart, per informer.
    for key, (lists, watches) in run["after"].items():
        before_lists = run["before"].get(key, (0, 0))[0]
        assert lists - before_lists <= 1, (key, run["before"].get(key), (lists, watches))
    pod_lists = run["requests"].get(("list", "pods"), 0)
    assert pod_lists <= len([k for k in run["after"] if k[0] == "gpulab-pods"]), run["requests"]


async def test_the_api_server_restarted_during_a_spawn_storm(hub_identity: Release, kube: Cluster):
    release = hub_identity
    run = await _storm_through(release, kube, "kube-apiserver")
    _assert_storm_survived(release, run)


async def test_etcd_restarted_during_a_spawn_storm(hub_identity: Release, kube: Cluster):
    release = hub_identity
    run = await _storm_through(release, kube, "etcd")
    _assert_storm_survived(release, run)


def hub_spec(release: Release) -> dict[str, Any]:
    """The hub's catalog as the chart installed it, each team in its namespace."""
    g = release.values["gpulab"]
    return {
        "teams": [{**t, "namespace": release.team_ns(t["name"])} for t in g["teams"]],
        "profiles": g["profiles"],
        "sharing": g["sharing"],
        "hub_namespace": release.hub_namespace,
        "kubeconfig": str(release.hub_kubeconfig),
    }


def crowd_servers(prefix: str, n: int, gpu_every: int) -> list[dict[str, Any]]:
    return [
        {
            "user": f"{prefix}{i:02d}",
            "team": "crowd",
            "profile": "h100-half" if i % gpu_every else "cpu",
            "groups": ["crowd"],
        }
        for i in range(n)
    ]


async def test_the_hub_restarted_while_servers_run_and_spawns_are_in_flight(
    hub_identity: Release, kube: Cluster, tmp_path: Path
):
    """The hub process killed (SIGKILL) with 8 servers running and 10 spawns under way;
    the next hub process loads what JupyterHub's database would hold and polls every
    server, as JupyterHub's start does. Every labelled pod is then a server's that runs,
    or gone; the ledger is exact; the first new spawn is admitted."""
    release = hub_identity
    ns = release.team_ns("crowd")
    # 2 GPUs running, 4 more asked in flight: crowd's burst (6) is never the reason.
    running, in_flight = crowd_servers("run", 8, 2), crowd_servers("fly", 10, 5)
    spec = {**hub_spec(release), "running": running, "in_flight": in_flight}
    (tmp_path / "spec.json").write_text(json.dumps(spec))
    out = tmp_path / "hub"
    out.mkdir()
    log = open(tmp_path / "hub.log", "w")
    hub = subprocess.Popen(
        [sys.executable, "-m", "tests.kube.bed.fault_hub", str(tmp_path / "spec.json"), str(out)],
        cwd=REPO,
        env={**os.environ, "KUBECONFIG": str(release.hub_kubeconfig), "PYTHONPATH": str(REPO)},
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        kube.wait(lambda: (out / "in-flight.started").exists() or hub.poll() is not None, "the in-flight spawns", 120)
        assert hub.poll() is None, (tmp_path / "hub.log").read_text()[-3000:]
        fly = {s["user"] for s in in_flight}
        kube.wait(
            lambda: sum(p["metadata"]["labels"].get(gl.USER) in fly for p in kube.pods(ns)) >= 3,
            "the first in-flight pods",
            60,
            0.05,
        )
    finally:
        hub.send_signal(signal.SIGKILL)
        hub.wait()
        log.close()
    assert len(list(out.glob("state-run*.json"))) == len(running)
    unsaved = [s for s in in_flight if not (out / f"state-{s['user']}.json").exists()]
    with_pod = {p["metadata"]["labels"].get(gl.USER) for p in kube.pods(ns)}
    assert any(s["user"] in with_pod for s in unsaved), "no spawn had its pod and no saved state at the kill"

    # The next hub process: fresh runtime and informers, the database's view of each server.
    await KubeSpawner._stop_all_reflectors()
    set_runtime(None)
    config = fault_hub.hub_config(spec)
    after = await fs.restart_hub(config, running + in_flight, out)
    try:
        assert not after["poll_errors"], after["poll_errors"]
        assert set(after["owned"]) >= {s["user"] for s in running}, after["stopped"]
        # In-flight spawns end running-and-owned or gone: no pod holds quota without a server.
        assert fs.orphans(kube, release.teams, after["owned"]) == [], after["stopped"]
        probe = next(iter(after["owned"].values()))
        await fs.wait_ledger_exact(probe, lambda: fs.held_by_team(kube, release.teams), 60)
        # The first new spawn is admitted and runs.
        first = fault_hub.make_spawner(config, {"user": "carol", "team": "nlp", "profile": "h100-half", "groups": []})
        url = await first.start()
        assert url.startswith("http://")
        await first.stop(now=True)
        print(
            f"hub restart: {len(unsaved)} of {len(in_flight)} in-flight spawns unsaved at the kill; "
            f"owned after {sorted(after['owned'])}, stopped {after['stopped']}; polls {after['polls_s']:.2f} s"
        )
    finally:
        await asyncio.gather(*(s.stop(now=True) for s in after["owned"].values()), return_exceptions=True)
