"""Red team: each finding of a red-team pass on a single-server hub, as a test named for it.

Real accounts (the hubs create them), real servers and notebook jobs, a root hub
and a hub that is not root (sudo mode: a real drop-in from ``gpulab sudoers``).
The attacker's code runs as alice's own account, a process with exactly her uid,
gid and groups (tests/support/redteam_tools.py), as a terminal of her JupyterLab gives
her; bob is the bystander whose work must go on. Where a finding needs the
machine staged (a runner gone and its pid handed to another process), the test
does it as root with what the kernel offers (a subreaper, ``ns_last_pid``) and
says so. docs/single-server.md#what-a-user-can-and-cannot-reach lists the
findings; every test here failed on the code before them.

Run under ``flock /tmp/gpulab-sudo-tests.lock`` (the sudo hub installs a sudoers drop-in).

One file over the usual length on purpose: every finding runs against the same two
module-scoped hubs (root and sudo), which take most of the module's time to start; the
red-team limits have their own module (test_redteam_limits.py) with their own hub.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import sqlite3
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
import requests

from spawner.local.accounts import Account, can_switch_users, lookup
from tests.support.hub import RunningHub
from tests.support.jobs import FINAL, get_job, kill_job_runners, submit, user_token, wait_state, write_notebook
from tests.support.redteam_tools import (
    SWAP,
    PidHeld,
    Stopper,
    as_user,
    kill_and_reap_group,
    peak_rss_bytes,
    root_only_file,
    run_as_user,
    set_subreaper,
    spawn_with_pid,
)
from tests.support.sudo_bed import MEDIATOR, as_account, hub_account_of, sudo_bed, sudo_hub

pytestmark = [
    pytest.mark.sudo_bed,
    pytest.mark.skipif(
        not can_switch_users(), reason="real accounts and a sudoers drop-in need root (CI runs as root)"
    ),
]

MODES = ["root", "sudo"]
CATALOG = """
inventory:
  - {model: H100-80GB, count: 1, memory_mib: 81559}
profiles:
  - {slug: cpu, display_name: "CPU", gpus: 0}
  - {slug: h100-1, display_name: "1 × H100", gpus: 1, gpu_model: H100-80GB}
teams:
  - {name: vision, users: [alice, bob, zroot, zsys], guarantee: 1, burst: 1, allowed_profiles: [cpu, h100-1]}
"""
#: The mediator's deadline is long here so that bob's work can be timed while alice's call is stuck.
DEADLINE = 40
# No running-jobs cap here: these tests leave long jobs of alice's running side by side
# (the cap has its own red-team test in test_redteam_limits.py).
EXTRA_CONFIG = (
    f"c.GPULabJobs.poll_interval = 0.3\nc.UserAccounts.mediator_timeout = {DEADLINE}\n"
    "c.GPULabJobs.max_running_jobs_per_user = 0\n"
)


@dataclass
class World:
    hub: RunningHub
    mode: str
    tokens: dict[str, str]
    accounts: dict[str, Account]

    def job(self, user: str, state: str = "succeeded", **body) -> dict:
        """A new job of ``user``'s (the calc notebook, CPU), once it reached ``state``."""
        body = {"notebook": "exp/calc.ipynb", "job_class": "batch", "profile": "cpu", **body}
        job = submit(self.hub, self.tokens[user], **body)
        return wait_state(self.hub, job["id"], state, token=self.tokens[user])

    def status_files(self, job: dict) -> list[Path]:
        """Every place an exit-status file of ``job`` could be: the owner's home, a shared folder."""
        name = f"job-{job['id']}-attempt-1.json"
        shared = self.hub.data_dir.resolve() / "jobs"  # as the hub names it (the harness's link is in a 0700 folder)
        return [self.accounts[job["user"]].home / ".gpulab" / "jobs" / name, shared / name]


@pytest.fixture(scope="module", autouse=True)
def subreaper() -> Iterator[None]:
    """Orphaned runners and servers become this process's: it can reap them and free their pids."""
    set_subreaper(True)
    yield
    set_subreaper(False)


