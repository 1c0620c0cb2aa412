"""gpulab's Jupyter server extension in a real jupyter_server (pytest-jupyter's fixtures).

The fixtures the ``lab_server/`` folders' conftests import beside pytest-jupyter's:
``jp_server_config`` (the server loads gpulab's extension), ``ext_fetch``, ``gpu_env``.
"""

from __future__ import annotations

import json

import pytest

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
    """The server loads gpulab's extension."""
    return {"ServerApp": {"jpserver_extensions": {"labextension": True}}}


@pytest.fixture
def gpu_env(monkeypatch):
    for key in [k for k in GPU_ENV]:
        monkeypatch.setenv(key, GPU_ENV[key])
    monkeypatch.delenv("JUPYTERHUB_API_URL", raising=False)
    monkeypatch.delenv("JUPYTERHUB_API_TOKEN", raising=False)


def json_body(response) -> dict:
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
