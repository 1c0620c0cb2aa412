"""Storage faults on one server, with real processes: the data disk full (for users, and to
the last byte), and gpulab's and the hub's databases locked past the wait.

The real embedded hub (``configure_embedded``, as ``gpulab up`` runs it, through
tests/support/hub.py) whose whole data folder is a small real ext4 disk
(:func:`tests.support.faults.small_filesystem`), with real papermill jobs of two users.

Runs as root (these machines and CI do): each user is a real system account. Run it
under ``flock /tmp/gpulab-sudo-tests.lock`` beside other tests that create accounts.
"""

from __future__ import annotations

import json
import time

import pytest

from tests.support.faults import (
    JOBS_EXTRA,
    check_consistent,
    create_users,
    devices,
    exclusive_lock,
    fill_disk,
    free_bytes,
    gate_folders,
    ledger,
    packer_shares,
    pids_of,
    post_cpu_job,
    release,
    root_can_write,
    servers,
    small_filesystem,
    start_servers,
    submit_gated,
    through_proxy,
    wait_until,
)
from tests.support.hub import RunningHub
from tests.support.jobs import FINAL, get_job, kill_job_runners, user_token, wait_state

#: Wall seconds of each fault, printed at the end of the module for the suite's budget.
TIMINGS: dict[str, float] = {}

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
MILLI = {"cpu": 0, "h100-quarter": 250, "h100-1": 1000}
DISK_EXTRA = JOBS_EXTRA + "c.GPULab.min_free_disk_mib = 4\n"


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
            h.gates = gate_folders(h, DISK_USERS)
            yield h
        finally:
            h.stop()
            kill_job_runners(h)
            h.close()
            for what, seconds in TIMINGS.items():
                print(f"\nfault timing: {what}: {seconds:.1f} s")


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
    check_consistent(hub, MILLI, {("d0", ""), ("d1", "")})


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
