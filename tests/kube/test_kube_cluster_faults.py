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
from typing import Any

from kubespawner import KubeSpawner

from tests.kube.bed import faults as fs
from tests.kube.bed.chart import Release
from tests.kube.bed.cluster import Cluster
from tests.support.kube_spawner import chart_config, chart_team, spawner_for

#: Users in the storm: a third CPU-only, the rest half a GPU into crowd (burst 6 GPUs):
#: 20 ask for 10 GPUs, so 8 are refused by the ledger.
STORM = 30


def storm_config(release: Release):
    config = chart_config(release)
    config.KubeSpawner.cmd = list(fs.SLEEP)
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
    tasks = [asyncio.ensure_future(s.start()) for s in spawners]
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
