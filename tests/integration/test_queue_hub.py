"""The spawn queue end to end on a real JupyterHub with the single-server spawner: one
declared H100 (no GPU here: the declared inventory is what the packer places on).

Queue order (first come, first served), the bound per user, cancel, bad input on every
endpoint (nothing changed), the queue surviving a hub restart, and the queued server
starting by itself when the GPU frees -- through the same ledger a spawn uses.
"""

from __future__ import annotations

import html
import json
import re
import time

import pytest

from tests.support.hub import RunningHub
from tests.support.jobs import user_token

CATALOG = """
inventory:
  - {model: H100-80GB, count: 1, memory_mib: 81559}
profiles:
  - {slug: h100, display_name: "1 × H100", gpus: 1, gpu_model: H100-80GB}
  - {slug: cpu, display_name: "CPU only", gpus: 0}
teams:
  - {name: vision, users: [alice, bob, carol, dave], guarantee: 1, burst: 1}
"""

EXTRA = """
c.GPULabQueue.max_entries_per_user = 2
c.GPULabQueue.retry_seconds = 2
c.JupyterHub.allow_named_servers = True
"""


@pytest.fixture(scope="module")
def hub(tmp_path_factory):
    h = RunningHub(tmp_path_factory.mktemp("queue-hub"), CATALOG, extra_config=EXTRA)
    try:
        h.start()
        yield h
    finally:
        h.close()


@pytest.fixture(scope="module")
def tokens(hub):
    return {u: user_token(hub, u) for u in ("alice", "bob", "carol", "dave")}


def queue(hub, tokens, user, method="GET", path="", **kw):
    return hub.api(method, "/gpulab/queue" + path, token=tokens[user], **kw)


def join(hub, tokens, user, server_name="", profile="h100"):
    return queue(
        hub, tokens, user, "POST", data=json.dumps({"team": "vision", "profile": profile, "server_name": server_name})
    )


def waiting(hub, tokens, user):
    r = queue(hub, tokens, user)
    assert r.status_code == 200, r.text
    return [e for e in r.json()["entries"] if e["state"] == "waiting"]


def page_of(hub, session) -> str:
    return hub.spawn_page(session).content.decode("utf-8")


def test_a_full_profile_queues_in_order(hub, tokens):
    r = hub.api("POST", "/users/alice/server", data=json.dumps({"team": "vision", "profile": "h100"}))
    assert r.status_code in (201, 202), r.text
    hub.wait_server("alice")
    r = join(hub, tokens, "bob")
    assert r.status_code == 201, r.text
    assert r.json()["position_sentence"] == "You are next in line for 1 × H100 in team vision"
    r = join(hub, tokens, "carol")
    assert r.status_code == 201, r.text
    assert r.json()["position"] == 2
    assert r.json()["position_sentence"] == "You are 2nd in line for 1 × H100 in team vision"
    # alice's server has no history, no time limit and no idle warning: no prediction, said so
    assert r.json()["predicted_start"] is None
    assert r.json()["prediction_sentence"].startswith("No predicted start yet")


def test_the_bound_per_user_and_one_entry_per_server(hub, tokens):
    assert join(hub, tokens, "carol").status_code == 409  # the default server is queued already
    assert join(hub, tokens, "carol", "second").status_code == 201
    r = join(hub, tokens, "carol", "third")
    assert r.status_code == 409 and "2 of the 2 queue entries" in r.json()["message"]
    assert len(waiting(hub, tokens, "carol")) == 2


def test_cancel_and_other_users_entries(hub, tokens):
    r = join(hub, tokens, "dave")
    assert r.status_code == 201
    dave_id = r.json()["id"]
    # bob cannot cancel dave's entry, nor learn it exists: 404, and it still waits
    r = queue(hub, tokens, "bob", "DELETE", f"/{dave_id}")
    assert r.status_code == 404
    assert [e["id"] for e in waiting(hub, tokens, "dave")] == [dave_id]
    assert dave_id not in [e["id"] for e in queue(hub, tokens, "bob").json()["entries"]]
    assert queue(hub, tokens, "dave", "DELETE", f"/{dave_id}").status_code == 204
    assert waiting(hub, tokens, "dave") == []
    r = queue(hub, tokens, "dave", "DELETE", f"/{dave_id}")
    assert r.status_code == 409  # cancelled already: nothing to cancel


