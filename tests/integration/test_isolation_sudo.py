"""A hub that is not root isolates users through sudo and ``gpulab-launch``.

Real everything: a non-root hub account, a group, the sudoers drop-in that
``gpulab sudoers`` prints (checked by ``visudo``) in /etc/sudoers.d, the
embedded hub running as that account, accounts it creates through the
drop-in's one ``useradd`` line, servers and notebook jobs the mediator starts
as those accounts. The attacker's probe of ``test_isolation`` runs again (from
a process with alice's credentials and from her job), and the hub's own
account is shown to get nothing from sudo but the mediator as the users.

Everything this file creates carries its tag (``gthub<hex>``, ``gtsu<hex>-*``,
``/etc/sudoers.d/gpulab-test-sudo-<hex>``) and is removed at the end, even
on failure; leftovers of a killed run are removed at the start.
"""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import time
from pathlib import Path

import pytest
import requests

from spawner.local.accounts import Account, can_switch_users, lookup
from spawner.local.processes import process_alive
from spawner.local.sudo import useradd_argv
from tests.support import VENV_BIN
from tests.support.hub import RunningHub, process_env
from tests.support.isolation import CATALOG, make_world, probe_as_alice, probe_from_alice_job, server_pid
from tests.support.jobs import submit, wait_state, write_notebook
from tests.support.sudo_bed import MEDIATOR, SudoBed, as_account, hub_account_of, sudo_bed, sudo_hub

pytestmark = [
    pytest.mark.sudo_bed,
    pytest.mark.skipif(
        not can_switch_users(), reason="making accounts and a sudoers drop-in needs root (CI runs as root)"
    ),
]


@pytest.fixture(scope="module")
def bed():
    with sudo_bed() as b:
        yield b


@pytest.fixture(scope="module")
def hub_account(bed: SudoBed) -> Account:
    return hub_account_of(bed)


@pytest.fixture(scope="module")
def hub(bed: SudoBed, hub_account: Account):
    with sudo_hub(bed, hub_account, CATALOG, "c.GPULabJobs.poll_interval = 0.3\n") as h:
        yield h


def as_hub(bed_hub: Account, argv: list[str], stdin: str = "") -> subprocess.CompletedProcess:
    """Run ``argv`` with exactly the hub account's credentials (no groups of root's, no capabilities)."""
    return as_account(bed_hub, argv, stdin)


@pytest.fixture(scope="module")
def world(hub: RunningHub) -> dict:
    """The same users, servers and job as tests/integration/test_isolation.py, on this hub."""
    return make_world(hub)


def uids_of(pid: int) -> list[int]:
    line = next(x for x in Path(f"/proc/{pid}/status").read_text().splitlines() if x.startswith("Uid:"))
    return [int(v) for v in line.split()[1:]]


def job_pid(hub: RunningHub, job_id: int) -> int:
    db = sqlite3.connect(hub.state_dir / "gpulab.sqlite")
    try:
        return db.execute("select pid from gpulab_jobs where id = ?", (job_id,)).fetchone()[0]
    finally:
        db.close()


def test_the_hub_runs_as_its_account_in_sudo_mode(hub, hub_account):
    assert uids_of(hub.proc.pid) == [hub_account.uid] * 4 and hub_account.uid != 0
    log = hub.log_path.read_text()
    assert "isolation mode: sudo (sudo -n -l allows " + MEDIATOR in log
    page = requests.get(hub.url + "/hub/login", timeout=10).text
    assert 'id="gpulab-isolation" data-mode="sudo"' in page and 'id="gpulab-not-isolated"' not in page
    state = hub.state_dir
    assert state.stat().st_uid == hub_account.uid and state.stat().st_mode & 0o777 == 0o700
    out = as_hub(hub_account, [str(VENV_BIN / "gpulab"), "check-isolation"])
    assert out.returncode == 0 and out.stdout.startswith("isolation mode: sudo"), out.stdout + out.stderr
    # A hub told to need sudo refuses to start when the rule does not name its mediator.
    out = as_hub(
        hub_account,
        [
            str(VENV_BIN / "python"),
            "-c",
            "from hub_config.config.embedded import "
            "choose_isolation; choose_isolation('sudo', '/opt/elsewhere/gpulab-launch', 'sudo')",
        ],
    )
    assert (
        out.returncode != 0
        and "GPULAB_ISOLATION=sudo but the hub is not root and sudo -n -l does not list /opt/elsewhere/gpulab-launch"
        in out.stderr
    ), out.stderr


