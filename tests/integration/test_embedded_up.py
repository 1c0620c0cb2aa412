"""``gpulab up`` as a user runs it: beside another hub, state under --data-dir, loud when not isolated."""

from __future__ import annotations

import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import requests

from spawner.local.accounts import can_switch_users, delete_account, ensure_account
from tests.support import REPO
from tests.support.cgroups import remove_cgroup_parent
from tests.support.hub import free_port
from tests.support.processes import NotReady, wait_ready

GPULAB = str(Path(sys.executable).with_name("gpulab"))


def reachable_tmp() -> Path:
    """A folder other accounts may enter (pytest's own is 0700)."""
    path = Path(tempfile.mkdtemp(prefix="gpulab-up-", dir="/tmp"))
    os.chmod(path, 0o711)
    return path


#: The cgroup parent of this module's hubs (the product's default, "gpulab", is left alone).
CGROUP_PARENT = f"gpulab-test-up-{secrets.token_hex(3)}"


@pytest.fixture(scope="module", autouse=True)
def _cgroups():
    yield
    remove_cgroup_parent(CGROUP_PARENT)


def env_for(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPULAB_")}
    env["PATH"] = f"{Path(sys.executable).parent}:{REPO / 'node_modules' / '.bin'}:{env.get('PATH', '')}"
    env["GPULAB_ACCOUNT_PREFIX"] = f"gt{secrets.token_hex(3)}-"
    env["GPULAB_CGROUP_PARENT"] = CGROUP_PARENT
    env.update(extra)
    return env


class UpProcess:
    def __init__(self, args: list[str], cwd: Path, env: dict[str, str], user=None, group=None):
        self.port = free_port()
        self.log = cwd / f"up-{self.port}.log"
        self.proc = subprocess.Popen(
            [GPULAB, "up", "--port", str(self.port), *args],
            cwd=cwd,
            env=env,
            stdout=open(self.log, "wb"),
            stderr=subprocess.STDOUT,
            start_new_session=True,
            user=user,
            group=group,
            extra_groups=[] if user is not None else None,
        )
        self.url = f"http://127.0.0.1:{self.port}"

    def wait(self, timeout: float = 60) -> None:
        try:
            wait_ready(self.proc, self.url + "/hub/api/", timeout=timeout)
        except NotReady as e:
            if e.returncode is not None:
                raise AssertionError(f"gpulab up exited {e.returncode}:\n{self.text()}") from None
            raise AssertionError(f"gpulab up never answered:\n{self.text()}") from None

    def text(self) -> str:
        return self.log.read_text(errors="replace")

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)


def test_two_hubs_side_by_side_keep_all_state_in_their_data_dirs():
    work = reachable_tmp()  # stands in for the repository root: nothing may land here
    hubs = []
    try:
        for name in ("one", "two"):
            hubs.append(UpProcess(["--data-dir", str(work / name)], work, env_for()))
        for hub in hubs:
            hub.wait()
        for hub in hubs:  # both serve their own login page
            assert requests.get(hub.url + "/hub/login", timeout=10).status_code == 200
        ports = [hub.text() for hub in hubs]
        assert all("Hub API listening on http://127.0.0.1:" in t for t in ports)
        assert sorted(p.name for p in work.iterdir() if not p.name.startswith("up-")) == ["one", "two"]
        for name in ("one", "two"):
            state = work / name / "hub"
            assert {"jupyterhub.sqlite", "gpulab.sqlite", "jupyterhub_cookie_secret"} <= {
                p.name for p in state.iterdir()
            }
            assert oct(state.stat().st_mode & 0o777) == "0o700"
        # Each hub's internal port follows its public port (or is free-picked), never 8081 for both.
        internal = [t.split("Hub API listening on http://127.0.0.1:", 1)[1].split("/", 1)[0] for t in ports]
        assert len(set(internal)) == 2
    finally:
        for hub in hubs:
            hub.stop()
        shutil.rmtree(work, ignore_errors=True)


@pytest.mark.skipif(not can_switch_users(), reason="needs root to make the non-root account the hub runs as")
def test_a_hub_that_cannot_switch_users_says_so_and_stays_on_loopback():
    work = reachable_tmp()
    name = f"gt{secrets.token_hex(3)}-hub"
    account = ensure_account(name, work)
    data = account.home / "data"
    env = env_for(HOME=str(account.home))
    hub = None
    try:
        refused = subprocess.run(
            [GPULAB, "up", "--ip", "0.0.0.0", "--port", str(free_port()), "--data-dir", str(data)],
            cwd=account.home,
            capture_output=True,
            text=True,
            env={**env, "GPULAB_DEMO_AUTH": "0"},
            timeout=60,
            user=account.uid,
            group=account.gid,
            extra_groups=[],
        )
        assert refused.returncode != 0
        assert "users are NOT isolated" in refused.stderr + refused.stdout
        assert "loopback" in refused.stderr + refused.stdout

        hub = UpProcess(["--data-dir", str(data)], account.home, env, user=account.uid, group=account.gid)
        hub.wait()
        assert "WARNING: users are NOT isolated" in hub.text()
        page = requests.get(hub.url + "/hub/login", timeout=10).text
        assert 'id="gpulab-not-isolated"' in page and "NOT isolated" in page
        assert oct(data.stat().st_mode & 0o777) == "0o700"
    finally:
        if hub is not None:
            hub.stop()
        delete_account(name)
        shutil.rmtree(work, ignore_errors=True)