@pytest.mark.parametrize(
    ("body", "status"),
    [
        (b"{not json", 400),
        (b"[]", 400),
        (json.dumps({"team": "vision", "profile": "h100", "gpus": 8}).encode(), 400),  # tampered: GPU size
        (json.dumps({"team": "vision", "profile": "nope"}).encode(), 400),
        (json.dumps({"team": "other", "profile": "h100"}).encode(), 403),
        (json.dumps({"team": "vision", "profile": "h100", "server_name": "a/b"}).encode(), 400),
        (json.dumps({"team": "vision", "profile": "h100", "server_name": 7}).encode(), 400),
        (json.dumps({"team": "vision", "profile": "cpu", "server_name": "cpu"}).encode(), 400),
        (json.dumps({"team": "vision", "profile": "h100", "server_name": "x" * 300}).encode(), 400),
        (b'{"team": "' + b"v" * 5000 + b'"}', 413),
    ],
)
def test_bad_joins_are_refused_and_change_nothing(hub, tokens, body, status):
    before = queue(hub, tokens, "dave").json()["entries"]
    r = hub.api("POST", "/gpulab/queue", token=tokens["dave"], data=body)
    assert r.status_code == status, r.text
    assert r.json()["message"]
    assert queue(hub, tokens, "dave").json()["entries"] == before


@pytest.mark.parametrize("path", ["/abc", "/-1", "/²", "/99999999999999", "/1x"])
def test_bad_cancels_are_refused(hub, tokens, path):
    before = queue(hub, tokens, "bob").json()["entries"]
    r = queue(hub, tokens, "bob", "DELETE", path)
    assert r.status_code in (400, 404), r.text
    assert queue(hub, tokens, "bob").json()["entries"] == before


def test_no_token_and_a_service_are_refused(hub):
    assert hub.api("GET", "/gpulab/queue", token="not-a-token").status_code == 403
    assert hub.api("GET", "/gpulab/queue").status_code == 403  # the admin service is no user


def test_the_spawn_page_says_the_place_in_line(hub):
    s = hub.login("carol")
    page = page_of(hub, s)
    assert "You are 2nd in line for 1 × H100 in team vision." in page
    assert "data-gpulab-cancel=" in page and "Leave the queue" in page
    s = hub.login("dave")
    page = page_of(hub, s)
    assert re.search(
        r'<button type="button"[^>]*data-gpulab-queue-url="/hub/gpulab/queue\?server="[^>]*data-gpulab-queue="vision:h100"',
        page,
    ), page
    # behind bob and carol's two entries; the page's own "Queue me" posts the spawn form to the queue, then comes back to the page
    xsrf = s.cookies.get("_xsrf", path="/hub/")
    r = s.post(
        hub.url + "/hub/gpulab/queue?server=", data={"_xsrf": xsrf, "queue": "vision:h100"}, allow_redirects=False
    )
    assert r.status_code == 303, r.text
    page = page_of(hub, s)
    assert "You are 4th in line for 1 × H100 in team vision." in page
    entry_id = re.search(r'data-gpulab-cancel="(\d+)"', page).group(1)
    # without the XSRF token the post is refused and nothing changes
    r = s.post(hub.url + "/hub/gpulab/queue/cancel", data={"cancel": entry_id}, allow_redirects=False)
    assert r.status_code == 403
    # another user's entry through the page: 404
    bob = hub.login("bob")
    page_of(hub, bob)
    bob_xsrf = bob.cookies.get("_xsrf", path="/hub/")
    r = bob.post(
        hub.url + "/hub/gpulab/queue/cancel", data={"_xsrf": bob_xsrf, "cancel": entry_id}, allow_redirects=False
    )
    assert r.status_code == 404
    r = s.post(hub.url + "/hub/gpulab/queue/cancel", data={"_xsrf": xsrf, "cancel": entry_id}, allow_redirects=False)
    assert r.status_code == 303
    assert "4th in line" not in page_of(hub, s)


