"""Spawn path: GPUKubeSpawner versus plain KubeSpawner, same run, same real cluster.

Both spawners run KubeSpawner 7's own start / stop code and its
kubernetes_asyncio client against the real Kubernetes control plane of the
test suite (``scripts/kube-testbed``: kube-apiserver, scheduler, controllers
and fake GPU nodes), as a ServiceAccount with z2jh's hub Role in a namespace
of their own. Requests are counted by the API server itself, from its audit
log, for that ServiceAccount only.

* ``KubeSpawner`` gets a static ``profile_list`` whose entries set exactly the
  pod fields gpulab would set for the same profiles (GPU resources, node
  selector, priority class, CPU/memory), derived from
  :func:`spawner.core.sharing.pod_gpu_spec` so the two are equivalent by
  construction;
* ``GPUKubeSpawner`` gets the same profiles as a gpulab catalog with one team,
  and in addition validates the request, reserves quota in the ledger,
  labels the pod and rebuilds the ledger from its pod reflector.

Spawns and stops run one after another (a spawn, then its stop), alternating
blocks of the two spawners so slow drift on a shared machine hits both. A
spawn's wall time includes the real scheduler binding the pod and the node
agent reporting it Running. Reported: wall time per spawn and per stop, API
requests per spawn+stop by verb, and the ratios GPUKubeSpawner / KubeSpawner.
The reflectors' list and watch requests (made at start and at every watch
restart, a per-process cost that grows with time, not with spawns) are
counted apart, per minute: each block stops all reflectors and starts its
spawner's own in a warm-up cycle that is not counted.

    .venv/bin/python benchmarks/spawn_path.py            # 100 spawns + stops each
    .venv/bin/python benchmarks/spawn_path.py --smoke    # 6 each
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import logging
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import yaml  # noqa: E402
from _common import percentile, table, write_result  # noqa: E402
from kubernetes_asyncio.config import kube_config  # noqa: E402
from kubespawner import KubeSpawner  # noqa: E402
from traitlets.config import Config  # noqa: E402

from spawner.core.catalog import catalog_from_dict  # noqa: E402
from spawner.core.priority import ALL_PRIORITY_CLASSES, effective_priority_class  # noqa: E402
from spawner.core.sharing import pod_gpu_spec  # noqa: E402
from spawner.kube.spawner import GPUKubeSpawner  # noqa: E402
from spawner.runtime import set_runtime  # noqa: E402
from tests.kube.bed.chart import Z2JH_HUB_RULES  # noqa: E402
from tests.kube.bed.pki import token_kubeconfig  # noqa: E402
from tests.kube.bed.testbed import Testbed, up  # noqa: E402

IMAGE = "quay.io/jupyter/base-notebook:2024-10-07"
TEAM = "bench"
CATALOG: dict[str, Any] = {
    "profiles": [
        {"slug": "cpu", "display_name": "CPU only", "gpus": 0},
        {"slug": "h100-quarter", "display_name": "0.25 x H100", "gpus": 0.25, "gpu_model": "H100-80GB"},
        {
            "slug": "h100-half",
            "display_name": "0.5 x H100",
            "gpus": 0.5,
            "gpu_model": "H100-80GB",
            "cpu": {"guarantee": 1, "limit": 4},
            "memory": {"guarantee": "8G", "limit": "16G"},
        },
        {"slug": "h100-1", "display_name": "1 x H100", "gpus": 1, "gpu_model": "H100-80GB"},
        {"slug": "h100-2", "display_name": "2 x H100", "gpus": 2, "gpu_model": "H100-80GB"},
    ],
    # A quota far above what the benchmark holds: admission is always allowed.
    "teams": [{"name": TEAM, "groups": ["bench"], "guarantee": 10000, "burst": 10000}],
    # 0.5 GPU = 2 of 4 time-slices: k-of-R requests need the device plugin's
    # failRequestsGreaterThanOne off (gpulab's default refuses them).
    "sharing": {"backend": "timeslice", "timeslice": {"replicas": 4, "fail_requests_greater_than_one": False}},
}
#: The profile every spawn asks for (fractional, so the sharing mapping runs).
PROFILE = "h100-half"
#: Requests the reflectors make (a list, then a watch, again at every watch restart):
#: a per-process cost that depends on time, not on the number of spawns.
REFLECTOR_VERBS = ("list", "watch")
#: The time-sliced test bed node is tainted as GPU nodes usually are.
TOLERATIONS = [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]


class User:
    """What a spawner reads from JupyterHub's User (as KubeSpawner's own tests build it)."""

    def __init__(self, name: str, groups: tuple[str, ...] = ()):
        self.name = name
        self.id = abs(hash(name)) % 10**6
        self.url = f"/user/{name}/"
        self.escaped_name = name
        self.groups = [type("Group", (), {"name": g})() for g in groups]


class Hub:
    public_host = ""
    url = "http://hub:8081/hub/"
    base_url = "/hub/"
    api_url = "http://hub:8081/hub/api"


def static_profile_list() -> list[dict[str, Any]]:
    """KubeSpawner's ``profile_list`` that sets what gpulab sets, from the same catalog."""
    catalog = catalog_from_dict(CATALOG, "spawn_path.CATALOG")
    team = catalog.team(TEAM)
    out = []
    for p in catalog.profiles.values():
        spec = pod_gpu_spec(p, catalog.sharing, team)
        override: dict[str, Any] = {
            "priority_class_name": effective_priority_class(p.priority_class, False).name,
        }
        if spec.limits:
            override["extra_resource_limits"] = dict(spec.limits)
            override["extra_resource_guarantees"] = dict(spec.requests)
        if spec.node_selector:
            override["node_selector"] = dict(spec.node_selector)
        for trait, value in (
            ("cpu_guarantee", p.cpu_guarantee),
            ("cpu_limit", p.cpu_limit),
            ("mem_guarantee", p.mem_guarantee),
            ("mem_limit", p.mem_limit),
        ):
            if value is not None:
                override[trait] = value
        out.append(
            {
                "slug": p.slug,
                "display_name": p.display_name,
                "description": p.description,
                "kubespawner_override": override,
            }
        )
    return out


