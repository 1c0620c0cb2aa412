"""The queue runner: starts the next queued server by itself when GPUs free.

It lives in the hub process beside the one ledger. Every release the ledger records (a
server stopped, a culler's reclaim, a job's end) and a periodic tick (``retry_seconds``:
catalog edits, devices) make it walk the queue in its order (:mod:`spawner.core.queue`)
and ask the ledger, read-only, whether the next entry fits now; if it does, it starts
that server through the hub's own REST API, as the user's "Start" would, with the entry's
team, profile and image. The spawner then reserves through the ledger as for any spawn, so
the queue can never admit what a spawn would not; a start refused in that window (someone
took the GPU first) puts the entry back, in its place.

The hub API is called with a token of the ``gpulab-queue`` service (no process: a name
with the ``servers`` scope, declared by ``configure_gpulab``), minted in the hub's
database when the runner starts and replaced at the next start.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import time
from datetime import timedelta
from typing import Any
from urllib.parse import quote

from sqlalchemy.orm import Session, sessionmaker
from tornado.httpclient import AsyncHTTPClient, HTTPClientError, HTTPRequest
from tornado.ioloop import PeriodicCallback
from traitlets import Bool, Float, Integer
from traitlets.config import Configurable

from hub_config.domain.queue_store import QueueError, QueueStore
from hub_config.domain.session_history import open_since, session_lengths
from hub_config.storage.db import from_epoch, iso, utcnow
from spawner.core.idle import max_lifetime_for
from spawner.core.ledger import Workload
from spawner.core.policy import PolicyError, resolve_request
from spawner.core.queue import (
    BLOCK_CAPACITY,
    BLOCK_TEAM,
    BLOCK_USER,
    CANCELLED,
    FAILED,
    STARTED,
    STARTING,
    WAITING,
    Holder,
    QueueEntry,
    ahead_of,
    entry_words,
    expected_end,
    next_to_start,
    position_sentence,
    predict_start,
    prediction_sentence,
    queue_order,
)
from spawner.runtime import GPULabRuntime

log = logging.getLogger("gpulab.queue")

#: The JupyterHub service whose token the runner starts servers with.
SERVICE_NAME = "gpulab-queue"
#: Its scopes: start (and read) any user's servers, nothing else.
SERVICE_SCOPES = ["servers", "read:users:name"]
#: Refusals of a queued start that free up (quota or devices taken in between, the hub busy,
#: a full disk): the entry waits again in its place. Any other refusal fails the entry.
WAIT_AGAIN_CODES = (403, 409, 429, 503, 507)
#: ... unless the refusal says the choice itself is no longer allowed (a 403 of the catalog's).
NEVER_FITS = ("not a member", "may not use", "is retired", "unknown profile", "offers no image")
#: Server names the queue accepts ('' is the default server).
SERVER_NAME = re.compile(r"[A-Za-z0-9._-]{0,255}")
TOKEN_NOTE = "gpulab queue runner (replaced at each hub start)"


class GPULabQueue(Configurable):
    """The spawn queue: "queue me" when a profile is full."""

    enabled = Bool(
        True,
        config=True,
        help="""Offer "Queue me" on the spawn page when a profile is full, and start queued
        servers by themselves when their GPUs free. False: a full profile is refused as before
        (entries already queued stay, and are started no more).""",
    )
    max_entries_per_user = Integer(
        2,
        min=1,
        config=True,
        help="""How many servers one user may have waiting in the queue at once (each server
        at most once). The bound keeps one user from lining up the whole cluster.""",
    )
    retry_seconds = Float(
        15.0,
        min=1.0,
        config=True,
        help="""Seconds between the runner's periodic walks of the queue. A release in the
        ledger (a stop, a reclaim, a job's end) starts a walk at once; the tick covers what
        the ledger does not see (catalog edits, devices freed by hand).""",
    )
    history_min_sessions = Integer(
        3,
        min=1,
        config=True,
        help="""Recorded sessions of a profile (the user's own first, else everyone's) needed
        before their lengths predict when a running session ends (docs/admin.md, "Predicted start").""",
    )


class QueueRunner:
    """The hub's queue: its store, the walk that starts the next entry, and what users see."""

    def __init__(self, runtime: GPULabRuntime, sessions: sessionmaker[Session], settings: GPULabQueue):
        self.runtime = runtime
        self.sessions = sessions
        self.settings = settings
        self.store = QueueStore(sessions)
        self.api_url = ""
        self.token = ""
        self._walking = False
        self._again = False
        self._periodic: PeriodicCallback | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        #: ``idle_warnings() -> {(user, server): reclaim_at epoch}``: the culler's warned servers
        #: (set by the runtime hook; none outside the hub).
        self.idle_warnings: Any = lambda: {}
        #: One sentence per user for their next spawn page ("Not queued: ..."), shown once.
        self.notices: dict[str, str] = {}
        #: ``job_ends() -> {ledger key: epoch}``: when each running job reaches its time limit.
        self.job_ends: Any = lambda: {}

    # -- what may start ------------------------------------------------------------------

    def fits(self, e: QueueEntry) -> str:
        """``""`` when ``e`` could start now, else what it waits for. Records nothing."""
        runtime = self.runtime
        profile = runtime.catalog.profile(e.profile)
        may_burst = profile.priority_class.may_burst if profile is not None else True
        decision = runtime.ledger.admit(e.team, e.user, e.milli, may_burst=may_burst)
        if not decision.allowed:
            team = runtime.ledger.team(e.team)
            cap = team.per_user_cap_milli if team is not None else None
            if cap is not None and runtime.ledger.user_held(e.team, e.user) + e.milli > cap:
                return BLOCK_USER
            return BLOCK_TEAM
        packer = runtime.packer
        if packer is not None and e.milli and not packer.can_place(e.milli, {e.gpu_model} if e.gpu_model else None):
            return BLOCK_CAPACITY
        return ""

    # -- the walk -------------------------------------------------------------------------

    def publish_waiting(self, active: list[QueueEntry] | None = None) -> list[QueueEntry]:
        """Tell the ledger what waits (each waiting entry's team and GPUs, in queue order): the
        demand its weighted borrowing reads. The entries still in the queue."""
        active = self.store.active() if active is None else active
        ledger = self.runtime.ledger

        def may_start(e: QueueEntry) -> bool:  # an entry its user's cap holds back is no demand on others
            team = ledger.team(e.team)
            cap = team.per_user_cap_milli if team is not None else None
            return cap is None or ledger.user_held(e.team, e.user) + e.milli <= cap

        ledger.set_waiting((e.team, e.milli) for e in queue_order(active) if e.state == WAITING and may_start(e))
        return active

    def poke(self) -> None:
        """Walk the queue soon (safe from any thread)."""
        loop = self._loop
        if loop is None or loop.is_closed():
            return
        loop.call_soon_threadsafe(lambda: asyncio.ensure_future(self.walk()))

    def _observe(self, event: str, w: Workload) -> None:
        if event == "remove" and w.milli > 0:
            self.poke()

    async def walk(self) -> int:
        """Start every entry that fits now, one at a time, in queue order; how many started."""
        if not self.settings.enabled or not self.token:
            return 0
        if self._walking:
            self._again = True
            return 0
        self._walking = True
        started = 0
        try:
            while True:
                self._again = False
                pick = next_to_start(self.publish_waiting(), self.fits)
                if pick is None or not self.store.mark(pick.id, STARTING, "starting", expect=(WAITING,)):
                    if self._again:
                        continue
                    return started
                outcome = await self._start(pick)
                if outcome == STARTED:
                    started += 1
                elif outcome == WAITING:  # someone took the GPU first: wait for the next release
                    return started
        except Exception:
            log.exception("gpulab: the queue walk failed")
            return started
        finally:
            self._walking = False

    async def _start(self, e: QueueEntry) -> str:
        """Start ``e``'s server through the hub API; the entry's new state."""
        path = f"users/{quote(e.user, safe='')}/server" + (
            f"s/{quote(e.server_name, safe='')}" if e.server_name else ""
        )
        options = {"team": e.team, "profile": e.profile}
        if e.image:
            options["image"] = e.image
        request = HTTPRequest(
            f"{self.api_url.rstrip('/')}/{path}",
            method="POST",
            body=json.dumps(options),
            headers={"Authorization": f"token {self.token}", "Content-Type": "application/json"},
            request_timeout=120,
        )
        what = f"{e.user}/{e.server_name} ({e.profile} in team {e.team})"
        try:
            response = await AsyncHTTPClient().fetch(request)
        except HTTPClientError as err:
            body = (
                err.response.body.decode("utf-8", "replace") if err.response is not None and err.response.body else ""
            )
            message = _message(body) or str(err)
            if err.code in WAIT_AGAIN_CODES and not any(w in message for w in NEVER_FITS):
                log.info("gpulab: queue entry %d for %s waits again: %s", e.id, what, message)
                self.store.mark(e.id, WAITING, f"the start was refused, waiting again: {message}", expect=(STARTING,))
                return WAITING
            if err.code == 400 and ("already running" in message or "pending" in message):
                self.store.mark(e.id, CANCELLED, "your server was already running", expect=(STARTING,))
                return CANCELLED
            log.warning("gpulab: queue entry %d for %s failed to start: %s %s", e.id, what, err.code, message)
            self.store.mark(e.id, FAILED, f"the server could not be started: {message}", expect=(STARTING,))
            return FAILED
        except OSError as err:  # the hub API is not reachable (yet): wait for the next walk
            self.store.mark(e.id, WAITING, "", expect=(STARTING,))
            log.warning("gpulab: queue runner cannot reach the hub API: %s", err)
            return WAITING
        log.info("gpulab: queue entry %d started %s (%s)", e.id, what, response.code)
        self.store.mark(e.id, STARTED, "started from the queue", expect=(STARTING,))
        return STARTED

    # -- the predicted start's inputs ----------------------------------------------------------

    def holders(self, now: float) -> list[Holder]:
        """Every workload holding GPUs, with when gpulab expects it to free them."""
        runtime = self.runtime
        workloads = [w for w in runtime.ledger.workloads() if w.milli > 0]
        since = open_since(self.sessions)
        lengths = session_lengths(self.sessions, {w.profile for w in workloads})
        warnings = self.idle_warnings()
        job_ends = self.job_ends()
        out = []
        for w in workloads:
            started = since.get(w.key, now)
            mine = lengths.get((w.profile, w.user), [])
            past = mine if len(mine) >= self.settings.history_min_sessions else lengths.get((w.profile, ""), [])
            profile = runtime.catalog.profile(w.profile)
            lifetime = max_lifetime_for(profile, runtime.ledger.team(w.team)) if w.kind == "notebook" else None
            reclaim_at = None
            if w.kind == "notebook" and w.key.startswith("notebook:"):
                user, _, server = w.key[len("notebook:") :].partition("/")
                reclaim_at = warnings.get((user, server))
            end, basis = expected_end(
                started,
                now,
                past,
                reclaim_at=reclaim_at,
                time_limit_end=job_ends.get(w.key),
                lifetime_end=started + lifetime[0] if lifetime else None,
                min_history=self.settings.history_min_sessions,
            )
            model = profile.gpu_model if profile is not None else None
            out.append(Holder(w.key, w.team, w.milli, model, end, basis))
        return out

    # -- joining and leaving ------------------------------------------------------------

    def join(self, user: str, groups: list[str], options: Any, server_name: str = "") -> QueueEntry:
        """Queue ``user``'s server ``server_name`` for the choice in ``options`` (the spawn
        options: team, profile, image), checked as a spawn would be; :class:`PolicyError`
        (400, 403) or :class:`QueueError` (409) when refused."""
        if not self.settings.enabled:
            raise QueueError("the spawn queue is off on this hub (c.GPULabQueue.enabled)", 409)
        if not isinstance(server_name, str) or not SERVER_NAME.fullmatch(server_name):
            raise PolicyError(
                "server_name must be at most 255 letters, digits, '.', '_' or '-' ('' is the default server)"
            )
        request = resolve_request(self.runtime.catalog, user, groups, options)
        if not request.milli:
            raise PolicyError(f"profile {request.profile.slug!r} holds no GPU: start it, there is nothing to wait for")
        entry = QueueEntry(
            id=0,
            user=user,
            server_name=server_name,
            team=request.team.name,
            profile=request.profile.slug,
            milli=request.milli,
            rank=request.profile.priority_class.rank,
            enqueued_at=0.0,
            gpu_model=request.profile.gpu_model,
            image=request.image.slug if request.image else "",
        )
        joined = self.store.join(entry, self.settings.max_entries_per_user)
        self.publish_waiting()
        log.info(
            "gpulab: %s queued %s/%s for %s in team %s (entry %d)",
            user,
            user,
            server_name,
            entry.profile,
            entry.team,
            joined.id,
        )
        self.poke()
        return joined

    def cancel(self, user: str, entry_id: int) -> QueueEntry:
        entry = self.store.cancel(entry_id, user)
        self.publish_waiting()
        log.info("gpulab: %s cancelled queue entry %d", user, entry_id)
        self.poke()  # those behind it may fit now
        return entry

    # -- what the user sees --------------------------------------------------------------

    def view(self, user: str, recent_seconds: float = 3600) -> list[dict[str, Any]]:
        """``user``'s queue entries still waiting, and those that left the queue in the last
        ``recent_seconds`` (started, cancelled, failed), newest first, as the page and the API say them."""
        now = time.time()
        mine = self.store.of_user(user)
        cutoff = utcnow() - timedelta(seconds=recent_seconds)
        shown = [(e, reason, at) for e, reason, at in mine if e.state in (WAITING, STARTING) or at >= cutoff]
        if not shown:
            return []
        active = self.store.active()
        holders = self.holders(now) if any(e.state == WAITING for e, _, _ in shown) else []
        packer = self.runtime.packer
        out = []
        for e, reason, at in shown:
            profile = self.runtime.catalog.profile(e.profile)
            what = entry_words(e, profile.display_name if profile is not None else e.profile)
            item: dict[str, Any] = {
                "id": e.id,
                "server_name": e.server_name,
                "team": e.team,
                "profile": e.profile,
                "display_name": what,
                "gpu_milli": e.milli,
                "state": e.state,
                "reason": reason,
                "enqueued_at": iso(from_epoch(e.enqueued_at)),
                "updated_at": iso(at),
            }
            if e.state == WAITING:
                ahead = ahead_of(active, e)
                position = 1 + sum(1 for a in ahead if a.team == e.team)
                team_usage = self.runtime.ledger.usage(e.team)
                may_burst = profile.priority_class.may_burst if profile is not None else True
                free = (
                    team_usage.free_milli if may_burst else max(0, team_usage.guarantee_milli - team_usage.held_milli)
                )
                device_free = packer.free_milli({e.gpu_model} if e.gpu_model else None) if packer is not None else None
                prediction = predict_start(e, ahead, holders, now, team_free_milli=free, device_free_milli=device_free)
                item.update(
                    position=position,
                    position_sentence=position_sentence(position, what, e.team),
                    predicted_start=iso(from_epoch(prediction.at)) if prediction.at is not None else None,
                    predicted_in_seconds=round(prediction.at - now) if prediction.at is not None else None,
                    prediction_sentence=prediction_sentence(prediction, now),
                )
            out.append(item)
        return out

    # -- lifecycle -----------------------------------------------------------------------

    def start(self) -> None:
        self.runtime.ledger.subscribe(self._observe)
        recovered = self.store.recover("waiting again after a hub restart")
        if recovered:
            log.info("gpulab: %d queue entr(ies) left starting by the last hub wait again", recovered)
        self.publish_waiting()  # what waited before a restart is demand again at once
        try:
            self._loop = asyncio.get_running_loop()
        except RuntimeError:
            self._loop = None  # a script, not the hub: nothing is started by itself
            return
        self._loop.create_task(self._connect_when_hub_is_up())
        self._periodic = PeriodicCallback(self.poke, self.settings.retry_seconds * 1000)
        self._periodic.start()

    async def _connect_when_hub_is_up(self) -> None:
        from jupyterhub.app import JupyterHub

        if not JupyterHub.initialized():
            return
        app = JupyterHub.instance()
        for _ in range(6000):
            if getattr(app, "tornado_application", None) is not None and app.hub is not None:
                break
            await asyncio.sleep(0.1)
        else:
            log.error("gpulab: the hub never came up; queued servers will not start by themselves")
            return
        try:
            self.token = mint_service_token(app)
        except Exception as e:
            log.error(
                "gpulab: cannot mint the queue runner's token (%s); queued servers will not start by themselves", e
            )
            return
        self.api_url = app.hub.api_url
        log.info("gpulab: queue runner ready (%d waiting)", len(self.store.active()))
        await self.walk()


def mint_service_token(app: Any) -> str:
    """A fresh API token of the ``gpulab-queue`` service in the hub's database (the previous
    runner's is removed): what the runner calls the hub API with."""
    from jupyterhub import orm

    service = orm.Service.find(app.db, SERVICE_NAME)
    if service is None:
        raise RuntimeError(f"the hub has no service {SERVICE_NAME!r} (configure_gpulab declares it)")
    for old in list(service.api_tokens):
        if old.note == TOKEN_NOTE:
            app.db.delete(old)
    app.db.commit()
    return service.new_api_token(note=TOKEN_NOTE, scopes=["inherit"])


def _message(body: str) -> str:
    try:
        data = json.loads(body)
    except ValueError:
        return body[:300]
    return str(data.get("message", ""))[:600] if isinstance(data, dict) else ""


def attach(runtime: GPULabRuntime, sessions: sessionmaker[Session], config: Any) -> QueueRunner:
    runner = QueueRunner(runtime, sessions, GPULabQueue(config=config))
    runner.start()
    return runner
