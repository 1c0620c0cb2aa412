"""The informer's watch loop (spawner/kube/informer.py) without a cluster.

The watch request is replaced by a stand-in that yields the events the API
server documents for a watch (https://kubernetes.io/docs/reference/using-api/api-concepts/#efficient-detection-of-changes:
ADDED / MODIFIED / DELETED / BOOKMARK, and on an expired version an ERROR event
whose object is a Status with code 410). The real watch against the test bed
is in tests/kube/test_kube_informer.py.
"""

from __future__ import annotations

import asyncio

import pytest
from kubernetes_asyncio.client.rest import ApiException

from spawner.kube.informer import GPUPodInformer, WatchGone


class ScriptedInformer(GPUPodInformer):
    """Each list and each watch answers from a script, as a real API server would."""

    def __init__(self, watches: list, **kw):
        super().__init__(namespace="team-a", omit_namespace=False, **kw)
        self.script = list(watches)
        self.watch_versions: list[str | None] = []

    async def _list_and_update(self, resource_version=None):
        self.resources = {"team-a/listed": pod("listed", "100")}
        self.lists += 1
        self.revision += 1
        self.resource_version = "100"
        if not self.first_load_future.done():
            self.first_load_future.set_result(None)
        return "100"

    async def _watch_once(self):
        self.watches += 1
        self.watch_versions.append(self.resource_version)
        if not self.script:
            self._stopping = True
            return
        step = self.script.pop(0)
        if isinstance(step, Exception):
            raise step
        for event in step:
            self._apply_event(event)


def pod(name: str, rv: str) -> dict:
    return {"metadata": {"name": name, "namespace": "team-a", "resourceVersion": rv, "labels": {}}}


GONE_EVENT = {
    "type": "ERROR",
    "object": {
        "kind": "Status",
        "apiVersion": "v1",
        "status": "Failure",
        "reason": "Expired",
        "code": 410,
        "message": "too old resource version: 100 (250)",
    },
}


async def run(informer: ScriptedInformer) -> None:
    await informer.start()
    await asyncio.wait_for(informer.watch_task, 10)


@pytest.fixture(autouse=True)
def no_backoff_sleep(monkeypatch):
    real = asyncio.sleep
    monkeypatch.setattr(asyncio, "sleep", lambda s, *a: real(0))


async def test_watches_resume_from_the_last_version_without_listing():
    informer = ScriptedInformer(
        [
            [{"type": "ADDED", "object": pod("a", "101")}],
            [{"type": "BOOKMARK", "object": {"kind": "Pod", "metadata": {"resourceVersion": "140"}}}],
            [{"type": "DELETED", "object": pod("a", "150")}, {"type": "MODIFIED", "object": pod("listed", "151")}],
        ]
    )
    await run(informer)
    assert informer.lists == 1
    assert informer.watch_versions == ["100", "101", "140", "151"]
    assert set(informer.pods) == {"team-a/listed"}


async def test_410_gone_lists_again_once_then_watches_on():
    informer = ScriptedInformer([[GONE_EVENT], [{"type": "ADDED", "object": pod("b", "300")}]])
    await run(informer)
    assert informer.lists == 2
    assert informer.watch_versions == ["100", "100", "300"]
    assert "team-a/b" in informer.pods


async def test_410_as_an_api_error_also_lists_again():
    informer = ScriptedInformer([ApiException(status=410, reason="Expired"), []])
    await run(informer)
    assert informer.lists == 2


async def test_other_errors_resume_from_the_same_version_without_listing():
    """An API server restart: connection refused, then the watch resumes where it was."""
    informer = ScriptedInformer([ConnectionRefusedError(), ApiException(status=500, reason="x"), []])
    await run(informer)
    assert informer.lists == 1
    assert informer.watch_versions == ["100", "100", "100", "100"]


async def test_gives_up_after_the_backoff_and_says_so():
    failures = [ConnectionRefusedError()] * 20
    called = []
    informer = ScriptedInformer(failures, on_failure=lambda: called.append(True))
    await run(informer)
    assert called == [True]
    assert informer.watch_task.done()


async def test_an_error_event_other_than_gone_is_an_api_error():
    informer = ScriptedInformer([])
    with pytest.raises(ApiException):
        informer._apply_event({"type": "ERROR", "object": {"code": 500, "reason": "InternalError", "message": "x"}})
    with pytest.raises(WatchGone):
        informer._apply_event(GONE_EVENT)


#: The body of a watch request the API server refused outright (here its authorizer, not yet
#: synced after a restart): a Status, not a watch event. Read raw, it is the stream's one line.
FORBIDDEN_STATUS = {
    "kind": "Status",
    "apiVersion": "v1",
    "metadata": {},
    "status": "Failure",
    "message": 'pods is forbidden: User "system:serviceaccount:hub:hub" cannot watch resource "pods"',
    "reason": "Forbidden",
    "code": 403,
}


async def test_a_refused_watch_request_is_an_api_error_and_stores_nothing():
    """A Status body stored as an object reached KubeSpawner's event sort as an empty event
    (KeyError 'lastTimestamp' for every spawn waiting then, seen after an API server restart)."""
    informer = ScriptedInformer([])
    with pytest.raises(ApiException) as refused:
        informer._apply_event(FORBIDDEN_STATUS)
    assert refused.value.status == 403
    assert informer.resources == {} and informer.revision == 0


async def test_a_refused_watch_request_resumes_from_the_same_version():
    informer = ScriptedInformer([[FORBIDDEN_STATUS], [{"type": "ADDED", "object": pod("c", "120")}]])
    await run(informer)
    assert informer.lists == 1
    assert informer.watch_versions == ["100", "100", "120"]
    assert set(informer.pods) == {"team-a/listed", "team-a/c"}
