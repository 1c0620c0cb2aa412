"""GPU-hour budgets on Kubernetes: the same hub-side check before GPUKubeSpawner makes a pod.

A real hub configured as Zero to JupyterHub configures it (tests/kube/bed/z2jh_hub_config.py)
on the real control plane. Team vision is past its budget: with ``refuse`` the spawn gets the
sentence and the API server never sees a pod; with ``over-quota`` the pod is created in the
over-quota priority class (preemptible), though the team holds nothing of its guarantee.
"""

from __future__ import annotations

import html

from tests.kube.bed.chart import Release
from tests.kube.bed.cluster import Cluster
from tests.kube.bed.z2jh_hub_config import bed_hub
from tests.support import budgets
from tests.support.kube_spawner import chart_team


def test_a_team_past_its_budget_is_refused_or_gets_only_a_preemptible_pod(tmp_path, release: Release, kube: Cluster):
    vision = chart_team(release, "vision")
    ns = release.team_ns(vision)
    hub = bed_hub(
        tmp_path / "hub",
        release.hub_namespace,
        release.hub_kubeconfig,
        release.catalog_yaml(),
        extra_config="c.GPULabBudgets.check_interval = 3600\n",
    )
    try:
        hub.start()
        r = hub.api("PUT", f"/gpulab/budgets/teams/{vision}", json={"gpu_hours": 1, "at_limit": "refuse"})
        assert r.status_code == 200, r.text
        budgets.add_history(hub, vision, "bob", 1.5, "UTC")
        offset = kube.tb.audit_offset()
        # the spawn form: the sentence, at once
        session = hub.login("alice")
        r = hub.post_spawn(session, "alice", {"profile": f"{vision}:h100-half"})
        assert r.status_code == 403, r.text[-2000:]
        assert "new GPU work is refused until the budget resets on" in html.unescape(r.text)
        # the REST API: the same check in the spawner's start, before any pod
        r = hub.api("POST", "/users/alice/server", json={"team": vision, "profile": "h100-half"})
        if r.status_code == 403:
            message = r.json()["message"]
        else:  # a slow start goes on in the background (202): it fails with the sentence
            assert r.status_code == 202, r.text
            hub.wait_server("alice", ready=False, timeout=60)
            message = hub.log_tail(200)
        assert "new GPU work is refused until the budget resets on" in message
        creates = [
            e
            for e in kube.tb.audit_events(offset, f"system:serviceaccount:{release.hub_namespace}:hub")
            if e["verb"] == "create" and "/pods" in e["requestURI"]
        ]
        assert creates == [] and kube.pods(ns, "gpulab.io/kind=notebook") == []

        r = hub.api("PUT", f"/gpulab/budgets/teams/{vision}", json={"gpu_hours": 1, "at_limit": "over-quota"})
        assert r.status_code == 200 and r.json()["level"] == "exhausted", r.text
        r = hub.api("POST", "/users/alice/server", json={"team": vision, "profile": "h100-half"})
        assert r.status_code in (201, 202), r.text
        hub.wait_server("alice", timeout=120)
        (pod,) = kube.pods(ns, "gpulab.io/kind=notebook")
        assert pod["spec"]["priorityClassName"] == "gpulab-over-quota", pod["spec"].get("priorityClassName")
        assert [h["over_quota"] for h in hub.me("alice")["holdings"]] == [True]
        hub.api("DELETE", "/users/alice/server")
        hub.wait_server("alice", ready=False, timeout=60)
        kube.wait(lambda: not kube.pods(ns, "gpulab.io/kind=notebook"), "the pod to be deleted", 60)
    finally:
        hub.close()
