"""Faults on one server, with real processes: the hub killed, the proxy killed, a database
locked by another writer, the data disk full.

The real embedded hub (``configure_embedded``, as ``gpulab up`` runs it, through
tests/support/hub.py) on a declared inventory of six H100s (no driver needed: the
packer places on declared devices exactly as on detected ones), twenty real
JupyterLab servers of ten users and ten real papermill jobs. Each test checks what
the hub says against what runs: the servers and job runners found in /proc with the
GPU shares in their environment (:func:`tests.support.faults.gpu_shares_of_processes`),
the ledger through ``/hub/api/gpulab/me`` and the admin usage API, the packer through
``/hub/api/gpulab/devices``, and every job's outcome and usage interval in gpulab's
database.

Runs as root (these machines and CI do): each user is a real system account. Run it
under ``flock /tmp/gpulab-sudo-tests.lock`` beside other tests that create accounts.
"""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import requests

from tests.support.faults import (
    create_users,
    device_use,
    exclusive_lock,
    fill_disk,
    free_bytes,
    gpu_shares_of_processes,
    kill_hub,
    pids_of,
    proxy_pid,
    root_can_write,
    servers,
    small_filesystem,
    start_servers,
    through_proxy,
    wait_until,
    write_gated_notebook,
)
from tests.support.hub import RunningHub
from tests.support.jobs import FINAL, get_job, kill_job_runners, submit, user_token, wait_state

USERS = [f"u{i:02d}" for i in range(10)]
CATALOG = f"""
inventory:
  - {{model: H100-80GB, count: 6, memory_mib: 81559}}
profiles:
  - {{slug: cpu, display_name: "CPU only", gpus: 0}}
  - {{slug: h100-quarter, display_name: "0.25 × H100", gpus: 0.25, gpu_model: H100-80GB}}
  - {{slug: h100-half, display_name: "0.5 × H100", gpus: 0.5, gpu_model: H100-80GB}}
  - {{slug: h100-1, display_name: "1 × H100", gpus: 1, gpu_model: H100-80GB}}
teams:
  - {{name: vision, users: [{", ".join(USERS[:5])}], guarantee: 12, burst: 12,
     allowed_profiles: [cpu, h100-quarter, h100-half, h100-1]}}
  - {{name: nlp, users: [{", ".join(USERS[5:])}], guarantee: 12, burst: 12,
     allowed_profiles: [cpu, h100-quarter, h100-half, h100-1]}}
"""
EXTRA = """
c.GPULabJobs.poll_interval = 0.3
c.GPULabJobs.stop_grace_seconds = 3
"""
TEAM = {u: "vision" if i < 5 else "nlp" for i, u in enumerate(USERS)}
MILLI = {"cpu": 0, "h100-quarter": 250, "h100-half": 500, "h100-1": 1000}

#: Twenty servers in three waves (each wave started at once): seven quarters on devices 0-1
#: (a quarter of device 1 left), four halves filling devices 2-3, nine CPU-only servers;
#: devices 4 and 5 stay for the jobs.
WAVES = [
    [(u, "", TEAM[u], "h100-quarter") for u in USERS[:7]],
    [(u, "b", TEAM[u], "h100-half") for u in USERS[:4]],
    [(u, "b", TEAM[u], "cpu") for u in USERS[4:]] + [(u, "", TEAM[u], "cpu") for u in USERS[7:]],
]
SERVERS = [spec for wave in WAVES for spec in wave]
#: Started just before the kill, in the last free quarter: its process runs, its spawn
#: has not returned (JupyterLab is still starting) when the hub dies.
SPAWNING = ("u09", "gpu", "nlp", "h100-quarter")
assert len(SERVERS) == 20

#: Wall seconds of each fault, printed at the end of the module for the suite's budget.
TIMINGS: dict[str, float] = {}


def key_of(user: str, name: str) -> str:
    return f"notebook:{user}/{name}"


@pytest.fixture(scope="module")
def hub(tmp_path_factory):
    h = RunningHub(tmp_path_factory.mktemp("faults"), CATALOG, extra_config=EXTRA)
    h.start()
    yield h
    h.stop()
    kill_job_runners(h)
    h.close()
    for what, seconds in TIMINGS.items():
        print(f"\nfault timing: {what}: {seconds:.1f} s")


@pytest.fixture(scope="module")
def tokens(hub):
    create_users(hub, USERS)
    return {u: user_token(hub, u) for u in USERS}