def test_servers_and_jobs_run_as_accounts_the_hub_created_through_sudo(hub, world, bed):
    for user in ("alice", "bob"):
        account = lookup(bed.prefix + user)
        assert account is not None, f"the hub did not create {bed.prefix}{user}"
        assert bed.group in {_group_name(g) for g in account.groups}
        assert (account.home.stat().st_uid, account.home.stat().st_mode & 0o777) == (account.uid, 0o700)
        pid = server_pid(hub, user)
        assert uids_of(pid) == [account.uid] * 4
        env = process_env(pid)
        assert env["HOME"] == str(account.home) and env["USER"] == account.name
        assert "LD_PRELOAD" not in env and "CONFIGPROXY_AUTH_TOKEN" not in env
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        assert env["JUPYTERHUB_API_TOKEN"].encode() not in cmdline
    bob = lookup(bed.prefix + "bob")
    job = world["bob_job"]
    for rel in (job["output_path"], job["log_path"], f".gpulab/jobs/job-{job['id']}-attempt-1.json"):
        st = (bob.home / rel).stat()
        assert (st.st_uid, st.st_gid) == (bob.uid, bob.gid), rel
    assert "result 42" in (bob.home / job["log_path"]).read_text()
    # The hub serves the log it cannot read itself: the mediator reads it as bob.
    r = hub.api("GET", f"/gpulab/jobs/{job['id']}/logs", token=world["tokens"]["bob"])
    assert r.status_code == 200 and "result 42" in r.json()["text"], r.text
    r = hub.api("GET", f"/gpulab/jobs/{job['id']}/output", token=world["tokens"]["bob"])
    assert r.status_code == 200 and r.json()["cells"], r.text


def _group_name(gid: int) -> str:
    import grp

    return grp.getgrgid(gid).gr_name


def test_alice_cannot_reach_bob_or_the_hub(hub, world):
    probe_as_alice(hub, world)
    done = probe_from_alice_job(hub, world)
    alice = hub.account("alice")
    assert uids_of(hub.proc.pid)[0] != alice.uid and done["state"] == "succeeded"


def test_the_hub_account_gets_nothing_from_sudo_but_the_mediator(hub, world, bed, hub_account):
    alice, bob = lookup(bed.prefix + "alice"), lookup(bed.prefix + "bob")
    refused = {
        "a shell as alice": ["sudo", "-n", "-u", alice.name, "/bin/sh", "-c", "id"],
        "python as alice": ["sudo", "-n", "-u", alice.name, str(VENV_BIN / "python"), "-c", "1"],
        "the mediator with arguments": ["sudo", "-n", "-u", alice.name, MEDIATOR, "--help"],
        "the mediator as root": ["sudo", "-n", "-u", "root", MEDIATOR],
        "the mediator as the hub's own account": ["sudo", "-n", "-u", bed.hub_user, MEDIATOR],
        "a shell as root": ["sudo", "-n", "/bin/sh", "-c", "id"],
        "useradd with uid 0": [
            "sudo",
            "-n",
            *useradd_argv(bed.prefix + "evil", hub.data_dir.resolve() / "homes", "/bin/bash", bed.group)[:-1],
            "--non-unique",
            "--uid",
            "0",
            bed.prefix + "evil",
        ],
        "useradd into another group": [
            "sudo",
            "-n",
            *useradd_argv(bed.prefix + "evil", hub.data_dir.resolve() / "homes", "/bin/bash", "sudo"),
        ],
        "useradd with a home named for another account": [
            "sudo",
            "-n",
            *useradd_argv(bed.prefix + "evil", hub.data_dir.resolve() / "homes", "/bin/bash", bed.group)[:-1],
            "--home-dir",
            str(hub.data_dir.resolve() / "homes" / (bed.prefix + "bob")),
            bed.prefix + "evil",
        ],
        "useradd of an unprefixed name": [
            "sudo",
            "-n",
            *useradd_argv("gtsuevil", hub.data_dir.resolve() / "homes", "/bin/bash", bed.group),
        ],
    }
    for what, argv in refused.items():
        out = as_hub(hub_account, argv, stdin="{}")
        # sudo's two refusals: no rule matches at all / a rule exists but not for this target.
        said_no = "a password is required" in out.stderr or "is not allowed to execute" in out.stderr
        assert out.returncode == 1 and not out.stdout and said_no, (what, out.stdout, out.stderr)
    assert lookup(bed.prefix + "evil") is None and lookup("gtsuevil") is None

    # Control: the mediator itself is allowed; as alice it reads her files, never bob's.
    def mediate(account: Account, request: dict) -> dict:
        out = as_hub(hub_account, ["sudo", "-n", "-u", account.name, "--", MEDIATOR], json.dumps(request))
        assert out.stdout, out.stderr
        return json.loads(out.stdout)

    assert mediate(alice, {"action": "prepare-home"})["uid"] == alice.uid
    assert mediate(alice, {"action": "read", "path": str(alice.home / "secret.txt")})["state"] == "ok"
    assert mediate(alice, {"action": "read", "path": str(bob.home / "secret.txt")})["state"] == "outside"
    link = alice.home / "bobs-secret"
    link.symlink_to(bob.home / "secret.txt")
    os.lchown(link, alice.uid, alice.gid)
    assert mediate(alice, {"action": "read", "path": str(link)})["state"] == "symlink"  # never followed
    # Signals go only to the account's own processes: bob's server survives alice's mediator.
    bob_server = server_pid(hub, "bob")
    reply = mediate(alice, {"action": "signal", "pid": bob_server, "signal": int(signal.SIGKILL)})
    assert reply == {"ok": True, "alive": False} and process_alive(bob_server, bob.uid)
    assert mediate(alice, {"action": "exec", "argv": ["/bin/sh"]})["ok"] is False


