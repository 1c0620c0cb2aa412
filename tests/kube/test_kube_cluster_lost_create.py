"""A pod create the real API server carried out but whose answer the hub lost.

Found in the spawn storm of benchmarks/kube_scale.py (docs/benchmarks.md, section 9):
under load the API server stores a pod and answers late, or with its own 504; the
create's retry then meets that very pod (409, or 403 from a ResourceQuota the pod now
fills), and KubeSpawner's create reported a refusal while the pod ran on. Here the
spawner's requests go through tests/support/answer_losing_proxy.py to the real API
server of the test bed, which stores the pod; the proxy only withholds the answer
(past the client's timeout) or replaces it with the API server's own documented 504
Status. Everything else, the quota admission, the 409, the watch, is the real control
plane's. The decision table: tests/unit/test_kube_lost_create.py.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from kubernetes_asyncio.client import ApiClient, Configuration, CoreV1Api
from kubespawner import KubeSpawner
from kubespawner.clients import load_config
from tornado.web import HTTPError

from spawner.core.labels import SPAWN_ATTEMPT_ANNOTATION
from spawner.kube.spawner import GPUKubeSpawner
from spawner.runtime import get_runtime
from tests.support.answer_losing_proxy import AnswerLosingProxy
from tests.support.kube_spawner import ClusterView, spawner_config, spawner_for

#: Seconds KubeSpawner waits for one API answer here (its default is 3): short, so the
#: withheld answer (held 8 s) is given up on quickly.
REQUEST_TIMEOUT = 2


@pytest.fixture
async def proxy(api: ClusterView) -> AsyncIterator[AnswerLosingProxy]:
    load_config()  # KubeSpawner's: the hub's kubeconfig, as the spawners read it
    real = Configuration.get_default_copy()
    p = AnswerLosingProxy(real.host, real.ssl_ca_cert)
    p.url = await p.start()  # type: ignore[attr-defined]
    yield p
    await p.close()


def through(proxy: AnswerLosingProxy, s: KubeSpawner) -> KubeSpawner:
    """The spawner's API requests (not its watches) through the proxy, with the hub's token."""
    conf = Configuration.get_default_copy()
    conf.host = proxy.url  # type: ignore[attr-defined]
    s.api = CoreV1Api(ApiClient(configuration=conf))
    return s


def one_server_quota(api: ClusterView, ns: str) -> None:
    """A ResourceQuota that exactly one half-GPU server fills (2 of 4 time-slices), ready."""
    api.create(
        "resourcequotas",
        ns,
        {"metadata": {"name": "one-server"}, "spec": {"hard": {"requests.nvidia.com/gpu.shared": "2"}}},
    )
    api.kube.wait(
        lambda: (api.get("resourcequotas", ns, "one-server") or {}).get("status", {}).get("used") is not None,
        "the quota controller to compute the new quota",
        60,
    )


def spawner(api: ClusterView, proxy: AnswerLosingProxy, user: str, cls: type = GPUKubeSpawner) -> KubeSpawner:
    config = spawner_config(api.release)
    config.KubeSpawner.k8s_api_request_timeout = REQUEST_TIMEOUT
    config.KubeSpawner.k8s_api_request_retry_timeout = 30
    return through(proxy, spawner_for(config, user, {"team": "vision", "profile": "h100-half"}, cls=cls))


def creates(proxy: AnswerLosingProxy, ns: str) -> list:
    return [x for x in proxy.seen if x.method == "POST" and x.path == f"/api/v1/namespaces/{ns}/pods"]


async def test_a_stored_create_without_answer_is_adopted_when_its_retry_meets_the_full_quota(
    api: ClusterView, proxy: AnswerLosingProxy
):
    """The storm's defect: the answer is lost, the pod fills the quota, the retry gets 403.
    (The lookup right after the lost answer is answered 504 too, as an overloaded API server
    may: without it the lookup already finds the pod and no retry is made.)"""
    ns = api.release.team_ns("vision")
    one_server_quota(api, ns)
    proxy.lose("POST", f"/api/v1/namespaces/{ns}/pods", "hold")
    proxy.lose("GET", f"/api/v1/namespaces/{ns}/pods/jupyter-alice", "504")
    s = spawner(api, proxy, "alice")
    await s.start()
    first, retry = creates(proxy, ns)
    assert first.status == 201 and first.lost == "hold"  # the API server stored it; the hub heard nothing
    assert retry.status == 403 and "exceeded quota: one-server" in retry.body["message"]  # the real quota's answer
    lookups = [x for x in proxy.seen if x.method == "GET"]
    assert [(x.status, x.lost) for x in lookups] == [(200, "504"), (200, "")]
    pod = api.get("pods", ns, s.pod_name)
    assert pod["metadata"]["uid"] == first.body["metadata"]["uid"] == s.pod_id  # the very pod: adopted
    assert pod["metadata"]["annotations"][SPAWN_ATTEMPT_ANNOTATION] == s._spawn_attempt
    assert api.count("delete", "pods") == 0
    assert get_runtime().ledger.get(s.workload_key).state == "running"
    await s.stop()
    assert get_runtime().ledger.usage("vision").held_milli == 0


async def test_a_stored_create_answered_504_is_adopted_without_a_second_create(
    api: ClusterView, proxy: AnswerLosingProxy
):
    """The API server's own 504 (its documented Timeout Status, the store done): one lookup, no retry."""
    ns = api.release.team_ns("vision")
    proxy.lose("POST", f"/api/v1/namespaces/{ns}/pods", "504")
    s = spawner(api, proxy, "bob")
    await s.start()
    (only,) = creates(proxy, ns)
    assert only.status == 201 and only.lost == "504"
    assert api.get("pods", ns, s.pod_name)["metadata"]["uid"] == only.body["metadata"]["uid"] == s.pod_id
    assert api.count("create", "pods") == 1 and api.count("delete", "pods") == 0
    assert api.count("get", "pods") == 1  # the lookup
    await s.stop()