@pytest.fixture(scope="module")
def gates(hub, tokens):
    """Each user's gated notebook, and the folder where the test drops release files."""
    out = {}
    for u in USERS:
        home = hub.home(u)
        hub.give(u, write_gated_notebook(home / "exp" / "gated.ipynb"))
        flags = home / "flags"
        flags.mkdir(exist_ok=True)
        hub.give(u, flags)
        out[u] = flags
    return out


def submit_gated(hub, tokens, gates, user: str, profile: str, name: str, **params) -> dict:
    params.setdefault("release_file", str(gates[user] / name))
    return submit(
        hub,
        tokens[user],
        notebook="exp/gated.ipynb",
        job_class="batch",
        profile=profile,
        parameters=params,
        time_limit_seconds=3600,
        name=name,
    )


def post_cpu_job(hub: RunningHub, token: str):
    """A CPU-only job submission, answered as it is (the tests check refusals with it)."""
    body = {"notebook": "exp/gated.ipynb", "job_class": "batch", "profile": "cpu"}
    return hub.api("POST", "/gpulab/jobs", token=token, data=json.dumps(body))


def release(gates, user: str, name: str) -> None:
    (gates[user] / name).write_text("go")


def ledger(hub: RunningHub) -> dict[str, int]:
    """Every ledger holding, ``key -> milli`` (through the hub API)."""
    return {w["key"]: w["gpu_milli"] for w in hub.holdings()}


def devices(hub: RunningHub) -> dict:
    r = hub.api("GET", "/gpulab/devices")
    assert r.status_code == 200, r.text
    return r.json()


def packer_shares(view: dict) -> dict[str, list[tuple[int, int]]]:
    out: dict[str, list[tuple[int, int]]] = {}
    for d in view["devices"]:
        for h in d["holders"]:
            out.setdefault(h["key"], []).append((d["index"], h["milli"]))
    return {k: sorted(v) for k, v in out.items()}


def sorted_shares(shares: dict[str, list[tuple[int, int]]]) -> dict[str, list[tuple[int, int]]]:
    return {k: sorted(v) for k, v in shares.items()}


def usage_rows(hub: RunningHub, key: str) -> list[tuple[str, str | None]]:
    """gpulab's usage intervals of ``key`` (read-only, as an admin's sqlite3 would)."""
    db = sqlite3.connect(f"file:{hub.state_dir / 'gpulab.sqlite'}?mode=ro", uri=True)
    try:
        return db.execute("select started_at, ended_at from gpulab_usage where key = ? order by id", (key,)).fetchall()
    finally:
        db.close()


def check_consistent(hub: RunningHub, expect_servers: set[tuple[str, str]]) -> dict[str, list[tuple[int, int]]]:
    """The hub's servers, ledger and packer agree with the processes that run; returns their shares."""
    listed = servers(hub)
    assert set(listed) == expect_servers, sorted(set(listed) ^ expect_servers)
    assert all(m["ready"] for m in listed.values()), [k for k, m in listed.items() if not m["ready"]]
    running = sorted_shares(gpu_shares_of_processes(hub))
    view = devices(hub)
    # The packer holds exactly what the processes hold, share for share.
    assert packer_shares(view) == {k: v for k, v in running.items() if v}, (packer_shares(view), running)
    used = device_use(running)
    for d in view["devices"]:
        assert d["used_milli"] == used.get(d["index"], 0) <= 1000, d
    # The ledger holds every live server (CPU-only ones at 0) and every job not yet final.
    jobs = {j["id"]: j for j in hub.api("GET", "/gpulab/jobs").json()["jobs"]}
    want = {key_of(u, n): MILLI[m["user_options"]["profile"]] for (u, n), m in listed.items()}
    want.update({f"job:{i}": j["gpu_milli"] for i, j in jobs.items() if j["state"] not in FINAL})
    assert ledger(hub) == want
    # ... and the admin usage report's "now" says the same per team.
    now = {t["team"]: t["held_milli"] for t in hub.api("GET", "/gpulab/usage").json()["now"]}
    per_team: dict[str, int] = {}
    for w in hub.holdings():
        per_team[w["team"]] = per_team.get(w["team"], 0) + w["gpu_milli"]
    assert {t: now.get(t, 0) for t in per_team} == per_team
    return running