def make_config(namespace: str) -> Config:
    c = Config()
    c.GPULab.teams = [{**t, "namespace": namespace} for t in CATALOG["teams"]]
    c.GPULab.profiles = CATALOG["profiles"]
    c.GPULab.sharing = CATALOG["sharing"]
    c.KubeSpawner.namespace = namespace
    c.KubeSpawner.image = IMAGE
    c.KubeSpawner.start_timeout = 60
    c.KubeSpawner.delete_grace_period = 1
    c.KubeSpawner.tolerations = TOLERATIONS
    return c


class Audit:
    """The API server's own count of one ServiceAccount's requests (its audit log)."""

    def __init__(self, tb: Testbed, username: str):
        self.tb = tb
        self.username = username
        self.offset = tb.audit_offset()

    def take(self) -> collections.Counter:
        """Requests since the last call, by (verb, resource, subresource)."""
        events = self.tb.audit_events(self.offset, self.username)
        self.offset = self.tb.audit_offset()
        out: collections.Counter = collections.Counter()
        for e in events:
            ref = e.get("objectRef") or {}
            out[(e["verb"], ref.get("resource", ""), ref.get("subresource", ""))] += 1
        return out


class Bench:
    def __init__(self, tb: Testbed, namespace: str, username: str, static_profiles: list[dict[str, Any]]):
        self.tb = tb
        self.namespace = namespace
        self.audit = Audit(tb, username)
        self.config = make_config(namespace)
        self.static_profiles = static_profiles
        self.results: dict[str, dict[str, Any]] = {
            name: {
                "spawns": 0,
                "start_s": [],
                "stop_s": [],
                "requests": collections.Counter(),
                "pods_created": 0,
                "gpu_labelled_pods": 0,
                "reflector_requests": 0,
                "block_s": 0.0,
                "reflectors": [],
            }
            for name in ("KubeSpawner", "GPUKubeSpawner")
        }

    def make(self, name: str, user: str) -> KubeSpawner:
        orm_spawner = type("ORMSpawner", (), {"name": "", "server": None, "user_options": {}})()
        if name == "GPUKubeSpawner":
            s = GPUKubeSpawner(config=self.config, user=User(user, ("bench",)), hub=Hub(), orm_spawner=orm_spawner)
            s.user_options = {"team": TEAM, "profile": PROFILE}
        else:
            s = KubeSpawner(config=self.config, user=User(user), hub=Hub(), orm_spawner=orm_spawner)
            s.profile_list = self.static_profiles
            s.user_options = {"profile": PROFILE}
        s.api_token = "token-" + user
        return s

    async def cycle(self, name: str, user: str, record: bool) -> None:
        s = self.make(name, user)
        self.audit.take()
        t0 = time.perf_counter()
        await s.start()
        t1 = time.perf_counter()
        pod = self.tb.request("GET", f"/api/v1/namespaces/{self.namespace}/pods/{s.pod_name}")
        await s.stop()
        t2 = time.perf_counter()
        requests = self.audit.take()
        if not record:
            return
        r = self.results[name]
        r["spawns"] += 1
        r["start_s"].append(t1 - t0)
        r["stop_s"].append(t2 - t1)
        for (verb, resource, sub), n in requests.items():
            if verb not in REFLECTOR_VERBS:
                r["requests"][verb] += n
            if verb == "create" and resource == "pods" and not sub:
                r["pods_created"] += n
        labels = (pod or {}).get("metadata", {}).get("labels", {})
        r["gpu_labelled_pods"] += "gpulab.io/gpu-milli" in labels
        limits = (pod or {}).get("spec", {}).get("containers", [{}])[0].get("resources", {}).get("limits", {})
        r.setdefault("pod_gpu_limits", dict(limits))


