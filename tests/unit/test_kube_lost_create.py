"""What a start does after a pod create without a clear answer (spawner/kube/lost_create.py),
and the watch's client timeouts (spawner/kube/informer.py), without a cluster.

The same paths on the real API server: tests/kube/test_kube_cluster_lost_create.py.
"""

from __future__ import annotations

import pytest
from kubernetes_asyncio.client import V1ObjectMeta, V1Pod

from spawner.core.labels import SPAWN_ATTEMPT_ANNOTATION
from spawner.kube.informer import GPUPodInformer, watch_request_timeout
from spawner.kube.lost_create import ABSENT, UNREAD, Next, attempt_of, decide, new_attempt

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
