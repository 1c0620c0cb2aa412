"""One hub process of benchmarks/kube_scale.py: watches, a restart, a storm, the spawn page.

Run by kube_scale.py as ``kube_scale_hub.py SPEC.json OUT.json``; SPEC says the part,
the spawner (``gpulab`` = GPUKubeSpawner, ``plain`` = KubeSpawner with the same
profiles as a static ``profile_list`` whose overrides set the team's namespace and
the pod fields gpulab sets), the scope (``ns``: per-namespace watches, ``all``: one
cluster-wide watch), the teams and the kubeconfig of this hub's ServiceAccount.
Pods run ``sleep`` (the node agent leaves them Running): no server processes.
"""

from __future__ import annotations

import asyncio
import collections
import cProfile
import io
import json
import logging
import os
import pstats
import re
import sys
import time
from pathlib import Path
from typing import Any

STARTED = time.perf_counter()
sys.path.insert(0, str(Path(__file__).resolve().parent))
import aiohttp  # noqa: E402
import jupyterhub  # noqa: E402
from _common import percentile  # noqa: E402  (also puts the repository on sys.path)
from aiohttp import web  # noqa: E402
from kubernetes_asyncio.client.rest import ApiException  # noqa: E402
from kubernetes_asyncio.config import kube_config  # noqa: E402
from kubespawner import KubeSpawner  # noqa: E402
from spawn_path import Hub, User  # noqa: E402
from traitlets.config import Config  # noqa: E402

from spawner.core.catalog import catalog_from_dict  # noqa: E402
from spawner.core.gpu_pools import and_node_affinity  # noqa: E402
from spawner.core.priority import effective_priority_class  # noqa: E402
from spawner.core.sharing import pod_gpu_spec  # noqa: E402
from spawner.kube.spawner import GPUKubeSpawner  # noqa: E402
from spawner.runtime import get_runtime, set_runtime  # noqa: E402

#: What every pod runs: the node agent starts no process for it and reports it Running.
SLEEP = ["sleep", "infinity"]
#: The pods of the reachable-server storm run the real single-user server instead.
SERVER = "jupyterhub-singleuser"


def config(spec: dict[str, Any]) -> Config:
    c = Config()
    c.GPULab.teams = spec["teams"]
    c.GPULab.profiles = spec["profiles"]
    c.GPULab.sharing = spec["sharing"]
    c.KubeSpawner.namespace = spec["hub_namespace"]
    c.KubeSpawner.image = "quay.io/jupyter/base-notebook:2024-10-07"
    # A real server where the part measures reachability (the node agent runs it on the pod IP).
    c.KubeSpawner.cmd = [SERVER] if spec.get("real_servers") else SLEEP
    c.KubeSpawner.start_timeout = spec.get("start_timeout", 300)
    c.KubeSpawner.delete_grace_period = 0
    c.KubeSpawner.tolerations = spec["tolerations"]
    c.KubeSpawner.k8s_api_request_retry_timeout = 120
    if spec["scope"] == "all":
        if spec["spawner"] == "gpulab":
            c.GPUKubeSpawner.ledger_namespaces = ["*"]
        else:
            c.KubeSpawner.enable_user_namespaces = True
    return c


def static_profiles(spec: dict[str, Any]) -> list[dict[str, Any]]:
    """KubeSpawner's profile list for the same catalog: one entry per (team, profile), whose
    override sets the team's namespace and exactly the pod fields gpulab sets."""
    catalog = catalog_from_dict(
        {"teams": spec["teams"], "profiles": spec["profiles"], "sharing": spec["sharing"]}, "kube_scale"
    )
    out = []
    for team in catalog.teams.values():
        for p in catalog.profiles.values():
            gpu = pod_gpu_spec(p, catalog.sharing, team)
            override: dict[str, Any] = {
                "namespace": team.namespace,
                "priority_class_name": effective_priority_class(p.priority_class, False).name,
            }
            if gpu.limits:
                override["extra_resource_limits"] = dict(gpu.limits)
                override["extra_resource_guarantees"] = dict(gpu.requests)
            if gpu.node_selector:
                override["node_selector"] = dict(gpu.node_selector)
            if gpu.node_requirements:  # off the pools of other sharing backends, as gpulab keeps it
                override["node_affinity_required"] = and_node_affinity([], gpu.node_requirements)
            out.append(
                {"slug": f"{team.name}-{p.slug}", "display_name": p.display_name, "kubespawner_override": override}
            )
    return out


