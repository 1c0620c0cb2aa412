"""Login -> JupyterLab ready for a returning user: gpulab beside a vanilla JupyterHub, in one run.

Two real hubs side by side on this machine, each with configurable-http-proxy
and real ``jupyterhub-singleuser`` (JupyterLab) servers from the same
virtualenv:

- **gpulab**: the embedded single-server hub exactly as ``gpulab up`` starts
  it (``hub_config/config/embedded.py``; as root: each user's own system account),
  the demo login, a catalog with two teams and four profiles. The user is a
  returning one: a warm-up run started ``0.5 × H100`` through the spawn
  form, so after login the spawn page offers "Start again with 0.5 × H100
  (team vision)" and the measured run clicks it.
- **vanilla**: JupyterHub with ``SimpleLocalProcessSpawner`` and the dummy
  authenticator, no options form: login starts the server at once.

One measured run, in headless Debian Chromium (Playwright, no browser
download): a fresh browser context opens the login page, fills it in, and the
clock runs from submitting the form to JupyterLab ready (its shell attached
and the splash screen gone), then the server is stopped through the REST API
and its stop awaited. Runs alternate between the two hubs (gpulab first on
even rounds, vanilla first on odd ones) so drift in the machine's load hits
both; the result is the median of N runs each and its ratio. Each hub's own
log gives where the time goes: the request times of the spawn page, the
one-click spawn and the login, and "took N seconds to start" of the server.

    .venv/bin/python benchmarks/login_to_lab.py            # 8 runs each
    .venv/bin/python benchmarks/login_to_lab.py --runs 6
    .venv/bin/python benchmarks/login_to_lab.py --smoke    # 1 run each (the tests)
"""

from __future__ import annotations

import argparse
import os
import re
import secrets
import shutil
import statistics
import sys
import tempfile
import textwrap
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import ROOT, table, write_result  # noqa: E402

from tests.support import VENV_BIN  # noqa: E402
from tests.support.browser import CHROMIUM, CHROMIUM_ARGS, chromium_missing  # noqa: E402
from tests.support.hub import RunningHub, free_port  # noqa: E402
from tests.support.processes import NotReady, wait_ready  # noqa: E402

PASSWORD = "gpulab-demo"
USER = "alice"
CATALOG = """
inventory:
  - {model: H100-80GB, count: 8, memory_mib: 81559}
profiles:
  - {slug: cpu, display_name: CPU only, gpus: 0}
  - {slug: h100-quarter, display_name: "0.25 × H100", gpus: 0.25, gpu_model: H100-80GB, idle_timeout: 4h}
  - {slug: h100-half, display_name: "0.5 × H100", gpus: 0.5, gpu_model: H100-80GB, idle_timeout: 2h}
  - {slug: h100-1, display_name: "1 × H100", gpus: 1, gpu_model: H100-80GB, idle_timeout: 1h}
teams:
  - {name: vision, users: [alice, bob], guarantee: 2, burst: 3, per_user_cap: 2}
  - {name: nlp, users: [alice, carol], guarantee: 2, burst: 4}
"""
#: Both hubs log at DEBUG: JupyterHub logs redirects (the login POST, the one-click spawn) only there.
LOG_LEVEL = 'c.JupyterHub.log_level = "DEBUG"\n'
_REQUEST = re.compile(r"\] (\d{3}) (GET|POST) ([^\s?]+)(?:\?\S*)?(?: -> \S+)? \(\S*@\S*\) ([\d.]+)ms")
_STARTED = re.compile(r"User (\S+) took ([\d.]+) seconds to start")


