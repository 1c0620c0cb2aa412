"""A small Kubernetes API-server stand-in over real HTTP, for tests only.

Not a mock of gpulab: it is the far end of the wire that KubeSpawner's real
``kubernetes_asyncio`` client talks to, implementing the slice of the
Kubernetes REST API that KubeSpawner 7 uses, with the server's semantics:

- create / get / list / watch / patch / delete for namespaced core/v1
  objects (pods, events, resourcequotas, services, secrets, PVCs ...), list
  and watch across all namespaces (``/api/v1/pods``), namespaces;
- label selectors (``=``, ``==``, ``!=``, ``in``, ``notin``, ``key``,
  ``!key``) and field selectors (``metadata.name=``, ``status.phase!=`` ...);
- a global ``resourceVersion``; watches replay history after a given
  version, start with ``ADDED`` events for version ``0``, end after
  ``timeoutSeconds`` and answer too-old versions with ``410 Gone``;
- server-filled metadata (namespace, uid, resourceVersion,
  creationTimestamp) and pod ``status.phase: Pending``;
- a "kubelet" step that, after ``kubelet_delay`` seconds, marks a pod
  Running with a podIP and ready containers (and records Scheduled/Started
  events), and finishes graceful deletions;
- ``ResourceQuota`` admission on pod create (``requests.<resource>``,
  ``limits.<resource>`` for cpu/memory, extended resources and ``pods``)
  refused as ``403 Forbidden`` with the real message shape;
- JSON merge patches; strategic-merge patches are applied with merge-patch
  semantics, which is exact for the label and annotation maps we patch;
- every request counted by (verb, path) so benchmarks can count API calls
  (``KubeAPIServer.requests`` / ``count()``, or ``GET /_standin/requests``).

Run standalone with ``python -m tests.kube_api_server --port 8001``.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import copy
import datetime
import json
import uuid
from collections.abc import Mapping
from decimal import Decimal
from typing import Any

from tornado import httpserver, web
from tornado.iostream import StreamClosedError

from tests.kube_selectors import _fmt_quantity, parse_field_selector, parse_label_selector, parse_quantity, pod_usage

HISTORY_LIMIT = 20000


def _now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def status_body(code: int, reason: str, message: str, details: Mapping[str, Any] | None = None) -> dict:
    """A ``meta/v1 Status`` object exactly as the API server returns it."""
    return {
        "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
        "message": message, "reason": reason, "details": dict(details or {}), "code": code,
    }



# --------------------------------------------------------------------------
# The store


class KubeAPIServer:
    """State plus the tornado application; ``await start()`` / ``await stop()``."""

    def __init__(self, *, kubelet_delay: float = 0.05, pod_ip_prefix: str = "10.244.0."):
        self.kubelet_delay = kubelet_delay
        self.pod_ip_prefix = pod_ip_prefix
        #: (plural, namespace, name) -> object
        self.objects: dict[tuple[str, str, str], dict] = {}
        self.namespaces: dict[str, dict] = {}
        self.resource_version = 100
        self.history: collections.deque = collections.deque(maxlen=HISTORY_LIMIT)
        self.watchers: list[tuple[str, str | None, Any, Any, asyncio.Queue]] = []
        #: (verb, path) -> count, e.g. ("create", "/api/v1/namespaces/ns/pods").
        self.requests: collections.Counter = collections.Counter()
        #: Bodies of every create / patch received (admitted or not), in order:
        #: (verb, plural, namespace, body).
        self.received: list[tuple[str, str, str, dict]] = []
        self._ip = 10
        self._tasks: set[asyncio.Task] = set()
        self._server: httpserver.HTTPServer | None = None
        self.port = 0

    # -- lifecycle ------------------------------------------------------

    async def start(self, port: int = 0, address: str = "127.0.0.1") -> str:
        app = web.Application([
            (r"/api/v1/namespaces/([^/]+)/([a-z]+)/([^/]+)(?:/status)?", ObjectHandler, {"api": self}),
            (r"/api/v1/namespaces/([^/]+)/([a-z]+)", CollectionHandler, {"api": self}),
            (r"/api/v1/namespaces/([^/]+)", NamespaceHandler, {"api": self}),
            (r"/api/v1/namespaces", NamespaceHandler, {"api": self}),
            (r"/api/v1/([a-z]+)", CollectionHandler, {"api": self}),
            (r"/_standin/requests", CountsHandler, {"api": self}),  # not Kubernetes: the counters
            # batch/v1 Jobs (notebook jobs): stored and watched like the core objects; no Job
            # controller runs -- a test plays it by patching status (added for issue 5).
            (r"/apis/batch/v1/namespaces/([^/]+)/(jobs)/([^/]+)(?:/status)?", ObjectHandler, {"api": self}),
            (r"/apis/batch/v1/namespaces/([^/]+)/(jobs)", CollectionHandler, {"api": self}),
            (r"/apis/batch/v1/(jobs)", CollectionHandler, {"api": self}),
        ])
        from tornado.netutil import bind_sockets

        sockets = bind_sockets(port, address)
        self.port = sockets[0].getsockname()[1]
        self._server = httpserver.HTTPServer(app)
        self._server.add_sockets(sockets)
        return self.url

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def stop(self) -> None:
        for *_, q in list(self.watchers):
            q.put_nowait(None)
        for t in list(self._tasks):
            t.cancel()
        if self._server is not None:
            self._server.stop()
            await self._server.close_all_connections()

    def kubeconfig(self) -> dict:
        """A kubeconfig dict pointing at this server (for ``KUBECONFIG``)."""
        return {
            "apiVersion": "v1", "kind": "Config", "current-context": "standin",
            "clusters": [{"name": "standin", "cluster": {"server": self.url}}],
            "users": [{"name": "standin", "user": {"token": "test"}}],
            "contexts": [{"name": "standin", "context": {"cluster": "standin", "user": "standin"}}],
        }

    # -- counting -------------------------------------------------------

    def count(self, verb: str | None = None, plural: str | None = None) -> int:
        """Requests seen, optionally only of ``verb`` and/or on ``plural`` objects."""
        n = 0
        for (v, path), c in self.requests.items():
            parts = path.strip("/").split("/")
            kind = parts[-1] if v in ("list", "watch", "create") else (parts[-2] if len(parts) > 1 else "")
            if (verb is None or v == verb) and (plural is None or kind == plural):
                n += c
        return n

    # -- storage --------------------------------------------------------

    def _next_rv(self) -> str:
        self.resource_version += 1
        return str(self.resource_version)

    def _emit(self, kind: str, plural: str, obj: dict, old: dict | None = None) -> None:
        rv = int(obj["metadata"]["resourceVersion"])
        self.history.append((rv, kind, plural, copy.deepcopy(obj), copy.deepcopy(old) if old else None))
        for w_plural, ns, lmatch, fmatch, q in list(self.watchers):
            ev = self._event_for(w_plural, ns, lmatch, fmatch, kind, plural, obj, old)
            if ev is not None:
                q.put_nowait(ev)

    @staticmethod
    def _matches(obj: dict, ns: str | None, lmatch, fmatch) -> bool:
        md = obj["metadata"]
        return (ns is None or md.get("namespace") == ns) and lmatch(md.get("labels") or {}) and fmatch(obj)

    def _event_for(self, w_plural, ns, lmatch, fmatch, kind, plural, obj, old):
        if w_plural != plural:
            return None
        now = self._matches(obj, ns, lmatch, fmatch)
        before = old is not None and self._matches(old, ns, lmatch, fmatch)
        if kind == "MODIFIED" and before and not now:
            return {"type": "DELETED", "object": obj}
        if kind == "MODIFIED" and now and not before:
            return {"type": "ADDED", "object": obj}
        return {"type": kind, "object": obj} if now else None

    def list(self, plural: str, ns: str | None, label_selector: str | None = None,
             field_selector: str | None = None) -> list[dict]:
        lmatch, fmatch = parse_label_selector(label_selector), parse_field_selector(field_selector)
        return [copy.deepcopy(o) for (p, n, _), o in sorted(self.objects.items())
                if p == plural and self._matches(o, ns, lmatch, fmatch)]

    def get(self, plural: str, ns: str, name: str) -> dict | None:
        o = self.objects.get((plural, ns, name))
        return copy.deepcopy(o) if o else None

    def create(self, plural: str, ns: str, body: dict) -> dict:
        """Store ``body`` as the API server would; raises web.HTTPError-like ``APIError``."""
        if not isinstance(body, dict) or not isinstance(body.get("metadata"), dict):
            raise APIError(400, "BadRequest", "the body must be an object with metadata")
        obj = copy.deepcopy(body)
        md = obj["metadata"]
        name = md.get("name")
        if not name and md.get("generateName"):
            name = md["generateName"] + uuid.uuid4().hex[:5]
            md["name"] = name
        if not name:
            raise APIError(422, "Invalid", f"{plural} \"\" is invalid: metadata.name: Required value: name or generateName is required")
        if md.get("namespace") not in (None, ns):
            raise APIError(400, "BadRequest", "the namespace of the provided object does not match the namespace sent on the request")
        if (plural, ns, name) in self.objects:
            raise APIError(409, "AlreadyExists", f'{plural} "{name}" already exists',
                           {"name": name, "kind": plural})
        if plural == "pods":
            self._admit_quota(ns, name, obj)
        md.update(namespace=ns, uid=str(uuid.uuid4()), resourceVersion=self._next_rv(),
                  creationTimestamp=_now())
        obj.setdefault("kind", _KINDS.get(plural, plural.rstrip("s").capitalize()))
        obj.setdefault("apiVersion", "v1")
        if plural == "pods":
            obj["status"] = {"phase": "Pending", "qosClass": "Burstable"}
            self._spawn(self._kubelet_start(ns, name))
        if plural == "resourcequotas":
            obj["status"] = {"hard": dict(obj.get("spec", {}).get("hard", {})), "used": {}}
        self.objects[(plural, ns, name)] = obj
        self._emit("ADDED", plural, obj)
        return copy.deepcopy(obj)

    def _admit_quota(self, ns: str, name: str, pod: dict) -> None:
        quotas = [o for (p, n, _), o in sorted(self.objects.items()) if p == "resourcequotas" and n == ns]
        if not quotas:
            return
        need = pod_usage(pod)
        for q in quotas:
            hard = q.get("spec", {}).get("hard", {})
            used: dict[str, Decimal] = collections.defaultdict(Decimal)
            for (p, n, _), other in self.objects.items():
                if p == "pods" and n == ns and other["status"].get("phase") not in ("Succeeded", "Failed"):
                    for k, v in pod_usage(other).items():
                        used[k] += v
            over = [k for k in sorted(hard) if need.get(k) and used[k] + need[k] > parse_quantity(hard[k])]
            if over:
                fmt = lambda d: ",".join(f"{k}={_fmt_quantity(d[k])}" for k in over)  # noqa: E731
                limited = ",".join(f"{k}={hard[k]}" for k in over)
                raise APIError(
                    403, "Forbidden",
                    f'pods "{name}" is forbidden: exceeded quota: {q["metadata"]["name"]}, '
                    f"requested: {fmt(need)}, used: {fmt(used)}, limited: {limited}",
                    {"name": name, "kind": "pods"},
                )

    def patch(self, plural: str, ns: str, name: str, patch: Any) -> dict:
        old = self.objects.get((plural, ns, name))
        if old is None:
            raise APIError(404, "NotFound", f'{plural} "{name}" not found', {"name": name, "kind": plural})
        if not isinstance(patch, dict):
            raise APIError(400, "BadRequest", "a merge patch must be a JSON object")
        new = _merge_patch(copy.deepcopy(old), patch)
        for key in ("name", "namespace", "uid", "creationTimestamp"):
            new["metadata"][key] = old["metadata"][key]
        new["metadata"]["resourceVersion"] = self._next_rv()
        self.objects[(plural, ns, name)] = new
        self._emit("MODIFIED", plural, new, old)
        return copy.deepcopy(new)

    def delete(self, plural: str, ns: str, name: str, grace: int | None = None) -> dict:
        obj = self.objects.get((plural, ns, name))
        if obj is None:
            raise APIError(404, "NotFound", f'{plural} "{name}" not found', {"name": name, "kind": plural})
        if plural == "pods" and grace and grace > 0 and obj["status"].get("phase") == "Running":
            if "deletionTimestamp" not in obj["metadata"]:
                old = copy.deepcopy(obj)
                obj["metadata"].update(deletionTimestamp=_now(), deletionGracePeriodSeconds=grace,
                                       resourceVersion=self._next_rv())
                self._emit("MODIFIED", plural, obj, old)
                self._spawn(self._kubelet_finish(ns, name))
            return copy.deepcopy(obj)
        return self._remove(plural, ns, name)

    def _remove(self, plural: str, ns: str, name: str) -> dict:
        obj = self.objects.pop((plural, ns, name))
        obj["metadata"]["resourceVersion"] = self._next_rv()
        self._emit("DELETED", plural, obj)
        return copy.deepcopy(obj)

    # -- the kubelet ----------------------------------------------------

    def _spawn(self, coro) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _record_event(self, ns: str, pod: dict, reason: str, message: str) -> None:
        name = f"{pod['metadata']['name']}.{uuid.uuid4().hex[:12]}"
        self.create("events", ns, {
            "metadata": {"name": name},
            "involvedObject": {"kind": "Pod", "namespace": ns, "name": pod["metadata"]["name"],
                               "uid": pod["metadata"]["uid"], "apiVersion": "v1"},
            "reason": reason, "message": message, "type": "Normal",
            "firstTimestamp": _now(), "lastTimestamp": _now(), "count": 1,
            "source": {"component": "standin-kubelet"},
        })

    async def _kubelet_start(self, ns: str, name: str) -> None:
        await asyncio.sleep(self.kubelet_delay)
        pod = self.objects.get(("pods", ns, name))
        if pod is None or "deletionTimestamp" in pod["metadata"]:
            return
        self._record_event(ns, pod, "Scheduled", f"Successfully assigned {ns}/{name} to standin-node")
        old = copy.deepcopy(pod)
        self._ip += 1
        containers = pod.get("spec", {}).get("containers", [])
        pod["status"] = {
            "phase": "Running", "podIP": f"{self.pod_ip_prefix}{self._ip % 250 + 2}",
            "podIPs": [{"ip": f"{self.pod_ip_prefix}{self._ip % 250 + 2}"}],
            "hostIP": "192.168.0.10", "startTime": _now(), "qosClass": "Burstable",
            "conditions": [{"type": "Ready", "status": "True", "lastTransitionTime": _now()}],
            "containerStatuses": [
                {"name": c["name"], "ready": True, "restartCount": 0, "image": c.get("image", ""),
                 "imageID": "", "started": True, "state": {"running": {"startedAt": _now()}}}
                for c in containers
            ],
        }
        pod["spec"]["nodeName"] = "standin-node"
        pod["metadata"]["resourceVersion"] = self._next_rv()
        self._emit("MODIFIED", "pods", pod, old)
        self._record_event(ns, pod, "Started", "Started container notebook")

    async def _kubelet_finish(self, ns: str, name: str) -> None:
        await asyncio.sleep(self.kubelet_delay)
        if ("pods", ns, name) in self.objects:
            self._remove("pods", ns, name)

    # -- watches --------------------------------------------------------

    def add_watcher(self, plural, ns, label_selector, field_selector, since: str | None) -> asyncio.Queue:
        lmatch, fmatch = parse_label_selector(label_selector), parse_field_selector(field_selector)
        q: asyncio.Queue = asyncio.Queue()
        if since in (None, "", "0"):
            for obj in self.list(plural, ns, label_selector, field_selector):
                q.put_nowait({"type": "ADDED", "object": obj})
        else:
            rv = int(since)
            oldest = self.history[0][0] if self.history else self.resource_version + 1
            if self.history and rv < oldest - 1 and len(self.history) == HISTORY_LIMIT:
                raise APIError(410, "Expired", f"too old resource version: {rv} ({oldest - 1})")
            for ev_rv, kind, ev_plural, obj, old in list(self.history):
                if ev_rv > rv:
                    ev = self._event_for(plural, ns, lmatch, fmatch, kind, ev_plural, obj, old)
                    if ev is not None:
                        q.put_nowait(ev)
        self.watchers.append((plural, ns, lmatch, fmatch, q))
        return q

    def remove_watcher(self, q: asyncio.Queue) -> None:
        self.watchers = [w for w in self.watchers if w[-1] is not q]


_KINDS = {"pods": "Pod", "events": "Event", "resourcequotas": "ResourceQuota", "services": "Service",
          "secrets": "Secret", "persistentvolumeclaims": "PersistentVolumeClaim", "configmaps": "ConfigMap",
          "namespaces": "Namespace", "jobs": "Job"}


class APIError(Exception):
    def __init__(self, code: int, reason: str, message: str, details: Mapping[str, Any] | None = None):
        super().__init__(message)
        self.body = status_body(code, reason, message, details)


def _merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    if not isinstance(target, dict):
        target = {}
    for k, v in patch.items():
        if v is None:
            target.pop(k, None)
        else:
            target[k] = _merge_patch(target.get(k), v)
    return target


# --------------------------------------------------------------------------
# HTTP


class _Base(web.RequestHandler):
    def initialize(self, api: KubeAPIServer) -> None:
        self.api = api

    def check_xsrf_cookie(self) -> None:  # an API server, not a browser app
        pass

    def count(self, verb: str) -> None:
        self.api.requests[(verb, self.request.path)] += 1

    def send(self, code: int, body: Any) -> None:
        self.set_status(code)
        self.set_header("Content-Type", "application/json")
        self.finish(json.dumps(body))

    def body_json(self) -> Any:
        try:
            return json.loads(self.request.body or b"{}")
        except ValueError as e:
            raise APIError(400, "BadRequest", f"invalid JSON body: {e}") from None

    def write_error(self, status_code: int, **kwargs: Any) -> None:
        exc = kwargs.get("exc_info", (None, None))[1]
        if isinstance(exc, APIError):
            self.send(exc.body["code"], exc.body)
        else:
            self.send(status_code, status_body(status_code, self._reason, str(exc or self._reason)))

    def _handle_request_exception(self, e: BaseException) -> None:
        if isinstance(e, APIError):
            if not self._finished:
                self.send(e.body["code"], e.body)
            return
        super()._handle_request_exception(e)


class CountsHandler(_Base):
    """``GET /_standin/requests``: every request so far, for benchmarks in another process."""

    def get(self) -> None:
        self.send(200, [{"verb": v, "path": p, "count": n} for (v, p), n in sorted(self.api.requests.items())])


class NamespaceHandler(_Base):
    def get(self, name: str | None = None) -> None:
        self.count("get")
        if name in self.api.namespaces:
            self.send(200, self.api.namespaces[name])
        else:
            raise APIError(404, "NotFound", f'namespaces "{name}" not found', {"name": name, "kind": "namespaces"})

    def post(self, name: str | None = None) -> None:
        self.count("create")
        body = self.body_json()
        ns = (body.get("metadata") or {}).get("name")
        if ns in self.api.namespaces:
            raise APIError(409, "AlreadyExists", f'namespaces "{ns}" already exists', {"name": ns, "kind": "namespaces"})
        body["metadata"].update(uid=str(uuid.uuid4()), resourceVersion=self.api._next_rv(), creationTimestamp=_now())
        body.update(kind="Namespace", apiVersion="v1", status={"phase": "Active"})
        self.api.namespaces[ns] = body
        self.api.received.append(("create", "namespaces", "", body))
        self.send(201, body)


class CollectionHandler(_Base):
    async def get(self, *args: str) -> None:
        ns, plural = (args[0], args[1]) if len(args) == 2 else (None, args[0])
        q = self.get_query_argument
        watch = q("watch", "false").lower() in ("true", "1")
        label_selector, field_selector = q("labelSelector", None), q("fieldSelector", None)
        try:
            parse_label_selector(label_selector), parse_field_selector(field_selector)
        except ValueError as e:
            raise APIError(400, "BadRequest", str(e)) from None
        if not watch:
            self.count("list")
            items = self.api.list(plural, ns, label_selector, field_selector)
            self.send(200, {"kind": _KINDS.get(plural, plural) + "List", "apiVersion": "v1",
                            "metadata": {"resourceVersion": str(self.api.resource_version)}, "items": items})
            return
        self.count("watch")
        timeout = float(q("timeoutSeconds", "1800"))
        queue = self.api.add_watcher(plural, ns, label_selector, field_selector, q("resourceVersion", None))
        self.set_header("Content-Type", "application/json")
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        try:
            await self.flush()
            while (left := deadline - loop.time()) > 0:
                try:
                    ev = await asyncio.wait_for(queue.get(), left)
                except asyncio.TimeoutError:
                    break
                if ev is None:  # the server is stopping
                    break
                self.write(json.dumps(ev) + "\n")
                await self.flush()
        except StreamClosedError:
            pass
        finally:
            self.api.remove_watcher(queue)
        if not self._finished:
            self.finish()

    def post(self, ns: str, plural: str) -> None:
        self.count("create")
        body = self.body_json()
        self.api.received.append(("create", plural, ns, copy.deepcopy(body)))  # refused ones too
        self.send(201, self.api.create(plural, ns, body))


class ObjectHandler(_Base):
    def get(self, ns: str, plural: str, name: str) -> None:
        self.count("get")
        obj = self.api.get(plural, ns, name)
        if obj is None:
            raise APIError(404, "NotFound", f'{plural} "{name}" not found', {"name": name, "kind": plural})
        self.send(200, obj)

    def patch(self, ns: str, plural: str, name: str) -> None:
        self.count("patch")
        ctype = self.request.headers.get("Content-Type", "")
        if "json-patch+json" in ctype:
            raise APIError(415, "UnsupportedMediaType", "JSON patch is not implemented by this stand-in")
        body = self.body_json()
        self.api.received.append(("patch", plural, ns, copy.deepcopy(body)))
        self.send(200, self.api.patch(plural, ns, name, body))

    def delete(self, ns: str, plural: str, name: str) -> None:
        self.count("delete")
        grace = self.get_query_argument("gracePeriodSeconds", None)
        if grace is None and self.request.body:
            grace = (self.body_json() or {}).get("gracePeriodSeconds")
        self.send(200, self.api.delete(plural, ns, name, None if grace is None else int(grace)))


def main() -> None:  # pragma: no cover - manual use
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=8001)
    parser.add_argument("--kubelet-delay", type=float, default=0.05)
    args = parser.parse_args()

    async def run() -> None:
        print("serving on", await KubeAPIServer(kubelet_delay=args.kubelet_delay).start(args.port), flush=True)
        await asyncio.Event().wait()

    asyncio.run(run())


if __name__ == "__main__":  # pragma: no cover
    main()
