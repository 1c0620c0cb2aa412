"""A real JupyterHub process with GPUKubeSpawner on the real control plane.

The hub (tests/support/hub.py) is configured the way Zero to JupyterHub
configures it: z2jh's chart defaults, the overlay helm/values-jupyterhub.yaml
and the test's values, applied by z2jh's hub config
(tests/kube/bed/z2jh_hub_config.py), extraConfig last. It talks to the test bed's
kube-apiserver with the hub ServiceAccount's token, bound only by the gpulab
chart's Roles and z2jh's. The scheduler binds the pod to a fake GPU node;
the node agent runs the pod's ``jupyterhub-singleuser`` as a local process
on the pod IP, so the hub, its proxy and the user's browser session reach a
real single-user server.
"""

from __future__ import annotations

import json
import re

import requests
import yaml

from tests.kube.bed.chart import Release
from tests.kube.bed.cluster import Cluster
from tests.kube.bed.z2jh_hub_config import bed_hub
from tests.support.hub import RunningHub
from tests.support.kube_spawner import chart_team


def kube_hub(tmp_path, release: Release, site: dict | None = None) -> RunningHub:
    """A hub configured as Zero to JupyterHub configures it: its chart defaults, the
    overlay helm/values-jupyterhub.yaml and the test's values, through z2jh's hub
    config (tests/kube/bed/z2jh_hub_config.py)."""
    return bed_hub(tmp_path / "hub", release.hub_namespace, release.hub_kubeconfig, release.catalog_yaml(), site)


def test_spawn_through_the_hub_reaches_the_server_and_stop_frees_the_gpu(tmp_path, release: Release, kube: Cluster):
    vision = chart_team(release, "vision")
    ns = release.team_ns(vision)
    hub = kube_hub(tmp_path, release)
    try:
        hub.start()
        session = hub.login("alice")
        page = hub.spawn_page(session).text
        assert f"3 of 3 GPUs free for team {vision}" in page, page[-3000:]
        r = hub.post_spawn(session, "alice", {"profile": f"{vision}:h100-half"})
        assert r.status_code == 302, r.text[-2000:]
        server = hub.wait_server("alice", timeout=120)
        assert server["url"] == "/user/alice/"
        pods = kube.pods(ns, "gpulab.io/kind=notebook")
        assert len(pods) == 1 and pods[0]["spec"]["nodeName"] == "gpu-h100-timeslice"
        assert pods[0]["status"]["phase"] == "Running"
        # Through the proxy to the single-user server, as the logged-in browser would
        # (the hub's OAuth redirects included).
        r = session.get(hub.url + "/user/alice/lab", timeout=60)
        assert r.status_code == 200 and "JupyterLab" in r.text, r.text[:500]
        assert r.url == hub.url + "/user/alice/lab"
        r = session.get(
            hub.url + "/user/alice/api/status",
            timeout=30,
            headers={"X-XSRFToken": session.cookies.get("_xsrf", path="/user/alice/") or ""},
        )
        assert r.status_code == 200 and "started" in r.json(), r.text[:500]
        held = hub.me("alice")["holdings"]
        assert [(h["team"], h["gpu_milli"], h["state"]) for h in held] == [(vision, 500, "running")]

        # A hub restart: the ledger comes back from the labelled pod.
        hub.restart()
        held = hub.me("alice")["holdings"]
        assert [(h["team"], h["gpu_milli"], h["state"]) for h in held] == [(vision, 500, "running")]
        assert hub.wait_server("alice")["ready"]

        r = hub.api("DELETE", "/users/alice/server")
        assert r.status_code in (202, 204), r.text
        hub.wait_server("alice", ready=False, timeout=60)
        kube.wait(lambda: not kube.pods(ns, "gpulab.io/kind=notebook"), "the pod to be deleted", 60)
        assert hub.me("alice")["holdings"] == []
    finally:
        hub.close()