@pytest.fixture(scope="module")
def root_hub(tmp_path_factory, subreaper) -> Iterator[RunningHub]:
    h = RunningHub(tmp_path_factory.mktemp("redteam"), CATALOG, extra_config=EXTRA_CONFIG)
    h.start()
    try:
        yield h
    finally:
        h.stop()
        kill_job_runners(h)
        h.close()


@pytest.fixture(scope="module")
def bed(subreaper):
    with sudo_bed() as b:
        yield b


@pytest.fixture(scope="module")
def sudo_hub_(bed) -> Iterator[RunningHub]:
    with sudo_hub(bed, hub_account_of(bed), CATALOG, EXTRA_CONFIG) as h:
        yield h


_worlds: dict[str, World] = {}


def world(request: pytest.FixtureRequest, mode: str) -> World:
    """The mode's hub with alice and bob: accounts (made by the hub), servers, a notebook each."""
    hub = request.getfixturevalue("root_hub" if mode == "root" else "sudo_hub_")
    if mode in _worlds and _worlds[mode].hub is hub:
        return _worlds[mode]
    tokens = {u: user_token(hub, u) for u in ("alice", "bob")}
    for user in tokens:
        r = hub.api("POST", f"/users/{user}/server", data=json.dumps({"profile": "cpu", "team": "vision"}))
        assert r.status_code in (201, 202) or "already running" in r.text, r.text
    for user in tokens:
        hub.wait_server(user)
        hub.give(user, write_notebook(hub.home(user) / "exp" / "calc.ipynb"))
    w = World(hub, mode, tokens, {u: hub.account(u) for u in tokens})
    _worlds[mode] = w
    return w


def job_pid(hub: RunningHub, job_id: int) -> int:
    db = sqlite3.connect(hub.state_dir / "gpulab.sqlite")
    try:
        return db.execute("select pid from gpulab_jobs where id = ?", (job_id,)).fetchone()[0]
    finally:
        db.close()


def alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def spawn_refused(hub: RunningHub, user: str, because: str) -> None:
    """``user``'s spawn ends with no server, and the hub's log says ``because``."""
    r = hub.api("POST", f"/users/{user}/server", data=json.dumps({"profile": "cpu", "team": "vision"}))
    deadline = time.monotonic() + 60
    while r.status_code == 202 and time.monotonic() < deadline:  # answered before start() ended
        if not hub.api("GET", f"/users/{user}").json()["servers"].get("", {}).get("pending"):
            break
        time.sleep(0.3)
    assert not hub.api("GET", f"/users/{user}").json()["servers"], f"{user}'s server was started ({r.status_code})"
    assert because in hub.log_path.read_text(), hub.log_tail(30)


def message(r: requests.Response) -> str:
    try:
        return str(r.json().get("message", r.text))
    except ValueError:
        return r.text


# -- CRITICAL ---------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", MODES)
def test_critical_log_and_output_swapped_for_symlinks_read_no_file_outside_the_home(request, mode, tmp_path):
    """Alice swaps her job's log (then its output) between a file and symlinks to the hub's cookie
    secret and a root-only file, as fast as she can, while she asks the hub for them."""
    w = world(request, mode)
    hub, alice = w.hub, w.accounts["alice"]
    job = w.job("alice")
    cookie = (hub.state_dir / "jupyterhub_cookie_secret").read_text().strip()
    text_target, text_secret = root_only_file(tmp_path, "root's own SECRET\n")
    json_target, json_secret = root_only_file(tmp_path, '{"cells": [], "metadata": {"root": "SECRET"}}')
    leaks: list[str] = []
    refusals: Counter[int] = Counter()
    for endpoint, rel, targets in (
        ("logs", job["log_path"], [text_target, hub.state_dir / "jupyterhub_cookie_secret"]),
        ("output", job["output_path"], [json_target]),
    ):
        swapper = as_user(alice, SWAP, str(alice.home / rel), *map(str, targets))
        try:
            for _ in range(300):
                r = hub.api("GET", f"/gpulab/jobs/{job['id']}/{endpoint}", token=w.tokens["alice"])
                refusals[r.status_code] += 1
                if any(s in r.text for s in (cookie, text_secret, json_secret)):
                    leaks.append(f"{endpoint}: {r.status_code} {r.text[:200]}")
        finally:
            swapper.kill()
            swapper.wait()
    assert not leaks, f"{len(leaks)} reads of alice's own job returned a file outside her home: {leaks[:3]}"
    assert refusals[403] > 0, f"the swap never showed (answers: {dict(refusals)})"
    assert set(refusals) <= {200, 403, 409}, dict(refusals)