# -- the hub killed ----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def live(hub, tokens, gates):
    """Twenty servers and ten jobs (running, queued, about to finish), all live."""
    seconds = [start_servers(hub, wave) for wave in WAVES]
    TIMINGS["20 servers started (3 concurrent waves)"] = sum(seconds)
    jobs = {
        # Devices 4 and 5 for two whole-GPU jobs; the one on 5 is released at the kill.
        "long": submit_gated(hub, tokens, gates, "u00", "h100-1", "long"),
        "finisher": submit_gated(hub, tokens, gates, "u01", "h100-1", "finisher", fail="planned failure at the kill"),
    }
    wait_state(hub, jobs["long"]["id"], "running")
    wait_state(hub, jobs["finisher"]["id"], "running")
    # No device left for these: they wait, holding their quota.
    for user, profile, name in (
        ("u02", "h100-1", "queued-1"),
        ("u03", "h100-1", "queued-2"),
        ("u04", "h100-1", "queued-3"),
        ("u05", "h100-1", "queued-4"),
        ("u09", "h100-1", "queued-5"),
    ):
        jobs[name] = submit_gated(hub, tokens, gates, user, profile, name)
    jobs["cpu-long"] = submit_gated(hub, tokens, gates, "u06", "cpu", "cpu-long")
    jobs["cpu-finisher"] = submit_gated(hub, tokens, gates, "u07", "cpu", "cpu-finisher")
    jobs["cpu-killed"] = submit_gated(hub, tokens, gates, "u08", "cpu", "cpu-killed")
    for name in ("cpu-long", "cpu-finisher", "cpu-killed"):
        wait_state(hub, jobs[name]["id"], "running")
    for name in ("queued-1", "queued-2", "queued-3", "queued-4", "queued-5"):
        assert get_job(hub, jobs[name]["id"])["state"] == "queued"
    assert len(jobs) == 10
    check_consistent(hub, {(u, n) for u, n, _, _ in SERVERS})
    return {k: v["id"] for k, v in jobs.items()}


def test_hub_killed_then_restarted_readopts_or_releases_everything(hub, tokens, gates, live):
    """SIGKILL the hub with 20 servers and 10 jobs live and one server still starting; while
    it is down, one job finishes with a failure, one succeeds, one runner and two servers are
    killed; restart it. Everything that runs is re-adopted, everything that ended is released
    once, every job's outcome is recorded once."""
    jobs = live
    user, name, team, profile = SPAWNING
    spawn = threading.Thread(
        target=hub.api,
        args=("POST", f"/users/{user}/servers/{name}"),
        kwargs={"data": json.dumps({"team": team, "profile": profile})},
    )
    spawn.start()
    wait_until(lambda: pids_of(hub, key_of(user, name)), 30, "the last server's process")
    assert not servers(hub).get((user, name), {}).get("ready")
    running_before = gpu_shares_of_processes(hub)
    t0 = time.monotonic()
    # The finishers are released at the moment of the kill: they end while the hub is down.
    release(gates, "u01", "finisher")
    release(gates, "u07", "cpu-finisher")
    kill_hub(hub)
    spawn.join(35)
    gone_servers = {("u01", ""), ("u08", "")}  # a quarter-GPU server and a CPU-only one
    for u, n in gone_servers:
        for pid in pids_of(hub, key_of(u, n)):
            os.kill(pid, signal.SIGKILL)
    for pid in pids_of(hub, f"job:{jobs['cpu-killed']}"):
        os.kill(pid, signal.SIGKILL)
    for job in ("finisher", "cpu-finisher"):
        key = f"job:{jobs[job]}"
        wait_until(lambda k=key: not pids_of(hub, k), 60, f"job {job} ended while the hub was down")
    wait_until(lambda: all(not pids_of(hub, key_of(u, n)) for u, n in gone_servers), 20, "servers killed")
    t_restart = time.monotonic()
    hub.start()
    TIMINGS["hub restart after SIGKILL (start() to API up)"] = time.monotonic() - t_restart

    # The server that was starting is adopted too: its process runs and holds its quarter.
    expect = {(u, n) for u, n, _, _ in SERVERS} - gone_servers | {(user, name)}
    wait_until(lambda: set(servers(hub)) == expect, 90, "the hub's server list after the restart")
    wait_until(lambda: all(m["ready"] for m in servers(hub).values()), 90, "every listed server ready")
    for u, n in sorted(expect):
        assert through_proxy(hub, u, n, tokens[u]) == 200, (u, n)
    # Every job's outcome, exactly once: the finisher's real failure, the CPU finisher's
    # success, the killed runner failed with the reason, the rest as they were.
    finisher = wait_state(hub, jobs["finisher"], FINAL, timeout=30)
    assert finisher["state"] == "failed" and "planned failure at the kill" in finisher["reason"], finisher
    assert wait_state(hub, jobs["cpu-finisher"], FINAL, timeout=30)["state"] == "succeeded"
    killed = wait_state(hub, jobs["cpu-killed"], FINAL, timeout=30)
    assert killed["state"] == "failed" and "gone when the hub restarted" in killed["reason"], killed
    for job in ("finisher", "cpu-finisher", "cpu-killed"):
        history = [h["state"] for h in get_job(hub, jobs[job])["history"]]
        assert history == ["queued", "running", history[-1]] and history[-1] in FINAL, (job, history)
        assert all(end is not None for _, end in usage_rows(hub, f"job:{jobs[job]}"))
    assert len(usage_rows(hub, f"job:{jobs['finisher']}")) == 1
    for job in ("long", "cpu-long"):
        record = get_job(hub, jobs[job])
        assert record["state"] == "running" and [h["state"] for h in record["history"]] == ["queued", "running"]
    # The finisher's device went to the oldest queued job, which started once, after the restart.
    started = wait_state(hub, jobs["queued-1"], "running", timeout=60)
    assert [h["state"] for h in started["history"]] == ["queued", "running"], started
    for job in ("queued-2", "queued-3", "queued-4", "queued-5"):
        assert get_job(hub, jobs[job])["state"] == "queued"
    running = check_consistent(hub, expect)
    # The re-adopted servers hold the devices they held before the kill.
    for u, n in expect:
        k = key_of(u, n)
        assert running.get(k, []) == sorted(running_before.get(k, [])), k
    # Released exactly once: each dead server's usage interval is closed, once; each
    # re-adopted GPU server still has its one open interval (not a second one).
    for u, n in gone_servers:
        assert all(end is not None for _, end in usage_rows(hub, key_of(u, n)))
    assert len(usage_rows(hub, key_of("u01", ""))) == 1
    for u, n in expect:
        if running.get(key_of(u, n)):
            rows = usage_rows(hub, key_of(u, n))
            assert len(rows) == 1 and rows[0][1] is None, (u, n, rows)
    TIMINGS["hub SIGKILL fault (kill to all checks done)"] = time.monotonic() - t0


