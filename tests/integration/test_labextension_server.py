"""The gpulab Jupyter server extension inside a real jupyter_server
(pytest-jupyter's fixtures), and its hub proxy against a real JupyterHub."""

from __future__ import annotations

import json
import time

import pytest
from tornado.httpclient import HTTPClientError

from tests.hub_harness import RunningHub, free_port

pytest_plugins = ["pytest_jupyter.jupyter_server"]

GPU_ENV = {
    "JUPYTERHUB_USER": "alice",
    "JUPYTERHUB_SERVER_NAME": "",
    "GPULAB_TEAM": "vision",
    "GPULAB_PROFILE": "h100-quarter",
    "GPULAB_GPU_MILLI": "250",
    "GPULAB_GPU_FRACTION": "0.25",
    "GPULAB_GPU_MODEL": "H100-80GB",
    "GPULAB_GPU_SOURCE": "declared",
    "GPULAB_GPU_MEMORY_MIB": "20389",
    "GPULAB_QUOTA": "over-quota",
    "GPULAB_PREEMPTIBLE": "1",
    "CUDA_VISIBLE_DEVICES": "0",
}


@pytest.fixture
def jp_server_config():
    return {"ServerApp": {"jpserver_extensions": {"labextension": True}}}


@pytest.fixture
def gpu_env(monkeypatch):
    for key in [k for k in GPU_ENV]:
        monkeypatch.setenv(key, GPU_ENV[key])
    monkeypatch.delenv("JUPYTERHUB_API_URL", raising=False)
    monkeypatch.delenv("JUPYTERHUB_API_TOKEN", raising=False)


def _json(response) -> dict:
    return json.loads(response.body)


@pytest.fixture
def ext_fetch(jp_fetch, jp_asyncio_loop):
    """``jp_fetch`` run on pytest-jupyter's own loop (the server's), from a plain test.

    The tests are synchronous on purpose: pytest-asyncio (asyncio_mode=auto)
    would run ``async def`` tests on a different loop than the server's.
    """

    def run(*parts, **kwargs):
        return jp_asyncio_loop.run_until_complete(jp_fetch(*parts, **kwargs))

    return run


def test_session_reports_the_spawners_share_and_no_invented_utilisation(ext_fetch, gpu_env):
    r = ext_fetch("gpulab", "api", "session")
    data = _json(r)
    assert data["gpu"] is True
    assert (data["user"], data["team"], data["profile"]) == ("alice", "vision", "h100-quarter")
    assert data["gpu_milli"] == 250 and data["share"] == "0.25 × H100-80GB"
    assert data["memory_mib"] == 20389 and data["devices"] == ["0"]
    assert data["preemptible"] is True and data["quota"] == "over-quota"
    assert data["hub"] is False
    # This machine has no NVIDIA driver: the answer says so and carries no numbers.
    util = data["utilisation"]
    assert util["available"] is False
    assert "NVML" in util["reason"] or "nvidia-ml-py" in util["reason"]
    assert "devices" not in util and "gpu_percent" not in json.dumps(util)


def test_session_without_gpu_profile(ext_fetch, monkeypatch):
    for key in GPU_ENV:
        monkeypatch.delenv(key, raising=False)
    data = _json(ext_fetch("gpulab", "api", "session"))
    assert data["gpu"] is False and data["share"] is None and data["devices"] == []
    assert data["utilisation"] == {"available": False, "reason": "this server has no GPU assigned"}


def test_session_requires_login(ext_fetch, gpu_env):
    with pytest.raises(HTTPClientError) as e:
        ext_fetch("gpulab", "api", "session", headers={"Authorization": ""})
    assert e.value.code == 403


def test_proxy_outside_jupyterhub_says_so(ext_fetch, gpu_env):
    with pytest.raises(HTTPClientError) as e:
        ext_fetch("gpulab", "api", "hub", "me")
    assert e.value.code == 503
    assert "does not run under JupyterHub" in _json(e.value.response)["message"]
    assert _json(e.value.response)["absent"] == "no-hub"  # the panel explains itself


@pytest.mark.parametrize(
    "body, status",
    [
        ('{"now": true}', 400),
        ("[]", 400),
        ("null", 400),
        ("stop", 400),
        ('{"a": ' * 40, 400),
        ("x" * 2000, 413),
    ],
)
def test_stop_refuses_bad_bodies_and_records_nothing(ext_fetch, gpu_env, monkeypatch, body, status):
    monkeypatch.setenv("JUPYTERHUB_API_URL", f"http://127.0.0.1:{free_port()}/hub/api")
    monkeypatch.setenv("JUPYTERHUB_API_TOKEN", "x")
    with pytest.raises(HTTPClientError) as e:
        ext_fetch("gpulab", "api", "stop", method="POST", body=body)
    assert e.value.code == status
    assert _json(e.value.response)["message"]
    assert _json(ext_fetch("gpulab", "api", "stop")) is None  # no stop was asked


