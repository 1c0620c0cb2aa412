"""What a start does after a pod create without a clear answer (spawner/kube/lost_create.py),
and the watch's client timeouts (spawner/kube/informer.py), without a cluster.

The same paths on the real API server: tests/kube/test_kube_cluster_lost_create.py.
"""

from __future__ import annotations

import logging
from types import SimpleNamespace

import aiohttp
import pytest
from kubernetes_asyncio.client import V1ObjectMeta, V1Pod
from kubernetes_asyncio.client.rest import ApiException

from spawner.core.labels import SPAWN_ATTEMPT_ANNOTATION
from spawner.kube.conventions import node_rejection_sentence
from spawner.kube.informer import GPUPodInformer, watch_request_timeout
from spawner.kube.lost_create import ABSENT, UNREAD, LostCreateRecovery, Next, attempt_of, decide, new_attempt
from spawner.kube.spawner import GPUKubeSpawner

OURS = "a" * 32
THEIRS = "b" * 32


@pytest.mark.parametrize("status", [None, 403, 409, 429, 500, 503, 504])
def test_a_pod_with_this_attempts_token_is_adopted_whatever_the_answer(status):
    assert decide(status, OURS, OURS) is Next.ADOPT


@pytest.mark.parametrize("status", [None, 429, 500, 502, 503, 504, 409])
def test_no_pod_after_a_timeout_overload_or_conflict_is_tried_again(status):
    assert decide(status, ABSENT, OURS) is Next.RETRY


def test_no_pod_after_a_quota_refusal_is_the_refusal():
    assert decide(403, ABSENT, OURS) is Next.RAISE


@pytest.mark.parametrize("token", [THEIRS, ""])
def test_another_pod_of_the_name_is_replaced_on_conflict_as_kubespawner_does(token):
    assert decide(409, token, OURS) is Next.REPLACE


@pytest.mark.parametrize("status", [None, 504, 503])
def test_another_pod_after_no_answer_is_tried_again_so_the_conflict_replaces_it(status):
    assert decide(status, THEIRS, OURS) is Next.RETRY


def test_another_pod_and_a_quota_refusal_is_the_refusal():
    assert decide(403, THEIRS, OURS) is Next.RAISE


@pytest.mark.parametrize("status", [None, 403, 409, 504])
def test_a_pod_that_cannot_be_read_is_never_reported_as_refused(status):
    assert decide(status, UNREAD, OURS) is Next.RETRY


def test_an_empty_attempt_never_adopts_an_unmarked_pod():
    assert decide(409, "", "") is Next.REPLACE


def test_a_pod_being_deleted_counts_as_absent_and_tokens_are_unique():
    md = V1ObjectMeta(name="jupyter-a", annotations={SPAWN_ATTEMPT_ANNOTATION: OURS})
    assert attempt_of(V1Pod(metadata=md)) == OURS
    md.deletion_timestamp = "2026-12-01T23:00:00Z"
    assert attempt_of(V1Pod(metadata=md)) is ABSENT
    assert attempt_of(V1Pod(metadata=V1ObjectMeta(name="x"))) == ""
    assert len({new_attempt() for _ in range(1000)}) == 1000


@pytest.mark.parametrize("watch_seconds", [300, 450, 600])
def test_a_watch_reads_past_its_own_server_side_timeout(watch_seconds):
    connect, read = watch_request_timeout(watch_seconds)
    assert connect == 10
    # Beyond the watch's end (the API server closes it then), never the old 120 s.
    assert watch_seconds < read <= watch_seconds + 60


