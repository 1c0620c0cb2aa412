"""GPUKubeSpawner's options, forms, manifests and ledger on the real control plane.

KubeSpawner's own start / poll / stop code and its kubernetes_asyncio client
talk to the test bed's kube-apiserver (scripts/kube-testbed) as the hub
ServiceAccount the gpulab chart binds; assertions are on the pod bodies the
API server received (its audit log records them) and on what it stores.
Nothing of gpulab is mocked: the catalog, ledger, policy and sharing code run
as in the hub. The spawners are built the way KubeSpawner's test suite builds
them, without a hub process (a user object with ``name``/``groups`` and a hub
object with its URLs). Pods that no scheduler of the test bed takes (KAI's,
HAMi's) are checked as the manifests KubeSpawner would send.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections import Counter

import kubernetes_validate
import pytest
import yaml
from kubespawner import KubeSpawner
from tornado.web import HTTPError
from traitlets.config import Config

from spawner.core import labels as gl
from spawner.core.catalog import catalog_from_dict
from spawner.kube.spawner import GPUKubeSpawner
from spawner.runtime import GPULabRuntime, get_runtime, set_runtime
from tests.support import REPO
from tests.support.catalogs import KUBE_SPAWNER
from tests.support.kube_spawner import K8S_VERSION, ClusterView, spawner_config, spawner_for


def ns(api: ClusterView, team: str) -> str:
    """The namespace the chart made for ``team`` in this run."""
    return api.release.team_ns(team)


def resources(pod: dict) -> dict:
    return pod["spec"]["containers"][0].get("resources", {})


def gpu_limits(pod: dict) -> dict:
    return {k: v for k, v in resources(pod).get("limits", {}).items() if k not in ("cpu", "memory")}


# --------------------------------------------------------------------------


async def test_start_poll_stop(api):
    s = spawner_for(spawner_config(api.release), "alice", {"team": "vision", "profile": "h100-half", "image": "base"})
    url = await s.start()
    assert re.fullmatch(r"http://127\.\d+\.\d+\.\d+:8888", url)  # the node agent's pod IP

    [pod] = api.created_pods(ns(api, "vision"))
    md, spec = pod["metadata"], pod["spec"]
    assert md["labels"][gl.TEAM] == "vision" and md["labels"][gl.PROFILE] == "h100-half"
    assert md["labels"][gl.GPU_MILLI] == "500" and md["labels"][gl.QUOTA] == "in-quota"
    assert md["labels"][gl.USER] == "alice" and md["labels"]["component"] == "singleuser-server"
    assert md["annotations"][gl.WORKLOAD_ANNOTATION] == "notebook:alice/"
    assert spec["priorityClassName"] == "gpulab-development"
    assert spec["nodeSelector"] == {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}
    assert resources(pod)["limits"]["nvidia.com/gpu.shared"] == "2"
    assert resources(pod)["requests"]["nvidia.com/gpu.shared"] == "2"
    # As the API server decoded them: canonical quantities.
    assert resources(pod)["limits"]["cpu"] == "4" and resources(pod)["requests"]["memory"] == "8G"
    assert spec["containers"][0]["image"] == "quay.io/jupyter/base-notebook:2024-10-07"
    env = {e["name"]: e.get("value") for e in spec["containers"][0]["env"]}
    assert env["GPULAB_GPU_MILLI"] == "500" and env["GPULAB_PREEMPTIBLE"] == "0"
    assert "CUDA_VISIBLE_DEVICES" not in env  # the device plugin decides on Kubernetes

    stored = api.get("pods", ns(api, "vision"), s.pod_name)
    assert stored["status"]["phase"] == "Running" and stored["metadata"]["uid"]
    assert await s.poll() is None
    ledger = get_runtime().ledger
    assert ledger.usage("vision").held_milli == 500
    assert ledger.get("notebook:alice/").state == "running"

    await s.stop()
    assert api.get("pods", ns(api, "vision"), s.pod_name) is None
    assert ledger.usage("vision").held_milli == 0
    assert await s.poll() == 1


@pytest.mark.parametrize(
    "backend,slug,check",
    [
        ("whole", "h100-1", lambda p: gpu_limits(p) == {"nvidia.com/gpu": "1"}),
        ("timeslice", "h100-half", lambda p: gpu_limits(p) == {"nvidia.com/gpu.shared": "2"}),
        ("mig", "h100-half", lambda p: gpu_limits(p) == {"nvidia.com/mig-4g.40gb": "1"}),
        (
            "hami",
            "h100-half",
            lambda p: (
                gpu_limits(p)
                == {"nvidia.com/gpu": "1", "nvidia.com/gpumem-percentage": "50", "nvidia.com/gpucores": "50"}
            ),
        ),
        (
            "kai",
            "h100-half",
            lambda p: (
                p["spec"]["schedulerName"] == "kai-scheduler"
                and p["metadata"]["annotations"]["gpu-fraction"] == "0.5"
                and p["metadata"]["labels"]["kai.scheduler/queue"] == "gpulab-vision"
                and "nvidia.com/gpu" not in json.dumps(resources(p))
            ),
        ),
    ],
)
async def test_backend_manifest_is_valid_kubernetes(api, backend, slug, check):
    catalog = {**KUBE_SPAWNER, "sharing": {**KUBE_SPAWNER["sharing"], "backend": backend}}
    s = spawner_for(spawner_config(api.release, catalog), "bob", {"team": "vision", "profile": slug})
    # The pod KubeSpawner would send (KAI's and HAMi's schedulers do not run in the
    # test bed, so these pods would wait forever); the scheduled backends are placed
    # on real nodes in tests/kube/test_kube_cluster_spawner.py.
    await s.load_user_options()
    pod = s.api.api_client.sanitize_for_serialization(await s.get_pod_manifest())
    assert check(pod), json.dumps(pod, indent=1)
    assert pod["metadata"]["labels"][gl.GPU_MILLI] == str(s.gpu_spec.effective_milli)
    # A valid v1 Pod (strict: no unknown fields), and the API server accepts it as is.
    assert kubernetes_validate.validate(pod, K8S_VERSION, strict=True)
    api.kube.request("POST", f"/api/v1/namespaces/{ns(api, 'vision')}/pods?dryRun=All&fieldValidation=Strict", pod)
    s._release_reservation()


async def test_whole_backend_refuses_fraction_before_creating_anything(api):
    catalog = {**KUBE_SPAWNER, "sharing": {"backend": "whole"}}
    s = spawner_for(spawner_config(api.release, catalog), "bob", {"team": "vision", "profile": "h100-half"})
    with pytest.raises(HTTPError) as e:
        await s.start()
    assert e.value.status_code == 403
    assert "gives whole GPUs only" in e.value.jupyterhub_message
    await s.stop()  # what the hub does after a failed start: no request needed
    assert api.count("create") == 0 and api.count("delete") == 0


async def test_timeslice_rounds_up_and_counts_the_rounded_size(api):
    s = spawner_for(spawner_config(api.release), "bob", {"team": "vision", "profile": "h100-third"})
    await s.start()
    [pod] = api.created_pods()
    assert resources(pod)["limits"] == {"nvidia.com/gpu.shared": "2"}  # 0.3 -> 2/4
    assert pod["metadata"]["labels"][gl.GPU_MILLI] == "500"
    assert get_runtime().ledger.usage("vision").held_milli == 500
    # The hub's saved state says what was granted (the idle culler reads it), not what was asked.
    assert s.get_state()["gpulab"] == {"team": "vision", "profile": "h100-third", "milli": 500, "over_quota": False}
    await s.stop()
    s.clear_state()
    assert "gpulab" not in s.get_state()


async def test_100_concurrent_spawns_guarantee_4_burst_6(api):
    users = [f"user{i:03d}" for i in range(100)]
    spawners = [spawner_for(spawner_config(api.release), u, {"profile": "h100-half"}, groups=("crowd",)) for u in users]
    results = await asyncio.gather(*(s.start() for s in spawners), return_exceptions=True)

    started = [s for s, r in zip(spawners, results, strict=True) if isinstance(r, str)]
    refused = [r for r in results if not isinstance(r, str)]
    assert len(started) == 12
    assert len(refused) == 88
    assert all(isinstance(r, HTTPError) and r.status_code == 403 for r in refused), refused[:3]
    assert {r.jupyterhub_message for r in refused} == {
        "team crowd holds 6 of its 6 GPU burst limit; this request needs 0.5"
    }

    pods = api.created_pods(ns(api, "crowd"))
    assert len(pods) == 12 and api.count("create", "pods") == 12
    quota = Counter(p["metadata"]["labels"][gl.QUOTA] for p in pods)
    assert quota == {"in-quota": 8, "over-quota": 4}
    for p in pods:
        over = p["metadata"]["labels"][gl.QUOTA] == "over-quota"
        assert p["spec"]["priorityClassName"] == ("gpulab-over-quota" if over else "gpulab-development")
    running = api.list("pods", ns(api, "crowd"), gl.SELECTOR, "status.phase=Running")
    assert len(running) == 12
    u = get_runtime().ledger.usage("crowd")
    assert (u.held_milli, u.in_quota_milli, u.over_quota_milli) == (6000, 4000, 2000)

    await asyncio.gather(*(s.stop() for s in spawners))
    assert api.list("pods", ns(api, "crowd")) == []
    assert get_runtime().ledger.usage("crowd").held_milli == 0


async def test_restart_rebuilds_the_same_ledger_from_the_cluster(api):
    plan = [
        ("alice", "vision", "h100-1"),
        ("bob", "vision", "h100-half"),
        ("alice", "nlp", "h100-1"),
        ("carol", "nlp", "h100-1"),
    ]
    for user, team, slug in plan:
        s = spawner_for(spawner_config(api.release), user, {"team": team, "profile": slug}, name=team)
        await s.start()
    before = sorted(get_runtime().ledger.workloads(), key=lambda w: w.key)
    # by key: alice/nlp, alice/vision, bob/vision, carol/nlp (nlp's guarantee is 1 GPU)
    assert [w.over_quota for w in before] == [False, False, False, True]

    # "Restart": reflectors gone, a fresh runtime from the same config, a new spawner.
    await KubeSpawner._stop_all_reflectors()
    set_runtime(None)
    fresh = spawner_for(spawner_config(api.release), "dave", {})
    assert get_runtime(parent=fresh).ledger.workloads() == []
    await fresh.refresh_ledger()
    after = sorted(get_runtime().ledger.workloads(), key=lambda w: w.key)
    assert after == before
    # Rebuilding again (e.g. on every spawn) never double counts.
    await fresh.refresh_ledger()
    assert get_runtime().ledger.usage("nlp").held_milli == 2000

    # A spawn still starting is kept; a pod deleted behind the hub's back is dropped.
    get_runtime().ledger.reserve("notebook:eve/", "vision", "eve", 250)
    api.delete("pods", ns(api, "nlp"), "jupyter-carol--nlp", grace=0)
    for _ in range(100):
        await fresh.refresh_ledger()
        if get_runtime().ledger.usage("nlp").held_milli == 1000:
            break
        await asyncio.sleep(0.02)
    usage = get_runtime().ledger.usage("nlp")
    assert usage.held_milli == 1000 and get_runtime().ledger.get("notebook:carol/nlp") is None
    assert get_runtime().ledger.get("notebook:eve/").state == "reserved"
    assert get_runtime().ledger.usage("vision").held_milli == 1750


async def test_stale_pod_of_the_same_name_is_replaced_and_the_reservation_kept(api):
    api.create(
        "pods",
        ns(api, "vision"),
        {
            "metadata": {"name": "jupyter-bob", "labels": {"component": "singleuser-server"}},
            "spec": {"containers": [{"name": "notebook", "image": "old"}]},
        },
    )
    s = spawner_for(spawner_config(api.release), "bob", {"team": "vision", "profile": "h100-half"})
    await s.start()  # KubeSpawner: 409 Conflict -> stop(now=True) deletes the old pod -> create again
    assert api.count("create", "pods") == 2 and api.count("delete", "pods") >= 1
    assert api.get("pods", ns(api, "vision"), "jupyter-bob")["metadata"]["labels"][gl.GPU_MILLI] == "500"
    assert get_runtime().ledger.usage("vision").held_milli == 500
    await s.stop()
    assert get_runtime().ledger.usage("vision").held_milli == 0


async def test_resource_quota_refusal_becomes_a_clear_message(api):
    api.create(
        "resourcequotas",
        ns(api, "vision"),
        {"metadata": {"name": "gpu-quota"}, "spec": {"hard": {"requests.nvidia.com/gpu.shared": "2"}}},
    )
    first = spawner_for(spawner_config(api.release), "alice", {"team": "vision", "profile": "h100-half"})
    await first.start()
    second = spawner_for(spawner_config(api.release), "bob", {"team": "vision", "profile": "h100-quarter"})
    with pytest.raises(HTTPError) as e:
        await second.start()
    assert e.value.status_code == 403
    msg = e.value.jupyterhub_message
    assert f"namespace {ns(api, 'vision')} is at its ResourceQuota 'gpu-quota'" in msg
    assert "requests.nvidia.com/gpu.shared=2" in msg and "asks for requests.nvidia.com/gpu.shared=1" in msg
    assert len(api.created_pods()) == 2 and len(api.list("pods", ns(api, "vision"))) == 1
    assert get_runtime().ledger.usage("vision").held_milli == 500  # the refused one was released
    await second.stop()
    await first.stop()


async def test_no_extra_api_requests_per_spawn_compared_with_kubespawner(api):
    config = spawner_config(api.release)
    # Reflectors re-list on a timer, independent of spawns: keep that out of the window.
    config.ResourceReflector.timeout_seconds = 300
    config.ResourceReflector.restart_seconds = 300
    vision = ns(api, "vision")

    async def one_cycle(cls, user, options, name=""):
        s = spawner_for(config, user, options, cls=cls, name=name)
        if cls is KubeSpawner:
            s.namespace = vision
        await s.start()
        await s.stop()

    async def requests_for(cls, user, options):
        await one_cycle(cls, user, options, name="warm")  # reflectors start once per process
        before = api.requests()
        await one_cycle(cls, user, options)
        diff = api.requests()
        diff.subtract(before)
        return Counter(
            {(verb, path.rsplit("/", 1)[0] if verb == "delete" else path): n for (verb, path), n in diff.items() if n}
        )

    # As the API server counted them (its audit log).
    plain = await requests_for(KubeSpawner, "alice", {})
    ours = await requests_for(GPUKubeSpawner, "bob", {"team": "vision", "profile": "h100-half"})
    assert (
        ours
        == plain
        == Counter(
            {("create", f"/api/v1/namespaces/{vision}/pods"): 1, ("delete", f"/api/v1/namespaces/{vision}/pods"): 1}
        )
    )


async def test_odd_user_names_reach_labels_escaped_and_annotations_verbatim(api):
    name = "Dr. {Ünïcode} <o'brien>"
    catalog = {
        **KUBE_SPAWNER,
        "profiles": [
            {**p, "description": "<img src=x onerror=alert(1)>"} if p["slug"] == "h100-quarter" else p
            for p in KUBE_SPAWNER["profiles"]
        ],
    }
    s = spawner_for(spawner_config(api.release, catalog), name, {"profile": "h100-quarter"}, groups=("crowd",))
    await s.start()
    [pod] = api.created_pods(ns(api, "crowd"))
    assert pod["metadata"]["annotations"][gl.USER_ANNOTATION] == name
    assert pod["metadata"]["labels"][gl.USER] == gl.label_value(name)
    assert re.fullmatch(r"[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?", pod["metadata"]["labels"][gl.USER])
    assert get_runtime().ledger.get(f"notebook:{name}/").user == name
    html = await s._render_options_form_dynamically(s)
    assert "<img" not in html and "&lt;img src=x onerror=alert(1)&gt;" in html
    await s.stop()
    assert get_runtime().ledger.usage("crowd").held_milli == 0


async def test_catalog_rejects_bad_sharing_options():
    with pytest.raises(ValueError) as e:
        catalog_from_dict({**KUBE_SPAWNER, "sharing": {"backend": "timeslice", "timeslice": {"replicas": "four"}}})
    assert "sharing.timeslice.replicas: expected a whole number of replicas" in str(e.value)
    runtime = GPULabRuntime(catalog_from_dict(KUBE_SPAWNER))
    assert runtime.catalog.sharing["timeslice"]["replicas"] == 4


# --------------------------------------------------------------------------
# docs/kubernetes.md shows what each backend produces; generated here, checked here.

DOC_CATALOG = {
    "profiles": [{"slug": "h100-half", "display_name": "0.5 × H100", "gpus": 0.5, "gpu_model": "H100-80GB"}],
    "teams": [{"name": "vision", "users": ["alice"], "guarantee": 2, "burst": 3, "namespace": "team-vision"}],
}
DOCS = REPO / "docs" / "kubernetes.md"
_GPU_KEYS = ("gpulab.io/", "kai.scheduler/", "gpu-fraction", "component")


def pod_excerpt(pod: dict) -> dict:
    """The parts of a pod that gpulab sets (the rest is KubeSpawner's usual pod)."""
    md, spec = pod["metadata"], pod["spec"]
    keep = lambda d: {k: v for k, v in sorted((d or {}).items()) if k.startswith(_GPU_KEYS)}  # noqa: E731
    out = {
        "metadata": {
            "namespace": "team-vision",
            "labels": keep(md.get("labels")),
            "annotations": keep(md.get("annotations")),
        },
        "spec": {"priorityClassName": spec.get("priorityClassName")},
    }
    if spec.get("schedulerName"):
        out["spec"]["schedulerName"] = spec["schedulerName"]
    out["spec"]["nodeSelector"] = spec.get("nodeSelector")
    res = spec["containers"][0].get("resources") or {}
    out["spec"]["containers"] = [
        {
            "name": "notebook",
            "resources": {k: v for k, v in (("requests", res.get("requests")), ("limits", res.get("limits"))) if v},
        }
    ]
    if gl.SPAWN_ATTEMPT_ANNOTATION in out["metadata"]["annotations"]:
        out["metadata"]["annotations"][gl.SPAWN_ATTEMPT_ANNOTATION] = "<a new token per start>"
    if not out["metadata"]["annotations"]:
        del out["metadata"]["annotations"]
    return out


async def backend_examples(api: ClusterView) -> dict[str, str]:
    """backend -> YAML of the pod excerpt (or the refusal) for a 0.5-GPU H100-80GB profile."""
    out = {}
    for backend in ("whole", "timeslice", "mig", "hami", "kai"):
        catalog = {**DOC_CATALOG, "sharing": {"backend": backend}}
        s = spawner_for(spawner_config(api.release, catalog), "alice", {"team": "vision", "profile": "h100-half"})
        try:
            await s.load_user_options()
        except HTTPError as e:
            out[backend] = f"# refused, nothing created:\n# {e.jupyterhub_message}\n"
        else:
            pod = s.api.api_client.sanitize_for_serialization(await s.get_pod_manifest())
            assert kubernetes_validate.validate(pod, K8S_VERSION, strict=True)
            out[backend] = yaml.safe_dump(pod_excerpt(pod), sort_keys=False, allow_unicode=True)
            s._release_reservation()
        await KubeSpawner._stop_all_reflectors()
        set_runtime(None)
    return out


async def test_docs_show_the_objects_each_backend_produces(api):
    import os

    examples = await backend_examples(api)
    if os.environ.get("GPULAB_REGENERATE_DOCS"):
        regenerate_docs(examples)
    docs = DOCS.read_text()
    for backend, text in examples.items():
        assert f"```yaml\n{text}```" in docs, (
            f"docs/kubernetes.md is stale for {backend}; "
            "regenerate with: GPULAB_REGENERATE_DOCS=1 .venv/bin/python -m pytest -k test_docs_show tests/kube/test_kube_spawner.py"
        )


def regenerate_docs(examples: dict[str, str]) -> None:
    """Write the examples into docs/kubernetes.md (a maintenance step, asked for by env var)."""
    text = DOCS.read_text()
    for backend, block in examples.items():
        start = text.index(f"<!-- {backend}-example -->")
        end = text.index("<!-- /example -->", start)
        text = text[:start] + f"<!-- {backend}-example -->\n```yaml\n{block}```\n" + text[end:]
    DOCS.write_text(text)


def test_docs_hub_configs_load(tmp_path):
    """Every jupyterhub_config.py example in docs/kubernetes.md loads with the docs' catalog."""
    from spawner.runtime import GPULab

    docs = DOCS.read_text()
    catalog_yaml = re.search(r"```yaml\n(teams:\n.*?)```", docs, re.S).group(1)
    (tmp_path / "catalog.yaml").write_text(catalog_yaml)
    blocks = [b for b in re.findall(r"```python\n(.*?)```", docs, re.S) if "c.GPULab.sharing" in b]
    assert len(blocks) == 5
    for block in blocks:
        c = Config()
        exec(compile(block, "docs/kubernetes.md", "exec"), {"c": c})
        assert c.JupyterHub.spawner_class == "gpu-kube"
        c.GPULab.catalog_file = str(tmp_path / "catalog.yaml")
        catalog = GPULab(config=c).load_catalog()
        assert catalog.sharing["backend"] == c.GPULab.sharing["backend"]
        assert catalog.teams["vision"].namespace == "team-vision"