class Hub_:
    def __init__(self, spec: dict[str, Any]):
        self.spec = spec
        self.config = config(spec)
        self.profiles = static_profiles(spec) if spec["spawner"] == "plain" else []
        self.hub = Hub()

    def spawner(self, user: str, team: str, profile: str, state: dict | None = None) -> KubeSpawner:
        orm = type("ORMSpawner", (), {"name": "", "server": None, "user_options": {}})()
        if self.spec["spawner"] == "gpulab":
            s = GPUKubeSpawner(config=self.config, user=User(user, ("bench",)), hub=self.hub, orm_spawner=orm)
            s.user_options = {"team": team, "profile": profile}
        else:
            s = KubeSpawner(config=self.config, user=User(user), hub=self.hub, orm_spawner=orm)
            s.profile_list = self.profiles
            s.user_options = {"profile": f"{team}-{profile}"}
        s.api_token = "token-" + user
        if state is not None:
            s.load_state(state)
        return s


def message(e: BaseException) -> str:
    return str(getattr(e, "jupyterhub_message", None) or getattr(e, "log_message", None) or e)


async def spawn(hub: Hub_, user: str, team: str, profile: str) -> dict[str, Any]:
    s = hub.spawner(user, team, profile)
    t0 = time.perf_counter()
    try:
        url = await s.start()
    except Exception as e:
        return {
            "user": user,
            "team": team,
            "profile": profile,
            "refused": refusal_words(e),
            "words": message(e)[:600],
            "s": time.perf_counter() - t0,
        }
    out = {"user": user, "team": team, "profile": profile, "running_s": time.perf_counter() - t0, "spawner": s}
    if hub.spec.get("real_servers"):
        out["reachable_s"] = await reachable(url, t0)
    return out


async def reachable(url: str, t0: float, timeout: float = 300) -> float | None:
    """Seconds from ``t0`` until the server answers HTTP at all, as JupyterHub's own check
    (``jupyterhub.utils.wait_for_http_server``) takes any answer as up; None if never."""
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5)) as session:
        while time.perf_counter() - t0 < timeout:
            try:
                async with session.get(url.rstrip("/") + "/api") as r:
                    await r.read()
                    return time.perf_counter() - t0
            except (aiohttp.ClientError, asyncio.TimeoutError, OSError):
                await asyncio.sleep(0.1)
    return None


# -- parts -----------------------------------------------------------------


async def part_watches(hub: Hub_, spec: dict[str, Any]) -> dict[str, Any]:
    """Spawn and stop once per team (ns scope) or start the reflectors (all scope), then idle."""
    t0 = time.perf_counter()
    if spec["scope"] == "ns":
        for i, t in enumerate(spec["teams"]):
            r = await spawn(hub, f"w-{spec['spawner']}-{i:03d}", t["name"], "cpu")
            if "spawner" in r:
                await r["spawner"].stop(now=True)
    else:
        s = hub.spawner("w-all", spec["teams"][0]["name"], "cpu")
        if spec["spawner"] == "gpulab":
            await s.refresh_ledger()
        await s._start_watching_pods()
        await s._start_watching_events()
    warm = time.perf_counter()
    await asyncio.sleep(spec["window"])
    keys = sorted("/".join(str(x) for x in k) for k in KubeSpawner.reflectors)
    lists = sum(getattr(r, "lists", 0) for r in KubeSpawner.reflectors.values())
    await KubeSpawner._stop_all_reflectors()
    return {"warm_s": warm - t0, "window_s": time.perf_counter() - warm, "reflectors": len(keys), "own_lists": lists}


async def part_restart(hub: Hub_, spec: dict[str, Any]) -> dict[str, Any]:
    """A hub start: every server's saved state loaded and polled at once, then one spawn."""
    servers = spec["servers"]
    t0 = time.perf_counter()
    spawners = []
    for srv in servers:
        state = {"pod_name": f"jupyter-{srv['user']}", "namespace": srv["namespace"], "kubespawner_version": "7.1"}
        if hub.spec["spawner"] == "gpulab":
            state["gpulab"] = srv["granted"]
        spawners.append(hub.spawner(srv["user"], srv["team"], srv["profile"], state))
    t_objects = time.perf_counter()
    polls = await asyncio.gather(*(s.poll() for s in spawners))
    t_polls = time.perf_counter()
    out: dict[str, Any] = {
        "servers": len(servers),
        "spawner_objects_s": t_objects - t0,
        "polls_s": t_polls - t_objects,
        "polls_running": sum(1 for p in polls if p is None),
    }
    if hub.spec["spawner"] == "gpulab":
        ledger = get_runtime().ledger
        held = {t["name"]: ledger.usage(t["name"]).held_milli for t in spec["teams"]}
        out["ledger_exact"] = held == spec["expected_milli"]
        out["ledger_held_milli"] = sum(held.values())
    first = await spawn(hub, f"first-{spec['spawner']}-{spec['scope']}", spec["teams"][0]["name"], "h100-half")
    t_first = time.perf_counter()
    out["first_spawn"] = first.get("refused") or "Running"
    out["first_spawn_s"] = first.get("running_s", first.get("s"))
    out["until_first_running_s"] = t_first - t0
    out["until_ledger_s"] = t_polls - t0
    if "spawner" in first:
        await first["spawner"].stop(now=True)
    await KubeSpawner._stop_all_reflectors()
    return out