async def test_a_quota_refusal_with_no_pod_stored_stays_a_refusal(api: ClusterView, proxy: AnswerLosingProxy):
    """The lookup finds nothing: the 403 is the real refusal, in words, and nothing is left."""
    ns = api.release.team_ns("vision")
    one_server_quota(api, ns)
    first = spawner(api, proxy, "alice")
    await first.start()
    second = spawner(api, proxy, "bob")
    with pytest.raises(HTTPError) as e:
        await second.start()
    assert e.value.status_code == 403
    assert "is at its ResourceQuota 'one-server'" in e.value.jupyterhub_message
    assert api.get("pods", ns, second.pod_name) is None
    assert api.count("get", "pods") == 1  # one lookup after the 403, none after it
    assert get_runtime().ledger.usage("vision").held_milli == 500
    await second.stop()
    await first.stop()


class ShippedCreate(GPUKubeSpawner):
    """GPUKubeSpawner with KubeSpawner's create as shipped (no lookup, no clean-up)."""

    _make_create_pod_request = KubeSpawner._make_create_pod_request

    async def _delete_own_pod(self) -> None:
        return None


async def test_without_the_lookup_the_same_lost_answer_is_a_refusal_while_the_pod_runs(
    api: ClusterView, proxy: AnswerLosingProxy
):
    """What the storm saw, on the same path: shows the first test can fail."""
    ns = api.release.team_ns("vision")
    one_server_quota(api, ns)
    proxy.lose("POST", f"/api/v1/namespaces/{ns}/pods", "hold")
    s = spawner(api, proxy, "alice", cls=ShippedCreate)
    with pytest.raises(HTTPError) as e:
        await s.start()
    assert e.value.status_code == 403  # "refused" ...
    first = creates(proxy, ns)[0]
    pod = api.get("pods", ns, s.pod_name)
    assert pod is not None and pod["metadata"]["uid"] == first.body["metadata"]["uid"]  # ... while its pod lives
    api.delete("pods", ns, s.pod_name, grace=0)
    api.kube.wait(lambda: api.get("pods", ns, s.pod_name) is None, "the orphan to be gone", 60)