@pytest.mark.parametrize("mode", MODES)
def test_critical_kept_notebook_and_runs_folder_swapped_for_symlinks_copy_nothing_across(request, mode, tmp_path):
    """Alice replaces her job's kept notebook with a symlink to a root-only file and asks for a
    Re-run of it; then makes a notebook's ``runs/`` folder a symlink to a folder outside her home
    and submits. The copies are made as alice with no symlink followed: both are refused, no job
    is recorded, nothing is written outside her home and no root-only byte reaches her files."""
    w = world(request, mode)
    hub, alice = w.hub, w.accounts["alice"]
    job = w.job("alice")
    kept = alice.home / job["input_path"]
    assert kept.is_file() and kept.stat().st_uid == alice.uid
    target, secret = root_only_file(tmp_path, '{"cells": [], "metadata": {"root": "SECRET"}}')
    run_as_user(
        alice, "import os, sys; os.unlink(sys.argv[1]); os.symlink(sys.argv[2], sys.argv[1])", str(kept), str(target)
    )
    count = len(hub.api("GET", "/gpulab/jobs").json()["jobs"])
    r = hub.api("POST", f"/gpulab/jobs/{job['id']}/rerun", token=w.tokens["alice"])
    assert r.status_code == 403 and "symlink" in message(r), r.text
    outside = tmp_path / "outside"
    outside.mkdir(mode=0o777)
    os.chmod(outside, 0o777)  # writable by anyone: only the hub's refusal keeps alice's copy out of it
    run_as_user(
        alice,
        "import os, shutil, sys; os.makedirs(os.path.dirname(sys.argv[1]), exist_ok=True); "
        "shutil.copy(sys.argv[3], sys.argv[1]); os.symlink(sys.argv[2], os.path.join(os.path.dirname(sys.argv[1]), 'runs'))",
        str(alice.home / "evil" / "calc.ipynb"),
        str(outside),
        str(alice.home / "exp" / "calc.ipynb"),
    )
    r = hub.api(
        "POST",
        "/gpulab/jobs",
        token=w.tokens["alice"],
        data=json.dumps({"notebook": "evil/calc.ipynb", "job_class": "batch", "profile": "cpu"}),
    )
    assert r.status_code == 403 and "symlink" in message(r), r.text
    assert list(outside.iterdir()) == []
    assert len(hub.api("GET", "/gpulab/jobs").json()["jobs"]) == count
    # Every file of hers there (the jobs' checkpoint folders too), no link followed.
    for folder, _, names in os.walk(alice.home / "exp" / "runs"):
        for path in (Path(folder) / n for n in names):
            if not path.is_symlink():
                assert secret not in path.read_text(errors="replace"), path