class VanillaHub:
    """JupyterHub + SimpleLocalProcessSpawner + dummy auth; an admin service token for stops."""

    def __init__(self, workdir: Path):
        self.workdir = workdir
        self.port, hub_port, api_port = free_port(), free_port(), free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.token = secrets.token_hex(16)
        self.log_path = workdir / "hub.log"
        singleuser = VENV_BIN / "jupyterhub-singleuser"
        root = hasattr(os, "geteuid") and os.geteuid() == 0
        (workdir / "jupyterhub_config.py").write_text(
            textwrap.dedent(f"""
            c = get_config()
            c.JupyterHub.bind_url = "{self.url}"
            c.JupyterHub.hub_ip = "127.0.0.1"
            c.JupyterHub.hub_port = {hub_port}
            c.ConfigurableHTTPProxy.api_url = "http://127.0.0.1:{api_port}"
            c.ConfigurableHTTPProxy.command = ["{ROOT / "node_modules" / ".bin" / "configurable-http-proxy"}"]
            c.ConfigurableHTTPProxy.pid_file = "{workdir / "proxy.pid"}"
            c.JupyterHub.pid_file = "{workdir / "hub.pid"}"
            c.JupyterHub.db_url = "sqlite:///{workdir / "jupyterhub.sqlite"}"
            c.JupyterHub.cookie_secret_file = "{workdir / "cookie_secret"}"
            c.JupyterHub.authenticator_class = "dummy"
            c.DummyAuthenticator.password = "{PASSWORD}"
            c.Authenticator.allow_all = True
            c.JupyterHub.spawner_class = "simple"
            c.SimpleLocalProcessSpawner.home_dir_template = "{workdir / "homes"}/{{username}}"
            c.Spawner.cmd = ["{singleuser}"]
            c.Spawner.args = {["--allow-root"] if root else []!r}
            c.Spawner.default_url = "/lab"
            c.Spawner.http_timeout = 60
            c.Spawner.start_timeout = 60
            c.JupyterHub.services = [{{"name": "bench", "api_token": "{self.token}"}}]
            c.JupyterHub.load_roles = [{{"name": "bench", "scopes": ["admin:servers", "read:users"],
                                        "services": ["bench"]}}]
        """)
            + LOG_LEVEL
        )
        self.proc = None

    def start(self) -> VanillaHub:
        import subprocess

        env = dict(os.environ, PATH=f"{VENV_BIN}:{ROOT / 'node_modules' / '.bin'}:{os.environ.get('PATH', '')}")
        self.proc = subprocess.Popen(
            [str(VENV_BIN / "jupyterhub"), "-f", str(self.workdir / "jupyterhub_config.py")],
            cwd=self.workdir,
            env=env,
            stdout=open(self.log_path, "ab"),
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        try:
            wait_ready(self.proc, self.url + "/hub/api/", timeout=60)
        except NotReady as e:
            if e.returncode is not None:
                raise RuntimeError(f"vanilla hub exited:\n{self.log_path.read_text()[-3000:]}") from None
            raise RuntimeError("vanilla hub did not come up") from None
        return self

    def api(self, method: str, path: str):
        import requests

        return requests.request(
            method, self.url + "/hub/api" + path, timeout=30, headers={"Authorization": f"token {self.token}"}
        )

    def close(self) -> None:
        import signal

        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)  # the hub stops the servers it started
            try:
                self.proc.wait(30)
            except Exception:
                os.killpg(self.proc.pid, signal.SIGKILL)
        pid_file = self.workdir / "proxy.pid"
        if pid_file.exists():
            try:
                os.kill(int(pid_file.read_text().strip()), signal.SIGTERM)
            except (ValueError, ProcessLookupError):
                pass


