"""The embedded single-server hub: one GPU box (or a laptop), no Kubernetes."""

from __future__ import annotations

import ipaddress
import os
import shutil
import socket
import sys
from pathlib import Path
from urllib.parse import urlparse

from spawner.catalog import CatalogError
from spawner.config import GPULab

from .idle_service import configure_idle_culler
from .setup import configure_gpulab

DEMO_CATALOG = str(Path(__file__).parent / "demo-teams.yaml")
REPO_ROOT = Path(__file__).resolve().parent.parent


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


def find_proxy() -> str:
    for candidate in (os.environ.get("GPULAB_CHP"), shutil.which("configurable-http-proxy"),
                      str(REPO_ROOT / "node_modules" / ".bin" / "configurable-http-proxy")):
        if candidate and Path(candidate).exists():
            return candidate
    raise SystemExit("gpulab: configurable-http-proxy not found; run scripts/bootstrap.sh or `npm install -g configurable-http-proxy`")


def configure_embedded(c) -> None:
    """Configure ``c`` for the embedded hub from ``GPULAB_*`` environment variables.

    - ``GPULAB_BIND`` (default ``http://127.0.0.1:8000``)
    - ``GPULAB_DATA_DIR`` (default ``./.gpulab``): hub database, cookie secret, user homes
    - ``GPULAB_CATALOG`` (default: the demo teams): teams/profiles YAML
    - ``GPULAB_DEMO_AUTH`` (default ``1``), ``GPULAB_DEMO_PASSWORD`` (default ``gpulab-demo``)
    - ``GPULAB_ADMIN_USERS`` (default ``admin``), comma-separated
    """
    bind_url = os.environ.get("GPULAB_BIND", "http://127.0.0.1:8000")
    data_dir = Path(os.environ.get("GPULAB_DATA_DIR", ".gpulab")).resolve()
    catalog_file = os.environ.get("GPULAB_CATALOG", DEMO_CATALOG)
    demo_auth = os.environ.get("GPULAB_DEMO_AUTH", "1") not in ("0", "false", "no")
    admins = [a for a in os.environ.get("GPULAB_ADMIN_USERS", "admin").split(",") if a]
    check_bind_safe(bind_url, demo_auth)

    data_dir.mkdir(parents=True, exist_ok=True)
    (data_dir / "homes").mkdir(exist_ok=True)
    c.JupyterHub.bind_url = bind_url
    c.JupyterHub.hub_ip = "127.0.0.1"
    c.JupyterHub.db_url = f"sqlite:///{data_dir / 'jupyterhub.sqlite'}"
    c.JupyterHub.cookie_secret_file = str(data_dir / "jupyterhub_cookie_secret")
    c.JupyterHub.pid_file = str(data_dir / "jupyterhub.pid")
    c.ConfigurableHTTPProxy.pid_file = str(data_dir / "jupyterhub-proxy.pid")
    c.ConfigurableHTTPProxy.command = [find_proxy()]
    c.JupyterHub.allow_named_servers = True
    c.JupyterHub.named_server_limit_per_user = 4
    c.JupyterHub.cleanup_servers = False  # servers survive a hub restart and are counted again

    c.JupyterHub.spawner_class = "gpu-simple-local"
    c.SimpleLocalProcessSpawner.home_dir_template = str(data_dir / "homes" / "{username}")
    c.Spawner.default_url = "/lab"
    c.Spawner.cmd = [str(Path(sys.executable).with_name("jupyterhub-singleuser"))]
    c.Spawner.http_timeout = 60
    c.Spawner.start_timeout = 60

    c.GPULab.catalog_file = catalog_file
    try:
        catalog = GPULab(config=c).load_catalog()
    except CatalogError as e:
        raise SystemExit(f"gpulab: invalid configuration:\n{e}") from None

    members = sorted({u for t in catalog.teams.values() for u in t.users})
    if demo_auth:
        c.JupyterHub.authenticator_class = "hub_config.auth.DemoAuthenticator"
        c.DemoAuthenticator.demo_password = os.environ.get("GPULAB_DEMO_PASSWORD", "gpulab-demo")
        c.Authenticator.allowed_users = set(members) | set(admins)
        c.Authenticator.admin_users = set(admins)
        gpus = ", ".join(f"{s.count} × {s.model}" for s in catalog.inventory) or "none declared"
        c.JupyterHub.template_vars = {
            "gpulab_demo": {
                "users": members,
                "admins": admins,
                "password": c.DemoAuthenticator.demo_password,
                "gpus": gpus + " (declared unless NVML finds a driver)",
            }
        }
    configure_gpulab(c, admin_users=admins)
    configure_idle_culler(c)  # the NVML culler when a driver is present; the admin page says why not
