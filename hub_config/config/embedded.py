"""The embedded single-server hub: one GPU box (or a laptop), no Kubernetes.

Users are isolated by the operating system: every hub user's servers and
notebook jobs run as that user's own system account (``<prefix><name>``,
created on first spawn, home 0700), and the hub's state (databases, cookie
secret, pid files) sits in a 0700 folder of its own. The hub switches to the
accounts itself when it is root, or through sudo and the mediator
``gpulab-launch`` when a sudoers rule allows it (:mod:`spawner.local.sudo`). A hub
that can do neither runs everything as its own account, says so at start and
on the login page, and listens on loopback only. See docs/single-server.md.
"""

from __future__ import annotations

import ipaddress
import logging
import os
import shutil
import socket
import sys
from pathlib import Path
from urllib.parse import urlparse

from traitlets import TraitError

from hub_config.config.idle_service import configure_idle_culler
from hub_config.config.setup import configure_gpulab
from hub_config.storage.db import DEFAULT_BUSY_TIMEOUT
from spawner.core.catalog import CatalogError
from spawner.local.accounts import UserAccounts, unreachable_by_others
from spawner.local.confinement import LimitsUnavailable, UserLimits, get_confiner
from spawner.local.sudo import NONE, ROOT, SUDO, isolation_mode
from spawner.runtime import GPULab

HUB_CONFIG = Path(__file__).resolve().parents[1]
DEMO_CATALOG = str(HUB_CONFIG / "demo-teams.yaml")
REPO_ROOT = HUB_CONFIG.parent


class UnsafeBindError(SystemExit):
    pass


def is_loopback(host: str) -> bool:
    if host in ("localhost", "localhost.localdomain"):
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        try:
            return all(ipaddress.ip_address(a[4][0]).is_loopback for a in socket.getaddrinfo(host, None))
        except OSError:
            return False


def check_bind_safe(bind_url: str, demo_auth: bool) -> None:
    """Refuse to expose demo credentials beyond this machine."""
    host = urlparse(bind_url).hostname or ""
    if demo_auth and not is_loopback(host):
        raise UnsafeBindError(
            f"gpulab: refusing to start: the demo login (one shared, published password) is enabled "
            f"and the hub would listen on {host or 'all interfaces'} ({bind_url}), which is not a loopback "
            "address. Bind to 127.0.0.1, or configure a real authenticator "
            "(c.JupyterHub.authenticator_class) and set GPULAB_DEMO_AUTH=0."
        )


NOT_ISOLATED = (
    "users are NOT isolated from each other: the hub is not root and has no sudo rule for "
    "gpulab-launch, so every server and job runs as the hub's own account and can read every other "
    "user's files and the hub's secrets. Run the hub as root, or install the sudoers rule "
    "(`gpulab sudoers`), to give each user a system account (docs/single-server.md)."
)
#: What the log and the login page say about each mode.
ISOLATED = {
    ROOT: "users are isolated: the hub is root and runs each user's servers and jobs as the user's own account",
    SUDO: "users are isolated: the hub is not root; it runs each user's servers and jobs as the user's own "
    "account through sudo and gpulab-launch",
}


def choose_isolation(wanted: str, mediator: str, sudo: str) -> tuple[str, str]:
    """The mode this hub runs in (``GPULAB_ISOLATION``: auto, root or sudo) and why."""
    mode, why = isolation_mode(mediator, sudo)
    if wanted not in ("auto", ROOT, SUDO):
        raise SystemExit(f"gpulab: GPULAB_ISOLATION={wanted!r}: use auto, root or sudo")
    if wanted != "auto" and mode != wanted:
        raise SystemExit(
            f"gpulab: refusing to start: GPULAB_ISOLATION={wanted} but {why} (docs/single-server.md#the-sudoers-rule)"
        )
    return mode, why


def check_isolation_bind(bind_url: str, isolated: bool) -> None:
    """A hub that cannot keep users apart serves this machine only."""
    host = urlparse(bind_url).hostname or ""
    if not isolated and not is_loopback(host):
        raise UnsafeBindError(
            f"gpulab: refusing to start on {host or 'all interfaces'} ({bind_url}): {NOT_ISOLATED} "
            "Without isolation the hub listens on a loopback address only."
        )