def wait_stopped(hub: Any, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        model = hub.api("GET", f"/users/{USER}").json()
        if not (model.get("servers") or {}).get(""):
            return
        time.sleep(0.2)
    raise TimeoutError(f"{USER}'s server did not stop")


def lab_ready(page) -> None:
    """JupyterLab's shell is attached and its splash screen is gone (the workspace is restored)."""
    page.wait_for_function(
        "() => document.querySelector('.jp-LabShell') !== null"
        " && document.getElementById('jupyterlab-splash') === null",
        timeout=120_000,
    )


def one_run(browser, hub: Any, kind: str, first: bool = False) -> dict[str, float]:
    """Log in and reach JupyterLab; ``first`` (gpulab's warm-up) picks 0.5 × H100 on the spawn form."""
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    page = context.new_page()
    page.set_default_timeout(120_000)
    page.goto(hub.url + "/hub/login")
    page.fill("input[name=username]", USER)
    page.fill("input[name=password]", PASSWORD)
    marks: dict[str, float] = {}
    t0 = time.perf_counter()
    page.click("input[type=submit], button[type=submit]")
    if kind == "gpulab":
        if first:
            page.wait_for_selector("#spawn_form")
            page.check("#gpulab-vision--h100-half")
            page.click("#spawn_form button[type=submit]")
        else:
            again = page.locator("#gpulab-start-again")
            again.wait_for()
            marks["spawn_page_s"] = time.perf_counter() - t0
            if again.inner_text().strip() != "Start again with 0.5 × H100 (team vision)":
                raise RuntimeError(f"unexpected start-again button: {again.inner_text()!r}")
            again.click()
    page.wait_for_url(f"**/user/{USER}/lab**", timeout=120_000)
    marks["lab_url_s"] = time.perf_counter() - t0
    lab_ready(page)
    marks["total_s"] = time.perf_counter() - t0
    context.close()
    r = hub.api("DELETE", f"/users/{USER}/server")
    if r.status_code not in (202, 204):
        raise RuntimeError(f"stop failed: {r.status_code} {r.text[:200]}")
    wait_stopped(hub)
    return marks


def log_profile(log_path: Path, since: int) -> dict[str, Any]:
    """Request times by route and server start times, from the hub's log after byte ``since``."""
    with open(log_path, "rb") as f:
        f.seek(since)
        text = f.read().decode(errors="replace")
    routes: dict[str, list[float]] = {}
    for status, method, path, ms in _REQUEST.findall(text):
        route = re.sub(rf"/{USER}(/|$)", "/USER\\1", path)
        routes.setdefault(f"{method} {route} {status}", []).append(float(ms))
    starts = [float(s) for _, s in _STARTED.findall(text)]
    return {
        "requests_ms_median": {
            k: round(statistics.median(v), 1)
            for k, v in sorted(routes.items())
            if "/static/" not in k and "/api/" not in k
        },
        "server_start_s": starts,
        "server_start_s_median": round(statistics.median(starts), 3) if starts else None,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=8, help="measured runs per hub (default 8, at least 6 for the docs)")
    ap.add_argument("--smoke", action="store_true", help="one measured run per hub (used by the tests)")
    ap.add_argument("--out", help="directory for the JSON result (default benchmarks/results)")
    args = ap.parse_args(argv)
    runs = 1 if args.smoke else args.runs
    if chromium_missing():
        raise SystemExit(chromium_missing())
    from playwright.sync_api import sync_playwright

    started = time.perf_counter()
    load_start = os.getloadavg()
    workdir = Path(tempfile.mkdtemp(prefix="gpulab-login-bench-"))
    gpulab = RunningHub(workdir / "gpulab", CATALOG, extra_config=LOG_LEVEL)
    (workdir / "vanilla").mkdir()
    vanilla = VanillaHub(workdir / "vanilla")
    results: dict[str, list[dict[str, float]]] = {"gpulab": [], "vanilla": []}
    hubs = {"gpulab": gpulab, "vanilla": vanilla}
    logs = {"gpulab": gpulab.log_path, "vanilla": vanilla.log_path}
    try:
        gpulab.start()
        vanilla.start()
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
            # Warm-up, not measured: system account, caches, and gpulab's "last choice".
            for kind in ("gpulab", "vanilla"):
                one_run(browser, hubs[kind], kind, first=True)
            offsets = {k: v.stat().st_size for k, v in logs.items()}
            for i in range(runs):
                order = ("gpulab", "vanilla") if i % 2 == 0 else ("vanilla", "gpulab")
                for kind in order:
                    marks = one_run(browser, hubs[kind], kind)
                    results[kind].append(marks)
                    print(f"  run {i + 1}/{runs} {kind:8s} {marks['total_s']:.2f} s", file=sys.stderr)
            browser.close()
        profile = {k: log_profile(path, offsets[k]) for k, path in logs.items()}
    finally:
        vanilla.close()
        gpulab.close()
        shutil.rmtree(workdir, ignore_errors=True)
    med = {k: statistics.median(m["total_s"] for m in v) for k, v in results.items()}
    ratio = med["gpulab"] / med["vanilla"]
    rows = [
        [
            k,
            len(v),
            med[k],
            min(m["total_s"] for m in v),
            max(m["total_s"] for m in v),
            statistics.median(m["lab_url_s"] for m in v),
            profile[k]["server_start_s_median"] or float("nan"),
        ]
        for k, v in results.items()
    ]
    print(
        table(
            ["hub", "runs", "median s", "min s", "max s", "to /user/… URL s", "server start s (hub log)"],
            rows,
            title="Login → JupyterLab ready, returning user (median of runs, alternating)",
        )
    )
    print(f"\nratio gpulab / vanilla (medians): {ratio:.3f}")
    spawn_page = [m["spawn_page_s"] for m in results["gpulab"] if "spawn_page_s" in m]
    if spawn_page:
        print(
            f"gpulab: login submitted → spawn page with 'Start again' shown: median {statistics.median(spawn_page):.2f} s"
        )
    for kind in ("gpulab", "vanilla"):
        print(
            f"\n{kind} hub, median request times (ms): "
            + ", ".join(f"{k}: {v}" for k, v in profile[kind]["requests_ms_median"].items())
        )
    path = write_result(
        "login_to_lab",
        {
            "smoke": args.smoke,
            "parameters": {
                "runs": runs,
                "user": USER,
                "choice": "vision:h100-half",
                "order": "alternating; gpulab first on even rounds",
                "browser": CHROMIUM,
                "ready": ".jp-LabShell attached and #jupyterlab-splash gone",
            },
            "median_s": med,
            "ratio_gpulab_over_vanilla": ratio,
            "runs": results,
            "profile": profile,
            "load_avg_at_run_start": load_start,
            "elapsed_s": time.perf_counter() - started,
        },
        args.out,
    )
    print(f"\nwrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