def test_no_gpu_is_handed_out_twice_after_the_restart(hub, tokens, gates, live):
    """After the restart the only free share is the dead server's quarter: a new quarter
    server lands exactly there, the next is refused. Stopping a re-adopted half-GPU server
    frees its half, once, and a new server lands in it and nowhere else."""
    expect = {(u, n) for u, n, _, _ in SERVERS} - {("u01", ""), ("u08", "")} | {SPAWNING[:2]}
    free = [d for d in devices(hub)["devices"] if d["free_milli"]]
    assert [d["free_milli"] for d in free] == [250], free
    start_servers(hub, [("u01", "", "vision", "h100-quarter")])
    expect |= {("u01", "")}
    running = check_consistent(hub, expect)
    assert running[key_of("u01", "")] == [(free[0]["index"], 250)]
    r = hub.api("POST", "/users/u08/server", data=json.dumps({"team": "nlp", "profile": "h100-quarter"}))
    assert r.status_code == 409, (r.status_code, r.text)
    assert "0.25 × H100" in r.json()["message"], r.text
    hub.wait_server("u08", "", ready=False)
    r = hub.api("DELETE", "/users/u00/servers/b")
    assert r.status_code in (202, 204), r.text
    hub.wait_server("u00", "b", ready=False)
    expect -= {("u00", "b")}
    freed = [d for d in devices(hub)["devices"] if d["free_milli"]]
    assert [d["free_milli"] for d in freed] == [500], freed
    rows = usage_rows(hub, key_of("u00", "b"))
    assert len(rows) == 1 and rows[0][1] is not None, rows
    start_servers(hub, [("u08", "", "nlp", "h100-quarter")])
    expect |= {("u08", "")}
    running = check_consistent(hub, expect)
    assert running[key_of("u08", "")] == [(freed[0]["index"], 250)]
    assert all(used <= 1000 for used in device_use(running).values())


# -- the proxy killed ----------------------------------------------------------------------------


def proxy_routes(hub: RunningHub) -> set[str]:
    """The routes configurable-http-proxy holds (asked on its API with its own token)."""
    env = dict(
        item.split("=", 1)
        for item in Path(f"/proc/{proxy_pid(hub)}/environ").read_bytes().decode().split("\0")
        if "=" in item
    )
    r = requests.get(
        f"http://127.0.0.1:{hub.api_port}/api/routes",
        headers={"Authorization": f"token {env['CONFIGPROXY_AUTH_TOKEN']}"},
        timeout=10,
    )
    r.raise_for_status()
    return set(r.json())


