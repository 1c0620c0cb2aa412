"""The embedded hub refuses to publish its demo login beyond this machine."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from hub_config.config.embedded import UnsafeBindError, check_bind_safe, is_loopback


@pytest.mark.parametrize(
    "host, loopback",
    [
        ("127.0.0.1", True),
        ("127.1.2.3", True),
        ("localhost", True),
        ("[::1]", True),
        ("0.0.0.0", False),
        ("10.0.0.5", False),
        ("", False),
    ],
)
def test_is_loopback(host, loopback):
    assert is_loopback(host) is loopback


def test_demo_login_only_on_loopback():
    check_bind_safe("http://127.0.0.1:8000", demo_auth=True)
    check_bind_safe("http://0.0.0.0:8000", demo_auth=False)
    with pytest.raises(UnsafeBindError, match="not a loopback address"):
        check_bind_safe("http://0.0.0.0:8000", demo_auth=True)
    with pytest.raises(UnsafeBindError):
        check_bind_safe("http://:8000", demo_auth=True)


def test_gpulab_up_refuses_a_public_bind_with_demo_login(tmp_path):
    env = {**os.environ, "GPULAB_DATA_DIR": str(tmp_path)}
    env.pop("GPULAB_BIND", None)
    out = subprocess.run(
        [str(Path(sys.executable).with_name("gpulab")), "up", "--ip", "0.0.0.0", "--port", "8123"],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=60,
    )
    assert out.returncode != 0
    assert "refusing to start" in out.stdout + out.stderr
    assert not (tmp_path / "jupyterhub.sqlite").exists()


def test_a_hub_without_isolation_serves_loopback_only():
    from hub_config.config.embedded import check_isolation_bind

    check_isolation_bind("http://127.0.0.1:8000", isolated=False)
    check_isolation_bind("http://0.0.0.0:8000", isolated=True)
    with pytest.raises(UnsafeBindError, match="NOT isolated"):
        check_isolation_bind("http://0.0.0.0:8000", isolated=False)


def test_internal_ports_follow_the_public_port_or_are_picked_free():
    import socket

    from hub_config.config.embedded import port_near

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        busy = taken.getsockname()[1]
        assert port_near(busy) != busy
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        free = probe.getsockname()[1]
    assert port_near(free) == free


def test_operator_roles_keep_their_scopes_when_gpulab_adds_its_own():
    from traitlets.config import Config

    from hub_config.config.setup import configure_gpulab

    c = Config()
    c.JupyterHub.load_roles = [
        {"name": "user", "scopes": ["self", "access:services"]},
        {"name": "server", "scopes": ["users:activity!user", "read:users:name"]},
        {"name": "teachers", "scopes": ["admin:users"], "groups": ["teachers"]},
    ]
    configure_gpulab(c, admin_users=["root-admin"])
    roles = {r["name"]: r for r in c.JupyterHub.load_roles}
    assert {"self", "access:services", "custom:gpulab:jobs!user"} <= set(roles["user"]["scopes"])
    assert {"read:users:name", "access:servers!server", "users:activity!user"} <= set(roles["server"]["scopes"])
    assert roles["teachers"] == {"name": "teachers", "scopes": ["admin:users"], "groups": ["teachers"]}
    assert roles["gpulab-admin"]["users"] == ["root-admin"]
