"""A real JupyterHub (with configurable-http-proxy) for integration tests.

Starts ``jupyterhub`` as a subprocess from a config file that calls the same
``configure_embedded(c)`` the product uses, plus test-only lines (an admin
service token). Nothing in the hub is mocked.

Run as root (as CI does), the hub gives every user a real system account:
the harness picks an account prefix of its own per hub (``gt<hex>-``), so
parallel runs never share accounts, keeps the data folder where those
accounts can reach it, and removes its accounts in :meth:`RunningHub.close`.
With ``run_as`` the hub itself runs as that (non-root) account, which then
owns the data folder; it isolates users through sudo when a drop-in allows it.
"""

from __future__ import annotations

import atexit
import os
import re
import secrets
import shutil
import signal
import subprocess
import tempfile
import textwrap
import time
from pathlib import Path
from typing import Any

import requests

from spawner.local.accounts import UserAccounts, can_switch_users, delete_account, lookup
from tests.support import REPO, VENV_BIN
from tests.support.cgroups import remove_cgroup_parent
from tests.support.ports import free_port
from tests.support.processes import NotReady, kill_uids, wait_ready

#: What the harness's service token may do by default: act as an admin of the hub and of gpulab.
ADMIN_SCOPES = [
    "admin:users",
    "admin:servers",
    "admin:server_state",
    "list:users",
    "read:users",
    "read:servers",
    "servers",
    "tokens",
    "custom:gpulab:admin",
    "custom:gpulab:jobs",
]
#: The same, and the idle culler's API (a test that also plays the culler).
ADMIN_AND_CULLER_SCOPES = [*ADMIN_SCOPES, "custom:gpulab:culler"]


