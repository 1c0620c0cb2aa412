"""The gpulab server extension inside a real single-user server spawned by a
real hub: the server token's scopes, XSRF, and who may use the proxy."""

from __future__ import annotations

import re

import pytest
import requests

from tests.support.catalogs import H100_HALF, H100_QUARTER, h100_inventory
from tests.support.hub import RunningHub

CATALOG = (
    h100_inventory(1)
    + "profiles:\n"
    + H100_QUARTER
    + H100_HALF
    + """teams:
  - {name: vision, users: [alice, bob], guarantee: 0.5, burst: 1, allowed_profiles: [h100-quarter, h100-half]}
"""
)


@pytest.fixture(scope="module")
def hub(start_hub):
    return start_hub(CATALOG)


@pytest.fixture(scope="module")
def alice(hub) -> requests.Session:
    """alice, logged in, with a 0.25-GPU server and JupyterLab loaded once (OAuth done)."""
    s = hub.login("alice")
    r = hub.post_spawn(s, "alice", {"choice": "vision:h100-quarter"})
    assert r.status_code in (302, 303), r.text[-2000:]
    hub.wait_server("alice")
    lab = s.get(hub.url + "/user/alice/lab", timeout=60)
    assert lab.status_code == 200, lab.text[-2000:]
    s.lab_html = lab.text  # type: ignore[attr-defined]
    return s


def ext(hub: RunningHub, path: str) -> str:
    return f"{hub.url}/user/alice/gpulab/api/{path}"


def xsrf_header(s: requests.Session) -> dict[str, str]:
    token = s.cookies.get("_xsrf", path="/user/alice/")
    assert token, s.cookies
    return {"X-XSRFToken": token}


def test_lab_page_loads_the_prebuilt_extension(alice):
    assert "gpulab-labextension" in alice.lab_html
    assert re.search(r'"load":\s*"static/remoteEntry\.[0-9a-f]+\.js"', alice.lab_html)


def test_session_reports_the_spawned_share(hub, alice):
    data = alice.get(ext(hub, "session"), timeout=30).json()
    assert data["gpu"] is True and data["hub"] is True
    assert (data["user"], data["team"], data["profile"]) == ("alice", "vision", "h100-quarter")
    assert data["gpu_milli"] == 250 and data["share"] == "0.25 × H100-80GB"
    assert data["devices"] == ["0"] and data["gpu_source"] == "declared"
    assert data["utilisation"]["available"] is False  # no driver here: no numbers


def test_server_token_reads_the_owners_gpu_view(hub, alice):
    r = alice.get(ext(hub, "hub/me"), timeout=30)
    assert r.status_code == 200, r.text
    me = r.json()
    assert me["user"] == "alice"
    assert [h["profile"] for h in me["holdings"]] == ["h100-quarter"]
    vision = {t["name"]: t for t in me["teams"]}["vision"]
    assert vision["held_milli"] == 250


def test_server_token_lists_the_owners_jobs_and_idle_state(hub, alice):
    r = alice.get(ext(hub, "hub/jobs"), timeout=30)
    assert r.status_code == 200, r.text
    assert r.json() == {"jobs": []}
    r = alice.get(ext(hub, "hub/idle"), params={"user": "alice", "server": ""}, timeout=30)
    assert r.status_code == 200, r.text
    assert r.json()["warning"] is None


def test_server_token_cannot_read_another_users_data(hub, alice):
    r = alice.get(ext(hub, "hub/me"), params={"user": "bob"}, timeout=30)
    assert r.status_code == 403
    r = alice.get(ext(hub, "hub/jobs"), params={"user": "bob"}, timeout=30)
    assert r.status_code in (403, 404) or r.json() == {"jobs": []}, r.text


def test_post_needs_the_xsrf_token(hub, alice):
    body = '{"notebook": "missing.ipynb", "job_class": "batch", "profile": "h100-quarter"}'
    r = alice.post(ext(hub, "hub/jobs"), data=body, timeout=30)
    assert r.status_code == 403
    assert "xsrf" in r.text.lower()
    # With the token the request reaches the hub, whose own validation answers.
    r = alice.post(ext(hub, "hub/jobs"), data=body, headers=xsrf_header(alice), timeout=30)
    assert 400 <= r.status_code < 500 and r.status_code != 403, r.text
    assert r.json()["message"]
    assert alice.get(ext(hub, "hub/jobs"), timeout=30).json() == {"jobs": []}


def test_another_user_cannot_use_alices_proxy(hub, alice):
    bob = hub.login("bob")
    r = bob.get(ext(hub, "hub/me"), timeout=30, allow_redirects=True)
    assert r.status_code == 403 or "alice" not in r.text
    r = requests.get(ext(hub, "session"), timeout=30, allow_redirects=False)
    assert r.status_code in (302, 403)
