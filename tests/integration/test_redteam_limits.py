"""Red team, limits: what one user's own code does to the machine, the hub and the other users.

One finding per test, each as the attacker does it: code typed into alice's own
JupyterLab terminal (it runs as her account, inside her server) or a cell of
her own notebook job. Real accounts, real servers, a real hub (root mode):

- no memory limit: a memory hog in a server;
- no process limit: a fork bomb in a server;
- shared /tmp and /dev/shm: alice lists bob's files there;
- any user can open any GPU device node (``CUDA_VISIBLE_DEVICES`` is only a variable);
- no cap on CPU-only jobs: many submissions, as many runners;
- kernel output in the hub's log: forged log lines and unbounded output (a kernel cell).

Both modes: a root hub, and a hub that is not root (sudo and the mediator, a
cgroup subtree delegated to its account; run it under ``flock
/tmp/gpulab-sudo-tests.lock``, as it installs a sudoers drop-in). Each test failed on the code before these limits (see the report of the change
that added this file). The attacks are bounded so that even there they cannot
hurt the machine: the "fork bomb" stops by itself at 600 processes, the hog
asks for 1.5 GiB once. The GPU device nodes are made by the test with
``mknod`` (NVIDIA's major 195, no driver behind them: an allowed open fails with
ENXIO, a denied one with EPERM) in a device folder the hub is pointed at.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import stat
import sys
import time
from pathlib import Path

import nbformat
import pytest
import requests

from spawner.local.accounts import can_switch_users
from spawner.local.cgroups import join_cgroup
from tests.support.cgroups import own_folder, remove_tree
from tests.support.hub import RunningHub
from tests.support.isolation import run_in_terminal
from tests.support.jobs import kill_job_runners, submit, user_token, wait_state, write_notebook
from tests.support.sudo_bed import hub_account_of, sudo_bed, sudo_hub

pytestmark = [
    pytest.mark.sudo_bed,
    pytest.mark.skipif(not can_switch_users(), reason="real accounts and device nodes need root (CI runs as root)"),
]

CATALOG = """
inventory:
  - {model: H100-80GB, count: 4, memory_mib: 81559}
profiles:
  - {slug: cpu, display_name: "CPU", gpus: 0, memory: {limit: 512Mi}}
  - {slug: gpu1, display_name: "1 GPU", gpus: 1, gpu_model: H100-80GB, memory: {limit: 512Mi}}
teams:
  - name: vision
    users: [alice, bob]
    guarantee: 4
    burst: 4
    allowed_profiles: [cpu, gpu1]
    limits: {processes: 200, running_jobs: 2}
"""
OUTPUT_CAP = 1 << 20


@pytest.fixture(scope="module")
def bed():
    with sudo_bed() as b:
        yield b


@pytest.fixture(scope="module")
def hub_account(bed):
    return hub_account_of(bed)


@pytest.fixture(scope="module")
def devices():
    """GPU device nodes of the test's own (``/dev/nvidia0..3`` and ``nvidiactl``, major 195), mode 0666."""
    folder = Path(f"/var/tmp/gpulab-redteam-dev-{secrets.token_hex(4)}")
    folder.mkdir(mode=0o755)
    for minor in range(4):
        os.mknod(folder / f"nvidia{minor}", stat.S_IFCHR | 0o666, os.makedev(195, minor))
    os.mknod(folder / "nvidiactl", stat.S_IFCHR | 0o666, os.makedev(195, 255))
    for node in folder.iterdir():
        os.chmod(node, 0o666)  # as the driver makes them (NVreg_DeviceFileMode's default)
    yield folder
    shutil.rmtree(folder)


def delegated_subtree(name: str, owner) -> list[Path]:
    """What an admin does for a hub that is not root: a cgroup folder per hierarchy, given to its account."""
    folders = []
    for controller in ("memory", "cpu", "pids"):
        folder = own_folder(controller, name)
        folder.mkdir()
        for path in (folder, *folder.iterdir()):
            os.chown(path, owner.uid, owner.gid)
        folders.append(folder)
    return folders


