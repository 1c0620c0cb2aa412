"""The spawn queue with GPUKubeSpawner on the real control plane: a hub configured as Zero
to JupyterHub configures it (tests/kube/bed/z2jh_hub_config.py), the scheduler binding the
pods to the fake GPU nodes, the node agent running their single-user servers.

Team nlp (burst 2) is filled by alice's two 1 × H100 servers; carol's "queue me" waits
(first in line, with the spawn page saying so) and, once alice stops one server, the
queue runner starts carol's server by itself: its pod lands in nlp's namespace, through
the same ledger (rebuilt from labelled pods) that admitted alice's.
"""

from __future__ import annotations

import json

import yaml

from tests.kube.bed.chart import Release
from tests.kube.bed.cluster import Cluster
from tests.kube.bed.z2jh_hub_config import bed_hub
from tests.support.jobs import user_token
from tests.support.kube_spawner import chart_team

EXTRA = """
c.GPULabQueue.retry_seconds = 2
c.JupyterHub.allow_named_servers = True
"""


def catalog_yaml(release: Release) -> str:
    g = release.values["gpulab"]
    return yaml.safe_dump(
        {
            "sharing": g["sharing"],
            "profiles": g["profiles"],
            "teams": [{**t, "namespace": release.team_ns(t["name"])} for t in g["teams"]],
        }
    )


def test_a_queued_server_starts_by_itself_when_the_team_frees(tmp_path, release: Release, kube: Cluster):
    nlp = chart_team(release, "nlp")
    ns = release.team_ns(nlp)
    hub = bed_hub(tmp_path / "hub", release.hub_namespace, release.hub_kubeconfig, catalog_yaml(release), None, EXTRA)
    try:
        hub.start()
        r = hub.api("POST", "/users", json={"usernames": ["alice", "bob", "carol"]})
        assert r.status_code in (201, 409), r.text
        for name in ("a", "b"):
            r = hub.api("POST", f"/users/alice/servers/{name}", data=json.dumps({"team": nlp, "profile": "h100-1"}))
            assert r.status_code in (201, 202), r.text
        for name in ("a", "b"):
            hub.wait_server("alice", name, timeout=120)
        carol = user_token(hub, "carol")
        r = hub.api("POST", "/gpulab/queue", token=carol, data=json.dumps({"team": nlp, "profile": "h100-1"}))
        assert r.status_code == 201, r.text
        assert r.json()["position_sentence"] == f"You are next in line for 1 × H100 in team {nlp}"
        entry_id = r.json()["id"]
        # tampered and other users' input: refused, nothing changed
        r = hub.api(
            "POST", "/gpulab/queue", token=carol, data=json.dumps({"team": nlp, "profile": "h100-1", "gpus": 8})
        )
        assert r.status_code == 400
        bob = user_token(hub, "bob")
        assert hub.api("DELETE", f"/gpulab/queue/{entry_id}", token=bob).status_code == 404
        entries = hub.api("GET", "/gpulab/queue", token=carol).json()["entries"]
        assert [e["state"] for e in entries] == ["waiting"]
        page = hub.spawn_page(hub.login("carol")).content.decode()
        assert f"You are next in line for 1 × H100 in team {nlp}." in page, page[-3000:]
        assert not kube.pods(ns, "gpulab.io/user=carol")

        r = hub.api("DELETE", "/users/alice/servers/a")
        assert r.status_code in (202, 204), r.text
        hub.wait_server("carol", timeout=180)
        entries = hub.api("GET", "/gpulab/queue", token=carol).json()["entries"]
        assert entries[0]["state"] == "started", entries
        (pod,) = kube.pods(ns, "gpulab.io/user=carol")
        assert pod["status"]["phase"] == "Running" and pod["spec"]["nodeName"].startswith("gpu-h100-whole")
        held = sorted((h["key"], h["gpu_milli"]) for h in hub.holdings() if h["team"] == nlp)
        assert held == [("notebook:alice/b", 1000), ("notebook:carol/", 1000)]
    finally:
        for user, name in (("alice", "a"), ("alice", "b"), ("carol", "")):
            hub.api("DELETE", f"/users/{user}/server" + (f"s/{name}" if name else ""))
        hub.close()
