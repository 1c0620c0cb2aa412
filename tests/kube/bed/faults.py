"""What the fault tests and benchmarks/kube_faults.py read after a fault: the spawns'
outcomes in the user's words, what the pods hold per team, whether the ledger says the
same, and how often the hub listed and watched (its informers' own counts and the API
server's audit log)."""

from __future__ import annotations

import asyncio
import collections
import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from spawner.core import labels as gl
from spawner.runtime import get_runtime
from tests.kube.bed.fault_hub import make_spawner, restarted_hub_state
from tests.kube.bed.testbed import Testbed

#: What a user must never read as the reason a server did not start.
NOT_FOR_USERS = re.compile(r"Traceback|HTTP 5\d\d|\(5\d\d\)|Internal Server Error|ClientConnectorError|Errno")


def user_words(e: BaseException) -> str:
    """What JupyterHub shows the user for a failed spawn: the exception's
    ``jupyterhub_message`` if it has one, else its text (jupyterhub/apihandlers/users.py,
    the progress handler's failed event)."""
    return str(getattr(e, "jupyterhub_message", None) or e)


def is_sentence(words: str) -> bool:
    """Written for a person: a message of its own (``outcomes`` marks one without), words
    rather than a code, and no status code, exception name or traceback."""
    words = words.strip()
    return (
        not words.startswith(NO_MESSAGE)
        and len(words.split()) >= 4
        and not NOT_FOR_USERS.search(words)
        and "Exception(" not in words
    )


#: How ``outcomes`` marks a failure that carried no message for the user (only its text).
NO_MESSAGE = "(no message for the user)"


def outcomes(spawners: list[Any], results: list[Any]) -> dict[str, dict[str, str]]:
    """``{"running": {user: url}, "refused": {user: the user's words}}``."""
    out: dict[str, dict[str, str]] = {"running": {}, "refused": {}}
    for s, r in zip(spawners, results, strict=True):
        if isinstance(r, str):
            out["running"][s.user.name] = r
        elif isinstance(r, BaseException):
            has_own = getattr(r, "jupyterhub_message", None) is not None
            out["refused"][s.user.name] = user_words(r) if has_own else f"{NO_MESSAGE} {user_words(r)}"
    return out


def held_by_team(tb_or_cluster: Any, teams: dict[str, str]) -> dict[str, int]:
    """GPU milli the cluster's labelled, unfinished pods hold per team (read as the admin,
    which the audit log does not count)."""
    held: dict[str, int] = collections.Counter()
    for ns in sorted(set(teams.values())):
        pods = tb_or_cluster.request("GET", f"/api/v1/namespaces/{ns}/pods?labelSelector={gl.SELECTOR}")["items"]
        for p in pods:
            if (p.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
                continue
            labels = p["metadata"].get("labels") or {}
            held[labels.get(gl.TEAM, "?")] += int(labels.get(gl.GPU_MILLI, "0") or 0)
    return dict(held)


def ledger_held(teams: list[str]) -> dict[str, int]:
    ledger = get_runtime().ledger
    return {t: ledger.usage(t).held_milli for t in teams if ledger.usage(t).held_milli}


async def wait_ledger_exact(spawner: Any, truth: Callable[[], dict[str, int]], timeout: float) -> dict[str, int]:
    """Wait until the ledger (rebuilt from the informers, as the next spawn page does) holds
    per team what the pods hold, and no reservation is left; returns what the pods hold.
    Fails with both sides when it does not settle."""
    deadline = time.monotonic() + timeout
    while True:
        await spawner.refresh_ledger()
        want = {t: n for t, n in (await asyncio.to_thread(truth)).items() if n}
        ledger = get_runtime().ledger
        have = ledger_held(sorted({*want, *(w.team for w in ledger.workloads())}))
        reserved = [w.key for w in ledger.workloads() if w.state != "running"]
        if have == want and not reserved:
            return want
        if time.monotonic() > deadline:
            raise AssertionError(f"the ledger never matched the pods: ledger {have}, pods {want}, reserved {reserved}")
        await asyncio.sleep(0.5)


def informer_counts(reflectors: dict[Any, Any]) -> dict[Any, tuple[int, int]]:
    """``{reflector key: (lists, watches)}`` of gpulab's informers (list-once reflectors)."""
    return {k: (r.lists, r.watches) for k, r in reflectors.items() if hasattr(r, "lists")}


def list_watch_requests(tb: Testbed, offset: int, username: str) -> dict[tuple[str, str], int]:
    """``{(verb, resource): n}`` of one user's requests after ``offset``, counted by the API
    server's audit log (watches when they started, everything else when complete)."""
    out: dict[tuple[str, str], int] = collections.Counter()
    for e in tb.audit_events(offset, username, stages=("ResponseStarted", "ResponseComplete")):
        started_watch = e.get("stage") == "ResponseStarted" and e.get("verb") == "watch"
        if started_watch or (e.get("stage") == "ResponseComplete" and e.get("verb") != "watch"):
            out[(e["verb"], (e.get("objectRef") or {}).get("resource", ""))] += 1
    return dict(out)


async def restart_hub(config: Any, servers: list[dict[str, Any]], out: Path) -> dict[str, Any]:
    """A hub start after the hub process died, as JupyterHub's ``init_spawners`` does it:
    a spawner for every server with a Server row, its state loaded from the database
    (:func:`~tests.kube.bed.fault_hub.restarted_hub_state`), all polled at once; a server
    whose poll says stopped (or fails) is stopped (``check_spawner``: "appears to have
    stopped while the Hub was down", then ``user.stop``). Returns the spawners that run
    (``owned``), the users stopped, and the seconds each phase took."""
    t0 = time.perf_counter()
    spawners = []
    for srv in servers:
        state = restarted_hub_state(srv, out)
        if state is None:
            continue
        s = make_spawner(config, srv)
        s.load_state(state)
        spawners.append((srv, s))
    polls = await asyncio.gather(*(s.poll() for _, s in spawners), return_exceptions=True)
    t_polls = time.perf_counter()
    owned, stopped = {}, []
    for (srv, s), status in zip(spawners, polls, strict=True):
        if status is None:
            owned[srv["user"]] = s
        else:
            stopped.append(s)
    await asyncio.gather(*(s.stop(now=True) for s in stopped), return_exceptions=True)
    return {
        "owned": owned,
        "stopped": [s.user.name for s in stopped],
        "poll_errors": [str(p) for p in polls if isinstance(p, BaseException)],
        "polls_s": t_polls - t0,
        "stops_s": time.perf_counter() - t_polls,
    }


def orphans(cluster: Any, teams: dict[str, str], owned: dict[str, Any]) -> list[str]:
    """Labelled pods in the team namespaces that no running server of the hub owns."""
    mine = {(s.namespace, s.pod_name) for s in owned.values()}
    out = []
    for ns in sorted(set(teams.values())):
        for p in cluster.request("GET", f"/api/v1/namespaces/{ns}/pods?labelSelector={gl.SELECTOR}")["items"]:
            md = p["metadata"]
            if md.get("deletionTimestamp") or (p.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
                continue
            if (ns, md["name"]) not in mine:
                out.append(f"{ns}/{md['name']}")
    return out
