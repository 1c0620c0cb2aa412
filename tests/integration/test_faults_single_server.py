"""Faults on one server, with real processes: the hub killed, the proxy killed, a database
locked by another writer (the disk full and locks past the wait: test_faults_storage_single_server.py).

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
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import requests

from tests.support.faults import (
    JOBS_EXTRA,
    check_consistent,
    create_users,
    device_use,
    devices,
    exclusive_lock,
    gate_folders,
    gpu_shares_of_processes,
    key_of,
    kill_hub,
    ledger,
    packer_shares,
    pids_of,
    proxy_pid,
    release,
    servers,
    start_servers,
    submit_gated,
    through_proxy,
    usage_rows,
    wait_until,
)
from tests.support.hub import RunningHub
from tests.support.jobs import FINAL, get_job, kill_job_runners, user_token, wait_state

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


@pytest.fixture(scope="module")
def hub(tmp_path_factory):
    h = RunningHub(tmp_path_factory.mktemp("faults"), CATALOG, extra_config=JOBS_EXTRA)
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
    return gate_folders(hub, USERS)


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
    check_consistent(hub, MILLI, {(u, n) for u, n, _, _ in SERVERS})
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
    running = check_consistent(hub, MILLI, expect)
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
    running = check_consistent(hub, MILLI, expect)
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
    running = check_consistent(hub, MILLI, expect)
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
    check_consistent(hub, MILLI, expect)


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
    check_consistent(hub, MILLI, expect)
    # ... and all works on: the job finishes, the server stops, both are released.
    release(gates, "u04", job_name)
    done = wait_state(hub, job["id"], FINAL)
    assert done["state"] == "succeeded" and [h["state"] for h in done["history"]] == ["queued", "running", "succeeded"]
    assert hub.api("DELETE", f"/users/{server[0]}/servers/{server[1]}").status_code in (202, 204)
    hub.wait_server(*server, ready=False)
    check_consistent(hub, MILLI, expect - {server})


# -- a lock held past the wait, and a full data disk: a second, smaller hub ---------------------