def test_stop_outside_jupyterhub_says_so(ext_fetch, gpu_env):
    with pytest.raises(HTTPClientError) as e:
        ext_fetch("gpulab", "api", "stop", method="POST", body="{}")
    assert e.value.code == 503 and _json(e.value.response)["absent"] == "no-hub"
    assert _json(ext_fetch("gpulab", "api", "stop")) is None


@pytest.mark.parametrize("path", ["hub/me%20x", "hub/..", "hub/", "hub/jobs/1/../../../users"])
def test_proxy_refuses_paths_outside_the_gpulab_api(ext_fetch, gpu_env, monkeypatch, path):
    monkeypatch.setenv("JUPYTERHUB_API_URL", f"http://127.0.0.1:{free_port()}/hub/api")
    monkeypatch.setenv("JUPYTERHUB_API_TOKEN", "x")
    with pytest.raises(HTTPClientError) as e:
        ext_fetch("gpulab", "api", *path.split("/"))
    assert e.value.code in (400, 404)


def test_proxy_reports_an_unreachable_hub(ext_fetch, gpu_env, monkeypatch):
    monkeypatch.setenv("JUPYTERHUB_API_URL", f"http://127.0.0.1:{free_port()}/hub/api")
    monkeypatch.setenv("JUPYTERHUB_API_TOKEN", "x")
    with pytest.raises(HTTPClientError) as e:
        ext_fetch("gpulab", "api", "hub", "me")
    assert e.value.code == 502
    assert "hub is not reachable" in _json(e.value.response)["message"]


# -- against a real hub ------------------------------------------------------


@pytest.fixture(scope="module")
def hub(tmp_path_factory):
    h = RunningHub(tmp_path_factory.mktemp("labext-proxy"))
    h.start()
    yield h
    h.close()


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


@pytest.mark.integration
def test_proxy_forwards_to_the_hub_as_the_owner(ext_fetch, hub_env):
    data = _json(ext_fetch("gpulab", "api", "hub", "me"))
    assert data["user"] == "alice"
    teams = {t["name"]: t for t in data["teams"]}
    assert "vision" in teams  # the demo catalog puts alice in vision (and nlp)
    assert teams["vision"]["profiles"] and teams["vision"]["burst_milli"] > 0


@pytest.mark.integration
def test_proxy_passes_the_hubs_refusal_through(ext_fetch, hub_env):
    with pytest.raises(HTTPClientError) as e:
        ext_fetch("gpulab", "api", "hub", "me", params={"user": "bob"})
    assert e.value.code == 403
    assert "custom:gpulab:admin" in _json(e.value.response)["message"]


@pytest.mark.integration
def test_proxy_refuses_an_oversized_body(ext_fetch, hub_env):
    with pytest.raises(HTTPClientError) as e:
        ext_fetch("gpulab", "api", "hub", "jobs", method="POST", body="x" * (256 * 1024 + 1))
    assert e.value.code == 413


@pytest.mark.integration
def test_a_route_the_hub_lacks_reads_as_no_gpulab_but_gpulabs_own_404_passes(ext_fetch, hub_env):
    # The hub's catch-all API 404 ("Not Found"): what a hub without gpulab answers for every path.
    with pytest.raises(HTTPClientError) as e:
        ext_fetch("gpulab", "api", "hub", "no-such-route")
    assert e.value.code == 404
    body = _json(e.value.response)
    assert body["absent"] == "no-gpulab"
    assert body["message"] == "This hub does not run gpulab; the GPU panel has nothing to show."
    # A 404 of gpulab's own (a job that does not exist) is passed through as such.
    with pytest.raises(HTTPClientError) as e:
        ext_fetch("gpulab", "api", "hub", "jobs", "999999")
    assert e.value.code == 404
    assert "absent" not in _json(e.value.response) and "999999" in _json(e.value.response)["message"]


@pytest.mark.integration
def test_stop_answers_first_then_records_the_hubs_refusal(ext_fetch, hub_env):
    # This token lacks delete:servers (a real server token carries delete:servers!server):
    # the answer is "requested", and the hub's 403 is then recorded for the panel.
    r = ext_fetch("gpulab", "api", "stop", method="POST", body="{}")
    assert r.code == 202 and _json(r)["state"] == "requested"
    deadline = time.monotonic() + 10
    state = _json(ext_fetch("gpulab", "api", "stop"))
    while state["state"] == "requested" and time.monotonic() < deadline:
        time.sleep(0.2)
        state = _json(ext_fetch("gpulab", "api", "stop"))
    assert state["state"] == "failed" and state["status"] == 403, state
    assert state["message"].startswith("The hub did not stop this server:") and "delete:servers" in state["message"]