def test_the_spawn_form_renders_for_a_user_in_two_teams_under_z2jh_config(tmp_path, release: Release, kube: Cluster):
    """z2jh sets c.KubeSpawner.profile_list = [] (its default, not null); that overrode
    GPUKubeSpawner's catalog profile list, so the page had no form and JupyterHub started
    the server "with default options", refused with "choose a profile"."""
    vision, nlp = chart_team(release, "vision"), chart_team(release, "nlp")
    hub = kube_hub(tmp_path, release)
    try:
        hub.start()
        session = hub.login("alice")  # in vision and in nlp
        r = hub.spawn_page(session)
        assert r.status_code == 200 and r.url == hub.url + "/hub/spawn", (r.status_code, r.url)
        page = r.content.decode()  # utf-8 (the page's meta charset; the header names none)
        assert 'id="spawn_form"' in page, page[-3000:]
        for name in (vision, nlp):
            assert f'value="{name}:h100-half"' in page and f'value="{name}:cpu"' in page
            assert f"— team {name}" in page, re.findall(r"<h3>.*?</h3>", page)
        assert f"3 of 3 GPUs free for team {vision}" in page and f"2 of 2 GPUs free for team {nlp}" in page
        assert "choose a profile" not in page
        assert hub.api("GET", "/users/alice").json()["servers"] == {}  # the page started nothing
        # A choice from that form starts the server in the team's namespace, bound by
        # z2jh's user-scheduler (c.KubeSpawner.scheduler_name from scheduling.userScheduler).
        r = hub.post_spawn(session, "alice", {"profile": f"{nlp}:h100-half"})
        assert r.status_code == 302, r.text[-2000:]
        hub.wait_server("alice", timeout=120)
        (pod,) = kube.pods(release.team_ns(nlp), "gpulab.io/kind=notebook")
        assert pod["spec"]["schedulerName"] == "jhub-user-scheduler"
        assert pod["spec"]["nodeName"] == "gpu-h100-timeslice" and pod["status"]["phase"] == "Running"
        assert pod["metadata"]["labels"]["hub.jupyter.org/network-access-hub"] == "true"  # z2jh's extraLabels
        r = hub.api("DELETE", "/users/alice/server")
        assert r.status_code in (202, 204), r.text
        hub.wait_server("alice", ready=False, timeout=60)
    finally:
        hub.close()


def server_env(hub: RunningHub, user: str) -> dict[str, str]:
    """The environment of ``user``'s single-user server process (the node agent started it)."""
    from pathlib import Path

    from tests.support.hub import process_env

    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            env = process_env(int(entry.name))
        except OSError:
            continue
        if env.get("JUPYTERHUB_USER") == user and f":{hub.hub_port}/" in env.get("JUPYTERHUB_API_URL", ""):
            return env
    raise AssertionError(f"no server process of {user} for the hub on port {hub.hub_port}")