# -- HIGH ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", MODES)
def test_high_fifo_in_place_of_a_log_holds_up_no_one(request, mode):
    """Alice puts a FIFO where her log was and asks for it 40 times at once; bob reads his log and
    starts a server meanwhile."""
    w = world(request, mode)
    hub, alice = w.hub, w.accounts["alice"]
    job, bobs = w.job("alice"), w.job("bob")
    fifo = alice.home / job["log_path"]
    run_as_user(alice, "import os, sys; os.unlink(sys.argv[1]); os.mkfifo(sys.argv[1], 0o600)", str(fifo))
    answers: list[requests.Response | Exception] = []

    def alice_reads() -> None:
        try:
            answers.append(hub.api("GET", f"/gpulab/jobs/{job['id']}/logs", token=w.tokens["alice"]))
        except requests.RequestException as e:
            answers.append(e)

    readers = [threading.Thread(target=alice_reads) for _ in range(40)]
    try:
        for t in readers:
            t.start()
        time.sleep(1)
        r = hub.api("GET", f"/gpulab/jobs/{bobs['id']}/logs", token=w.tokens["bob"])
        assert r.status_code == 200 and "result 42" in r.json()["text"], r.text
        r = hub.api("POST", "/users/bob/servers/fifo", data=json.dumps({"profile": "cpu", "team": "vision"}))
        assert r.status_code in (201, 202), r.text
        hub.wait_server("bob", "fifo", timeout=60)
        for t in readers:
            t.join(60)
    finally:
        # Whatever still waits in open() on the FIFO: a writer lets it go (the old code's case).
        for _ in range(50):
            try:
                os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
            except OSError:
                break
            time.sleep(0.1)
        hub.api("DELETE", "/users/bob/servers/fifo", data=json.dumps({"remove": True}))
    codes = Counter(a.status_code if isinstance(a, requests.Response) else type(a).__name__ for a in answers)
    # Refused, each at once: not a regular file, or (past the per-user cap on calls in flight) later.
    assert sum(codes.values()) == 40 and set(codes) <= {403, 429} and codes[403], codes
    said = {message(a) for a in answers if isinstance(a, requests.Response) and a.status_code == 403}
    assert all("is not a regular file" in m for m in said), said


@pytest.mark.parametrize("mode", MODES)
def test_high_sparse_gibibyte_output_notebook_is_refused_unread(request, mode):
    w = world(request, mode)
    hub, alice = w.hub, w.accounts["alice"]
    job = w.job("alice")
    run_as_user(alice, "import os, sys; os.truncate(sys.argv[1], 1 << 30)", str(alice.home / job["output_path"]))
    before = peak_rss_bytes(hub.proc.pid)
    r = hub.api("GET", f"/gpulab/jobs/{job['id']}/output", token=w.tokens["alice"])
    grew = peak_rss_bytes(hub.proc.pid) - before
    assert r.status_code == 413, (r.status_code, r.text[:300])
    assert "1073741824 bytes, more than this hub serves" in message(r)
    assert grew < 256 << 20, f"the hub's peak memory grew by {grew >> 20} MiB for a refused read"


@pytest.mark.parametrize("mode", MODES)
def test_high_stopped_mediator_holds_up_only_its_own_user(request, mode):
    """Alice SIGSTOPs every mediator the hub runs as her (her own processes) while her job ends and she
    reads her log; bob submits a job, reads his log and starts a server while her calls are stuck."""
    w = world(request, mode)
    hub, alice = w.hub, w.accounts["alice"]
    job = w.job("alice", "running", parameters={"sleep_seconds": 6})
    runner = job_pid(hub, job["id"])
    stopper = Stopper(alice, "gpulab-launch", 3 * DEADLINE)
    try:
        while alive(runner):  # the job ends; the hub reads its exit status as alice
            time.sleep(0.1)
        first = stopper.wait_for_one(timeout=30)
        assert first is not None, "the hub read alice's exit status without running a process of hers"
        stuck_since = first[1]
        results: dict[str, object] = {}

        def alice_log() -> None:  # answered at the deadline: wait longer than the harness's 30 s
            results["alice log"] = requests.get(
                f"{hub.url}/hub/api/gpulab/jobs/{job['id']}/logs",
                headers={"Authorization": f"token {w.tokens['alice']}"},
                timeout=DEADLINE * 2,
            )

        def bob_job() -> None:
            done = w.job("bob")
            results["bob job"] = done["state"]
            r = hub.api("GET", f"/gpulab/jobs/{done['id']}/logs", token=w.tokens["bob"])
            results["bob log"] = r.status_code
            results["bob job done"] = time.monotonic()

        def bob_server() -> None:
            r = hub.api("POST", "/users/bob/servers/meanwhile", data=json.dumps({"profile": "cpu", "team": "vision"}))
            results["bob spawn"] = r.status_code
            hub.wait_server("bob", "meanwhile", timeout=DEADLINE)
            results["bob server done"] = time.monotonic()

        threads = [threading.Thread(target=f) for f in (bob_job, bob_server, alice_log)]
        for t in threads:
            t.start()
        for t in threads[:2]:
            t.join(DEADLINE * 2)
        # Bob was served while alice's calls were still stuck.
        assert results.get("bob job") == "succeeded" and results.get("bob log") == 200, results
        assert results.get("bob spawn") in (201, 202), results
        bob_done = max(results["bob job done"], results["bob server done"])  # type: ignore[type-var]
        assert get_job(hub, job["id"])["state"] == "running", "alice's job settled before bob was served"
        settled = wait_state(hub, job["id"], FINAL, timeout=DEADLINE * 2)
        settled_at = time.monotonic()
        threads[2].join(DEADLINE * 2)
    finally:
        stopper.close()
        hub.api("DELETE", "/users/bob/servers/meanwhile", data=json.dumps({"remove": True}))
    assert bob_done < settled_at, (
        f"bob was served {bob_done - stuck_since:.1f} s in, alice settled {settled_at - stuck_since:.1f} s in"
    )
    # Alice gets sentences, and her stopped processes were ended at the deadline.
    assert settled["state"] == "failed" and "exit status could not be read" in settled["reason"], settled["reason"]
    assert f"longer than {DEADLINE} s" in settled["reason"], settled["reason"]
    r = results["alice log"]
    assert isinstance(r, requests.Response) and r.status_code == 504 and "may be stopped" in message(r), r
    time.sleep(2)
    assert not [pid for pid, _ in stopper.stopped if alive(pid)], "a stopped mediator outlived its deadline"


