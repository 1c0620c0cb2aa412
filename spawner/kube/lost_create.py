"""A pod create whose answer was lost: look the pod up before retrying or reporting.

KubeSpawner creates a server's pod in ``_make_create_pod_request``, retried by
``exponential_backoff``: a client-side timeout (``k8s_api_request_timeout``) is tried
again, a 409 Conflict makes it stop the pod of that name and try again, and any other
API error fails the start. Under load the API server can store the pod and still
answer late or with an error: the client's timeout fires while the write is in etcd,
or the API server's own deadline answers 504 ("request did not complete within
requested timeout", ``k8s.io/apiserver/pkg/endpoints/handlers/finisher``) while the
store goes on. The retry then meets the pod it made: 409 (and KubeSpawner deletes it),
or, in a namespace whose ResourceQuota that very pod now fills, 403 (quota admission
runs before the store's 409): the hub says "refused" while the pod runs on, owned by
no server.

So every create here carries a token of this spawn attempt
(:data:`~spawner.core.labels.SPAWN_ATTEMPT_ANNOTATION`), and after any failed or
unanswered create the pod is read by name (one GET, only on that path):

- it carries this attempt's token: the create did happen; adopt it (the start goes on);
- another pod holds the name: KubeSpawner's behaviour, replace it on 409, else retry;
- no pod: a timeout or a 5xx / 429 is retried, a 403 is the refusal it says;

and a start that fails anyway deletes its own attempt's pod (by uid) before the
failure is reported. :func:`decide` is the decision, apart from any I/O.
"""

from __future__ import annotations

import asyncio
import enum
import uuid
from typing import Any

import aiohttp
from kubernetes_asyncio.client import V1DeleteOptions, V1Preconditions
from kubernetes_asyncio.client.rest import ApiException

from spawner.admission import refusal
from spawner.core.labels import SPAWN_ATTEMPT_ANNOTATION

from .conventions import api_refusal, unreachable_sentence
from .ledger import api_message

#: Statuses the API server answers for a request it may still complete, or did: its
#: overload and timeout answers (429 Too Many Requests, 500, 502, 503, 504).
MAYBE_STORED = frozenset({429, 500, 502, 503, 504})
#: Statuses after which the pod may exist although the create did not say so.
LOOK_UP = MAYBE_STORED | {403, 409}


class Next(enum.Enum):
    """What to do after a create that did not answer 201."""

    ADOPT = "adopt"  # the pod is this attempt's: the create happened
    RETRY = "retry"  # try the create again (within KubeSpawner's retry timeout)
    REPLACE = "replace"  # another pod holds the name: stop it, then retry (KubeSpawner's 409)
    RAISE = "raise"  # the API server's answer stands (a refusal, or an invalid pod)


#: No pod of that name, as :func:`decide` takes it.
ABSENT = None
#: The pod could not be read (the lookup itself failed).
UNREAD = "unread"


def decide(status: int | None, found: str | None, attempt: str) -> Next:
    """The next step after a create answered ``status`` (``None``: no answer in time).

    ``found`` is the spawn-attempt token of the live pod of that name (``""`` for a pod
    without one, :data:`ABSENT` for none or one being deleted, :data:`UNREAD` when the
    lookup failed); ``attempt`` is this attempt's token.
    """
    if found == attempt and attempt:
        return Next.ADOPT
    if found == UNREAD:
        # Cannot tell whether our pod lives: never report a refusal on a guess. A 403 or
        # 409 will be answered again by the retry, and read again after it.
        return Next.RETRY
    if found is ABSENT:
        if status is None or status in MAYBE_STORED or status == 409:
            return Next.RETRY  # still being stored, or the other pod went in between
        return Next.RAISE
    # Another pod (a stale server of the same name, or an earlier attempt's).
    if status == 409:
        return Next.REPLACE
    if status is None or status in MAYBE_STORED:
        return Next.RETRY  # the retry's 409 then replaces it
    return Next.RAISE