def test_a_server_without_a_gpu_sees_none_and_a_gpu_server_sees_the_device_it_got(
    tmp_path, release: Release, kube: Cluster
):
    """CUDA images set NVIDIA_VISIBLE_DEVICES=all, so on a GPU node with the nvidia runtime a
    "CPU only" server saw every GPU of the node. Without a GPU it is now ``void``; with
    one it is the device the node gave the pod, as the kubelet's pod-resources view says."""
    vision = chart_team(release, "vision")
    ns = release.team_ns(vision)
    hub = kube_hub(tmp_path, release)
    try:
        hub.start()
        session = hub.login("alice")
        for choice in ("cpu", "h100-half"):
            r = hub.post_spawn(session, "alice", {"profile": f"{vision}:{choice}"})
            assert r.status_code == 302, r.text[-2000:]
            hub.wait_server("alice", timeout=120)
            (pod,) = kube.pods(ns, "gpulab.io/kind=notebook")
            env = server_env(hub, "alice")
            if choice == "cpu":
                assert env["NVIDIA_VISIBLE_DEVICES"] == "void"
            else:
                node = pod["spec"]["nodeName"]
                (held,) = [p for p in kube.tb.pod_resources(node) if p["name"] == pod["metadata"]["name"]]
                (devices,) = [d["deviceIds"] for d in held["containers"][0]["devices"]]
                # 0.5 GPU is 2 of 4 time-slices here; each id is "<GPU uuid>::<replica>".
                assert held["namespace"] == ns and len(devices) == 2
                assert all(d.startswith("GPU-") and "::" in d for d in devices)
                gpus = sorted({d.split("::")[0] for d in devices})
                assert sorted(env["NVIDIA_VISIBLE_DEVICES"].split(",")) == gpus  # the replicas' GPUs
            r = hub.api("DELETE", "/users/alice/server")
            assert r.status_code in (202, 204), r.text
            hub.wait_server("alice", ready=False, timeout=60)
            kube.wait(lambda: not kube.pods(ns, "gpulab.io/kind=notebook"), "the pod to be deleted", 60)
    finally:
        hub.close()


def test_the_progress_page_says_why_a_pod_waits(tmp_path, release: Release, kube: Cluster):
    nlp = chart_team(release, "nlp")
    hub = kube_hub(tmp_path, release)
    # A profile whose GPU model no node has: the pod stays Pending.
    catalog = yaml.safe_load(hub.catalog_path.read_text())
    catalog["profiles"].append(
        {"slug": "h200-1", "display_name": "1 × H200", "gpus": 1, "gpu_model": "H200-141GB", "sharing": "whole"}
    )
    hub.catalog_path.write_text(yaml.safe_dump(catalog))
    try:
        hub.start()
        session = hub.login("carol")
        # A server a moment ago: its pod's events ("Successfully assigned ... to <node>") live on
        # for an hour under the same pod name, and must not stand in for the new pod's. The hub
        # restarts in between (an upgrade): its events informer then starts with the new spawn,
        # while the spawn page already reads the progress.
        r = hub.post_spawn(session, "carol", {"profile": f"{nlp}:h100-half"})
        assert r.status_code == 302, r.text[-2000:]
        hub.wait_server("carol", timeout=120)
        hub.api("DELETE", "/users/carol/server")
        hub.wait_server("carol", ready=False, timeout=60)
        hub.restart()
        session = hub.login("carol")
        r = hub.post_spawn(session, "carol", {"profile": f"{nlp}:h200-1"})
        assert r.status_code == 302, r.text[-2000:]
        words = None
        messages: list[str] = []
        with session.get(
            hub.url + "/hub/api/users/carol/server/progress",
            stream=True,
            timeout=60,
            headers={"Referer": hub.url + "/hub/spawn-pending/carol"},
        ) as events:
            for line in events.iter_lines(decode_unicode=True):
                if line.startswith("data:"):
                    message = json.loads(line[5:]).get("message", "")
                    messages.append(message)
                    if "running now offers" in message:
                        words = message
                        break
        if words is None:  # the whole story in the captured output (an assertion message is cut short)
            print("progress messages:", *messages, sep="\n  ")
            print("pods:", json.dumps(kube.pods(release.team_ns(nlp), "gpulab.io/kind=notebook"), indent=1)[:6000])
            print("hub log:\n" + hub.log_tail(200))
        assert words is not None, messages
        assert not any("Successfully assigned" in m for m in messages), messages  # the last pod's event
        assert words.startswith(
            "None of the 7 nodes running now offers 1 × H200 (7 nodes with another GPU model or pool)."
        ), words
        pod = kube.pods(release.team_ns(nlp), "gpulab.io/kind=notebook")[0]
        assert pod["status"]["phase"] == "Pending"
        hub.api("DELETE", "/users/carol/server")
        hub.wait_server("carol", ready=False, timeout=60)
    finally:
        hub.close()