# -- MEDIUM -------------------------------------------------------------------------------------

#: What alice leaves where her jobs' exit statuses go: (label, kind, content).
BAD_STATUS = [
    ("not JSON", "bytes", b"{not json"),
    ("nested 60 000 deep", "bytes", b"[" * 60_000),
    ("wrong types", "bytes", b'{"returncode": "0", "error": ["x"]}'),
    ("an error that is an object", "bytes", b'{"returncode": 1, "error": {"a": 1}}'),
    ("binary", "bytes", bytes(range(256)) * 4),
    ("sparse, 1 TiB", "sparse", b""),
    ("a FIFO", "fifo", b""),
    ("a symlink to /etc/shadow", "symlink", b"/etc/shadow"),
]
PLANT = r"""
import os, sys
kind, data = sys.argv[1], bytes.fromhex(sys.argv[2])
for i, path in enumerate(sys.argv[3:]):
    in_home = i == 0
    if not in_home and not os.path.isfile(path):
        continue  # a shared folder: alice can only change a file that is hers there
    if in_home:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        if os.path.lexists(path):
            os.unlink(path)
    if kind == "bytes":
        with open(path, "wb") as f:
            f.write(data)
    elif kind == "sparse":
        with open(path, "ab") as f:
            f.truncate(1 << 40)
    elif in_home and kind == "fifo":
        os.mkfifo(path)
    elif in_home and kind == "symlink":
        os.symlink(data.decode(), path)
"""


@pytest.mark.parametrize("mode", MODES)
def test_medium_any_exit_status_content_leaves_recovery_of_others_whole(request, mode):
    """While the hub is down, alice's runners die and she leaves every kind of exit-status file;
    bob's jobs (one on the GPU) end normally. After the restart each job is settled on its own."""
    w = world(request, mode)
    hub, alice = w.hub, w.accounts["alice"]
    hers = [
        w.job("alice", "running", parameters={"sleep_seconds": 300}, name=f"bad-{i}") for i in range(len(BAD_STATUS))
    ]
    his = [w.job("bob", "running", parameters={"sleep_seconds": 4}, profile=p) for p in ("cpu", "h100-1")]
    runners = {j["id"]: job_pid(hub, j["id"]) for j in hers + his}
    hub.stop()
    try:
        for job in hers:
            kill_and_reap_group(runners[job["id"]])
        deadline = time.monotonic() + 60
        while any(alive(runners[j["id"]]) for j in his) and time.monotonic() < deadline:
            time.sleep(0.2)
        for job, (_, kind, data) in zip(hers, BAD_STATUS, strict=True):
            run_as_user(alice, PLANT, kind, data.hex(), *map(str, w.status_files(job)))
    finally:
        hub.start()
    settled = {j["id"]: wait_state(hub, j["id"], FINAL, timeout=60) for j in hers + his}
    for job, (label, _, _) in zip(hers, BAD_STATUS, strict=True):
        got = settled[job["id"]]
        assert got["state"] == "failed" and got["reason"].strip() and "Traceback" not in got["reason"], (label, got)
    assert [settled[j["id"]]["state"] for j in his] == ["succeeded", "succeeded"]
    # Nothing is still held, and the GPU bob's job had is free again (not handed out twice).
    deadline = time.monotonic() + 30
    while [h for h in hub.holdings() if h["key"].startswith("job:")] and time.monotonic() < deadline:
        time.sleep(0.3)
    assert not [h for h in hub.holdings() if h["key"].startswith("job:")], hub.holdings()
    assert w.job("bob", profile="h100-1")["state"] == "succeeded"