def test_the_queue_survives_a_hub_restart(hub, tokens):
    before = {u: [(e["id"], e["position"]) for e in waiting(hub, tokens, u)] for u in ("bob", "carol")}
    hub.restart()
    after = {u: [(e["id"], e["position"]) for e in waiting(hub, tokens, u)] for u in ("bob", "carol")}
    assert after == before
    assert hub.wait_server("alice")  # re-adopted: still holds the GPU, so bob still waits


def test_the_next_in_line_starts_by_itself_when_the_gpu_frees(hub, tokens):
    r = hub.api("DELETE", "/users/alice/server")
    assert r.status_code in (202, 204), r.text
    hub.wait_server("bob", timeout=60)
    bob = queue(hub, tokens, "bob").json()["entries"]
    assert bob[0]["state"] == "started", bob
    assert [h["key"] for h in hub.holdings() if h["gpu_milli"]] == ["notebook:bob/"]
    # carol (2nd) is next now; her entries wait, nobody else started
    assert sorted(e["position"] for e in waiting(hub, tokens, "carol")) == [1, 2]
    assert not (hub.api("GET", "/users/carol").json().get("servers") or {})


@pytest.mark.parametrize(
    ("path", "form", "status"),
    [
        ("/hub/gpulab/queue?server=", {}, 400),  # no choice
        ("/hub/gpulab/queue?server=", {"queue": "vision"}, 400),  # not team:profile
        ("/hub/gpulab/queue?server=", {"queue": ["vision:h100", "vision:h100"]}, 400),
        ("/hub/gpulab/queue?server=", {"queue": "vision:" + "h" * 300}, 400),
        ("/hub/gpulab/queue?server=" + "x" * 300, {"queue": "vision:h100"}, 400),
        ("/hub/gpulab/queue/cancel", {"cancel": "²"}, 400),
        ("/hub/gpulab/queue/cancel", {"cancel": "-1"}, 400),
        ("/hub/gpulab/queue/cancel", {"cancel": "999999"}, 404),
    ],
)
def test_bad_page_posts_are_refused_and_change_nothing(hub, tokens, path, form, status):
    s = hub.login("dave")
    page_of(hub, s)
    before = queue(hub, tokens, "dave").json()["entries"]
    r = s.post(hub.url + path, data={"_xsrf": s.cookies.get("_xsrf", path="/hub/"), **form}, allow_redirects=False)
    assert r.status_code == status, r.text[-500:]
    assert queue(hub, tokens, "dave").json()["entries"] == before


def test_a_page_join_that_is_refused_says_why_on_the_page(hub):
    s = hub.login("dave")
    page_of(hub, s)
    xsrf = s.cookies.get("_xsrf", path="/hub/")
    # the CPU profile holds no GPU: nothing to wait for, said on the page (not a bare error)
    r = s.post(hub.url + "/hub/gpulab/queue?server=", data={"_xsrf": xsrf, "queue": "vision:cpu"}, allow_redirects=True)
    assert r.status_code == 200
    assert "Not queued: profile 'cpu' holds no GPU" in html.unescape(r.content.decode())


def test_an_entry_whose_profile_was_retired_fails_with_the_reason_and_holds_nobody_back(hub, tokens):
    # bob holds the GPU (started from the queue); carol waits twice for 1 × H100
    assert hub.api("POST", "/gpulab/profiles/h100/retire").status_code == 200
    try:
        r = hub.api("DELETE", "/users/bob/server")
        assert r.status_code in (202, 204), r.text
        hub.wait_server("bob", ready=False)
        deadline = time.monotonic() + 60

        def unsettled() -> list:  # an entry the runner is starting fails when the hub refuses it
            return [e for e in queue(hub, tokens, "carol").json()["entries"] if e["state"] in ("waiting", "starting")]

        while unsettled():
            assert time.monotonic() < deadline, queue(hub, tokens, "carol").json()
            time.sleep(0.5)
        entries = queue(hub, tokens, "carol").json()["entries"]
        assert {e["state"] for e in entries if e["profile"] == "h100"} == {"failed"}, entries
        assert all("is retired" in e["reason"] for e in entries if e["state"] == "failed")
        assert not (hub.api("GET", "/users/carol").json().get("servers") or {})
        page = page_of(hub, hub.login("carol"))
        assert "did not start: the server could not be started" in html.unescape(page)
    finally:
        assert hub.api("POST", "/gpulab/profiles/h100/restore").status_code == 200