async def test_the_informer_asks_for_the_read_timeout_of_each_watch(monkeypatch):
    """The arguments of the real watch request, as kubernetes_asyncio receives them."""
    seen = {}

    class Stop(Exception):
        pass

    def stream(self, func, **kw):
        seen.update(kw)
        raise Stop

    monkeypatch.setattr("kubernetes_asyncio.watch.Watch.stream", stream)
    informer = GPUPodInformer(namespace="team-a", omit_namespace=False)
    informer.resource_version = "1"
    with pytest.raises(Stop):
        await informer._watch_once()
    timeout = seen["timeout_seconds"]
    assert informer.watch_timeout_seconds <= timeout <= 2 * informer.watch_timeout_seconds
    assert seen["_request_timeout"] == (10, timeout + 30)
    assert seen["allow_watch_bookmarks"] is True


class _FakePods:
    """The two calls LostCreateRecovery makes, answering as an API server that is restarting:
    the connection refused or closed (aiohttp's errors, as kubernetes_asyncio raises them)."""

    def __init__(self, create_errors: list[BaseException], stored: V1Pod | None = None):
        self.create_errors = create_errors
        self.stored = stored
        self.creates = 0

    async def create_namespaced_pod(self, namespace, pod):
        self.creates += 1
        if self.create_errors:
            raise self.create_errors.pop(0)
        return pod

    async def read_namespaced_pod(self, name, namespace):
        if self.stored is None:
            raise aiohttp.ClientOSError(111, "Connect call failed")
        return self.stored


def _recovery(api: _FakePods) -> LostCreateRecovery:
    r = LostCreateRecovery()
    r.api, r.log = api, logging.getLogger("test")
    r.namespace, r.pod_name, r.k8s_api_request_timeout, r.delete_grace_period = "team-a", "jupyter-a", 3, 1
    r._new_spawn_attempt()
    return r


def _pod(r: LostCreateRecovery) -> V1Pod:
    return r._mark_attempt(V1Pod(metadata=V1ObjectMeta(name="jupyter-a", uid="u1")))


@pytest.mark.parametrize(
    "error",
    [aiohttp.ServerDisconnectedError(), aiohttp.ClientOSError(111, "Connect call failed ('127.0.0.1', 6443)")],
    ids=["disconnected", "refused"],
)
async def test_a_create_that_lost_the_connection_is_tried_again_not_failed(error):
    api = _FakePods([error])
    r = _recovery(api)
    pod = _pod(r)
    assert await r._make_create_pod_request(pod, 3) is False  # KubeSpawner's backoff tries again
    assert r._create_lost is error
    assert await r._make_create_pod_request(pod, 3) is True
    assert api.creates == 2 and r._create_lost is None


async def test_a_create_stored_before_the_connection_closed_is_adopted():
    r = _recovery(_FakePods([aiohttp.ServerDisconnectedError()]))
    pod = _pod(r)
    r.api.stored = pod  # the API server wrote the pod, then went away before answering
    assert await r._make_create_pod_request(pod, 3) is True
    assert r._attempt_pod_uid == "u1"


def _failing_start(lost: BaseException | None, uid: str | None = None) -> SimpleNamespace:
    return SimpleNamespace(
        log=logging.getLogger("test"),
        namespace="team-a",
        pod_name="jupyter-a",
        _log_name="a",
        _create_lost=lost,
        _attempt_pod_uid=uid,
    )


def _words(e: Exception | None) -> str:
    assert e is not None
    return str(getattr(e, "jupyterhub_message", None) or getattr(e, "log_message", None) or e)


def test_retries_running_out_while_the_api_server_is_away_read_as_a_sentence():
    lost = aiohttp.ClientOSError(111, "Connect call failed ('127.0.0.1', 6443)")
    failure = GPUKubeSpawner._start_failure(_failing_start(lost), TimeoutError("Could not create pod team-a/x"))
    words = _words(failure)
    assert "lost its connection to the cluster's API server" in words and "Errno" not in words
    assert getattr(failure, "status_code", None) == 503


