"""The single-server attacker tests' world: two users, their servers, a job, and a probe.

Shared by ``tests/integration/test_isolation.py`` (a root hub) and
``test_isolation_sudo.py`` (a hub that is not root, through sudo and the mediator):
the same attacks, the same expected refusals.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import nbformat
import requests

from tests.support import REPO
from tests.support.hub import RunningHub, process_env
from tests.support.jobs import submit, user_token, wait_state, write_notebook

PROBE = REPO / "tests" / "support" / "isolation_probe.py"
CATALOG = """
profiles:
  - {slug: cpu, display_name: "CPU", gpus: 0}
teams:
  - {name: vision, users: [alice, bob], guarantee: 1, burst: 2, allowed_profiles: [cpu]}
"""


def make_world(hub: RunningHub) -> dict:
    """Both users with a running server, a file in their home and a finished job."""
    tokens = {u: user_token(hub, u) for u in ("alice", "bob")}
    for user in ("alice", "bob"):
        r = hub.api("POST", f"/users/{user}/server", data=json.dumps({"profile": "cpu", "team": "vision"}))
        assert r.status_code in (201, 202), r.text
    servers = {u: hub.wait_server(u) for u in ("alice", "bob")}
    for user in ("alice", "bob"):
        home = hub.home(user)
        hub.give(user, write_notebook(home / "exp" / "calc.ipynb"))
        (home / "secret.txt").write_text(f"{user}'s secret")
        hub.give(user, home / "secret.txt")
    bob_job = wait_state(
        hub, submit(hub, tokens["bob"], notebook="exp/calc.ipynb", job_class="batch", profile="cpu")["id"], "succeeded"
    )
    return {"tokens": tokens, "servers": servers, "bob_job": bob_job}


def server_pid(hub: RunningHub, user: str) -> int:
    return hub.api("GET", f"/users/{user}").json()["servers"][""]["state"]["pid"]


def proxy_pid(hub: RunningHub) -> int:
    return int((hub.state_dir / "jupyterhub-proxy.pid").read_text().strip())


def targets(hub: RunningHub, world: dict) -> dict:
    bob_home = hub.home("bob")
    job = world["bob_job"]
    state = hub.state_dir
    bob_server_token = process_env(server_pid(hub, "bob"))["JUPYTERHUB_API_TOKEN"]
    return {
        "read": {
            "own secret": str(hub.home("alice") / "secret.txt"),  # control: must be allowed
            "bob's secret": str(bob_home / "secret.txt"),
            "bob's notebook": str(bob_home / "exp" / "calc.ipynb"),
            "bob's job output": str(bob_home / job["output_path"]),
            "bob's job log": str(bob_home / job["log_path"]),
            "bob's job status": str(bob_home / ".gpulab" / "jobs" / f"job-{job['id']}-attempt-1.json"),
            "jupyterhub.sqlite": str(state / "jupyterhub.sqlite"),
            "gpulab.sqlite": str(state / "gpulab.sqlite"),
            "cookie secret": str(state / "jupyterhub_cookie_secret"),
        },
        "write": {
            "own home": str(hub.home("alice")),
            "bob's home": str(bob_home),
            "bob's job folder": str((bob_home / job["output_path"]).parent),
            "hub state": str(state),
            "bob's job status folder": str(bob_home / ".gpulab" / "jobs"),
        },
        "list": {"bob's home": str(bob_home), "hub state": str(state), "homes": str(hub.data_dir / "homes")},
        "environ": {"bob's server": server_pid(hub, "bob"), "hub": hub.proc.pid, "proxy": proxy_pid(hub)},
        "signal": {
            "bob's server": server_pid(hub, "bob"),
            "hub": hub.proc.pid,
            "proxy": proxy_pid(hub),
            "own server": server_pid(hub, "alice"),
        },  # control: must be allowed
        "secrets": [bob_server_token, world["tokens"]["bob"], hub.token],
    }


EXPECTED = {
    "read own secret": "allowed",
    "read bob's secret": "denied",
    "read bob's notebook": "denied",
    "read bob's job output": "denied",
    "read bob's job log": "denied",
    "read bob's job status": "denied",
    "read jupyterhub.sqlite": "denied",
    "read gpulab.sqlite": "denied",
    "read cookie secret": "denied",
    "write own home": "allowed",
    "write bob's home": "denied",
    "write bob's job folder": "denied",
    "write hub state": "denied",
    "write bob's job status folder": "denied",
    "list bob's home": "denied",
    "list hub state": "denied",
    "list homes": "denied",
    "environ bob's server": "denied",
    "environ hub": "denied",
    "environ proxy": "denied",
    "signal bob's server": "denied",
    "signal hub": "denied",
    "signal proxy": "denied",
    "signal own server": "allowed",
    "secret leaks": [],
}


def check(result: dict, alice_uid: int) -> None:
    assert result["uid"] == result["euid"] == alice_uid
    got = {k: result[k] for k in EXPECTED}
    assert got == EXPECTED


def probe_as_alice(hub: RunningHub, world: dict) -> None:
    """Run the probe in a process with alice's account's credentials; every attack must be refused."""
    alice = hub.account("alice")
    spec = hub.home("alice") / "targets.json"
    spec.write_text(json.dumps(targets(hub, world)))
    hub.give("alice", spec)
    setpriv = shutil.which("setpriv")
    out = subprocess.run(
        [
            setpriv,
            f"--reuid={alice.uid}",
            f"--regid={alice.gid}",
            "--init-groups",
            "--inh-caps=-all",
            sys.executable,
            str(PROBE),
            str(spec),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=alice.home,
        env={"HOME": str(alice.home), "USER": alice.name, "PATH": os.environ["PATH"]},
    )
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout.split("PROBE ", 1)[1])
    check(result, alice.uid)
    assert not (hub.home("bob") / ".probe-from-attacker").exists()


def probe_from_alice_job(hub: RunningHub, world: dict) -> dict:
    """Run the probe as a cell of alice's notebook job; every attack must be refused. The job."""
    alice = hub.account("alice")
    home = hub.home("alice")
    spec = home / "attack" / "targets.json"
    spec.parent.mkdir(exist_ok=True)
    spec.write_text(json.dumps(targets(hub, world)))
    nb = nbformat.v4.new_notebook()
    nb.cells = [
        nbformat.v4.new_code_cell(
            f"import runpy, sys\nsys.argv = ['probe', {str(spec)!r}]\n"
            f"runpy.run_path({str(PROBE)!r}, run_name='__main__')"
        )
    ]
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(nb, str(spec.parent / "attack.ipynb"))
    hub.give("alice", spec)
    hub.give("alice", spec.parent / "attack.ipynb")
    job = submit(hub, world["tokens"]["alice"], notebook="attack/attack.ipynb", job_class="batch", profile="cpu")
    done = wait_state(hub, job["id"], {"succeeded", "failed"}, token=world["tokens"]["alice"])
    log = (home / done["log_path"]).read_text()
    assert done["state"] == "succeeded", log
    result = json.loads(log.split("PROBE ", 1)[1].splitlines()[0])
    check(result, alice.uid)
    assert (home / done["output_path"]).stat().st_uid == alice.uid
    assert not (hub.home("bob") / ".probe-from-attacker").exists()
    return done


def run_in_terminal(hub: RunningHub, user: str, token: str, command: str) -> None:
    """Type ``command`` into a new JupyterLab terminal of ``user``'s server (its websocket)."""
    import asyncio

    from tornado.httpclient import HTTPRequest
    from tornado.websocket import websocket_connect

    headers = {"Authorization": f"token {token}"}
    r = requests.post(f"{hub.url}/user/{user}/api/terminals", headers=headers, timeout=30)
    assert r.status_code == 200, r.text
    name = r.json()["name"]

    async def type_it() -> None:
        url = f"ws://127.0.0.1:{hub.port}/user/{user}/terminals/websocket/{name}"
        ws = await websocket_connect(HTTPRequest(url, headers=headers, connect_timeout=30))
        await ws.write_message(json.dumps(["stdin", command + "\r"]))
        await asyncio.sleep(1)
        ws.close()

    asyncio.run(type_it())