def test_stopping_a_server_and_cancelling_a_job_end_their_processes(hub, world, bed):
    alice = lookup(bed.prefix + "alice")
    home = alice.home
    write_notebook(home / "exp" / "slow.ipynb")
    hub.give("alice", home / "exp" / "slow.ipynb")
    job = submit(
        hub,
        world["tokens"]["alice"],
        notebook="exp/slow.ipynb",
        job_class="batch",
        profile="cpu",
        parameters={"sleep_seconds": 120},
    )
    wait_state(hub, job["id"], "running", token=world["tokens"]["alice"])
    runner = job_pid(hub, job["id"])
    assert uids_of(runner) == [alice.uid] * 4 and process_alive(runner)
    r = hub.api("POST", f"/gpulab/jobs/{job['id']}/cancel", token=world["tokens"]["alice"])
    assert r.status_code == 200, r.text
    deadline = time.monotonic() + 30
    while process_alive(runner) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not process_alive(runner), "the job's runner survived its cancellation"
    assert wait_state(hub, job["id"], "cancelled")["state"] == "cancelled"

    pid = server_pid(hub, "alice")
    assert process_alive(pid, alice.uid)
    r = hub.api("DELETE", "/users/alice/server")
    assert r.status_code in (202, 204), r.text
    hub.wait_server("alice", ready=False, timeout=60)
    assert not process_alive(pid), "alice's server survived its stop"
    assert hub.api("GET", "/users/alice").json()["servers"] == {}


def test_alice_logs_in_and_spawns_from_the_form(hub, world, bed):
    """The browser's way: the login form, the spawn form, the server reached through the proxy."""
    alice = lookup(bed.prefix + "alice")
    session = hub.login("alice")
    assert 'value="vision:cpu"' in hub.spawn_page(session).text
    r = hub.post_spawn(session, "alice", {"choice": "vision:cpu"})
    assert r.status_code in (302, 303), r.text[-2000:]
    hub.wait_server("alice")
    pid = server_pid(hub, "alice")
    assert uids_of(pid) == [alice.uid] * 4
    r = requests.get(
        f"{hub.url}/user/alice/api/status", timeout=30, headers={"Authorization": f"token {world['tokens']['alice']}"}
    )
    assert r.status_code == 200 and "started" in r.json(), r.text[:500]
    assert hub.api("DELETE", "/users/alice/server").status_code in (202, 204)
    hub.wait_server("alice", ready=False, timeout=60)
    assert not process_alive(pid)


def test_a_restarted_hub_polls_and_stops_the_server_it_left_running(hub, world, bed):
    bob = lookup(bed.prefix + "bob")
    pid = server_pid(hub, "bob")
    hub.restart()
    assert process_alive(pid, bob.uid), "bob's server did not outlive the hub"
    server = hub.wait_server("bob")  # polled from /proc by the new hub, still counted
    assert server["state"]["pid"] == pid
    assert hub.api("DELETE", "/users/bob/server").status_code in (202, 204)
    hub.wait_server("bob", ready=False, timeout=60)
    assert not process_alive(pid), "bob's server survived its stop after the restart"