#: Alice puts symlinks where folders of hers may be made (``argv[2:]``), to ``argv[1]``.
PLANT_LINKS = r"""
import os, sys
for path in sys.argv[2:]:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    os.symlink(sys.argv[1], path)
"""


def next_checkpoint_paths(hub: RunningHub, name: str, seconds: int = 8) -> list[str]:
    """Where the checkpoint folder of alice's next job named ``name`` will be, for each second it
    may be submitted in: ``exp/runs/<name>-<UTC stamp>-<next id>.checkpoints`` (docs/jobs.md).
    Nothing else submits jobs in this module meanwhile, so the next id is the largest plus one."""
    ids = [j["id"] for j in hub.api("GET", "/gpulab/jobs").json()["jobs"]]
    now = datetime.now(timezone.utc)
    stamps = [(now + timedelta(seconds=s)).strftime("%Y%m%d-%H%M%S") for s in range(-1, seconds)]
    return [f"exp/runs/{name}-{stamp}-{max(ids, default=0) + 1}.checkpoints" for stamp in stamps]


@pytest.mark.parametrize("mode", MODES)
def test_medium_a_symlink_for_the_checkpoint_folder_touches_nothing_outside_the_home(request, mode, tmp_path):
    """Alice puts symlinks where her next job's checkpoint folder will be: to a folder of hers
    outside her home, then (a second job) to a root-only folder. Neither the hub nor her runner
    follows them: each job fails saying so, and nothing appears in either folder."""
    w = world(request, mode)
    hub, alice = w.hub, w.accounts["alice"]
    hers_outside = Path("/var/tmp") / f"gpulab-redteam-{secrets.token_hex(4)}"
    hers_outside.mkdir(mode=0o700)
    os.chown(hers_outside, alice.uid, alice.gid)
    roots = tmp_path / "root-only"
    roots.mkdir(mode=0o755)
    try:
        for target in (hers_outside, roots):
            name = f"planted-{secrets.token_hex(3)}"
            run_as_user(
                alice, PLANT_LINKS, str(target), *(str(alice.home / p) for p in next_checkpoint_paths(hub, name))
            )
            job = submit(hub, w.tokens["alice"], notebook="exp/calc.ipynb", job_class="batch", profile="cpu", name=name)
            assert (alice.home / job["checkpoint_path"]).is_symlink(), "the planted link missed the job's folder"
            done = wait_state(hub, job["id"], FINAL, timeout=60, token=w.tokens["alice"])
            assert done["state"] == "failed", done
            assert "symlink" in done["reason"] or "not inside the home" in done["reason"], done["reason"]
            assert (alice.home / job["checkpoint_path"]).is_symlink()
        assert list(hers_outside.iterdir()) == [] and list(roots.iterdir()) == []
    finally:
        shutil.rmtree(hers_outside, ignore_errors=True)


# -- LOW ----------------------------------------------------------------------------------------

#: A process made to look like a job runner to anyone who reads only its command line.
LOOKALIKE = [sys.executable, "-c", "import time; time.sleep(600)", "hub_config.jobs.runner", "--status"]