def test_the_hub_identity_has_only_the_charts_rights(release: Release, kube: Cluster):
    """What the hub's token may do: the chart's Roles and z2jh's, nothing cluster-wide."""
    import subprocess

    from tests.support import REPO

    kubectl = str(REPO / ".tools" / "bin" / "kubectl")
    ns = release.team_ns(chart_team(release, "vision"))

    def can(*args: str) -> str:
        return subprocess.run(
            [kubectl, "--kubeconfig", str(release.hub_kubeconfig), "auth", "can-i", *args],
            capture_output=True,
            text=True,
        ).stdout.strip()

    assert can("create", "pods", "-n", ns) == "yes"
    assert can("watch", "pods", "-n", ns) == "yes"
    assert can("create", "jobs.batch", "-n", ns) == "yes"
    assert can("get", "secrets", "-n", ns) == "no"
    assert can("create", "pods", "-n", "default") == "no"
    assert can("list", "nodes") == "no"
    assert can("list", "pods", "--all-namespaces") == "no"
    assert can("create", "resourcequotas", "-n", ns) == "no"
    assert can("create", "pods", "-n", release.hub_namespace) == "yes"  # z2jh's own hub Role
    # And a real request with that token is refused where the chart grants nothing.
    r = requests.get(
        f"{kube.server}/api/v1/namespaces/default/pods",
        verify=str(kube.tb.ca_file),
        timeout=10,
        headers={
            "Authorization": "Bearer " + yaml.safe_load(release.hub_kubeconfig.read_text())["users"][0]["user"]["token"]
        },
    )
    assert r.status_code == 403


def test_the_spawn_page_counts_labelled_pods_and_refuses_tampered_forms(tmp_path, release: Release, kube: Cluster):
    from spawner.core import labels as gl
    from spawner.core.ledger import Workload

    vision = chart_team(release, "vision")
    ns = release.team_ns(vision)
    # Someone else's server, started by another hub process: 2.5 of vision's 3 GPUs.
    outsider = Workload("notebook:carol/big", vision, "carol", 2500, "h100-1", "notebook")
    kube.create(
        f"/api/v1/namespaces/{ns}/pods",
        {
            "metadata": {
                "name": "outsider",
                "labels": gl.workload_labels(outsider),
                "annotations": gl.workload_annotations(outsider),
            },
            "spec": {
                "priorityClassName": "gpulab-development",
                "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
                "containers": [
                    {
                        "name": "notebook",
                        "image": "quay.io/jupyter/base-notebook:2024-10-07",
                        "resources": {"limits": {"nvidia.com/gpu.shared": "10"}},
                    }
                ],
            },
        },
    )
    hub = kube_hub(tmp_path, release)
    try:
        hub.start()
        session = hub.login("alice")
        page = hub.spawn_page(session).text
        assert f"0.5 of 3 GPUs free for team {vision}" in page, page[-3000:]
        assert re.search(rf'value="{vision}:h100-1"\s+disabled', page)
        assert f"Unavailable: team {vision} holds 2.5 of its 3 GPU burst limit; this request needs 1" in page
        offset = kube.tb.audit_offset()
        for form, words in (
            ({"profile": f"{vision}:h100-half", "gpus": "-1"}, "unknown spawn option(s): &#39;gpus&#39;"),
            ({"profile": f"{vision}:nope"}, "unknown profile"),
            ({"profile": "x" * 5000}, ""),
        ):
            r = hub.post_spawn(session, "alice", form)
            assert r.status_code == 400 and words in r.text and "Traceback" not in r.text, (form, r.text[-500:])
        creates = [
            e
            for e in kube.tb.audit_events(offset, f"system:serviceaccount:{release.hub_namespace}:hub")
            if e["verb"] == "create"
        ]
        assert creates == []  # the tampered forms never reached the cluster
        assert [p["metadata"]["name"] for p in kube.pods(ns)] == ["outsider"]
    finally:
        hub.close()
