"""The sudoers drop-in a non-root hub needs, and the mediator's own rules (no hub, no accounts).

The real-process test of the whole mechanism is tests/integration/test_isolation_sudo.py.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from hub_config.config.embedded import choose_isolation
from spawner.local import mediator
from spawner.local.sudo import ROOT, sudoers_rule
from tests.support import REPO, VENV_BIN

SHIPPED = REPO / "scripts" / "gpulab.sudoers"


def test_the_shipped_drop_in_is_what_gpulab_sudoers_prints_for_the_defaults():
    out = subprocess.run(
        [
            str(VENV_BIN / "gpulab"),
            "sudoers",
            "--hub-user",
            "gpulab",
            "--mediator",
            "/opt/gpulab/bin/gpulab-launch",
            "--home-root",
            "/home",
            "--prefix",
            "jupyter-",
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert out == SHIPPED.read_text()
    assert 'Cmnd_Alias GPULAB_LAUNCH = /opt/gpulab/bin/gpulab-launch ""' in out  # no arguments allowed
    assert "Runas_Alias GPULAB_USERS = %jupyterhub-users" in out
    assert "ALL = (ALL)" not in out and "NOPASSWD: ALL" not in out
    # No option names the home: useradd names it for the account (--base-dir), so they cannot differ.
    assert "--home-dir" not in out and "--base-dir /home --shell" in out


def test_visudo_accepts_the_drop_in(tmp_path):
    visudo = shutil.which("visudo")
    if visudo is None:
        pytest.fail("visudo is missing: scripts/bootstrap.sh --test installs Debian's sudo")
    for create in (True, False):
        f = tmp_path / f"rule-{create}"
        f.write_text(sudoers_rule("gpulab", "/opt/gpulab/bin/gpulab-launch", create_accounts=create))
        out = subprocess.run([visudo, "-cf", str(f)], capture_output=True, text=True)
        assert out.returncode == 0, out.stdout + out.stderr
    assert "useradd" not in sudoers_rule("gpulab", "/opt/x/gpulab-launch", create_accounts=False)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"hub_user": "gpulab, root"},
        {"mediator": "/opt/gpulab/bin/gpulab-launch *"},
        {"group": "users ALL"},
        {"prefix": "Jupyter-"},
        {"home_root": "/home/a b"},
        {"mediator": "relative/gpulab-launch"},
    ],
)
def test_the_rule_refuses_what_sudoers_would_need_escaped(kwargs):
    args = {"hub_user": "gpulab", "mediator": "/opt/gpulab/bin/gpulab-launch", **kwargs}
    with pytest.raises(ValueError):
        sudoers_rule(**args)


def test_the_mediator_passes_only_a_safe_environment():
    env = mediator.clean_env(
        {
            "JUPYTERHUB_API_TOKEN": "t",
            "PATH": "/usr/bin",
            "LD_PRELOAD": "/tmp/x.so",
            "LD_AUDIT": "x",
            "PYTHONPATH": "/tmp",
            "PYTHONSTARTUP": "/tmp/s.py",
            "LD_LIBRARY_PATH": "/usr/local/cuda/lib64",
            "HOME": "/elsewhere",
            "BASH_ENV": "/tmp/rc",
        }
    )
    assert env["JUPYTERHUB_API_TOKEN"] == "t" and env["LD_LIBRARY_PATH"] == "/usr/local/cuda/lib64"
    assert not {"LD_PRELOAD", "LD_AUDIT", "PYTHONPATH", "PYTHONSTARTUP", "BASH_ENV"} & set(env)
    assert env["HOME"] == mediator.me().pw_dir  # from the account database, not from the hub
    for bad in ({"A=B": "x"}, {"A": 1}, {"A": "x\0y"}, ["A"]):
        with pytest.raises(mediator.Refused):
            mediator.clean_env(bad)


@pytest.mark.skipif(os.geteuid() != 0, reason="checks the refusal to run as root")
def test_the_mediator_refuses_to_run_as_root_and_takes_no_arguments():
    launch = str(VENV_BIN / "gpulab-launch")
    out = subprocess.run([launch], input=json.dumps({"action": "prepare-home"}), capture_output=True, text=True)
    assert out.returncode == 1 and "does not run as root" in json.loads(out.stdout)["error"]
    out = subprocess.run([launch, "--anything"], input="{}", capture_output=True, text=True)
    assert out.returncode == 2 and "takes no arguments" in out.stderr


@pytest.mark.skipif(os.geteuid() != 0, reason="a root hub's mode")
def test_a_root_hub_runs_in_root_mode_and_refuses_a_required_sudo_mode():
    assert choose_isolation("auto", "/nonexistent/gpulab-launch", "sudo")[0] == ROOT
    with pytest.raises(SystemExit, match="GPULAB_ISOLATION=sudo but the hub is root"):
        choose_isolation("sudo", "/nonexistent/gpulab-launch", "sudo")
    with pytest.raises(SystemExit, match="use auto, root or sudo"):
        choose_isolation("none", "/nonexistent/gpulab-launch", "sudo")
    out = subprocess.run([str(VENV_BIN / "gpulab"), "check-isolation"], capture_output=True, text=True)
    assert out.returncode == 0 and out.stdout.startswith("isolation mode: root")


@pytest.mark.parametrize(
    "request_, action",
    [
        ({"pid": True, "signal": 15}, mediator.send_signal),
        ({"pid": 1, "signal": 15}, mediator.send_signal),
        ({"pid": "12", "signal": 15}, mediator.send_signal),
        ({"pid": 4242, "signal": 19}, mediator.send_signal),
        ({"offset": -1, "path": "/x"}, mediator.read),
        ({"limit": 1.5, "path": "/x"}, mediator.read),
        ({"args": "--debug"}, mediator.start_server),
        ({"args": ["a\0b"]}, mediator.start_server),
        (
            {"input": "relative.ipynb", "output": "/o", "cwd": "/", "status": "/s", "log": "/l", "attempt": 1},
            mediator.start_job,
        ),
    ],
)
def test_the_mediator_refuses_malformed_requests(request_, action):
    with pytest.raises(mediator.Refused):
        action(request_)


def test_the_mediator_reads_only_inside_the_home():
    assert mediator.read({"path": "relative/file", "limit": 10})["state"] == "outside"
    assert mediator.read({"path": "/etc/hostname", "limit": 10})["state"] == "outside"
    home = mediator.me().pw_dir
    assert mediator.read({"path": f"{home}/../etc/hostname", "limit": 10})["state"] == "outside"
    with pytest.raises(mediator.Refused, match="not inside the home"):
        mediator.inside_home("/etc/passwd")
    assert mediator.inside_home(home) == Path(os.path.realpath(home))


def test_a_deeply_nested_request_gets_a_refusal_not_a_traceback():
    out = subprocess.run(
        [str(VENV_BIN / "gpulab-launch")], input="[" * 100_000, capture_output=True, text=True, timeout=60
    )
    reply = json.loads(out.stdout)
    assert out.returncode == 1 and reply["ok"] is False and "not JSON of a depth" in reply["error"]
    assert "Traceback" not in out.stderr, out.stderr
