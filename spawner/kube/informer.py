"""Reflectors that list once and then only watch (an informer's list-then-watch).

KubeSpawner's :class:`~kubespawner.reflector.ResourceReflector` ends each watch
after ``timeout_seconds`` (10 s) of quiet or ``restart_seconds`` (30 s) at most,
and lists everything again before the next watch: a list and a watch request
per reflector every 10-30 s, and at thousands of pods each list carries them all.

:class:`ResumingWatch` keeps KubeSpawner's reflector (its ``resources``, ``pods``
or ``events``, ``first_load_future``, ``stop``), but does what client-go's
reflector does (k8s.io/client-go/tools/cache/reflector.go, ``ListAndWatch``):
it lists once, then watches from the last ``resourceVersion`` it saw, asks
for bookmarks (``allowWatchBookmarks``) so that version stays current while
nothing changes, ends each watch after a randomised 5-10 minutes (client-go's
``minWatchTimeout``), and resumes from where it was. It lists again only
when the API server says that version is gone (410 Gone, after etcd
compaction or an API server restart that lost its watch cache) or when a
watch fails; so after a restart of the API server the watches resume and
each relists at most once, not once per 10 s.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import random
from collections.abc import Callable
from functools import partial
from typing import Any

from kubernetes_asyncio import watch
from kubernetes_asyncio.client import ApiClient, Configuration
from kubernetes_asyncio.client.rest import ApiException
from kubespawner.clients import shared_client
from kubespawner.reflector import ResourceReflector
from kubespawner.spawner import EventReflector, PodReflector
from traitlets import Int

from spawner.core import labels as gl

#: The status code of a watch or list whose resourceVersion the API server no longer has.
GONE = 410
#: Seconds between tries while the API server cannot be reached (doubling up to this).
MAX_BACKOFF_SECONDS = 30.0


#: Seconds a watch's read may stay silent beyond the watch's own timeout before the
#: connection counts as dead (the API server ends the watch at ``timeout_seconds``).
READ_MARGIN_SECONDS = 30
#: Seconds to connect to the API server for a watch.
CONNECT_SECONDS = 10


def watch_request_timeout(watch_seconds: int, request_timeout: int = 0) -> tuple[int, int]:
    """The client's ``(connect, read)`` timeouts for a watch that the API server ends after
    ``watch_seconds``: the read waits just past that end. The API server sends no event and,
    to a quiet namespace, often no bookmark for minutes (measured: none within 120 s, so a
    120 s read timeout resumed every quiet watch about every 2 minutes); a read timeout
    below the watch's own would end it early and each end costs a new watch request."""
    return CONNECT_SECONDS, max(request_timeout, watch_seconds + READ_MARGIN_SECONDS)


class WatchGone(Exception):
    """The API server no longer has the resourceVersion the watch resumed from."""


#: Revisions: one counter for all informers, so a (revision, ...) key never repeats.
_REVISIONS = itertools.count(1)
#: Per event loop: the API client the informers' watches share (see :func:`watch_client`).
_WATCH_CLIENTS: dict[Any, Any] = {}


def watch_client(api_group_name: str) -> Any:
    """The API client the informers watch through: one per event loop, with no cap on its
    connections. Each open watch holds one HTTP/1.1 connection for minutes, and
    kubernetes_asyncio caps a client at 100 (``connection_pool_maxsize``): on KubeSpawner's
    shared client, 100 namespaces' watches would leave no connection for a pod create."""
    loop = asyncio.get_running_loop()
    api = _WATCH_CLIENTS.get(loop)
    if api is None:
        conf = Configuration.get_default_copy()
        conf.connection_pool_maxsize = None
        api = _WATCH_CLIENTS[loop] = ApiClient(configuration=conf)
    return shared_client(api_group_name, api_client=api)