def port_near(preferred: int) -> int:
    """``preferred`` when it is free on 127.0.0.1, else a free port the kernel picks."""
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", preferred))
        except OSError:
            s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def prepare_dir(path: Path, mode: int) -> Path:
    """Create ``path`` and give it exactly ``mode`` (the hub owns it)."""
    path.mkdir(parents=True, exist_ok=True)
    os.chmod(path, mode)
    return path


def check_reachable(paths: dict[str, Path | str]) -> None:
    """Users' accounts must reach the interpreter, gpulab's code and their homes."""
    problems = []
    for what, path in paths.items():
        blocked = unreachable_by_others(path)
        if blocked is not None:
            problems.append(f"{what} {path}: other accounts cannot enter {blocked}")
    if problems:
        raise SystemExit(
            "gpulab: refusing to start: servers and jobs run as the users' own accounts, which cannot "
            "reach what they need:\n  " + "\n  ".join(problems) + "\nInstall gpulab in a virtualenv "
            "other users can read (e.g. /opt/gpulab, created from /usr/bin/python3) and put the data "
            "folder (--data-dir) or the homes (GPULAB_HOME_ROOT) where they can reach them."
        )


def report_limits(c, mode: str) -> None:
    """Set up (once) and print what confines each server and job; refuse to start when it must and cannot.

    ``GPULAB_LIMITS`` (auto, on, off) and ``GPULAB_CGROUP_PARENT`` set ``c.UserLimits.enabled``
    and ``cgroup_parent`` (a hub that is not root: the subtree delegated to it).
    """
    if os.environ.get("GPULAB_LIMITS"):
        c.UserLimits.enabled = os.environ["GPULAB_LIMITS"]
    if os.environ.get("GPULAB_CGROUP_PARENT"):
        c.UserLimits.cgroup_parent = os.environ["GPULAB_CGROUP_PARENT"]
    try:
        settings = UserLimits(config=c)
    except TraitError as e:
        raise SystemExit(f"gpulab: GPULAB_LIMITS: {e}") from None
    try:
        confiner = get_confiner(settings, mode)
    except LimitsUnavailable as e:
        raise SystemExit(f"gpulab: refusing to start: {e}") from None
    confiner.remove_leftovers(c.UserAccounts.prefix)
    for line in confiner.status.lines():
        print(f"gpulab: {line}", file=sys.stderr, flush=True)
    print(
        "gpulab: servers' output goes to ~/.gpulab/logs/server[-<name>].log in each user's home "
        f"(kept under 2 × {settings.server_output_max_bytes} bytes), not to this log"
        if settings.server_output_max_bytes > 0
        else "gpulab: servers' output goes to this log (c.UserLimits.server_output_max_bytes = 0)",
        file=sys.stderr,
        flush=True,
    )


def find_proxy() -> str:
    for candidate in (
        os.environ.get("GPULAB_CHP"),
        shutil.which("configurable-http-proxy"),
        str(REPO_ROOT / "node_modules" / ".bin" / "configurable-http-proxy"),
    ):
        if candidate and Path(candidate).exists():
            return candidate
    raise SystemExit(
        "gpulab: configurable-http-proxy not found; run scripts/bootstrap.sh or `npm install -g configurable-http-proxy`"
    )