def routes_now(hub: RunningHub) -> set[str] | None:
    """:func:`proxy_routes`, or ``None`` while the proxy does not answer yet."""
    try:
        return proxy_routes(hub)
    except (OSError, KeyError, requests.RequestException):
        return None


def test_proxy_killed_is_restarted_by_the_hub_with_every_route(hub, tokens, live):
    """SIGKILL configurable-http-proxy: JupyterHub's proxy check (every
    ``ConfigurableHTTPProxy.check_running_interval`` seconds) starts a new one and restores
    the routes; every server answers through it again, and nothing was lost meanwhile."""
    expect = set(servers(hub))
    assert len(expect) == 20
    held, placed = ledger(hub), packer_shares(devices(hub))
    routes = proxy_routes(hub)
    assert routes == {"/"} | {f"/user/{u}/{n}" if n else f"/user/{u}" for u, n in expect}  # as CHP keys them
    old = proxy_pid(hub)
    t0 = time.monotonic()
    os.kill(old, signal.SIGKILL)
    wait_until(lambda: proxy_pid(hub) not in (None, old), 60, "a new proxy started by the hub")
    wait_until(lambda: routes_now(hub) == routes, 60, "the routes restored")
    for user, name in sorted(expect):
        wait_until(lambda u=user, n=name: through_proxy(hub, u, n, tokens[u]) == 200, 30, f"{user}/{name} answers")
    TIMINGS["proxy SIGKILL fault (kill to every server answering)"] = time.monotonic() - t0
    assert ledger(hub) == held and packer_shares(devices(hub)) == placed
    check_consistent(hub, expect)


# -- a database locked by another writer ----------------------------------------------------------


def timed(fn) -> dict:
    t0 = time.monotonic()
    try:
        r = fn()
        body = r.text
        try:
            parsed = r.json()
        except ValueError:
            parsed = None
        return {"status": r.status_code, "body": body[:2000], "json": parsed, "seconds": time.monotonic() - t0}
    except Exception as e:  # a timeout or a refused connection is an outcome too
        return {"status": None, "body": repr(e), "json": None, "seconds": time.monotonic() - t0}


@pytest.mark.parametrize("database", ["jupyterhub.sqlite", "gpulab.sqlite"])
def test_database_locked_by_another_writer_for_ten_seconds(hub, tokens, gates, live, database):
    """Another process holds ``BEGIN EXCLUSIVE`` on one of the hub's two databases for 10 s
    while users list, submit, spawn and use their servers: each request waits or fails with
    a sentence (never a 500), nothing is half-written, and all works once the lock is gone."""
    tag = database.split(".")[0]
    server = ("u05", f"lock-{tag}")
    job_name = f"during-{tag}-lock"
    probes = {
        "list users": lambda: hub.api("GET", "/users"),
        "my quota": lambda: hub.api("GET", "/gpulab/me", token=tokens["u02"]),
        "list jobs": lambda: hub.api("GET", "/gpulab/jobs", token=tokens["u03"]),
        "submit a job": lambda: hub.api(
            "POST",
            "/gpulab/jobs",
            token=tokens["u04"],
            data=json.dumps(
                {
                    "notebook": "exp/gated.ipynb",
                    "job_class": "batch",
                    "profile": "cpu",
                    "name": job_name,
                    "parameters": {"release_file": str(gates["u04"] / job_name)},
                }
            ),
        ),
        "start a server": lambda: hub.api(
            "POST", f"/users/{server[0]}/servers/{server[1]}", data=json.dumps({"team": "nlp", "profile": "cpu"})
        ),
        "use a server": lambda: requests.get(
            hub.url + "/user/u06/api/status", headers={"Authorization": f"token {tokens['u06']}"}, timeout=30
        ),
    }
    t0 = time.monotonic()
    with exclusive_lock(hub.state_dir / database, 10), ThreadPoolExecutor(len(probes)) as pool:
        time.sleep(0.5)
        futures = {name: pool.submit(timed, fn) for name, fn in probes.items()}
        outcomes = {name: f.result() for name, f in futures.items()}
    TIMINGS[f"{database} locked 10 s (lock to every request answered)"] = time.monotonic() - t0
    expected = {"list users": 200, "my quota": 200, "list jobs": 200, "submit a job": 201, "use a server": 200}
    for name, status in expected.items():
        assert outcomes[name]["status"] == status, (name, outcomes[name])
    assert outcomes["start a server"]["status"] in (201, 202), outcomes["start a server"]
    # Writers waited for the lock (readers of gpulab's WAL database need not).
    assert outcomes["submit a job"]["seconds"] > 5 and outcomes["start a server"]["seconds"] > 5, outcomes
    # Nothing half-written: the job is recorded once, with its ledger hold, and runs once;
    # the server runs, counted.
    job = outcomes["submit a job"]["json"]
    assert [j["id"] for j in hub.api("GET", "/gpulab/jobs").json()["jobs"] if j["name"] == job_name] == [job["id"]]
    wait_state(hub, job["id"], "running")
    assert len(pids_of(hub, f"job:{job['id']}")) >= 1
    hub.wait_server(*server)
    expect = set(servers(hub))
    assert server in expect
    check_consistent(hub, expect)
    # ... and all works on: the job finishes, the server stops, both are released.
    release(gates, "u04", job_name)
    done = wait_state(hub, job["id"], FINAL)
    assert done["state"] == "succeeded" and [h["state"] for h in done["history"]] == ["queued", "running", "succeeded"]
    assert hub.api("DELETE", f"/users/{server[0]}/servers/{server[1]}").status_code in (202, 204)
    hub.wait_server(*server, ready=False)
    check_consistent(hub, expect - {server})