def test_a_503_answer_and_a_closed_connection_read_as_a_sentence():
    shutting_down = ApiException(status=503, reason="Service Unavailable")
    shutting_down.body = b'{"kind":"Status","message":"apiserver is shutting down","code":503}'
    for e in (shutting_down, aiohttp.ServerDisconnectedError()):
        words = _words(GPUKubeSpawner._start_failure(_failing_start(None), e))
        assert words.startswith("The hub lost its connection to the cluster's API server"), words
    assert "apiserver is shutting down" in _words(GPUKubeSpawner._start_failure(_failing_start(None), shutting_down))


def test_other_failures_stand_as_kubespawner_raises_them():
    # A pod that never started (its own timeout) is not an API server lost, even after one was.
    assert GPUKubeSpawner._start_failure(_failing_start(None), TimeoutError("pod did not start")) is None
    lost = aiohttp.ServerDisconnectedError()
    assert GPUKubeSpawner._start_failure(_failing_start(lost, uid="u1"), TimeoutError("did not start")) is None
    assert GPUKubeSpawner._start_failure(_failing_start(None), ApiException(status=422)) is None


def _failed_pod(attempt: str, reason: str = "OutOfnvidia.com/gpu.shared") -> dict:
    """A pod as a kubelet leaves one it cannot admit (phase Failed, its reason and message)."""
    return {
        "metadata": {"name": "jupyter-a", "namespace": "team-a", "annotations": {SPAWN_ATTEMPT_ANNOTATION: attempt}},
        "spec": {"nodeName": "gpu-h100-timeslice-x48"},
        "status": {
            "phase": "Failed",
            "reason": reason,
            "message": "Pod was rejected: Node didn't have enough resource: nvidia.com/gpu.shared, requested: 2, "
            "used: 32, capacity: 32",
        },
    }


def test_a_pod_its_node_turned_away_ends_the_start_with_a_sentence():
    words = node_rejection_sentence(_failed_pod(OURS))
    assert words is not None and words.startswith("The node gpu-h100-timeslice-x48 turned your server away")
    assert "OutOfnvidia.com/gpu.shared: Pod was rejected" in words and words.endswith("places it anew.")
    running = {"metadata": {}, "status": {"phase": "Running"}}
    assert node_rejection_sentence(running) is None
    deleting = _failed_pod(OURS)
    deleting["metadata"]["deletionTimestamp"] = "2026-12-02T01:00:00Z"
    assert node_rejection_sentence(deleting) is None


def test_only_this_attempts_rejected_pod_ends_the_start():
    """GPUKubeSpawner.is_pod_running, as KubeSpawner's start polls it from the reflector."""
    from spawner.kube.spawner import _starting_spawner

    me = GPUKubeSpawner.__new__(GPUKubeSpawner)  # traitlets set up, no hub or user needed
    me._spawn_attempt, me.log = OURS, logging.getLogger("test")
    check = GPUKubeSpawner.is_pod_running
    token = _starting_spawner.set(me)
    try:
        with pytest.raises(Exception, match="turned your server away") as raised:
            check(me, _failed_pod(OURS))
        assert getattr(raised.value, "status_code", None) == 503
        # an earlier pod of the same name, still in the reflector: KubeSpawner's answer (not running)
        assert check(me, _failed_pod(THEIRS)) is False
    finally:
        _starting_spawner.reset(token)
    # outside a start (the hub's poll), a failed pod is KubeSpawner's business
    assert check(me, _failed_pod(OURS)) is False


class _NameEvents:
    """KubeSpawner's view: every event of the pod name, the previous pod's included."""

    @property
    def events(self) -> list[dict]:
        return [
            {"involvedObject": {"name": "jupyter-carol", "uid": "old"}, "reason": "Scheduled"},
            {"involvedObject": {"name": "jupyter-carol", "uid": "new"}, "reason": "FailedScheduling"},
        ]


class _Events(LostCreateRecovery, _NameEvents):
    pass


def test_progress_shows_only_the_events_of_this_attempts_pod():
    s = _Events()
    assert s.events == []  # before its create: none of the name's events are this attempt's
    s._attempt_pod_uid = "new"
    assert [e["reason"] for e in s.events] == ["FailedScheduling"]