def refusal_words(e: BaseException) -> str:
    """A refusal's words, with what differs per user (pod names, counts) folded, so that
    the same refusal of many users counts as one kind."""
    text = message(e)
    if isinstance(e, ApiException):
        try:
            text = f"API {e.status}: " + json.loads(e.body or "{}").get("message", "")
        except ValueError:
            text = f"API {e.status}: {e.reason}"
    text = re.sub(r"jupyter-[a-z0-9-]+", "jupyter-<user>", text)
    return re.sub(r"\d+(\.\d+)?", "N", text)


def pod_milli(pod: Any, replicas: int) -> int:
    """The GPU (thousandths) a pod asks for: whole GPUs, or time-slices of one."""
    limits = (pod.spec.containers[0].resources.limits or {}) if pod.spec.containers[0].resources else {}
    return int(float(limits.get("nvidia.com/gpu", 0)) * 1000) + int(
        float(limits.get("nvidia.com/gpu.shared", 0)) * 1000 / replicas
    )


def reachability(results: list[dict[str, Any]]) -> dict[str, Any]:
    """POST -> reachable server p50/p99 (only where the pods run real servers)."""
    times = [r["reachable_s"] for r in results if "reachable_s" in r]
    if not times:
        return {}
    up = sorted(t for t in times if t is not None)
    return {
        "reachable": len(up),
        "never_reachable": len(times) - len(up),
        "reachable_p50_s": percentile(up, 50),
        "reachable_p99_s": percentile(up, 99),
    }


async def part_storm(hub: Hub_, spec: dict[str, Any]) -> dict[str, Any]:
    users = spec["storm"]
    teams = spec["storm_teams"]
    namespaces = {t["name"]: t["namespace"] for t in spec["teams"] if t["name"] in teams}
    profiles = [p["slug"] for p in spec["profiles"] if p["slug"] != "cpu"]
    # One warm spawn first, as on a running hub (the reflectors are up).
    warm = await spawn(hub, "storm-warm", teams[0], "cpu")
    if "spawner" in warm:
        await warm["spawner"].stop(now=True)
    t0 = time.perf_counter()
    results = await asyncio.gather(
        *(spawn(hub, f"s{i:04d}", teams[i % len(teams)], profiles[i % len(profiles)]) for i in range(users))
    )
    wall = time.perf_counter() - t0
    running = sorted(r["running_s"] for r in results if "running_s" in r)
    refused = [r for r in results if "refused" in r]
    spawners = [r["spawner"] for r in results if "spawner" in r]
    # What the cluster holds now, read as the hub (its Role lists pods in team namespaces).
    await asyncio.sleep(2)  # a create still in the API server when its start gave up lands
    api = hub.spawner("storm-reader", teams[0], "cpu").api
    replicas = spec["sharing"]["timeslice"]["replicas"]
    held: dict[str, int] = collections.Counter()
    pods: dict[str, str] = {}
    for team, ns in namespaces.items():
        for pod in (await api.list_namespaced_pod(ns)).items:
            if pod.metadata.deletion_timestamp:
                continue
            held[team] += pod_milli(pod, replicas)
            pods[pod.metadata.name] = pod.status.phase if pod.status else ""
    owned = {s.pod_name for s in spawners}
    orphans = [name for name in pods if name not in owned and name != "jupyter-storm-warm"]
    kinds = collections.Counter(r["refused"] for r in refused)
    out = {
        "users": users,
        "wall_s": wall,
        "running": len(running),
        "running_p50_s": percentile(running, 50),
        "running_p99_s": percentile(running, 99),
        "refused": len(refused),
        **reachability(results),
        "refusal_kinds": dict(kinds),
        "refusal_examples": {k: next(r["words"] for r in refused if r["refused"] == k) for k in kinds},
        "pods_milli_by_team": held,
        "orphans": len(orphans),
        "orphan_phases": dict(collections.Counter(pods[n] for n in orphans)),
    }
    await asyncio.gather(*(s.stop(now=True) for s in spawners), return_exceptions=True)
    await KubeSpawner._stop_all_reflectors()
    return out


async def profile_page(s: Any, rounds: int) -> str:
    """The same page rounds again under cProfile (after the timed ones): where the time goes."""
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(rounds):
        s._render_options_form(await s._gpulab_profile_list())
    prof.disable()
    out = io.StringIO()
    stats = pstats.Stats(prof, stream=out)
    stats.sort_stats("tottime").print_stats(25)
    stats.sort_stats("cumulative").print_stats(25)
    return out.getvalue()