@pytest.mark.parametrize("mode", MODES)
def test_low_reused_pid_of_a_job_runner_is_not_taken_for_it(request, mode):
    """While the hub is down alice's runner dies and its pid goes to a process of bob's that looks like
    a runner. After the restart alice's job is finished (its runner is gone) and bob's process untouched.
    (When another task of the busy machine takes the dead runner's pid first, the case is set up
    again with a new job: that pid can no longer be given to bob.)"""
    w = world(request, mode)
    hub, bob = w.hub, w.accounts["bob"]
    for attempt in range(3):
        job = w.job("alice", "running", parameters={"sleep_seconds": 300})
        pid = job_pid(hub, job["id"])
        hub.stop()
        try:
            kill_and_reap_group(pid)
            decoy = spawn_with_pid(pid, bob, LOOKALIKE + list(map(str, w.status_files(job))))
        except PidHeld:
            if attempt == 2:
                raise
            continue
        finally:
            hub.start()
        break
    try:
        done = wait_state(hub, job["id"], FINAL, timeout=30)
        assert done["state"] == "failed" and "process was gone" in done["reason"], done
        assert hub.api("POST", f"/gpulab/jobs/{job['id']}/cancel", token=w.tokens["alice"]).status_code == 409
        time.sleep(1)
        assert decoy.poll() is None, "the hub signalled bob's process for alice's job"
    finally:
        decoy.kill()
        decoy.wait()


@pytest.mark.parametrize("mode", MODES)
def test_low_reused_pid_of_a_server_is_not_taken_for_it(request, mode):
    """While the hub is down bob's server dies and its pid goes to a process of alice's. The restarted
    hub does not count bob's server alive, and stopping it signals nothing of alice's. (When another
    task of the busy machine takes the dead server's pid first, bob's server is started again and
    the case set up anew.)"""
    w = world(request, mode)
    hub, alice = w.hub, w.accounts["alice"]
    for attempt in range(3):
        if attempt:  # bob's server died in the last attempt: start another one
            hub.wait_server("bob", ready=False, timeout=60)
            r = hub.api("POST", "/users/bob/server", data=json.dumps({"profile": "cpu", "team": "vision"}))
            assert r.status_code in (201, 202), r.text
            hub.wait_server("bob")
        pid = hub.api("GET", "/users/bob").json()["servers"][""]["state"]["pid"]
        hub.stop()
        try:
            kill_and_reap_group(pid)
            decoy = spawn_with_pid(pid, alice, [sys.executable, "-c", "import time; time.sleep(600)"])
        except PidHeld:
            if attempt == 2:
                raise
            continue
        finally:
            hub.start()
        break
    try:
        hub.wait_server("bob", ready=False, timeout=60)  # polled, found gone
        r = hub.api("DELETE", "/users/bob/server")
        assert r.status_code in (204, 400, 404), r.text  # nothing left to stop
        time.sleep(1)
        assert decoy.poll() is None, "the hub signalled alice's process as bob's server"
    finally:
        decoy.kill()
        decoy.wait()
        _worlds.pop(mode, None)  # bob's server is gone: a later test starts a fresh world


def test_low_two_hubs_on_one_account_prefix_are_refused(request, tmp_path):
    """A second hub (its own data folder) configured with the first one's account prefix: alice's
    account and home are the first hub's, so the second refuses to run her (root mode; sudo mode
    claims homes through the same mediator)."""
    w = world(request, "root")
    first = w.hub
    second = RunningHub(tmp_path / "second", CATALOG, env={"GPULAB_ACCOUNT_PREFIX": first.account_prefix})
    second.start()
    try:
        spawn_refused(second, "alice", f"system account {first.account_prefix}alice belongs to another gpulab hub")
    finally:
        second.close()
    marker = (w.accounts["alice"].home / ".gpulab" / "hub").read_text().strip()
    assert marker == str(first.data_dir.resolve()), marker


@pytest.mark.parametrize("mode", MODES)
def test_low_status_files_show_no_one_else_owners_or_outcomes(request, mode):
    """Bob, as his account, tries to see who ran alice's job and how it ended, wherever a status file can be."""
    w = world(request, mode)
    job = w.job("alice")
    probe = r"""
import json, os, sys
seen = {}
for path in sys.argv[1:]:
    for what, look in (("stat", os.stat), ("list", lambda p: os.listdir(os.path.dirname(p)))):
        try:
            look(path)
            seen[what + " " + path] = "allowed"
        except (PermissionError, FileNotFoundError) as e:
            seen[what + " " + path] = type(e).__name__
print(json.dumps(seen))
"""
    seen = json.loads(run_as_user(w.accounts["bob"], probe, *map(str, w.status_files(job))))
    assert "allowed" not in seen.values(), seen