def reflector_requests(events: list[dict[str, Any]]) -> int:
    return sum(1 for e in events if e["verb"] in REFLECTOR_VERBS)


async def run(spawns: int, blocks: int, warmup: int) -> dict[str, Any]:
    tb = up()
    suffix = os.urandom(3).hex()
    namespace = f"spawn-bench-{suffix}"
    tb.request("POST", "/api/v1/namespaces", {"metadata": {"name": namespace}})
    for _ in range(300):  # pods are refused until the ServiceAccount controller made "default"
        try:
            tb.request("GET", f"/api/v1/namespaces/{namespace}/serviceaccounts/default")
            break
        except Exception:
            await asyncio.sleep(0.1)
    tb.request("POST", f"/api/v1/namespaces/{namespace}/serviceaccounts", {"metadata": {"name": "hub"}})
    tb.request(
        "POST",
        f"/apis/rbac.authorization.k8s.io/v1/namespaces/{namespace}/roles",
        {"metadata": {"name": "hub"}, "rules": Z2JH_HUB_RULES},
    )
    tb.request(
        "POST",
        f"/apis/rbac.authorization.k8s.io/v1/namespaces/{namespace}/rolebindings",
        {
            "metadata": {"name": "hub"},
            "subjects": [{"kind": "ServiceAccount", "name": "hub", "namespace": namespace}],
            "roleRef": {"kind": "Role", "name": "hub", "apiGroup": "rbac.authorization.k8s.io"},
        },
    )
    token = tb.request(
        "POST",
        f"/api/v1/namespaces/{namespace}/serviceaccounts/hub/token",
        {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": {"expirationSeconds": 7200}},
    )["status"]["token"]
    # The pods name gpulab's PriorityClasses (the chart makes them; without the
    # chart, the benchmark does, and removes them again).
    created_classes = []
    for pc in ALL_PRIORITY_CLASSES:
        try:
            tb.request(
                "POST",
                "/apis/scheduling.k8s.io/v1/priorityclasses",
                {
                    "metadata": {"name": pc.name},
                    "value": pc.value,
                    "preemptionPolicy": pc.preemption_policy,
                    "description": pc.description,
                },
            )
            created_classes.append(pc.name)
        except Exception as e:
            if "409" not in str(e):
                raise
    tmp = tempfile.TemporaryDirectory(prefix="gpulab-spawn-bench-")
    kubeconfig = Path(tmp.name) / "kubeconfig"
    kubeconfig.write_text(yaml.safe_dump(token_kubeconfig(tb.server, tb.ca_file, token, namespace)))
    os.environ["KUBECONFIG"] = str(kubeconfig)
    # kubernetes_asyncio reads $KUBECONFIG once, at import: point its default there too.
    kube_config.KUBE_CONFIG_DEFAULT_LOCATION = str(kubeconfig)
    set_runtime(None)
    username = f"system:serviceaccount:{namespace}:hub"
    bench = Bench(tb, namespace, username, static_profile_list())
    wall_started = time.perf_counter()
    try:
        per_block = [spawns // blocks + (1 if b < spawns % blocks else 0) for b in range(blocks)]
        n = 0
        for b, size in enumerate(per_block):
            order = ("KubeSpawner", "GPUKubeSpawner") if b % 2 == 0 else ("GPUKubeSpawner", "KubeSpawner")
            for name in order:
                # Each block starts its spawner's own reflectors (warm-up, not counted),
                # so the reflectors' list/watch requests in the block are that spawner's.
                await KubeSpawner._stop_all_reflectors()
                for i in range(warmup):
                    await bench.cycle(name, f"warm-{b}-{name.lower()}-{i}", record=False)
                r = bench.results[name]
                r["reflectors"] = sorted("/".join(str(x) for x in key) for key in KubeSpawner.reflectors)
                offset = tb.audit_offset()
                t0 = time.perf_counter()
                for _ in range(size):
                    await bench.cycle(name, f"user-{n:04d}", record=True)
                    n += 1
                r["block_s"] += time.perf_counter() - t0
                # Watches are logged when they end: stop the block's reflectors first.
                await KubeSpawner._stop_all_reflectors()
                await asyncio.sleep(0.5)
                r["reflector_requests"] += reflector_requests(tb.audit_events(offset, username))
        leftover = len(tb.request("GET", f"/api/v1/namespaces/{namespace}/pods")["items"])
    finally:
        await KubeSpawner._stop_all_reflectors()
        set_runtime(None)
        tb.request("DELETE", f"/api/v1/namespaces/{namespace}")
        for name in created_classes:
            tb.request("DELETE", f"/apis/scheduling.k8s.io/v1/priorityclasses/{name}")
        tmp.cleanup()
    rows = {}
    for name, r in bench.results.items():
        start_s, stop_s = sorted(r["start_s"]), sorted(r["stop_s"])
        total = sum(r["requests"].values())
        rows[name] = {
            "spawns": r["spawns"],
            "wall_s": sum(start_s) + sum(stop_s),
            "start_p50_s": percentile(start_s, 50),
            "start_p99_s": percentile(start_s, 99),
            "stop_p50_s": percentile(stop_s, 50),
            "stop_p99_s": percentile(stop_s, 99),
            "requests_total": total,
            "requests_per_spawn": total / r["spawns"] if r["spawns"] else float("nan"),
            "requests_by_verb_per_spawn": {v: c / r["spawns"] for v, c in sorted(r["requests"].items())},
            "reflectors": r["reflectors"],
            "reflector_requests": r["reflector_requests"],
            "reflector_requests_per_min": r["reflector_requests"] / (r["block_s"] / 60) if r["block_s"] else 0.0,
            "pods_created": r["pods_created"],
            "gpu_labelled_pods": r["gpu_labelled_pods"],
            "pod_gpu_limits": r.get("pod_gpu_limits", {}),
        }
    k, g = rows["KubeSpawner"], rows["GPUKubeSpawner"]
    return {
        "rows": rows,
        "ratios": {
            "wall_time": g["wall_s"] / k["wall_s"],
            "start_p50": g["start_p50_s"] / k["start_p50_s"],
            "stop_p50": g["stop_p50_s"] / k["stop_p50_s"],
            "requests_per_spawn": g["requests_per_spawn"] / k["requests_per_spawn"],
            "extra_requests_per_spawn": g["requests_per_spawn"] - k["requests_per_spawn"],
            "reflector_requests_per_min": g["reflector_requests_per_min"] / k["reflector_requests_per_min"]
            if k["reflector_requests_per_min"]
            else float("nan"),
        },
        "leftover_pods": leftover,
        "kubernetes": tb.versions.get("kubernetes", ""),
        "elapsed_s": time.perf_counter() - wall_started,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--smoke", action="store_true", help="6 spawns each, a few seconds (used by the tests)")
    ap.add_argument("--spawns", type=int, help="spawn+stop cycles per spawner (default 200)")
    ap.add_argument("--blocks", type=int, help="alternating blocks per spawner (default 4)")
    ap.add_argument("--out", help="directory for the JSON result (default benchmarks/results)")
    args = ap.parse_args(argv)
    spawns = args.spawns or (6 if args.smoke else 100)
    blocks = args.blocks or (2 if args.smoke else 4)
    warmup = 1
    logging.basicConfig(level=logging.WARNING)

    result = asyncio.run(run(spawns, blocks, warmup))
    rows = result["rows"]
    verbs = sorted({v for r in rows.values() for v in r["requests_by_verb_per_spawn"]})
    print(
        table(
            [
                "spawner",
                "spawns",
                "wall s",
                "start p50 s",
                "start p99 s",
                "stop p50 s",
                "stop p99 s",
                "API requests / spawn+stop",
                *[f"{v} / spawn" for v in verbs],
                "reflectors",
                "reflector list+watch / min",
            ],
            [
                [
                    name,
                    r["spawns"],
                    r["wall_s"],
                    r["start_p50_s"],
                    r["start_p99_s"],
                    r["stop_p50_s"],
                    r["stop_p99_s"],
                    r["requests_per_spawn"],
                    *[r["requests_by_verb_per_spawn"].get(v, 0.0) for v in verbs],
                    ", ".join(r["reflectors"]),
                    r["reflector_requests_per_min"],
                ]
                for name, r in rows.items()
            ],
            title=f"Spawn path: {spawns} spawn+stop cycles each on the real test bed "
            f"(Kubernetes {result['kubernetes']}; requests counted by the API server's audit log)",
        )
    )
    q = result["ratios"]
    print()
    print(
        table(
            ["measure", "GPUKubeSpawner / KubeSpawner"],
            [
                ["wall time", q["wall_time"]],
                ["start p50", q["start_p50"]],
                ["stop p50", q["stop_p50"]],
                ["API requests per spawn+stop", q["requests_per_spawn"]],
                ["extra API requests per spawn+stop", f"{q['extra_requests_per_spawn']:+.2f}"],
                ["reflector list+watch per minute (per process, not per spawn)", q["reflector_requests_per_min"]],
            ],
            title="Ratios",
        )
    )
    path = write_result(
        "spawn_path",
        {
            "smoke": args.smoke,
            "parameters": {
                "spawns": spawns,
                "blocks": blocks,
                "warmup": warmup,
                "profile": PROFILE,
                "catalog": CATALOG,
                "static_profile_list": static_profile_list(),
            },
            **result,
        },
        args.out,
    )
    print(f"\nwrote {path} in {result['elapsed_s']:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
