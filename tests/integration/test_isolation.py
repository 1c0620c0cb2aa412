"""Attacker tests: on the embedded hub, one user cannot reach another user or the hub.

Real accounts (the hub creates them; the harness gives them a prefix of its
own and removes them), real servers, a real notebook job. Alice attacks from
a terminal of her own JupyterLab (typed through its websocket), from a process
with exactly her account's credentials (uid, gid, groups, no capabilities) and
from a cell of her own notebook job; the targets are bob's home, his job's output and log, his server's
environment (his token), the hub's databases and secrets, and bob's and the
hub's processes. Each probe has a positive control, so a broken probe fails
instead of passing.
"""

from __future__ import annotations

import json
import os
import stat
import sys
import time
from pathlib import Path

import pytest

from spawner.local.accounts import can_switch_users
from tests.support.hub import RunningHub, process_env
from tests.support.isolation import (
    CATALOG,
    PROBE,
    check,
    make_world,
    probe_as_alice,
    probe_from_alice_job,
    run_in_terminal,
    server_pid,
    targets,
)

pytestmark = [
    pytest.mark.skipif(not can_switch_users(), reason="creating and switching accounts needs root (CI runs as root)"),
]


@pytest.fixture(scope="module")
def hub(start_hub):
    return start_hub(CATALOG, extra_config="c.GPULabJobs.poll_interval = 0.3\n")


@pytest.fixture(scope="module")
def world(hub: RunningHub) -> dict:
    """Both users with a running server, a file in their home and a finished job."""
    return make_world(hub)


def test_servers_run_as_their_users_accounts(hub, world):
    for user in ("alice", "bob"):
        account = hub.account(user)
        assert account.name == f"{hub.account_prefix}{user}"
        pid = server_pid(hub, user)
        status = Path(f"/proc/{pid}/status").read_text()
        uid_line = next(line for line in status.splitlines() if line.startswith("Uid:"))
        assert uid_line.split()[1:] == [str(account.uid)] * 4  # real, effective, saved, fs
        assert account.uid != 0 and os.stat(f"/proc/{pid}").st_uid == account.uid
        home = account.home
        st = home.stat()
        assert (st.st_uid, stat.S_IMODE(st.st_mode)) == (account.uid, 0o700)
        env = process_env(pid)
        assert env["HOME"] == str(home) and env["USER"] == account.name
        assert "CONFIGPROXY_AUTH_TOKEN" not in env
    assert hub.account("alice").uid != hub.account("bob").uid


def test_hub_state_is_private_to_the_hub(hub, world):
    state = hub.state_dir
    assert stat.S_IMODE(state.stat().st_mode) == 0o700 and state.stat().st_uid == os.getuid()
    for name in ("jupyterhub.sqlite", "gpulab.sqlite", "jupyterhub_cookie_secret", "jupyterhub-proxy.pid"):
        assert (state / name).exists(), name
    # Nothing of the hub's lands beside it or in the hub's working directory, and no folder
    # shared by every user holds anything of the jobs (their status files are in the homes).
    assert not list(hub.workdir.glob("*.sqlite*")) and not (hub.workdir / "jobs").exists()
    assert not (hub.data_dir / "jobs").exists()


def test_job_outputs_and_logs_belong_to_their_owner(hub, world):
    bob = hub.account("bob")
    job = world["bob_job"]
    for rel in (job["output_path"], job["log_path"], f".gpulab/jobs/job-{job['id']}-attempt-1.json"):
        path = hub.home("bob") / rel
        st = path.stat()
        assert (st.st_uid, st.st_gid) == (bob.uid, bob.gid), rel
        assert path.parent.stat().st_uid == bob.uid
    # The home (0700) keeps others out; the log is private even inside it.
    assert not (hub.home("bob") / job["log_path"]).stat().st_mode & 0o077
    assert "result 42" in (hub.home("bob") / job["log_path"]).read_text()


def test_alice_terminal_cannot_reach_bob_or_the_hub(hub, world, tmp_path):
    """A process with alice's terminal's credentials: her uid, gid and groups, no capabilities."""
    probe_as_alice(hub, world)


def test_alice_job_cannot_reach_bob_or_the_hub(hub, world):
    """The same probe as a cell of alice's notebook job (papermill as her account)."""
    probe_from_alice_job(hub, world)


def test_probe_finds_what_its_credentials_allow(hub, world):
    """Control: the probe does find what it looks for when the credentials allow it (root)."""
    import tests.support.isolation_probe as probe

    t = targets(hub, world)
    result = probe.probe(t)  # as root, in this test process
    assert result["read bob's secret"] == "allowed" and result["environ bob's server"] == "allowed"
    assert result["secret leaks"], "the leak scan found bob's server token nowhere even as root"


def test_alice_jupyter_terminal_cannot_reach_bob_or_the_hub(hub, world):
    """The same probe typed into a terminal of alice's own JupyterLab."""
    alice = hub.account("alice")
    home = hub.home("alice")
    spec = home / "terminal-targets.json"
    spec.write_text(json.dumps(targets(hub, world)))
    hub.give("alice", spec)
    out = home / "terminal-probe.out"
    run_in_terminal(
        hub, "alice", world["tokens"]["alice"], f"{sys.executable} {PROBE} {spec} > {out}.tmp 2>&1; mv {out}.tmp {out}"
    )
    deadline = time.monotonic() + 60
    while not out.exists() and time.monotonic() < deadline:
        time.sleep(0.3)
    text = out.read_text()
    assert out.stat().st_uid == alice.uid
    check(json.loads(text.split("PROBE ", 1)[1]), alice.uid)
