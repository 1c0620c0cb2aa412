"""The embedded hub runs the GPU idle culler by default: NVML when a driver is present,
off (saying why) without one. The hub's page that says so: tests/integration/test_idle_embedded.py."""

from __future__ import annotations

import sys

import pytest
from traitlets.config import Config

from hub_config.config.idle_service import SERVICE, configure_idle_culler
from hub_config.config.scopes import CULLER_SERVICE_SCOPES
from hub_config.domain.idle_records import GPULabIdle
from spawner.core.packer import GPUDevice


def fake_gpus():
    return [GPUDevice(i, "H100-80GB", 81559, f"GPU-{i}", "local", "nvml") for i in range(2)]


def test_with_a_driver_the_nvml_culler_runs_as_a_hub_service(monkeypatch):
    monkeypatch.delenv("GPULAB_IDLE_CULLER", raising=False)
    monkeypatch.setenv("GPULAB_IDLE_CULLER_ARGS", "--timeout=1800 --grace=600")
    c = Config()
    c.JupyterHub.bind_url = "http://127.0.0.1:8000/"
    assert configure_idle_culler(c, detect=fake_gpus)
    service = next(s for s in c.JupyterHub.services if s["name"] == SERVICE)
    assert service["command"][:4] == [sys.executable, "-m", "idle_culler", "--source=nvml"]
    assert "--public-url=http://127.0.0.1:8000" in service["command"]
    assert service["command"][-2:] == ["--timeout=1800", "--grace=600"]
    role = next(r for r in c.JupyterHub.load_roles if r["name"] == SERVICE)
    assert role["services"] == [SERVICE] and role["scopes"] == CULLER_SERVICE_SCOPES
    settings = GPULabIdle(config=c)
    assert settings.culler_running is True and "NVML" in settings.culler_status and "2 GPU(s)" in settings.culler_status


@pytest.mark.parametrize(
    "env, detected, why",
    [
        ("auto", None, "no NVIDIA driver"),
        ("auto", [], "no NVIDIA driver"),
        ("off", fake_gpus, "GPULAB_IDLE_CULLER=off"),
    ],
)
def test_without_a_driver_or_when_turned_off_the_culler_is_off_and_says_why(monkeypatch, env, detected, why):
    monkeypatch.setenv("GPULAB_IDLE_CULLER", env)
    c = Config()
    assert not configure_idle_culler(c, detect=detected if callable(detected) else (lambda: detected))
    assert not any(s.get("name") == SERVICE for s in c.JupyterHub.get("services", []))
    settings = GPULabIdle(config=c)
    assert settings.culler_running is False and why in settings.culler_status