class ResumingWatch(ResourceReflector):
    """A KubeSpawner reflector that lists once and resumes its watch from the last version seen."""

    watch_timeout_seconds = Int(
        300,
        config=True,
        help="""Seconds a watch request lasts at least (the API server ends it then and
        the reflector resumes it from the last version seen, without listing again);
        each watch lasts a random time between this and twice this, as client-go's
        reflectors do, so that many hubs do not reconnect at once.""",
    )

    #: The last resourceVersion seen (a list, an event or a bookmark); ``None``: list again.
    resource_version: str | None = None
    #: Full lists made since the start (the first included).
    lists = 0
    #: Watch requests made since the start.
    watches = 0
    #: A new number on every change to ``resources``, unique across informers: readers
    #: cache what they derive from it.
    revision = 0

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.api = watch_client(self.api_group_name)
        self._derived_by_ref: dict[str, Any] = {}
        self._derived_by_key: dict[str, Any] = {}
        #: Workload key -> ``namespace/name`` of the pod it was derived from.
        self._ref_by_key: dict[str, str] = {}

    async def _list_and_update(self, resource_version: str | None = None) -> str:
        rv = await super()._list_and_update(resource_version)
        self.lists += 1
        self.revision = next(_REVISIONS)
        self._derive_all()
        self.resource_version = rv
        return rv

    async def start(self) -> None:
        """List once (a failure raises, as KubeSpawner's reflector does), then watch."""
        task: asyncio.Task | None = getattr(self, "watch_task", None)
        if task is not None and not task.done():
            raise RuntimeError(f"Task watching for {self.kind} is already running")
        try:
            await self._list_and_update()
        except Exception as e:
            self.log.exception(f"Initial list of {self.kind} failed")
            if not self.first_load_future.done():
                self.first_load_future.set_exception(e)
            raise
        self.watch_task = asyncio.create_task(self._watch_and_update())

    def _apply_event(self, event: dict[str, Any]) -> None:
        """One watch event into ``resources``; raises :class:`WatchGone` on 410."""
        if "type" not in event or "object" not in event:
            # Not a watch event: the API server refused the watch request itself (403 while
            # its authorizer syncs after a restart, 410, 429, 5xx) and the body is a Status.
            # The stream is read raw, so this is kubernetes_asyncio's unmarshal_event check;
            # stored as an object, it would reach KubeSpawner's readers as an empty event.
            code = event.get("code")
            raise ApiException(status=code or 500, reason=f"{event.get('reason')}: {event.get('message')}")
        kind, obj = event.get("type"), event.get("object") or {}
        if kind == "ERROR":
            code = obj.get("code")
            if code == GONE:
                raise WatchGone(obj.get("message") or "resource version too old")
            raise ApiException(status=code or 500, reason=f"{obj.get('reason')}: {obj.get('message')}")
        md = obj.get("metadata") or {}
        if md.get("resourceVersion"):
            self.resource_version = md["resourceVersion"]
        if kind == "BOOKMARK":
            return
        ref_key = f"{md.get('namespace')}/{md.get('name')}"
        if kind == "DELETED":
            self.resources.pop(ref_key, None)
            self._derive(ref_key, None)
        else:
            self.resources[ref_key] = obj
            self._derive(ref_key, obj)
        self.revision = next(_REVISIONS)

    #: What the pods stand for (``derive(pod)``, set by the reader), kept per pod as events arrive.
    derive: Callable[[dict], Any] | None = None

    def _derive_all(self) -> None:
        self._derived_by_ref = {}
        self._derived_by_key = {}
        self._ref_by_key = {}
        for ref_key, obj in list(self.resources.items()):
            self._derive(ref_key, obj)

    def _derive(self, ref_key: str, obj: dict | None) -> None:
        if self.derive is None:
            return
        old = self._derived_by_ref.pop(ref_key, None)
        if old is not None:
            old_key = str(getattr(old, "key", ""))
            if self._derived_by_key.get(old_key) is old:
                del self._derived_by_key[old_key]
                self._ref_by_key.pop(old_key, None)
        new: Any = self.derive(obj) if obj is not None else None
        if new is not None:
            self._derived_by_ref[ref_key] = new
            self._derived_by_key[new.key] = new
            self._ref_by_key[new.key] = ref_key

    def ref_of(self, key: str) -> str | None:
        """``namespace/name`` of the pod that stands for the workload ``key`` (``None``: none held)."""
        return self._ref_by_key.get(key)

    async def _watch_once(self) -> None:
        """One watch request from ``resource_version``, until the API server ends it."""
        timeout = random.randint(self.watch_timeout_seconds, 2 * self.watch_timeout_seconds)
        args: dict[str, Any] = {
            "label_selector": self.label_selector,
            "field_selector": self.field_selector,
            "resource_version": self.resource_version,
            "allow_watch_bookmarks": True,
            "timeout_seconds": timeout,
            "_request_timeout": watch_request_timeout(timeout, self.request_timeout),
        }
        if not self.omit_namespace:
            args["namespace"] = self.namespace
        w = watch.Watch(return_type="str")  # raw lines: this reflector keeps dicts, as KubeSpawner's
        self.watches += 1
        try:
            async with w.stream(partial(getattr(self.api, self.list_method_name)), **args) as stream:
                async for line in stream:
                    line = line.strip()
                    if not line:
                        continue
                    self._apply_event(json.loads(line))
                    if self._stopping:
                        break
        finally:
            w.stop()
            await w.close()

    async def _watch_and_update(self) -> None:
        where = "all namespaces" if self.omit_namespace else f"namespace {self.namespace}"
        selectors = ", ".join(s for s in (self.label_selector, self.field_selector) if s)
        self.log.info("watching %s (%s) in %s, resuming from the last version seen", self.kind, selectors, where)
        delay = 0.1
        while not self._stopping:
            try:
                if self.resource_version is None:
                    await self._list_and_update()
                await self._watch_once()
                delay = 0.1
            except asyncio.CancelledError:
                if self._stopping:  # stop() cancels the task: end quietly, as KubeSpawner's reflector does
                    break
                raise
            except (WatchGone, ApiException) as e:
                if isinstance(e, WatchGone) or e.status == GONE:
                    self.log.info(
                        "%s watch in %s: version %s is gone; listing again", self.kind, where, self.resource_version
                    )
                    self.resource_version = None
                    continue
                delay = await self._backoff(delay, e, where)
            except Exception as e:  # connection refused or reset, read timeout
                delay = await self._backoff(delay, e, where)
            if delay < 0:
                if self.on_failure:
                    self.on_failure()
                return
        self.log.info("%s watcher in %s stopped", self.kind, where)

    async def _backoff(self, delay: float, error: Exception, where: str) -> float:
        """Wait before the next try; -1 once the API server stayed away too long (as KubeSpawner gives up)."""
        delay *= 2
        if delay > MAX_BACKOFF_SECONDS:
            self.log.error("watching %s in %s never recovered (%s); giving up", self.kind, where, error)
            return -1
        self.log.warning("watching %s in %s failed (%s); resuming in %.1f s", self.kind, where, error, delay)
        await asyncio.sleep(delay)
        return delay


class GPUPodInformer(ResumingWatch, PodReflector):
    """Every pod gpulab counts (``gpulab.io/gpu-milli`` exists), in one namespace or all.

    The one pod watch of a gpulab hub: the ledger is rebuilt from it, and
    KubeSpawner's own code (waiting for a pod to run, polls, stops) reads it
    as its ``pod_reflector``, since every pod GPUKubeSpawner makes carries the label.
    """

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        # ResourceReflector only builds key=value selectors; this one selects on existence.
        self.label_selector = gl.SELECTOR

    def workloads(self) -> dict[str, Any]:
        """``{workload key: workload}`` of the pods held (``derive`` must be set before
        ``start``), kept up to date event by event: no walk over thousands of pods."""
        return self._derived_by_key

    def pod_of(self, key: str) -> dict | None:
        """The pod that holds workload ``key``, if this informer has it (a walk over the
        pods: for the rare server whose pod the hub must find by its labels)."""
        for ref_key, workload in self._derived_by_ref.items():
            if workload.key == key:
                return self.resources.get(ref_key)
        return None


class EventInformer(ResumingWatch, EventReflector):
    """KubeSpawner's event reflector (the spawn progress messages), listing once."""