@pytest.fixture(scope="module", params=["root", "sudo"])
def hub(request, tmp_path_factory, devices):
    """The embedded hub as root, then as an account of its own through sudo (the drop-in installed,
    a cgroup subtree delegated to it and the hub started inside, as systemd's Delegate=yes does)."""
    extra = f"""
c.GPULab.gpu_inventory_source = "declared"
c.GPULabJobs.poll_interval = 0.3
c.UserLimits.device_dir = {str(devices)!r}
c.UserLimits.server_output_max_bytes = {OUTPUT_CAP}
"""
    if request.param == "root":
        h = RunningHub(tmp_path_factory.mktemp("redteam-limits"), CATALOG, extra_config=extra)
        h.start()
        yield h
        h.stop()
        kill_job_runners(h)
        h.close()
        return
    bed, owner = request.getfixturevalue("bed"), request.getfixturevalue("hub_account")
    folders = delegated_subtree(f"gpulab-test-deleg-{bed.tag}", owner)
    procs = [str(f / "cgroup.procs") for f in folders]
    try:
        with sudo_hub(bed, owner, CATALOG, extra, preexec=lambda: join_cgroup(procs)) as h:
            yield h
    finally:
        for folder in folders:
            if folder.exists():
                remove_tree(folder)


def sudo_mode(hub: RunningHub) -> bool:
    return hub.run_as is not None


@pytest.fixture(scope="module")
def world(hub: RunningHub):
    """alice with a 1-GPU server, bob with a CPU server; a token each."""
    tokens = {u: user_token(hub, u) for u in ("alice", "bob")}
    for user, profile in (("alice", "gpu1"), ("bob", "cpu")):
        r = hub.api("POST", f"/users/{user}/server", data=json.dumps({"profile": profile, "team": "vision"}))
        assert r.status_code in (201, 202), r.text
    for user in ("alice", "bob"):
        hub.wait_server(user)
    return {"tokens": tokens}


def server_state(hub: RunningHub, user: str) -> dict:
    return hub.api("GET", f"/users/{user}").json()["servers"][""]["state"]


def in_terminal(hub: RunningHub, world: dict, user: str, command: str, timeout: float = 90) -> str:
    """Run ``command`` in a new terminal of ``user``'s JupyterLab (as her account); its output."""
    home = hub.home(user)
    out = home / f"redteam-{secrets.token_hex(4)}.out"
    try:
        run_in_terminal(hub, user, world["tokens"][user], f"( {command} ) > {out}.tmp 2>&1; mv {out}.tmp {out}")
    except AssertionError as e:
        raise AssertionError(f"{e}\n{user}'s server log:\n{server_log_tail(hub, user)}") from None
    deadline = time.monotonic() + timeout
    while not out.exists():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{user}'s terminal command did not finish: {command}\n{hub.log_tail(30)}")
        time.sleep(0.3)
    assert out.stat().st_uid == hub.account(user).uid  # it ran as the user's account
    return out.read_text()


def server_log_tail(hub: RunningHub, user: str, n: int = 40) -> str:
    """The end of the user's server output (its capture file; the hub's log without one)."""
    path = hub.home(user) / ".gpulab" / "logs" / "server.log"
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-n:])
    except OSError:
        return hub.log_tail(n)


def still_fine(hub: RunningHub, world: dict) -> None:
    """The hub answers, and both users' servers answer their own API."""
    assert hub.api("GET", "/").status_code == 200
    for user in ("alice", "bob"):
        r = hub.api("GET", f"/users/{user}").json()["servers"][""]
        assert r["ready"], r
        status = requests.get(
            f"{hub.url}/user/{user}/api/status", headers={"Authorization": f"token {world['tokens'][user]}"}, timeout=30
        )
        assert status.status_code == 200, (user, status.status_code)


def test_memory_hog_in_a_server_is_oom_killed_inside_it(hub, world):
    """Finding: no memory limit. alice's hog asks for 1.5 GiB in a 512 MiB profile: the kernel kills the hog
    (SIGKILL, exit 137 in her shell); her server, bob's and the hub go on."""
    out = in_terminal(
        hub, world, "alice", f"{sys.executable} -c 'b = bytearray(1536 << 20); print(\"ALLOCATED\")'; echo rc=$?"
    )
    assert "ALLOCATED" not in out and "rc=137" in out, out
    still_fine(hub, world)