# -- a lock held past the wait, and a full data disk: a second, smaller hub ---------------------

DISK_USERS = ["d0", "d1"]
DISK_CATALOG = """
inventory:
  - {model: H100-80GB, count: 2, memory_mib: 81559}
profiles:
  - {slug: cpu, display_name: "CPU only", gpus: 0}
  - {slug: h100-quarter, display_name: "0.25 × H100", gpus: 0.25, gpu_model: H100-80GB}
  - {slug: h100-1, display_name: "1 × H100", gpus: 1, gpu_model: H100-80GB}
teams:
  - {name: lab, users: [d0, d1], guarantee: 4, burst: 4, allowed_profiles: [cpu, h100-quarter, h100-1]}
"""
#: The data disk (ext4, 10 % of it reserved for root as on any ext4 disk): small enough to
#: fill in a moment; the hub refuses new work below 4 MiB free for users.
DISK_MIB = 64
DISK_EXTRA = EXTRA + "c.GPULab.min_free_disk_mib = 4\n"


@pytest.fixture(scope="module")
def disk_hub(tmp_path_factory):
    """A hub whose whole data folder (databases, job status files, homes) is a 64 MiB ext4
    disk, and whose databases wait only 3 s for a lock (``GPULAB_DB_BUSY_TIMEOUT``)."""
    workdir = tmp_path_factory.mktemp("faults-disk")
    with small_filesystem(DISK_MIB) as disk:
        (workdir / "data").symlink_to(disk)
        h = RunningHub(workdir, DISK_CATALOG, extra_config=DISK_EXTRA, env={"GPULAB_DB_BUSY_TIMEOUT": "3"})
        h.start()
        try:
            create_users(h, DISK_USERS)
            h.tokens = {u: user_token(h, u) for u in DISK_USERS}
            h.gates = {}
            for u in DISK_USERS:
                h.give(u, write_gated_notebook(h.home(u) / "exp" / "gated.ipynb"))
                flags = h.home(u) / "flags"
                flags.mkdir(exist_ok=True)
                h.give(u, flags)
                h.gates[u] = flags
            yield h
        finally:
            h.stop()
            kill_job_runners(h)
            h.close()