def configure_embedded(c) -> None:
    """Configure ``c`` for the embedded hub from ``GPULAB_*`` environment variables.

    - ``GPULAB_BIND`` (default ``http://127.0.0.1:8000``); the hub's internal
      port and the proxy's API port follow it (+1, +2) or are picked free
      (``GPULAB_HUB_PORT``, ``GPULAB_PROXY_API_PORT`` set them)
    - ``GPULAB_DATA_DIR`` (default ``./.gpulab``): everything the hub writes
      (``hub/`` 0700: databases, cookie secret, pid files; ``jobs/``; ``homes/``)
    - ``GPULAB_HOME_ROOT`` (default ``$GPULAB_DATA_DIR/homes``), ``GPULAB_ACCOUNT_PREFIX``
      (default ``jupyter-``): the users' system accounts
    - ``GPULAB_CATALOG`` (default: the demo teams): teams/profiles YAML
    - ``GPULAB_DEMO_AUTH`` (default ``1``), ``GPULAB_DEMO_PASSWORD`` (default ``gpulab-demo``)
    - ``GPULAB_ADMIN_USERS`` (default ``admin``), comma-separated
    - ``GPULAB_DB_BUSY_TIMEOUT`` (default 20): seconds a write to either SQLite database
      waits for a lock another process holds
    """
    bind_url = os.environ.get("GPULAB_BIND", "http://127.0.0.1:8000")
    data_dir = Path(os.environ.get("GPULAB_DATA_DIR", ".gpulab")).resolve()
    catalog_file = os.environ.get("GPULAB_CATALOG", DEMO_CATALOG)
    demo_auth = os.environ.get("GPULAB_DEMO_AUTH", "1") not in ("0", "false", "no")
    admins = [a for a in os.environ.get("GPULAB_ADMIN_USERS", "admin").split(",") if a]
    accounts = UserAccounts(config=c)
    mode, why = choose_isolation(os.environ.get("GPULAB_ISOLATION", "auto"), accounts.mediator, accounts.sudo)
    isolated = mode != NONE
    check_bind_safe(bind_url, demo_auth)
    check_isolation_bind(bind_url, isolated)

    # Users' homes may live below the data folder: others may enter it, not list it.
    prepare_dir(data_dir, 0o711 if isolated else 0o700)
    state_dir = prepare_dir(data_dir / "hub", 0o700)
    home_root = Path(os.environ.get("GPULAB_HOME_ROOT") or data_dir / "homes").resolve()
    home_root.mkdir(parents=True, exist_ok=True)
    c.JupyterHub.bind_url = bind_url
    c.JupyterHub.hub_ip = "127.0.0.1"
    port = urlparse(bind_url).port or 8000
    c.JupyterHub.hub_port = int(os.environ.get("GPULAB_HUB_PORT") or port_near(port + 1))
    api_port = int(os.environ.get("GPULAB_PROXY_API_PORT") or port_near(port + 2))
    c.ConfigurableHTTPProxy.api_url = f"http://127.0.0.1:{api_port}"
    c.JupyterHub.db_url = f"sqlite:///{state_dir / 'jupyterhub.sqlite'}"
    # Both databases wait as long for a lock another process holds (a backup, an admin's
    # sqlite3), then fail: requests wait out a short lock instead of failing at once.
    busy = float(os.environ.get("GPULAB_DB_BUSY_TIMEOUT") or DEFAULT_BUSY_TIMEOUT)
    c.GPULabDB.busy_timeout = busy
    c.JupyterHub.db_kwargs = {"connect_args": {"check_same_thread": False, "timeout": busy}}
    c.JupyterHub.cookie_secret_file = str(state_dir / "jupyterhub_cookie_secret")
    c.JupyterHub.pid_file = str(state_dir / "jupyterhub.pid")
    c.ConfigurableHTTPProxy.pid_file = str(state_dir / "jupyterhub-proxy.pid")
    c.ConfigurableHTTPProxy.command = [find_proxy()]
    c.GPULabDB.db_url = f"sqlite:///{state_dir / 'gpulab.sqlite'}"
    c.GPULabJobs.state_dir = str(data_dir / "jobs")
    # New work waits for room on these; running servers and jobs are left alone.
    c.GPULab.data_disks = {
        "the hub's databases": str(state_dir),
        "the job status folder": str(data_dir / "jobs"),
        "the users' homes": str(home_root),
    }
    c.JupyterHub.allow_named_servers = True
    c.JupyterHub.named_server_limit_per_user = 4
    c.JupyterHub.cleanup_servers = False  # servers survive a hub restart and are counted again

    singleuser = Path(sys.executable).with_name("jupyterhub-singleuser")
    if isolated:
        c.JupyterHub.spawner_class = "gpu-local"
        c.UserAccounts.enabled = True
        c.UserAccounts.switch = mode
        c.UserAccounts.home_root = str(home_root)
        c.UserAccounts.prefix = os.environ.get("GPULAB_ACCOUNT_PREFIX", "jupyter-")
        c.UserAccounts.hub_id = str(data_dir)  # claimed in each home: a second hub on one prefix is refused
        if mode == SUDO:  # the group the sudoers rule lets the hub act as
            c.UserAccounts.group = os.environ.get("GPULAB_ACCOUNT_GROUP", "jupyterhub-users")
        if home_root == data_dir / "homes":  # ours: others may enter their own home, not list the others
            prepare_dir(home_root, 0o711)
        reach: dict[str, Path | str] = {
            "the Python interpreter": sys.executable,
            "the single-user server": singleuser,
            "gpulab's code": REPO_ROOT,
            "the users' homes": home_root,
        }
        if mode == SUDO:  # a job's exit status is then a file in its owner's home
            reach["the mediator"] = accounts.mediator
        else:
            reach["the job status folder"] = data_dir / "jobs"
        check_reachable(reach)
        print(
            f"gpulab: isolation mode: {mode} ({why}): {ISOLATED[mode]}; each runs as system account "
            f"{c.UserAccounts.prefix}<name> (created on first spawn, home in {home_root}); "
            f"hub state in {state_dir} (0700)",
            file=sys.stderr,
            flush=True,
        )
        report_limits(c, mode)
    else:
        c.JupyterHub.spawner_class = "gpu-simple-local"
        c.SimpleLocalProcessSpawner.home_dir_template = str(home_root / "{username}")
        print(f"gpulab: isolation mode: {NONE} ({why})", file=sys.stderr, flush=True)
        print(f"gpulab: WARNING: {NOT_ISOLATED}", file=sys.stderr, flush=True)
        logging.getLogger("JupyterHub").warning("gpulab: %s", NOT_ISOLATED)
    c.Spawner.default_url = "/lab"
    c.Spawner.cmd = [str(singleuser)]
    c.Spawner.http_timeout = 60
    c.Spawner.start_timeout = 60

    c.GPULab.catalog_file = catalog_file
    try:
        catalog = GPULab(config=c).load_catalog()
    except CatalogError as e:
        raise SystemExit(f"gpulab: invalid configuration:\n{e}") from None
    if isolated and not UserLimits(config=c).memory_limit:
        unlimited = sorted(p.slug for p in catalog.profiles.values() if p.mem_limit is None)
        if unlimited:
            print(
                f"gpulab: profiles without a memory limit (their servers and jobs may use all memory "
                f"unless a team caps them): {', '.join(unlimited)}",
                file=sys.stderr,
                flush=True,
            )

    members = sorted({u for t in catalog.teams.values() for u in t.users})
    if demo_auth:
        c.JupyterHub.authenticator_class = "hub_config.config.auth.DemoAuthenticator"
        c.DemoAuthenticator.demo_password = os.environ.get("GPULAB_DEMO_PASSWORD", "gpulab-demo")
        c.Authenticator.allowed_users = set(members) | set(admins)
        c.Authenticator.admin_users = set(admins)
        gpus = ", ".join(f"{s.count} × {s.model}" for s in catalog.inventory) or "none declared"
        c.JupyterHub.template_vars = {
            "gpulab_not_isolated": None if isolated else NOT_ISOLATED,
            "gpulab_isolation": ISOLATED.get(mode),
            "gpulab_isolation_mode": mode,
            "gpulab_demo": {
                "users": members,
                "admins": admins,
                "password": c.DemoAuthenticator.demo_password,
                "gpus": gpus + " (declared unless NVML finds a driver)",
            },
        }
    else:
        c.JupyterHub.template_vars = {
            "gpulab_not_isolated": None if isolated else NOT_ISOLATED,
            "gpulab_isolation": ISOLATED.get(mode),
            "gpulab_isolation_mode": mode,
        }
    configure_gpulab(c, admin_users=admins)
    configure_idle_culler(c)  # the NVML culler when a driver is present; the admin page says why not