BOMB = r"""
import os, sys, time
children, error = [], ""
for _ in range(600):  # bounded: even without a limit this stops at 600 sleeping processes
    try:
        pid = os.fork()
    except OSError as e:
        error = os.strerror(e.errno)
        break
    if pid == 0:
        time.sleep(30)
        os._exit(0)
    children.append(pid)
print("FORKED", len(children), error, flush=True)
open(sys.argv[1], "w").write(str(len(children)))
time.sleep(float(sys.argv[2]))  # hold them while the others go on
for pid in children:
    os.kill(pid, 9)
for pid in children:
    os.waitpid(pid, 0)
print("DONE", flush=True)
"""


def test_fork_bomb_in_a_server_stops_at_its_process_limit(hub, world):
    """Finding: no process limit. alice forks as many processes as she can; her team's limit (200 tasks
    per server) stops her, while bob still starts processes and the hub answers."""
    home = hub.home("alice")
    script = home / "bomb.py"
    script.write_text(BOMB)
    hub.give("alice", script)
    held = home / "bomb.held"
    run_in_terminal(
        hub, "alice", world["tokens"]["alice"], f"{sys.executable} {script} {held} 8 > {home}/bomb.out 2>&1"
    )
    deadline = time.monotonic() + 60
    while not held.exists() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert held.exists(), (home / "bomb.out").read_text() if (home / "bomb.out").exists() else "no output"
    forked = int(held.read_text())
    # While alice sits at her limit, bob forks freely and the hub answers.
    bob = in_terminal(
        hub,
        world,
        "bob",
        f'{sys.executable} -c \'import subprocess; [subprocess.run(["true"]) for _ in range(20)]; print("BOB OK")\'',
    )
    assert "BOB OK" in bob
    still_fine(hub, world)
    deadline = time.monotonic() + 60
    while "DONE" not in (home / "bomb.out").read_text() and time.monotonic() < deadline:
        time.sleep(0.2)  # the bomb lets its processes go: alice's server forks again
    out = (home / "bomb.out").read_text()
    assert forked < 200 and "Resource temporarily unavailable" in out, out


def test_alice_cannot_see_bobs_tmp_or_shm_files(hub, world):
    """Finding: shared /tmp and /dev/shm. bob leaves files there (mode 0644, as his tools do);
    alice lists both folders."""
    tag = f"bob-secret-{secrets.token_hex(4)}"
    try:
        bob = in_terminal(
            hub, world, "bob", f"echo s3cret > /tmp/{tag}; echo s3cret > /dev/shm/{tag}; ls /tmp /dev/shm"
        )
        assert bob.count(tag) == 2, bob  # bob sees his own files
        listing = in_terminal(hub, world, "alice", "ls -a /tmp /dev/shm")
        read = in_terminal(hub, world, "alice", f"cat /tmp/{tag} /dev/shm/{tag} 2>/dev/null; echo END")
        assert tag not in listing and read.strip() == "END", (listing, read)
    finally:
        for folder in ("/tmp", "/dev/shm"):  # where they land without a private /tmp
            Path(folder, tag).unlink(missing_ok=True)


OPEN_NODES = r"""
import errno, json, os, sys
out = {}
for path in sorted(os.listdir(sys.argv[1])):
    try:
        os.close(os.open(os.path.join(sys.argv[1], path), os.O_RDWR))
        out[path] = "opened"
    except OSError as e:
        out[path] = errno.errorcode.get(e.errno, str(e.errno))
print("NODES " + json.dumps(out))
"""


def open_nodes(hub: RunningHub, world: dict, user: str, devices: Path) -> dict:
    script = hub.home(user) / "open_nodes.py"
    script.write_text(OPEN_NODES)
    hub.give(user, script)
    out = in_terminal(hub, world, user, f"{sys.executable} {script} {devices}")
    return json.loads(out.split("NODES ", 1)[1])