class RunningHub:
    """One hub process; ``start()``, ``stop()``, ``restart()``; HTTP helpers."""

    def __init__(
        self,
        workdir: Path,
        catalog_yaml: str | None = None,
        extra_config: str = "",
        env: dict[str, str] | None = None,
        admin_scopes: list[str] | None = None,
        run_as: Any = None,
        base_config: str | None = None,
    ):
        self.workdir = Path(workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self.hub_port = free_port()
        self.api_port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.token = secrets.token_hex(16)
        self.catalog_path = self.workdir / "catalog.yaml"
        if catalog_yaml is not None:
            self.catalog_path.write_text(catalog_yaml)
        else:
            self.catalog_path.write_text((REPO / "hub_config" / "demo-teams.yaml").read_text())
        self.log_path = self.workdir / "hub.log"
        self.proc: subprocess.Popen | None = None
        self.env = dict(env or {})
        #: The (non-root) account the hub process runs as; ``None``: this process's.
        self.run_as = run_as
        #: Run in the hub's process before it execs, after it became ``run_as`` (e.g. to join
        #: the cgroup subtree an admin delegated to the hub's account).
        self.preexec: Any = None
        #: Real system accounts: their own prefix, a data folder they can reach (the
        #: workdir is in pytest's 0700 temporary folder), linked as ``workdir/data``.
        self.isolated = can_switch_users()
        self.account_prefix = f"gt{secrets.token_hex(3)}-"
        self.data_dir = self.workdir / "data"
        if self.isolated and not self.data_dir.exists():
            # Not under /tmp: each server and job has a private /tmp, as on a real server, where the
            # data folder is /var/lib/gpulab and the homes /home.
            real = Path(tempfile.mkdtemp(prefix="gpulab-test-data-", dir="/var/tmp"))
            os.chmod(real, 0o711)
            if run_as is not None:
                os.chown(real, run_as.uid, run_as.gid)
            self.data_dir.symlink_to(real)
        if self.isolated:  # the real path: a path through the link under /tmp is not one a server sees
            self.data_dir = self.data_dir.resolve()
        self.env.setdefault("GPULAB_ACCOUNT_PREFIX", self.account_prefix)
        #: The cgroups of this hub's servers and jobs: a parent of its own, removed in close().
        self.cgroup_parent = f"gpulab-test-{self.account_prefix.rstrip('-')}"
        self.env.setdefault("GPULAB_CGROUP_PARENT", self.cgroup_parent)
        if self.isolated:  # even when a fixture fails before its teardown could run
            atexit.register(self.remove_accounts)
        scopes = admin_scopes or ADMIN_SCOPES
        self.config_path = self.workdir / "jupyterhub_config.py"
        #: What configures the hub before the test's lines: the embedded mode's
        #: configure_embedded(c) unless the caller gives its own (z2jh's, for Kubernetes).
        base = base_config or "from hub_config.config.embedded import configure_embedded\nconfigure_embedded(c)\n"
        self.config_path.write_text(
            "c = get_config()\n"
            + textwrap.dedent(base)
            + textwrap.dedent(f"""
            c.JupyterHub.hub_port = {self.hub_port}
            c.ConfigurableHTTPProxy.api_url = "http://127.0.0.1:{self.api_port}"
            c.JupyterHub.services = list(c.JupyterHub.get("services", [])) + [
                {{"name": "test-admin", "api_token": "{self.token}"}}]
            c.JupyterHub.load_roles = list(c.JupyterHub.load_roles) + [
                {{"name": "test-admin", "scopes": {scopes!r}, "services": ["test-admin"]}}]
            c.JupyterHub.log_level = "DEBUG"
        """)
            + textwrap.dedent(extra_config)
        )

    # -- lifecycle ----------------------------------------------------------

    def start(self, timeout: float = 60) -> RunningHub:
        env = dict(os.environ)
        env.update(
            {
                "GPULAB_BIND": self.url,
                "GPULAB_DATA_DIR": str(self.data_dir.resolve()),
                "GPULAB_CATALOG": str(self.catalog_path),
                "PATH": f"{VENV_BIN}:{REPO / 'node_modules' / '.bin'}:{env.get('PATH', '')}",
                "PYTHONUNBUFFERED": "1",
            }
        )
        env.update(self.env)
        log = open(self.log_path, "ab")
        switch: dict[str, Any] = {}
        if self.run_as is not None:
            env.update({"HOME": str(self.run_as.home), "USER": self.run_as.name, "LOGNAME": self.run_as.name})
            switch = {"user": self.run_as.uid, "group": self.run_as.gid, "extra_groups": []}
        self.proc = subprocess.Popen(
            [str(VENV_BIN / "jupyterhub"), "-f", str(self.config_path)],
            cwd=self.workdir,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=self.preexec,
            **switch,
        )
        try:
            wait_ready(self.proc, self.url + "/hub/api/", timeout=timeout)
        except NotReady as e:
            tail = self.log_tail()
            # its proxy may outlive it: never leave a half-started hub (and its services) behind
            self.stop()
            if e.returncode is not None:
                raise RuntimeError(f"hub exited with {e.returncode}:\n{tail}") from None
            raise RuntimeError(f"hub did not come up in {timeout}s:\n{tail}") from None
        return self

    def stop(self, kill_servers: bool = False) -> None:
        """Stop the hub (and its proxy). Single-user servers keep running unless ``kill_servers``."""
        if kill_servers:
            self._kill_servers()
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(5)
        self.proc = None
        # configurable-http-proxy runs in the hub's session; make sure it is gone.
        pid_file = self.state_dir / "jupyterhub-proxy.pid"
        if pid_file.exists():
            try:
                os.kill(int(pid_file.read_text().strip()), signal.SIGTERM)
            except (ValueError, ProcessLookupError):
                pass

    def restart(self) -> RunningHub:
        self.stop()
        return self.start()

    def _kill_servers(self) -> None:
        """Kill every single-user server this hub started, even if the hub is gone.

        Found by the hub API URL in each process's environment, so a test that
        crashed the hub cannot leak servers into later tests.
        """
        marker = f"JUPYTERHUB_API_URL=http://127.0.0.1:{self.hub_port}/".encode()
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                environ = (entry / "environ").read_bytes()
            except OSError:
                continue
            if marker in environ:
                try:
                    os.kill(int(entry.name), signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass

    def close(self) -> None:
        self.stop(kill_servers=True)
        if self.isolated:
            self.remove_accounts()
            self.remove_cgroups()
            real = self.data_dir.resolve()
            if real.parent == Path("/var/tmp") and real.name.startswith("gpulab-test-data-"):
                shutil.rmtree(real, ignore_errors=True)

    # -- users' system accounts ----------------------------------------------

    @property
    def state_dir(self) -> Path:
        """The hub's private folder (databases, cookie secret, pid files)."""
        return self.data_dir / "hub"

    @property
    def accounts(self) -> UserAccounts:
        return UserAccounts(prefix=self.account_prefix, home_root=str(self.data_dir.resolve() / "homes"))

    def account(self, user: str):
        """The user's system account (created as the hub creates it), or ``None`` when not isolated."""
        return self.accounts.account_for(user) if self.isolated else None

    def home(self, user: str) -> Path:
        """The user's home as the hub sees it (the account is created if needed)."""
        account = self.account(user)
        return account.home if account is not None else self.data_dir / "homes" / user

    def give(self, user: str, path: Path) -> Path:
        """Make ``path`` (and the folders between it and the home) the user's, as if they wrote it."""
        account = self.account(user)
        if account is None:
            return path
        home = account.home.resolve()
        target = Path(path).resolve()
        for p in [target, *target.parents]:
            if p == home:
                break
            os.chown(p, account.uid, account.gid, follow_symlinks=False)
        return path

    def remove_accounts(self) -> None:
        """Kill every process of this hub's accounts, then delete the accounts and homes."""
        names = [
            line.split(":", 1)[0]
            for line in Path("/etc/passwd").read_text().splitlines()
            if line.startswith(self.account_prefix)
        ]
        kill_uids({a.uid for a in map(lookup, names) if a is not None})
        for name in names:
            delete_account(name)

    def remove_cgroups(self) -> None:
        """Remove this hub's cgroups (their processes are this hub's accounts', killed before)."""
        remove_cgroup_parent(self.cgroup_parent)

    def log_tail(self, n: int = 60) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return ""

    # -- HTTP helpers -------------------------------------------------------

    def api(self, method: str, path: str, token: str | None = None, **kwargs: Any) -> requests.Response:
        headers = kwargs.pop("headers", {})
        headers.setdefault("Authorization", f"token {token or self.token}")
        return requests.request(method, self.url + "/hub/api" + path, headers=headers, timeout=30, **kwargs)

    def login(self, username: str, password: str = "gpulab-demo") -> requests.Session:
        s = requests.Session()
        r = s.get(self.url + "/hub/login", timeout=10)
        xsrf = _xsrf(r.text) or s.cookies.get("_xsrf")
        r = s.post(
            self.url + "/hub/login",
            data={"username": username, "password": password, "_xsrf": xsrf},
            timeout=30,
            allow_redirects=True,
        )
        if "jupyterhub-session-id" not in s.cookies and "jupyterhub-hub-login" not in s.cookies:
            raise RuntimeError(f"login of {username} failed: {r.status_code}")
        return s

    def spawn_page(self, session: requests.Session, server_name: str = "", user: str = "") -> requests.Response:
        path = f"/hub/spawn/{user}/{server_name}" if server_name else "/hub/spawn"
        return session.get(self.url + path, timeout=30)

    def post_spawn(
        self, session: requests.Session, user: str, data: dict[str, Any], server_name: str = ""
    ) -> requests.Response:
        page = self.spawn_page(session, server_name, user)
        xsrf = _xsrf(page.text) or session.cookies.get("_xsrf", path="/hub/")
        body = dict(data)
        body.setdefault("_xsrf", xsrf)
        path = f"/hub/spawn/{user}/{server_name}" if server_name else f"/hub/spawn/{user}"
        return session.post(self.url + path, data=body, timeout=90, allow_redirects=False)

    def wait_server(self, user: str, server_name: str = "", ready: bool = True, timeout: float = 90) -> dict:
        deadline = time.monotonic() + timeout
        model: dict = {}
        while time.monotonic() < deadline:
            model = self.api("GET", f"/users/{user}").json()
            server = (model.get("servers") or {}).get(server_name)
            if ready and server and server.get("ready"):
                return server
            if not ready and not server:
                return {}
            time.sleep(0.3)
        raise TimeoutError(f"server {user}/{server_name} ready={ready} not reached: {model}\n{self.log_tail()}")

    def me(self, user: str) -> dict:
        r = self.api("GET", "/gpulab/me", params={"user": user})
        r.raise_for_status()
        return r.json()

    def holdings(self) -> list[dict]:
        """Every ledger holding of every team member (through the hub API)."""
        out = []
        for u in self.api("GET", "/users").json():
            r = self.api("GET", "/gpulab/me", params={"user": u["name"]})
            if r.status_code == 200:
                out.extend(r.json()["holdings"])
        return out


def _xsrf(html: str) -> str | None:
    m = re.search(r'name="_xsrf" value="([^"]+)"', html)
    return m.group(1) if m else None


def process_env(pid: int) -> dict[str, str]:
    """The environment a running process was started with (Linux /proc)."""
    raw = Path(f"/proc/{pid}/environ").read_bytes()
    return dict(item.split("=", 1) for item in raw.decode(errors="replace").split("\0") if "=" in item)