def test_low_sudoers_useradd_rule_pins_the_home_to_the_account(request, bed):
    """The hub's account (sudo mode) tries to make an account whose home is bob's."""
    w = world(request, "sudo")
    homes = w.hub.data_dir.resolve() / "homes"
    evil, bobs_home = bed.prefix + "evil", str(homes / (bed.prefix + "bob"))
    attempts = {
        "--home-dir before the shell": [
            "/usr/sbin/useradd", "--create-home", "--home-dir", bobs_home, "--shell", "/bin/bash",
            "--user-group", "--groups", bed.group, "--comment", "gpulab", evil,
        ],
        "--home-dir beside --base-dir": [
            "/usr/sbin/useradd", "--create-home", "--base-dir", str(homes), "--home-dir", bobs_home,
            "--shell", "/bin/bash", "--user-group", "--groups", bed.group, "--comment", "gpulab", evil,
        ],
    }  # fmt: skip
    for what, argv in attempts.items():
        out = as_account(hub_account_of(bed), ["sudo", "-n", *argv])
        assert out.returncode == 1 and "a password is required" in out.stderr, (what, out.stdout, out.stderr)
    assert lookup(evil) is None


def test_low_account_of_uid_0_or_a_system_uid_is_refused(request, tmp_path):
    """Hub users whose accounts (made ahead by an admin, or slipped in) are a uid-0 alias and a system account."""
    w = world(request, "root")
    hub = w.hub
    names = {"zroot": hub.account_prefix + "zroot", "zsys": hub.account_prefix + "zsys"}
    subprocess.run(
        ["useradd", "--non-unique", "--uid", "0", "--gid", "0", "--home-dir", str(tmp_path / "zroot"), names["zroot"]],
        check=True,
        capture_output=True,
    )
    subprocess.run(
        ["useradd", "--system", "--home-dir", str(tmp_path / "zsys"), names["zsys"]], check=True, capture_output=True
    )
    try:
        for user, account in names.items():
            r = hub.api("POST", f"/users/{user}", data="{}")
            assert r.status_code in (201, 409), r.text
            spawn_refused(hub, user, f"hub user {user} maps to system account {account}")
            token = user_token(hub, user)
            r = hub.api(
                "POST",
                "/gpulab/jobs",
                token=token,
                data=json.dumps({"notebook": "calc.ipynb", "job_class": "batch", "profile": "cpu"}),
            )
            assert 400 <= r.status_code < 500, r.text
    finally:
        for account in names.values():
            subprocess.run(["userdel", "--force", account], capture_output=True)


@pytest.mark.parametrize("mode", MODES)
def test_low_huge_log_offset_is_a_clear_400(request, mode):
    w = world(request, mode)
    job = w.job("alice")
    for offset in (10**18 - 1, 10**12):
        r = w.hub.api("GET", f"/gpulab/jobs/{job['id']}/logs", token=w.tokens["alice"], params={"offset": offset})
        assert r.status_code == 400 and "past the end of the log" in message(r), (offset, r.status_code, r.text)


@pytest.mark.parametrize("mode", MODES)
def test_low_deeply_nested_request_to_the_mediator_is_refused_in_words(request, mode):
    """The mediator run as alice, the way the hub runs it (switched to her, or through sudo), given
    JSON nested 100 000 deep."""
    w = world(request, mode)
    alice = w.accounts["alice"]
    if mode == "root":
        out = as_account(alice, [MEDIATOR], stdin="[" * 100_000)
    else:
        out = as_account(
            hub_account_of(request.getfixturevalue("bed")),
            ["sudo", "-n", "-u", alice.name, "--", MEDIATOR],
            "[" * 100_000,
        )
    assert "Traceback" not in out.stderr, out.stderr[-1000:]
    reply = json.loads(out.stdout)
    assert reply["ok"] is False and "not JSON" in reply["error"], reply
