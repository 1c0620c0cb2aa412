"""Weighted borrowing end to end on a real JupyterHub with the single-server spawner: the
spawn queue's waiting entries are the demand the one ledger shares a department's idle
capacity by (docs/configuration.md, "Fair share").

Four declared H100 in department research: audio (dave) is guaranteed all four and holds
them; nlp (weight 1: nina, nick) and vision (weight 3: alice, bob, barb) queue one GPU
each, nlp first. When dave stops, first come would start nina, nick, alice and bob (2 : 2);
by weight nlp gets 1 and vision 3, and nick waits with the reason.
"""

from __future__ import annotations

import json
import time

import pytest

from tests.support.hub import RunningHub
from tests.support.jobs import user_token

CATALOG = """
inventory:
  - {model: H100-80GB, count: 4, memory_mib: 81559}
profiles:
  - {slug: h100, display_name: "1 × H100", gpus: 1, gpu_model: H100-80GB}
  - {slug: h100-4, display_name: "4 × H100", gpus: 4, gpu_model: H100-80GB}
departments:
  - {name: research, guarantee: 4, burst: 4}
teams:
  - {name: audio, users: [dave], guarantee: 4, burst: 4, department: research}
  - {name: nlp, users: [nina, nick], guarantee: 0, burst: 4, department: research, fair_share_weight: 1}
  - {name: vision, users: [alice, bob, barb], guarantee: 0, burst: 4, department: research, fair_share_weight: 3}
"""
EXTRA = """
c.GPULabQueue.retry_seconds = 2
"""
USERS = ("dave", "nina", "nick", "alice", "bob", "barb")
TEAM = {"nina": "nlp", "nick": "nlp", "alice": "vision", "bob": "vision", "barb": "vision"}


@pytest.fixture(scope="module")
def hub(start_hub):
    return start_hub(CATALOG, extra_config=EXTRA)


@pytest.fixture(scope="module")
def tokens(hub):
    return {u: user_token(hub, u) for u in USERS}


def entries(hub: RunningHub, token: str) -> list[dict]:
    r = hub.api("GET", "/gpulab/queue", token=token)
    assert r.status_code == 200, r.text
    return r.json()["entries"]


def test_idle_capacity_goes_to_the_waiting_teams_by_weight(hub, tokens):
    r = hub.api("POST", "/users/dave/server", json={"team": "audio", "profile": "h100-4"})
    assert r.status_code in (201, 202), r.text
    hub.wait_server("dave")
    for user in ("nina", "nick", "alice", "bob", "barb"):  # in this order: first come is nlp
        r = hub.api(
            "POST", "/gpulab/queue", token=tokens[user], data=json.dumps({"team": TEAM[user], "profile": "h100"})
        )
        assert r.status_code == 201, r.text
        time.sleep(0.05)
    # the tree shows each team's fair share now, from what each has waiting: none while audio
    # holds its whole guarantee (nothing is lent)
    tree = hub.api("GET", "/gpulab/tree").json()
    shares = {t["name"]: (t["fair_share_now_milli"], t["waiting_milli"]) for t in tree["departments"][0]["teams"]}
    assert shares == {"audio": (0, 0), "nlp": (0, 2000), "vision": (0, 3000)}, shares

    assert hub.api("DELETE", "/users/dave/server").status_code in (202, 204)
    for user in ("nina", "alice", "bob", "barb"):
        hub.wait_server(user, timeout=90)
    held = {}
    for w in hub.holdings():
        held[w["team"]] = held.get(w["team"], 0) + w["gpu_milli"]
    assert held == {"nlp": 1000, "vision": 3000}, held
    # nick still waits: the department is full now, and he was held back by weight before
    (nick,) = [e for e in entries(hub, tokens["nick"]) if e["state"] == "waiting"]
    assert nick["team"] == "nlp"
    assert not (hub.api("GET", "/users/nick").json().get("servers") or {})
    for user in ("nina", "alice", "bob", "barb"):
        hub.api("DELETE", f"/users/{user}/server")
    # once nlp's share is free again, nick starts from the queue
    hub.wait_server("nick", timeout=90)
