"""The spawn page of a real JupyterHub process running GPUKubeSpawner.

The hub (``tests/hub_harness.py``: the embedded hub's config with the spawner
switched to ``gpu-kube``) and the Kubernetes API-server stand-in
(``tests/kube_api_server.py``) run as separate processes and talk over HTTP;
the test drives the hub's pages like a browser would.
"""

from __future__ import annotations

import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
import requests
import yaml

from spawner import labels as gl
from spawner.ledger import Workload
from tests.hub_harness import RunningHub, free_port

REPO = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.integration

HUB_CATALOG = """
sharing: {backend: timeslice, timeslice: {replicas: 2}}
profiles:
  - {slug: h100-half, display_name: 0.5 × H100, gpus: 0.5, gpu_model: H100-80GB}
  - {slug: h100-1, display_name: 1 × H100, gpus: 1, gpu_model: H100-80GB}
teams:
  - {name: vision, users: [alice, bob], guarantee: 2, burst: 3, namespace: team-vision}
"""


@pytest.fixture
def standin_process(tmp_path):
    """The API-server stand-in as its own process (the hub is another one)."""
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "tests.kube_api_server", "--port", str(port)],
                            cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    for _ in range(100):
        try:
            requests.get(url + "/api/v1/namespaces/default/pods", timeout=1)
            break
        except requests.RequestException:
            time.sleep(0.1)
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "standin",
        "clusters": [{"name": "standin", "cluster": {"server": url}}],
        "users": [{"name": "standin", "user": {"token": "test"}}],
        "contexts": [{"name": "standin", "context": {"cluster": "standin", "user": "standin"}}],
    }))
    yield url, kubeconfig
    proc.terminate()
    proc.wait(10)


def test_hub_spawn_page_shows_availability_and_refusals(tmp_path, standin_process):
    url, kubeconfig = standin_process
    # Someone else's server, started outside this hub: 2.5 GPUs of team vision, and the
    # namespace's ResourceQuota (2 time-slices) is full with it.
    outsider = Workload("notebook:carol/big", "vision", "carol", 2500, "h100-2", "notebook")
    requests.post(f"{url}/api/v1/namespaces/team-vision/pods", timeout=5, json={
        "metadata": {"name": "outsider", "labels": gl.workload_labels(outsider),
                     "annotations": gl.workload_annotations(outsider)},
        "spec": {"containers": [{"name": "notebook", "image": "x",
                                 "resources": {"limits": {"nvidia.com/gpu.shared": "2"}}}]}}).raise_for_status()
    requests.post(f"{url}/api/v1/namespaces/team-vision/resourcequotas", timeout=5, json={
        "metadata": {"name": "gpu-quota"},
        "spec": {"hard": {"requests.nvidia.com/gpu.shared": "2"}}}).raise_for_status()

    hub = RunningHub(tmp_path / "hub", catalog_yaml=HUB_CATALOG, env={"KUBECONFIG": str(kubeconfig)},
                     extra_config=f"""
c.JupyterHub.spawner_class = "gpu-kube"
c.KubeSpawner.k8s_api_host = "{url}"
c.KubeSpawner.namespace = "default"
c.KubeSpawner.image = "quay.io/jupyter/base-notebook:2024-10-07"
""")
    try:
        hub.start()
        session = hub.login("alice")
        page = hub.spawn_page(session).text
        assert "0.5 of 3 GPUs free for team vision" in page, hub.log_tail()
        assert re.search(r'value="vision:h100-1"\s+disabled', page)
        assert "Unavailable: team vision holds 2.5 of its 3 GPU burst limit; this request needs 1" in page

        r = hub.post_spawn(session, "alice", {"profile": "vision:h100-half", "gpus": "-1"})
        assert r.status_code == 400 and "unknown spawn option(s): &#39;gpus&#39;" in r.text

        # The ledger admits 0.5 GPU; the cluster's ResourceQuota refuses the pod.
        r = hub.post_spawn(session, "alice", {"profile": "vision:h100-half"})
        assert r.status_code == 403, r.text[-2000:]
        assert ("The cluster refused the server: namespace team-vision is at its ResourceQuota "
                "&#39;gpu-quota&#39;") in r.text
        assert "Traceback" not in r.text
        pods = requests.get(f"{url}/api/v1/namespaces/team-vision/pods", timeout=5).json()["items"]
        assert [p["metadata"]["name"] for p in pods] == ["outsider"]
        counts = {(r["verb"], r["path"]): r["count"]
                  for r in requests.get(f"{url}/_standin/requests", timeout=5).json()}
        # ours (outsider + the refused one); the tampered form never reached the cluster
        assert counts[("create", "/api/v1/namespaces/team-vision/pods")] == 2
    finally:
        hub.close()