async def part_page(hub: Hub_, spec: dict[str, Any]) -> dict[str, Any]:
    """The spawn form of a user in 3 teams: profile list (ledger rebuilt) and rendered HTML."""
    s = hub.spawner("page-user", spec["teams"][0]["name"], "cpu")
    s.user.groups = [type("Group", (), {"name": g})() for g in spec["page_groups"]]
    times = []
    profiles = await s._gpulab_profile_list()  # warm: the informers start
    for _ in range(spec["page_rounds"]):
        t0 = time.perf_counter()
        profiles = await s._gpulab_profile_list()
        html = s._render_options_form(profiles)
        times.append(time.perf_counter() - t0)
    profile = await profile_page(s, spec["page_rounds"]) if spec.get("profile") else None
    await KubeSpawner._stop_all_reflectors()
    times.sort()
    pods = sum(1 for _ in get_runtime().ledger.workloads())
    return {
        "p50_s": percentile(times, 50),
        "p99_s": percentile(times, 99),
        "choices": len(profiles),
        **({"profile": profile} if profile else {}),
        "html_bytes": len(html),
        "workloads": pods,
    }


async def part_populate(hub: Hub_, spec: dict[str, Any]) -> dict[str, Any]:
    """Make the servers' pods with GPUKubeSpawner's own manifests (labels, resources,
    priority class) through the API, 24 at a time, then wait until all run."""
    gate = asyncio.Semaphore(24)
    t0 = time.perf_counter()
    granted = {}

    async def one(srv: dict[str, Any]) -> None:
        s = hub.spawner(srv["user"], srv["team"], srv["profile"])
        await s.load_user_options()
        pod = await s.get_pod_manifest()
        granted[srv["user"]] = s.get_state()["gpulab"]
        async with gate:
            await s.api.create_namespaced_pod(s.namespace, pod)

    await asyncio.gather(*(one(srv) for srv in spec["servers"]))
    created = time.perf_counter()
    s = hub.spawner("populate", spec["teams"][0]["name"], "cpu")
    informer = (await s._ledger_reflectors())[0]
    while True:
        running = sum(1 for r in informer for p in r.pods.values() if (p.get("status") or {}).get("phase") == "Running")
        if running >= len(spec["servers"]) or time.perf_counter() - created > 900:
            break
        await asyncio.sleep(2)
    await KubeSpawner._stop_all_reflectors()
    return {
        "create_s": created - t0,
        "running_s": time.perf_counter() - created,
        "running": running,
        "granted": granted,
    }


PARTS = {
    "watches": part_watches,
    "restart": part_restart,
    "storm": part_storm,
    "page": part_page,
    "populate": part_populate,
}


async def hub_api_root(hub: Hub_) -> web.AppRunner:
    """The hub's API root for the real servers: a single-user server asks it once at start
    and exits when it never answers (``jupyterhub/singleuser/extension.py``,
    ``check_hub_version``: five tries, then ``exit(1)``). This answers as JupyterHub's
    ``RootAPIHandler`` (``GET /hub/api/``: ``{"version": ...}``, with the
    ``X-JupyterHub-Version`` header its API handlers set), and 200 to the activity reports
    a server posts every few minutes; nothing else of the hub is needed to be reachable."""

    async def answer(request: web.Request) -> web.Response:
        return web.json_response(
            {"version": jupyterhub.__version__}, headers={"X-JupyterHub-Version": jupyterhub.__version__}
        )

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", answer)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    hub.hub.api_url = f"http://127.0.0.1:{port}/hub/api"
    hub.hub.url = f"http://127.0.0.1:{port}/hub/"
    return runner


async def amain(spec: dict[str, Any]) -> dict[str, Any]:
    os.environ["KUBECONFIG"] = spec["kubeconfig"]
    kube_config.KUBE_CONFIG_DEFAULT_LOCATION = spec["kubeconfig"]
    set_runtime(None)
    hub = Hub_(spec)
    root = await hub_api_root(hub) if spec.get("real_servers") else None
    out = await PARTS[spec["part"]](hub, spec)
    if root is not None:
        await root.cleanup()
    out["process_cpu_s"] = time.process_time()
    out["imports_s"] = IMPORTED - STARTED
    return out


IMPORTED = time.perf_counter()


def main() -> int:
    # The spawners' warnings and errors (adopted creates, failed deletes) into the hub's log.
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    spec = json.loads(Path(sys.argv[1]).read_text())
    out = asyncio.run(amain(spec))
    Path(sys.argv[2]).write_text(json.dumps(out, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
