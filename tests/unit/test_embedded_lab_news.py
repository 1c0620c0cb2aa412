"""The embedded hub turns JupyterLab's news announcements off for its users (GPULAB_LAB_NEWS).

The defaults are read back with jupyterlab_server's own settings loader, as a user's lab
server reads them: a default under the user's settings, not a lock.
"""

from __future__ import annotations

import os

import pytest
from traitlets.config import Config

from hub_config.config.embedded import EmbeddedSettings, apply_lab_defaults

NOTIFICATION = "@jupyterlab/apputils-extension:notification"


def lab_overrides(monkeypatch, c: Config, tmp_path) -> dict:
    """The setting overrides a lab server started with the spawner's environment would load."""
    from jupyterlab_server.settings_utils import _get_overrides

    path = dict(c.Spawner.get("environment") or {}).get("JUPYTER_CONFIG_PATH")
    if path:
        monkeypatch.setenv("JUPYTER_CONFIG_PATH", path)
    else:
        monkeypatch.delenv("JUPYTER_CONFIG_PATH", raising=False)
    monkeypatch.setenv("JUPYTER_CONFIG_DIR", str(tmp_path / "user-config"))  # not this machine's ~/.jupyter
    overrides, error = _get_overrides(str(tmp_path / "no-app-settings"))
    assert not error, error
    return overrides


def test_news_is_off_by_default(monkeypatch, tmp_path):
    c = Config()
    c.Spawner.environment = {"JUPYTER_CONFIG_PATH": "/srv/site-jupyter", "KEEP": "1"}
    apply_lab_defaults(c, EmbeddedSettings.from_env({}))
    env = c.Spawner.environment
    assert env["KEEP"] == "1"
    assert env["JUPYTER_CONFIG_PATH"].split(os.pathsep)[1] == "/srv/site-jupyter"  # kept, after ours
    assert lab_overrides(monkeypatch, c, tmp_path)[NOTIFICATION] == {"fetchNews": "false", "checkForUpdates": False}


def test_news_on_or_jupyterlabs_own_prompt(monkeypatch, tmp_path):
    c = Config()
    apply_lab_defaults(c, EmbeddedSettings.from_env({"GPULAB_LAB_NEWS": "on"}))
    assert lab_overrides(monkeypatch, c, tmp_path)[NOTIFICATION] == {"fetchNews": "true"}
    c = Config()
    apply_lab_defaults(c, EmbeddedSettings.from_env({"GPULAB_LAB_NEWS": "ASK"}))
    assert "environment" not in c.Spawner
    assert NOTIFICATION not in lab_overrides(monkeypatch, c, tmp_path)


def test_a_typo_stops_the_hub_with_the_choices():
    with pytest.raises(SystemExit, match="GPULAB_LAB_NEWS='of': use one of off, on, ask"):
        EmbeddedSettings.from_env({"GPULAB_LAB_NEWS": "of"})
