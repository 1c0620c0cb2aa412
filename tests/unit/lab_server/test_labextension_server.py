"""The gpulab Jupyter server extension inside a real jupyter_server, in this process
(pytest-jupyter's fixtures). Its hub proxy against a real hub: tests/integration/test_labextension_proxy.py."""

from __future__ import annotations

import json

import pytest
from tornado.httpclient import HTTPClientError

from tests.support.lab_server import GPU_ENV, json_body
from tests.support.ports import free_port


def test_session_reports_the_spawners_share_and_no_invented_utilisation(ext_fetch, gpu_env):
    r = ext_fetch("gpulab", "api", "session")
    data = json_body(r)
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
    data = json_body(ext_fetch("gpulab", "api", "session"))
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
    assert "does not run under JupyterHub" in json_body(e.value.response)["message"]
    assert json_body(e.value.response)["absent"] == "no-hub"  # the panel explains itself


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
    assert json_body(e.value.response)["message"]
    assert json_body(ext_fetch("gpulab", "api", "stop")) is None  # no stop was asked


def test_stop_outside_jupyterhub_says_so(ext_fetch, gpu_env):
    with pytest.raises(HTTPClientError) as e:
        ext_fetch("gpulab", "api", "stop", method="POST", body="{}")
    assert e.value.code == 503 and json_body(e.value.response)["absent"] == "no-hub"
    assert json_body(ext_fetch("gpulab", "api", "stop")) is None


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
    assert "hub is not reachable" in json_body(e.value.response)["message"]