def test_gpulab_database_locked_past_the_wait_answers_503_and_writes_nothing_half(disk_hub):
    """gpulab's database locked for 15 s, five times longer than this hub waits: a submission
    is refused with a 503 that says so, and is not recorded; a job that finishes meanwhile
    keeps its devices until its outcome is written (once), and the job queued behind it
    then starts once."""
    hub, tokens, gates = disk_hub, disk_hub.tokens, disk_hub.gates
    running = submit_gated(hub, tokens, gates, "d1", "h100-1", "ends-in-lock")
    wait_state(hub, running["id"], "running")
    other = submit_gated(hub, tokens, gates, "d0", "h100-1", "other-gpu")
    wait_state(hub, other["id"], "running")
    behind = submit_gated(hub, tokens, gates, "d0", "h100-1", "behind")
    assert get_job(hub, behind["id"])["state"] == "queued"
    before = {j["id"] for j in hub.api("GET", "/gpulab/jobs").json()["jobs"]}
    t0 = time.monotonic()
    with exclusive_lock(hub.state_dir / "gpulab.sqlite", 15) as lock:
        r = post_cpu_job(hub, tokens["d0"])
        assert r.status_code == 503, r.text
        message = r.json()["message"]
        assert "gpulab's database" in message and "gpulab.sqlite" in message and "locked" in message, message
        assert "not carried out" in message and r.headers.get("Retry-After")
        release(gates, "d1", "ends-in-lock")
        wait_until(lambda: not pids_of(hub, f"job:{running['id']}"), 30, "the job ended during the lock")
        # The ended job's devices stay held while its outcome cannot be written.
        assert not pids_of(hub, f"job:{behind['id']}")
        assert lock.poll() is None, "the lock ended before the checks: the machine is too slow for this test"
    TIMINGS["gpulab.sqlite locked past the 3 s wait (15 s lock)"] = time.monotonic() - t0
    done = wait_state(hub, running["id"], FINAL, timeout=30)
    assert [h["state"] for h in done["history"]] == ["queued", "running", "succeeded"], done
    started = wait_state(hub, behind["id"], "running", timeout=30)
    assert [h["state"] for h in started["history"]] == ["queued", "running"], started
    wait_until(lambda: len({p for p in pids_of(hub, f"job:{behind['id']}")}) >= 1, 20, "the queued job's runner")
    assert {j["id"] for j in hub.api("GET", "/gpulab/jobs").json()["jobs"]} == before  # nothing added
    assert ledger(hub) == {f"job:{other['id']}": 1000, f"job:{behind['id']}": 1000}
    for job in (other, behind):
        hub.api("POST", f"/gpulab/jobs/{job['id']}/cancel", token=tokens["d0"])
        wait_state(hub, job["id"], "cancelled")
    wait_until(lambda: ledger(hub) == {}, 20, "every job released")


def test_hub_database_locked_past_the_wait_gpulab_answers_503(disk_hub):
    """The hub's own database locked past the wait: gpulab's API cannot look up the caller and
    says so with a 503, rather than "invalid credentials"; all works again after."""
    hub, tokens = disk_hub, disk_hub.tokens
    with exclusive_lock(hub.state_dir / "jupyterhub.sqlite", 8):
        r = hub.api("GET", "/gpulab/me", token=tokens["d0"])
    assert r.status_code == 503, r.text
    message = r.json()["message"]
    assert "cannot tell who is asking" in message and "jupyterhub.sqlite" in message and "locked" in message
    assert hub.api("GET", "/gpulab/me", token=tokens["d0"]).status_code == 200


def refused_for_disk(r, status: int = 507) -> str:
    """The sentence of a refusal for a full disk (JSON or the spawn page); fails otherwise."""
    import html

    assert r.status_code == status, (r.status_code, r.text[-2000:])
    text = r.json()["message"] if "json" in r.headers.get("Content-Type", "") else html.unescape(r.text)
    assert "is full" in text, text[-2000:]
    return text