def test_a_user_opens_only_the_gpu_device_nodes_placed_for_her(hub, world, devices):
    """Finding: any user can open any GPU device node. alice's server holds one GPU: she opens its node
    (ENXIO: allowed, no driver here) and gets EPERM on the three others; the control node stays open.
    bob's CPU server opens no GPU node. After alice's server stops, its grant is gone. A hub that is not
    root cannot write device rules: there the finding stays, and the hub says so at start."""
    if sudo_mode(hub):
        log = hub.log_path.read_text()
        assert "GPU device isolation is off: a hub that is not root cannot write device rules" in log
        assert set(open_nodes(hub, world, "alice", devices).values()) == {"ENXIO"}  # as said: not isolated
        return
    placed = [i for i, _ in server_state(hub, "alice")["gpulab"]["shares"]]
    assert len(placed) == 1
    mine = f"nvidia{placed[0]}"
    expected = {f"nvidia{i}": "EPERM" for i in range(4)} | {mine: "ENXIO", "nvidiactl": "ENXIO"}
    assert open_nodes(hub, world, "alice", devices) == expected
    assert open_nodes(hub, world, "bob", devices) == {f"nvidia{i}": "EPERM" for i in range(4)} | {"nvidiactl": "ENXIO"}
    # Released with the server: her next (CPU) server has no GPU node either.
    assert hub.api("DELETE", "/users/alice/server").status_code in (202, 204)
    hub.wait_server("alice", ready=False)
    r = hub.api("POST", "/users/alice/server", data=json.dumps({"profile": "cpu", "team": "vision"}))
    assert r.status_code in (201, 202), r.text
    hub.wait_server("alice")
    assert open_nodes(hub, world, "alice", devices)[mine] == "EPERM"


JOB_HOG = """
import json, os
seen = {"cgroup": open("/proc/self/cgroup").read(), "tmp": sorted(os.listdir("/tmp"))}
json.dump(seen, open(os.path.expanduser("~/hog/seen.json"), "w"))
b = bytearray(1536 << 20)
json.dump({"allocated": True}, open(os.path.expanduser("~/hog/allocated.json"), "w"))
"""


def test_a_jobs_memory_hog_is_oom_killed_in_the_jobs_own_cgroup(hub, world):
    """Finding: no memory limit, for jobs. A cell of alice's notebook job asks for 1.5 GiB under a
    512 MiB profile: the kernel dies of it, the job fails saying so; the job ran in a cgroup of its own
    (joined before papermill started) with a private /tmp."""
    home = hub.home("alice")
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(JOB_HOG)]
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    (home / "hog").mkdir(exist_ok=True)
    nbformat.write(nb, str(home / "hog" / "hog.ipynb"))
    hub.give("alice", home / "hog" / "hog.ipynb")
    token = world["tokens"]["alice"]
    job = submit(hub, token, notebook="hog/hog.ipynb", job_class="batch", profile="cpu")
    done = wait_state(hub, job["id"], {"succeeded", "failed"}, token=token, timeout=150)
    assert done["state"] == "failed", done
    assert "reached its memory limit" in done["reason"], done["reason"]
    assert not (home / "hog" / "allocated.json").exists()
    seen = json.loads((home / "hog" / "seen.json").read_text())
    memory = next(line for line in seen["cgroup"].splitlines() if ":memory:" in line or line.startswith("0::"))
    assert memory.endswith(f".job-{job['id']}"), seen["cgroup"]
    assert [n for n in seen["tmp"] if not n.startswith(("gpulab-", "tmp"))] == [], seen["tmp"]
    still_fine(hub, world)


def test_cpu_only_jobs_are_capped_per_user_and_the_rest_wait_with_a_reason(hub, world):
    """Finding: no cap on CPU-only jobs (six submissions ran six runners). alice submits four CPU-only
    jobs; her team lets a member run two at once: two run, two wait, queued, saying why; all finish."""
    home = hub.home("alice")
    hub.give("alice", write_notebook(home / "cap" / "slow.ipynb"))
    token = world["tokens"]["alice"]
    ids = [
        submit(
            hub, token, notebook="cap/slow.ipynb", job_class="batch", profile="cpu", parameters={"sleep_seconds": 6}
        )["id"]
        for _ in range(4)
    ]
    most, reasons = 0, set()
    deadline = time.monotonic() + 150
    while time.monotonic() < deadline:
        jobs = [hub.api("GET", f"/gpulab/jobs/{i}", token=token).json() for i in ids]
        states = [j["state"] for j in jobs]
        most = max(most, states.count("running"))
        reasons |= {j["reason"] for j in jobs if j["state"] == "queued"}
        if all(s in ("succeeded", "failed") for s in states):
            break
        time.sleep(0.3)
    assert most == 2, most
    assert any("already runs 2 jobs" in r and "team vision" in r for r in reasons), reasons
    for i in ids:
        assert wait_state(hub, i, "succeeded", token=token)["state"] == "succeeded"


