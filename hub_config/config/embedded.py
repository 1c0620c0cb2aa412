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
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from traitlets import TraitError

from hub_config.config.idle_service import configure_idle_culler
from hub_config.config.setup import configure_gpulab
from hub_config.storage.db import DEFAULT_BUSY_TIMEOUT
from spawner.core.catalog import Catalog, CatalogError
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


def report_limits(c: Any, settings: EmbeddedSettings, mode: str) -> None:
    """Set up (once) and print what confines each server and job; refuse to start when it must and cannot.

    ``GPULAB_LIMITS`` (auto, on, off) and ``GPULAB_CGROUP_PARENT`` set ``c.UserLimits.enabled``
    and ``cgroup_parent`` (a hub that is not root: the subtree delegated to it).
    """
    if settings.limits:
        c.UserLimits.enabled = settings.limits
    if settings.cgroup_parent:
        c.UserLimits.cgroup_parent = settings.cgroup_parent
    try:
        limits = UserLimits(config=c)
    except TraitError as e:
        raise SystemExit(f"gpulab: GPULAB_LIMITS: {e}") from None
    try:
        confiner = get_confiner(limits, mode)
    except LimitsUnavailable as e:
        raise SystemExit(f"gpulab: refusing to start: {e}") from None
    confiner.remove_leftovers(c.UserAccounts.prefix)
    for line in confiner.status.lines():
        print(f"gpulab: {line}", file=sys.stderr, flush=True)
    print(
        "gpulab: servers' output goes to ~/.gpulab/logs/server[-<name>].log in each user's home "
        f"(kept under 2 × {limits.server_output_max_bytes} bytes), not to this log"
        if limits.server_output_max_bytes > 0
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


@dataclass(frozen=True)
class EmbeddedSettings:
    """What the ``GPULAB_*`` environment asks of the embedded hub (read once, nothing touched)."""

    bind_url: str = "http://127.0.0.1:8000"
    data_dir: Path = Path(".gpulab")
    catalog_file: str = DEMO_CATALOG
    demo_auth: bool = True
    demo_password: str = "gpulab-demo"
    admins: tuple[str, ...] = ("admin",)
    isolation: str = "auto"
    #: Where the users' homes are (default: ``homes/`` in the data folder).
    home_root: Path | None = None
    account_prefix: str = "jupyter-"
    account_group: str = "jupyterhub-users"
    hub_port: int | None = None
    proxy_api_port: int | None = None
    #: ``c.UserLimits.enabled`` (auto, on, off) and ``cgroup_parent``, when set.
    limits: str | None = None
    cgroup_parent: str | None = None
    #: Seconds a write to either SQLite database waits for a lock another process holds.
    db_busy_timeout: float = DEFAULT_BUSY_TIMEOUT

    @classmethod
    def from_env(cls, env: Mapping[str, str] = os.environ) -> EmbeddedSettings:
        port = env.get("GPULAB_HUB_PORT")
        api_port = env.get("GPULAB_PROXY_API_PORT")
        return cls(
            bind_url=env.get("GPULAB_BIND", cls.bind_url),
            data_dir=Path(env.get("GPULAB_DATA_DIR", ".gpulab")).resolve(),
            catalog_file=env.get("GPULAB_CATALOG", DEMO_CATALOG),
            demo_auth=env.get("GPULAB_DEMO_AUTH", "1") not in ("0", "false", "no"),
            demo_password=env.get("GPULAB_DEMO_PASSWORD", cls.demo_password),
            admins=tuple(a for a in env.get("GPULAB_ADMIN_USERS", "admin").split(",") if a),
            isolation=env.get("GPULAB_ISOLATION", cls.isolation),
            home_root=Path(env["GPULAB_HOME_ROOT"]).resolve() if env.get("GPULAB_HOME_ROOT") else None,
            account_prefix=env.get("GPULAB_ACCOUNT_PREFIX", cls.account_prefix),
            account_group=env.get("GPULAB_ACCOUNT_GROUP", cls.account_group),
            hub_port=int(port) if port else None,
            proxy_api_port=int(api_port) if api_port else None,
            limits=env.get("GPULAB_LIMITS") or None,
            cgroup_parent=env.get("GPULAB_CGROUP_PARENT") or None,
            db_busy_timeout=float(env.get("GPULAB_DB_BUSY_TIMEOUT") or DEFAULT_BUSY_TIMEOUT),
        )

    @property
    def homes(self) -> Path:
        return self.home_root or (self.data_dir / "homes").resolve()


@dataclass(frozen=True)
class Prepared:
    """What :func:`prepare` found and made on this machine for the hub to use."""

    #: ``root``, ``sudo`` or ``none``, and why.
    mode: str
    why: str
    state_dir: Path
    hub_port: int
    proxy_api_port: int
    proxy_command: str
    singleuser: Path

    @property
    def isolated(self) -> bool:
        return self.mode != NONE


def prepare(settings: EmbeddedSettings, accounts: UserAccounts) -> Prepared:
    """Check the settings are safe, decide the isolation mode, make the folders, pick ports."""
    mode, why = choose_isolation(settings.isolation, accounts.mediator, accounts.sudo)
    isolated = mode != NONE
    check_bind_safe(settings.bind_url, settings.demo_auth)
    check_isolation_bind(settings.bind_url, isolated)
    # Users' homes may live below the data folder: others may enter it, not list it.
    prepare_dir(settings.data_dir, 0o711 if isolated else 0o700)
    state_dir = prepare_dir(settings.data_dir / "hub", 0o700)
    home_root = settings.homes
    home_root.mkdir(parents=True, exist_ok=True)
    singleuser = Path(sys.executable).with_name("jupyterhub-singleuser")
    if isolated:
        if home_root == settings.data_dir / "homes":  # ours: others may enter their own home, not list the others
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
            reach["the job status folder"] = settings.data_dir / "jobs"
        check_reachable(reach)
    port = urlparse(settings.bind_url).port or 8000
    return Prepared(
        mode=mode,
        why=why,
        state_dir=state_dir,
        hub_port=settings.hub_port or port_near(port + 1),
        proxy_api_port=settings.proxy_api_port or port_near(port + 2),
        proxy_command=find_proxy(),
        singleuser=singleuser,
    )


def apply_hub(c: Any, settings: EmbeddedSettings, prepared: Prepared) -> None:
    """Where the hub listens and keeps its state; its servers' spawner and their limits."""
    state_dir = prepared.state_dir
    c.JupyterHub.bind_url = settings.bind_url
    c.JupyterHub.hub_ip = "127.0.0.1"
    c.JupyterHub.hub_port = prepared.hub_port
    c.ConfigurableHTTPProxy.api_url = f"http://127.0.0.1:{prepared.proxy_api_port}"
    c.JupyterHub.db_url = f"sqlite:///{state_dir / 'jupyterhub.sqlite'}"
    # Both databases wait as long for a lock another process holds (a backup, an admin's
    # sqlite3), then fail: requests wait out a short lock instead of failing at once.
    c.GPULabDB.busy_timeout = settings.db_busy_timeout
    c.JupyterHub.db_kwargs = {"connect_args": {"check_same_thread": False, "timeout": settings.db_busy_timeout}}
    c.JupyterHub.cookie_secret_file = str(state_dir / "jupyterhub_cookie_secret")
    c.JupyterHub.pid_file = str(state_dir / "jupyterhub.pid")
    c.ConfigurableHTTPProxy.pid_file = str(state_dir / "jupyterhub-proxy.pid")
    c.ConfigurableHTTPProxy.command = [prepared.proxy_command]
    c.GPULabDB.db_url = f"sqlite:///{state_dir / 'gpulab.sqlite'}"
    c.GPULabJobs.state_dir = str(settings.data_dir / "jobs")
    # New work waits for room on these; running servers and jobs are left alone.
    c.GPULab.data_disks = {
        "the hub's databases": str(state_dir),
        "the job status folder": str(settings.data_dir / "jobs"),
        "the users' homes": str(settings.homes),
    }
    c.JupyterHub.allow_named_servers = True
    c.JupyterHub.named_server_limit_per_user = 4
    c.JupyterHub.cleanup_servers = False  # servers survive a hub restart and are counted again
    c.Spawner.default_url = "/lab"
    c.Spawner.cmd = [str(prepared.singleuser)]
    c.Spawner.http_timeout = 60
    c.Spawner.start_timeout = 60
    c.GPULab.catalog_file = settings.catalog_file


def apply_isolation(c: Any, settings: EmbeddedSettings, prepared: Prepared) -> None:
    """Each user's own system account (root or sudo), or every server as the hub's account."""
    if prepared.isolated:
        c.JupyterHub.spawner_class = "gpu-local"
        c.UserAccounts.enabled = True
        c.UserAccounts.switch = prepared.mode
        c.UserAccounts.home_root = str(settings.homes)
        c.UserAccounts.prefix = settings.account_prefix
        c.UserAccounts.hub_id = str(settings.data_dir)  # claimed in each home: a second hub on one prefix is refused
        if prepared.mode == SUDO:  # the group the sudoers rule lets the hub act as
            c.UserAccounts.group = settings.account_group
    else:
        c.JupyterHub.spawner_class = "gpu-simple-local"
        c.SimpleLocalProcessSpawner.home_dir_template = str(settings.homes / "{username}")


def apply_auth(c: Any, settings: EmbeddedSettings, prepared: Prepared, catalog: Catalog) -> None:
    """The demo login (the catalog's members and the admins) and what the login page says."""
    isolation_vars = {
        "gpulab_not_isolated": None if prepared.isolated else NOT_ISOLATED,
        "gpulab_isolation": ISOLATED.get(prepared.mode),
        "gpulab_isolation_mode": prepared.mode,
    }
    if not settings.demo_auth:
        c.JupyterHub.template_vars = isolation_vars
        return
    members = sorted({u for t in catalog.teams.values() for u in t.users})
    c.JupyterHub.authenticator_class = "hub_config.config.auth.DemoAuthenticator"
    c.DemoAuthenticator.demo_password = settings.demo_password
    c.Authenticator.allowed_users = set(members) | set(settings.admins)
    c.Authenticator.admin_users = set(settings.admins)
    gpus = ", ".join(f"{s.count} × {s.model}" for s in catalog.inventory) or "none declared"
    c.JupyterHub.template_vars = {
        **isolation_vars,
        "gpulab_demo": {
            "users": members,
            "admins": list(settings.admins),
            "password": settings.demo_password,
            "gpus": gpus + " (declared unless NVML finds a driver)",
        },
    }


def announce(c: Any, settings: EmbeddedSettings, prepared: Prepared) -> None:
    """Say at start how users are isolated, or that they are not."""
    if prepared.isolated:
        print(
            f"gpulab: isolation mode: {prepared.mode} ({prepared.why}): {ISOLATED[prepared.mode]}; each runs as "
            f"system account {c.UserAccounts.prefix}<name> (created on first spawn, home in {settings.homes}); "
            f"hub state in {prepared.state_dir} (0700)",
            file=sys.stderr,
            flush=True,
        )
    else:
        print(f"gpulab: isolation mode: {NONE} ({prepared.why})", file=sys.stderr, flush=True)
        print(f"gpulab: WARNING: {NOT_ISOLATED}", file=sys.stderr, flush=True)
        logging.getLogger("JupyterHub").warning("gpulab: %s", NOT_ISOLATED)


def warn_unlimited_memory(c: Any, catalog: Catalog) -> None:
    """Name the profiles whose servers and jobs no memory limit bounds (none set by default)."""
    if UserLimits(config=c).memory_limit:
        return
    unlimited = sorted(p.slug for p in catalog.profiles.values() if p.mem_limit is None)
    if unlimited:
        print(
            f"gpulab: profiles without a memory limit (their servers and jobs may use all memory "
            f"unless a team caps them): {', '.join(unlimited)}",
            file=sys.stderr,
            flush=True,
        )


def configure_embedded(c: Any) -> None:
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

    Read the settings, prepare the machine (checks, folders, ports), then apply them to
    ``c`` (the ``apply_*`` steps only write configuration).
    """
    settings = EmbeddedSettings.from_env()
    prepared = prepare(settings, UserAccounts(config=c))
    apply_hub(c, settings, prepared)
    apply_isolation(c, settings, prepared)
    announce(c, settings, prepared)
    if prepared.isolated:
        report_limits(c, settings, prepared.mode)
    try:
        catalog = GPULab(config=c).load_catalog()
    except CatalogError as e:
        raise SystemExit(f"gpulab: invalid configuration:\n{e}") from None
    if prepared.isolated:
        warn_unlimited_memory(c, catalog)
    apply_auth(c, settings, prepared, catalog)
    configure_gpulab(c, admin_users=list(settings.admins))
    configure_idle_culler(c)  # the NVML culler when a driver is present; the admin page says why not