def test_data_disk_full_refuses_new_work_with_a_sentence_and_leaves_running_work(disk_hub):
    """A user's process fills the data disk (what users may write of it, as a runaway job
    would): new servers (form and REST) and job submissions are refused with a sentence that
    names the full disk and where it is; the running server and job go on; once space is
    freed, new work starts and the running job's outcome is recorded once."""
    hub, tokens, gates = disk_hub, disk_hub.tokens, disk_hub.gates
    start_servers(hub, [("d0", "", "lab", "h100-quarter")])
    job = submit_gated(hub, tokens, gates, "d1", "cpu", "through-full-disk")
    ends = submit_gated(hub, tokens, gates, "d0", "cpu", "ends-on-full-disk")
    # Their kernels run the gated cell (a job still starting would write its runtime files
    # to the full disk and fail: the user's job, not the hub, would be the one writing).
    for user, record in (("d1", job), ("d0", ends)):
        wait_state(hub, record["id"], "running")
        log = hub.home(user) / get_job(hub, record["id"])["log_path"]
        wait_until(lambda p=log: p.exists() and "Executing Cell 3" in p.read_text(errors="replace"), 60, "gated")
    d1 = hub.login("d1")
    held, placed = ledger(hub), packer_shares(devices(hub))
    jobs_before = hub.api("GET", "/gpulab/jobs").json()["jobs"]
    disk = hub.data_dir.resolve()
    t0 = time.monotonic()
    filler = fill_disk(hub.home("d1") / "big.bin", hub.account("d1"))
    assert free_bytes(disk) < 64 << 10 < free_bytes(disk, for_root=True)  # full for users, not for root
    where = str(disk / "hub")
    r = post_cpu_job(hub, tokens["d1"])
    assert where in refused_for_disk(r)
    r = hub.api("POST", "/users/d1/server", data=json.dumps({"team": "lab", "profile": "h100-quarter"}))
    assert where in refused_for_disk(r)
    hub.wait_server("d1", "", ready=False)
    r = hub.post_spawn(d1, "d1", {"choice": "lab:h100-quarter"}, server_name="form")
    assert where in refused_for_disk(r)
    # A job that ends now gets its outcome recorded, once (its few writes reuse its own
    # blocks here, so it succeeds; a job that needs more space fails with papermill's error).
    release(gates, "d0", "ends-on-full-disk")
    ended = wait_state(hub, ends["id"], FINAL, timeout=60)
    assert [h["state"] for h in ended["history"]] == ["queued", "running", ended["state"]], ended
    # Running work goes on: the server answers, the job runs; nothing was added or taken.
    assert through_proxy(hub, "d0", "", tokens["d0"]) == 200
    assert pids_of(hub, f"job:{job['id']}") and get_job(hub, job["id"])["state"] == "running"
    assert set(servers(hub)) == {("d0", "")}
    assert ledger(hub) == {k: v for k, v in held.items() if k != f"job:{ends['id']}"}
    assert packer_shares(devices(hub)) == placed
    assert [j["id"] for j in hub.api("GET", "/gpulab/jobs").json()["jobs"]] == [j["id"] for j in jobs_before]
    # Space freed: new work starts, the running job ends normally, recorded once.
    filler.unlink()
    TIMINGS["data disk full for users (fill to freed)"] = time.monotonic() - t0
    again = submit_gated(hub, tokens, gates, "d1", "cpu", "after-full-disk")
    start_servers(hub, [("d1", "", "lab", "h100-quarter")])
    for name, record in (("through-full-disk", job), ("after-full-disk", again)):
        release(gates, "d1", name)
        done = wait_state(hub, record["id"], FINAL)
        assert [h["state"] for h in done["history"]] == ["queued", "running", "succeeded"], done
    check_consistent(hub, {("d0", ""), ("d1", "")})


def test_data_disk_full_to_the_last_byte_gpulab_answers_with_sentences(disk_hub):
    """Root fills the rest (the blocks reserved for root too). New work is still refused with
    the sentence; gpulab's reads answer; a write to gpulab's database either fits in the
    space its write-ahead log already holds (SQLite reuses it) and is applied, or is refused
    with a sentence (507, the file named) and changes nothing, never a 500. After the space
    is freed, all works. (JupyterHub's own pages and API fail on their own writes then:
    docs/single-server.md says to keep the hub's databases where users cannot fill them.)"""
    hub, tokens = disk_hub, disk_hub.tokens
    disk = hub.data_dir.resolve()
    t0 = time.monotonic()
    filler = fill_disk(disk / "hub" / "filler.bin")
    try:
        assert not root_can_write(disk / "hub")
        r = post_cpu_job(hub, tokens["d1"])
        assert str(disk / "hub") in refused_for_disk(r)
        assert hub.api("GET", "/gpulab/devices").status_code == 200
        assert hub.api("GET", "/gpulab/me", params={"user": "d0"}).status_code == 200
        # An admin's catalog edit writes gpulab's database itself.
        r = hub.api("PATCH", "/gpulab/teams/lab", data=json.dumps({"guarantee": 3}))
        if r.status_code == 200:
            assert hub.api("GET", "/gpulab/teams/lab").json()["guarantee_milli"] == 3000
        else:
            text = refused_for_disk(r)
            assert "gpulab.sqlite" in text and "not carried out" in text, text
            assert hub.api("GET", "/gpulab/teams/lab").json()["guarantee_milli"] == 4000
    finally:
        filler.unlink()
    TIMINGS["data disk full to the last byte (fill to freed)"] = time.monotonic() - t0
    r = hub.api("PATCH", "/gpulab/teams/lab", data=json.dumps({"guarantee": 2}))
    assert r.status_code == 200, r.text
    assert hub.api("GET", "/gpulab/teams/lab").json()["guarantee_milli"] == 2000
    job = submit_gated(hub, tokens, hub.gates, "d1", "cpu", "after-the-last-byte")
    release(hub.gates, "d1", "after-the-last-byte")
    assert wait_state(hub, job["id"], FINAL)["state"] == "succeeded"