def run_in_kernel(hub: RunningHub, world: dict, user: str, code: str, timeout: float = 90) -> dict:
    """Execute ``code`` in a new kernel of ``user``'s server (REST + the kernel's websocket); the reply."""
    import asyncio
    import uuid

    from tornado.httpclient import HTTPRequest
    from tornado.websocket import websocket_connect

    headers = {"Authorization": f"token {world['tokens'][user]}"}
    base = f"{hub.url}/user/{user}/api/kernels"
    r = requests.post(base, headers=headers, json={"name": "python3"}, timeout=60)
    assert r.status_code == 201, (r.status_code, r.text, server_log_tail(hub, user))
    kernel = r.json()["id"]

    async def execute() -> dict:
        url = f"ws://127.0.0.1:{hub.port}/user/{user}/api/kernels/{kernel}/channels"
        ws = await websocket_connect(HTTPRequest(url, headers=headers, connect_timeout=30))
        msg_id = uuid.uuid4().hex
        header = {"msg_id": msg_id, "username": user, "session": uuid.uuid4().hex, "msg_type": "execute_request"}
        content = {"code": code, "silent": False, "store_history": False, "user_expressions": {}, "allow_stdin": False}
        await ws.write_message(
            json.dumps(
                {
                    "header": {**header, "version": "5.3"},
                    "parent_header": {},
                    "metadata": {},
                    "content": content,
                    "channel": "shell",
                }
            )
        )
        while True:
            raw = await asyncio.wait_for(ws.read_message(), timeout)
            assert raw is not None, "the kernel's websocket closed"
            msg = json.loads(raw)
            if msg.get("msg_type") == "execute_reply" and msg["parent_header"].get("msg_id") == msg_id:
                ws.close()
                return msg["content"]

    try:
        return asyncio.run(execute())
    finally:
        requests.delete(f"{base}/{kernel}", headers=headers, timeout=30)


#: A kernel's inherited stderr (ipykernel keeps a copy of it while it redirects fd 2 to the notebook):
#: found by comparing the kernel's descriptors with its server's fd 2, then written to.
FORGE = r"""
import os
server_stderr = os.readlink(f"/proc/{os.getppid()}/fd/2")
def target(fd):
    try:
        return os.readlink(f"/proc/self/fd/{fd}")
    except OSError:  # the descriptor listdir itself used
        return ""
inherited = [int(fd) for fd in os.listdir("/proc/self/fd") if int(fd) > 2 and target(fd) == server_stderr]
line = FORGED.encode() + b"\n"
for fd in inherited[:1]:
    os.write(fd, line)
    for _ in range(80):
        os.write(fd, b"x" * 65536)  # 5 MiB
    os.write(fd, b"\n" + line)
print("WROTE", inherited[:1], server_stderr)
"""


def test_kernel_output_never_reaches_the_hub_log(hub, world):
    """Finding: kernel stderr went verbatim into the hub's log. A cell of alice's kernel writes forged hub
    log lines and 5 MiB to the stderr it inherited from her server: the hub's log gets none of it; her own
    capture file, which only she can read, keeps it, bounded."""
    forged = f"[W 2026-12-01 10:00:00.000 JupyterHub app:1] FORGED-{secrets.token_hex(4)} admin logged in"
    before = hub.log_path.stat().st_size
    reply = run_in_kernel(hub, world, "alice", f"FORGED = {forged!r}\n" + FORGE)
    assert reply["status"] == "ok", reply
    time.sleep(1)
    log = hub.log_path.read_text(errors="replace")
    assert forged.split("] ")[1] not in log
    assert hub.log_path.stat().st_size - before < 1 << 20
    logs = hub.home("alice") / ".gpulab" / "logs"
    files = sorted(logs.glob("server.log*"))
    assert [f.name for f in files] == ["server.log", "server.log.1"], files
    assert sum(f.stat().st_size for f in files) <= 2 * OUTPUT_CAP
    assert forged in files[0].read_text(errors="replace")
    alice = hub.account("alice")
    for path in (logs, *files):
        st = path.stat()
        assert st.st_uid == alice.uid and not st.st_mode & 0o077, (path, oct(st.st_mode))