def new_attempt() -> str:
    """A token for one spawn attempt (unique: two hubs or two starts never share one)."""
    return uuid.uuid4().hex


def attempt_of(pod: Any) -> str | None:
    """The attempt token of a pod read from the API (``None`` once it is being deleted)."""
    md = pod.metadata
    if md.deletion_timestamp:
        return ABSENT
    return (md.annotations or {}).get(SPAWN_ATTEMPT_ANNOTATION, "")


class LostCreateRecovery:
    """KubeSpawner's pod create, with the lookup above (mixed into GPUKubeSpawner)."""

    #: This start's token (set by :meth:`_new_spawn_attempt`), written on the pod.
    _spawn_attempt = ""
    #: The uid of the pod this attempt made or adopted, once known.
    _attempt_pod_uid: str | None = None
    #: Whether this attempt sent a create (else a failed start has no pod to look for).
    _create_sent = False
    #: Why the last create of this attempt got no answer: the connection to the API server
    #: refused, reset or closed (it is restarting), or its 5xx; ``None`` after an answer.
    _create_lost: BaseException | None = None

    # KubeSpawner's attributes this code uses.
    api: Any
    log: Any
    namespace: str
    pod_name: str
    k8s_api_request_timeout: int
    delete_grace_period: int
    _log_name: str

    @property
    def events(self) -> list[dict[str, Any]]:
        """KubeSpawner's events of this server's pod name, kept to the pod this attempt made.

        Events outlive their pod (an hour by default), so the name's events include the
        previous pod's. KubeSpawner drops those behind a marker that its start sets after
        the events informer is ready, while its progress generator walks the list by index
        from whenever the spawn page connected: a page open before the marker (z2jh sends
        the browser there at once) showed the old pod's "Successfully assigned ... to
        <node>" and then, the list having shrunk behind the marker, never the new pod's
        events (its FailedScheduling, the reason it waits). By uid, the list only grows."""
        uid = self._attempt_pod_uid
        if not uid:
            return []  # no pod of this attempt yet: none of the name's events are its own
        return [e for e in super().events if (e.get("involvedObject") or {}).get("uid") == uid]  # type: ignore[misc]

    def _new_spawn_attempt(self) -> str:
        self._spawn_attempt = new_attempt()
        self._attempt_pod_uid = None
        self._create_sent = False
        self._create_lost = None
        return self._spawn_attempt

    def _mark_attempt(self, pod: Any) -> Any:
        """The pod manifest with this attempt's token."""
        if not self._spawn_attempt:
            self._new_spawn_attempt()
        pod.metadata.annotations = {**(pod.metadata.annotations or {}), SPAWN_ATTEMPT_ANNOTATION: self._spawn_attempt}
        return pod

    async def _read_attempt(self) -> tuple[str | None, str | None]:
        """``(token, uid)`` of the live pod of this server's name; ``(ABSENT, None)``
        without one, ``(UNREAD, None)`` when it cannot be read now."""
        try:
            pod = await asyncio.wait_for(
                self.api.read_namespaced_pod(self.pod_name, self.namespace), self.k8s_api_request_timeout
            )
        except ApiException as e:
            if e.status == 404:
                return ABSENT, None
            self.log.warning("gpulab: cannot read pod %s/%s (%s)", self.namespace, self.pod_name, e.status)
            return UNREAD, None
        except (asyncio.TimeoutError, OSError, aiohttp.ClientError) as e:
            self.log.warning("gpulab: cannot read pod %s/%s (%r)", self.namespace, self.pod_name, e)
            return UNREAD, None
        return attempt_of(pod), pod.metadata.uid

    async def _make_create_pod_request(self, pod: Any, request_timeout: int) -> bool:
        """KubeSpawner's create (True: created; False: try again), reading the pod by name
        after any answer that may hide a stored pod."""
        ref = f"{self.namespace}/{pod.metadata.name}"
        self._create_sent = True
        try:
            self.log.info("Attempting to create pod %s, with timeout %s", pod.metadata.name, request_timeout)
            created = await asyncio.wait_for(self.api.create_namespaced_pod(self.namespace, pod), request_timeout)
            self._attempt_pod_uid = created.metadata.uid
            self._create_lost = None
            return True
        except asyncio.TimeoutError:
            status, error = None, None
        except aiohttp.ClientError as e:
            # Refused, reset or closed: the API server restarting. The create may have been
            # stored before the connection went, so it reads like a create without an answer.
            status, error, self._create_lost = None, None, e
        except ApiException as e:
            if e.status not in LOOK_UP:
                raise
            status, error = e.status, e
            if e.status in MAYBE_STORED:
                self._create_lost = e
        found, uid = await self._read_attempt()
        step = decide(status, found, self._spawn_attempt)
        answer = "no answer in time" if status is None else f"status {status}"
        if step is Next.ADOPT:
            self.log.warning(
                "gpulab: the create of pod %s got %s, but the API server stored it (uid %s): adopting it",
                ref,
                answer,
                uid,
            )
            self._attempt_pod_uid = uid
            return True
        if step is Next.REPLACE:
            self.log.info("Found existing pod %s (not this start's), attempting to kill", ref)
            await self.stop(True)  # type: ignore[attr-defined]
            return False
        if step is Next.RETRY:
            self.log.info("gpulab: the create of pod %s got %s (pod there: %s); trying again", ref, answer, found)
            return False
        assert error is not None
        if found is ABSENT:
            self._create_sent = False  # nothing of this attempt is stored: no lookup after it
        raise error

    async def _delete_own_pod(self) -> None:
        """Before a failed start is reported: delete the pod this attempt made, if it lives
        (by uid, so a pod of the same name made by anyone else is left alone)."""
        if not (self._spawn_attempt and self._create_sent):
            return
        found, uid = await self._read_attempt()
        if found != self._spawn_attempt or uid is None:
            return
        self.log.warning(
            "gpulab: the start of pod %s/%s failed after its pod was stored (uid %s): deleting it",
            self.namespace,
            self.pod_name,
            uid,
        )
        try:
            await self.api.delete_namespaced_pod(
                self.pod_name,
                self.namespace,
                body=V1DeleteOptions(
                    grace_period_seconds=self.delete_grace_period, preconditions=V1Preconditions(uid=uid)
                ),
            )
        except ApiException as e:
            if e.status not in (404, 409):  # gone already, or another pod now (uid precondition)
                self.log.error("gpulab: could not delete pod %s/%s: %s", self.namespace, self.pod_name, e)
        except Exception as e:  # the start's own failure is what gets reported
            self.log.error("gpulab: could not delete pod %s/%s: %r", self.namespace, self.pod_name, e)

    def _start_failure(self, e: Exception) -> Exception | None:
        """The refusal with a sentence for a failed start, or ``None`` to let ``e`` stand."""
        if isinstance(e, ApiException) and e.status == 403:
            message = api_message(e)
            self.log.warning("gpulab: API server refused pod %s/%s: %s", self.namespace, self.pod_name, message)
            sentence, reason = api_refusal(self.namespace, message)
            return refusal(sentence, 403, reason)
        lost: BaseException | None = None
        if isinstance(e, ApiException) and e.status >= 500:  # "apiserver is shutting down" (503)
            lost = e
        elif isinstance(e, aiohttp.ClientError):  # connection refused, reset or closed
            lost = e
        elif isinstance(e, TimeoutError) and self._create_lost is not None and self._attempt_pod_uid is None:
            # KubeSpawner's create retries ran out while the API server stayed away.
            lost = self._create_lost
        if lost is None:
            return None
        self.log.warning("gpulab: lost the API server while starting %s: %r", self._log_name, lost)
        cause = api_message(lost) if isinstance(lost, ApiException) else lost
        return refusal(unreachable_sentence(cause), 503, "cluster")
