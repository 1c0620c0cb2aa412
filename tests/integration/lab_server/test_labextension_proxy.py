"""The gpulab Jupyter server extension's hub proxy against a real JupyterHub (the
extension in a real jupyter_server, pytest-jupyter's fixtures)."""

from __future__ import annotations

import time

import pytest
from tornado.httpclient import HTTPClientError

from tests.support.lab_server import json_body

# -- against a real hub ------------------------------------------------------


@pytest.fixture(scope="module")
def hub(start_hub):
    return start_hub()


@pytest.fixture
def alice_token(hub):
    """A hub token of alice's with exactly what the server token carries for the proxy."""
    r = hub.api(
        "POST", "/users/alice/tokens", json={"scopes": ["custom:gpulab:jobs!user=alice"], "note": "labextension test"}
    )
    assert r.status_code == 201, r.text
    return r.json()["token"]


@pytest.fixture
def hub_env(hub, alice_token, gpu_env, monkeypatch):
    monkeypatch.setenv("JUPYTERHUB_API_URL", hub.url + "/hub/api")
    monkeypatch.setenv("JUPYTERHUB_API_TOKEN", alice_token)


def test_proxy_forwards_to_the_hub_as_the_owner(ext_fetch, hub_env):
    data = json_body(ext_fetch("gpulab", "api", "hub", "me"))
    assert data["user"] == "alice"
    teams = {t["name"]: t for t in data["teams"]}
    assert "vision" in teams  # the demo catalog puts alice in vision (and nlp)
    assert teams["vision"]["profiles"] and teams["vision"]["burst_milli"] > 0


def test_proxy_passes_the_hubs_refusal_through(ext_fetch, hub_env):
    with pytest.raises(HTTPClientError) as e:
        ext_fetch("gpulab", "api", "hub", "me", params={"user": "bob"})
    assert e.value.code == 403
    assert "custom:gpulab:admin" in json_body(e.value.response)["message"]


def test_proxy_refuses_an_oversized_body(ext_fetch, hub_env):
    with pytest.raises(HTTPClientError) as e:
        ext_fetch("gpulab", "api", "hub", "jobs", method="POST", body="x" * (256 * 1024 + 1))
    assert e.value.code == 413


def test_a_route_the_hub_lacks_reads_as_no_gpulab_but_gpulabs_own_404_passes(ext_fetch, hub_env):
    # The hub's catch-all API 404 ("Not Found"): what a hub without gpulab answers for every path.
    with pytest.raises(HTTPClientError) as e:
        ext_fetch("gpulab", "api", "hub", "no-such-route")
    assert e.value.code == 404
    body = json_body(e.value.response)
    assert body["absent"] == "no-gpulab"
    assert body["message"] == "This hub does not run gpulab; the GPU panel has nothing to show."
    # A 404 of gpulab's own (a job that does not exist) is passed through as such.
    with pytest.raises(HTTPClientError) as e:
        ext_fetch("gpulab", "api", "hub", "jobs", "999999")
    assert e.value.code == 404
    assert "absent" not in json_body(e.value.response) and "999999" in json_body(e.value.response)["message"]


def test_stop_answers_first_then_records_the_hubs_refusal(ext_fetch, hub_env):
    # This token lacks delete:servers (a real server token carries delete:servers!server):
    # the answer is "requested", and the hub's 403 is then recorded for the panel.
    r = ext_fetch("gpulab", "api", "stop", method="POST", body="{}")
    assert r.code == 202 and json_body(r)["state"] == "requested"
    deadline = time.monotonic() + 10
    state = json_body(ext_fetch("gpulab", "api", "stop"))
    while state["state"] == "requested" and time.monotonic() < deadline:
        time.sleep(0.2)
        state = json_body(ext_fetch("gpulab", "api", "stop"))
    assert state["state"] == "failed" and state["status"] == 403, state
    assert state["message"].startswith("The hub did not stop this server:") and "delete:servers" in state["message"]
