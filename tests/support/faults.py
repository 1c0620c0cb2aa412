"""Pieces of the single-server fault tests: many servers at once, jobs held on a gate,
what really runs on each GPU (read from the processes), a database lock held by
another process, and a small filesystem to fill.

Nothing here imitates a component: the servers, job runners, SQLite locks and
filesystems are real; these functions only start, find and measure them.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from tests.support.hub import RunningHub
from tests.support.jobs import FINAL, submit, write_parameterised_notebook


def write_gated_notebook(path: Path) -> Path:
    """A notebook that runs until ``release_file`` exists (or ``hold_seconds`` passed), then
    succeeds, or raises ``RuntimeError(fail)`` when ``fail`` is set: a job the test ends when it wants."""
    return write_parameterised_notebook(
        path,
        'release_file = ""\nfail = ""\nhold_seconds = 600',
        "import os, time\n"
        "deadline = time.time() + hold_seconds\n"
        "while release_file and not os.path.exists(release_file) and time.time() < deadline:\n"
        "    time.sleep(0.1)\n"
        "if fail:\n"
        "    raise RuntimeError(fail)\n"
        "print('released', os.environ.get('CUDA_VISIBLE_DEVICES'))",
    )


def create_users(hub: RunningHub, names: list[str]) -> None:
    r = hub.api("POST", "/users", data=json.dumps({"usernames": names}))
    assert r.status_code in (201, 409), r.text


def start_servers(hub: RunningHub, specs: list[tuple[str, str, str, str]], timeout: float = 240) -> float:
    """Start ``(user, server name, team, profile)`` servers through the REST API, all at once;
    wait until each is ready; the seconds it took."""
    t0 = time.monotonic()

    def one(spec: tuple[str, str, str, str]) -> None:
        user, name, team, profile = spec
        path = f"/users/{user}/servers/{name}" if name else f"/users/{user}/server"
        r = hub.api("POST", path, data=json.dumps({"team": team, "profile": profile}))
        assert r.status_code in (201, 202), (spec, r.status_code, r.text)

    with ThreadPoolExecutor(max_workers=len(specs) or 1) as pool:
        list(pool.map(one, specs))
    for user, name, _team, _profile in specs:
        hub.wait_server(user, name, timeout=max(5.0, timeout - (time.monotonic() - t0)))
    return time.monotonic() - t0


def servers(hub: RunningHub) -> dict[tuple[str, str], dict]:
    """Every server the hub lists, ``(user, name) -> model`` (with its spawner state)."""
    out = {}
    for u in hub.api("GET", "/users", params={"state": "active"}).json():
        for name, model in (u.get("servers") or {}).items():
            out[(u["name"], name)] = model
    return out


def through_proxy(hub: RunningHub, user: str, name: str, token: str) -> int:
    """Status of the server's own ``api/status`` asked through the public proxy."""
    import requests

    prefix = f"/user/{user}/{name}/" if name else f"/user/{user}/"
    r = requests.get(
        hub.url + prefix + "api/status", headers={"Authorization": f"token {token}"}, timeout=20, allow_redirects=False
    )
    return r.status_code


def wait_until(check, timeout: float, what: str, interval: float = 0.3):
    """``check()``'s first truthy value within ``timeout`` seconds, or an AssertionError naming ``what``."""
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        last = check()
        if last:
            return last
        time.sleep(interval)
    raise AssertionError(f"{what}: not reached in {timeout} s (last: {last!r})")


# -- what runs ---------------------------------------------------------------------------------


def _environ(pid: str) -> dict[str, str] | None:
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes()
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    if stat.rsplit(")", 1)[1].split()[0] == "Z":
        return None  # a zombie holds nothing
    return dict(item.split("=", 1) for item in raw.decode(errors="replace").split("\0") if "=" in item)


def gpu_shares_of_processes(hub: RunningHub) -> dict[str, list[tuple[int, int]]]:
    """What each live server and job runner of this hub holds, read from the processes
    themselves (``CUDA_VISIBLE_DEVICES`` and ``GPULAB_GPU_MILLI`` in their environment),
    by ledger key: the truth the ledger and the packer must agree with.

    Servers are found by the hub API URL in their environment, job runners by
    ``GPULAB_JOB_ID`` and their home below this hub's data folder; kernels inherit the
    same variables and count once, under their server's or job's key.
    """
    marker = f"http://127.0.0.1:{hub.hub_port}/"
    homes = str(hub.data_dir.resolve())
    out: dict[str, list[tuple[int, int]]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        env = _environ(entry)
        if env is None or "GPULAB_GPU_MILLI" not in env:
            continue
        if env.get("JUPYTERHUB_API_URL", "").startswith(marker):
            key = f"notebook:{env['JUPYTERHUB_USER']}/{env.get('JUPYTERHUB_SERVER_NAME', '')}"
        elif "GPULAB_JOB_ID" in env and env.get("HOME", "").startswith(homes):
            key = f"job:{env['GPULAB_JOB_ID']}"
        else:
            continue
        milli = int(env["GPULAB_GPU_MILLI"])
        devices = [int(d) for d in env.get("CUDA_VISIBLE_DEVICES", "").split(",") if d]
        shares = [(devices[0], milli)] if devices and milli < 1000 else [(d, 1000) for d in devices]
        out[key] = shares
    return out


def device_use(shares_by_key: dict[str, list[tuple[int, int]]]) -> dict[int, int]:
    """Milli-GPUs in use per device index."""
    used: dict[int, int] = {}
    for shares in shares_by_key.values():
        for index, milli in shares:
            used[index] = used.get(index, 0) + milli
    return used


def pids_of(hub: RunningHub, key: str) -> list[int]:
    """Live processes holding ``key`` (a server with its kernels, or a job runner with its kernel)."""
    marker = f"http://127.0.0.1:{hub.hub_port}/"
    homes = str(hub.data_dir.resolve())
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        env = _environ(entry)
        if env is None:
            continue
        if key.startswith("notebook:") and env.get("JUPYTERHUB_API_URL", "").startswith(marker):
            if f"notebook:{env.get('JUPYTERHUB_USER')}/{env.get('JUPYTERHUB_SERVER_NAME', '')}" == key:
                found.append(int(entry))
        elif key.startswith("job:") and env.get("GPULAB_JOB_ID") == key[4:] and env.get("HOME", "").startswith(homes):
            found.append(int(entry))  # this hub's job (other hubs number their jobs from 1 too)
    return found


def kill_hub(hub: RunningHub) -> int:
    """SIGKILL the hub process alone (its proxy, servers and runners live on, as after a crash)."""
    assert hub.proc is not None
    pid = hub.proc.pid
    os.kill(pid, signal.SIGKILL)
    hub.proc.wait(10)
    hub.proc = None
    return pid


def proxy_pid(hub: RunningHub) -> int | None:
    """The pid in the proxy's pid file; ``None`` while there is none (the hub replaces it)."""
    try:
        return int((hub.state_dir / "jupyterhub-proxy.pid").read_text().strip())
    except (OSError, ValueError):
        return None


# -- a database held by another writer --------------------------------------------------------------

_HOLD_LOCK = """
import sqlite3, sys, time
con = sqlite3.connect(sys.argv[1], isolation_level=None, timeout=30)
con.execute("BEGIN EXCLUSIVE")
print("locked", flush=True)
time.sleep(float(sys.argv[2]))
con.execute("COMMIT")
print("released", flush=True)
"""


@contextlib.contextmanager
def exclusive_lock(path: Path, seconds: float) -> Iterator[subprocess.Popen]:
    """Another process holds ``BEGIN EXCLUSIVE`` on the SQLite file at ``path`` for ``seconds``."""
    proc = subprocess.Popen(
        [sys.executable, "-c", _HOLD_LOCK, str(path), str(seconds)], stdout=subprocess.PIPE, text=True
    )
    try:
        line = proc.stdout.readline() if proc.stdout else ""
        assert line.strip() == "locked", f"could not lock {path}: {line!r}"
        yield proc
    finally:
        try:
            proc.wait(seconds + 30)
        finally:
            if proc.poll() is None:
                proc.kill()


# -- a small filesystem --------------------------------------------------------------------------


@contextlib.contextmanager
def small_filesystem(size_mib: int, reserved_percent: int = 10) -> Iterator[Path]:
    """An ext4 image of ``size_mib`` MiB, loop-mounted on a fresh folder under /var/tmp (root only).

    Like any ext4 disk it keeps ``reserved_percent`` of its blocks for root: users' writes
    stop at "disk full" while a root hub can still write its records.
    """
    # Not under /tmp: servers and jobs get a private /tmp and would not see it there.
    work = Path(tempfile.mkdtemp(prefix="gpulab-test-fs-", dir="/var/tmp"))
    os.chmod(work, 0o711)  # the users' accounts reach their homes on it
    image, mountpoint = work / "disk.img", work / "mnt"
    mountpoint.mkdir()
    with open(image, "wb") as f:
        f.truncate(size_mib << 20)
    subprocess.run(["mkfs.ext4", "-q", "-F", "-m", str(reserved_percent), str(image)], check=True, capture_output=True)
    subprocess.run(["mount", "-o", "loop", str(image), str(mountpoint)], check=True, capture_output=True)
    os.chmod(mountpoint, 0o711)
    try:
        yield mountpoint
    finally:
        for _ in range(20):
            if subprocess.run(["umount", str(mountpoint)], capture_output=True).returncode == 0:
                break
            time.sleep(0.5)
        else:
            subprocess.run(["umount", "-l", str(mountpoint)], capture_output=True)
        shutil.rmtree(work, ignore_errors=True)


_FILL = """
import sys
chunk = bytes(64 << 10)
with open(sys.argv[1], "wb", buffering=0) as f:
    while True:  # a short write fills the last blocks; the next one raises ENOSPC
        try:
            f.write(chunk)
        except OSError:
            break
"""


def fill_disk(path: Path, account=None) -> Path:
    """Write ``path`` until its filesystem refuses (ENOSPC), as ``account`` (a user's process
    filling her home) or as root (then the blocks reserved for root go too); ``path``."""
    switch = {"user": account.uid, "group": account.gid, "extra_groups": []} if account is not None else {}
    subprocess.run([sys.executable, "-c", _FILL, str(path)], check=True, timeout=120, **switch)
    return path


def root_can_write(folder: Path, size: int = 64 << 10) -> bool:
    """Can root still write ``size`` bytes there? (ext4 keeps a few blocks even from root,
    so ``statvfs``'s free count alone does not say the disk is full to the last byte.)"""
    probe = folder / ".gpulab-test-probe"
    try:
        with open(probe, "wb", buffering=0) as f:
            f.write(bytes(size))
            os.fsync(f.fileno())
        return True
    except OSError:
        return False
    finally:
        probe.unlink(missing_ok=True)


def free_bytes(folder: Path, for_root: bool = False) -> int:
    """Free bytes on ``folder``'s filesystem for users (or, ``for_root``, with root's reserve)."""
    st = os.statvfs(folder)
    return (st.f_bfree if for_root else st.f_bavail) * st.f_frsize


#: The jobs backend's settings for fault tests: a quick poll, a short stop grace.
JOBS_EXTRA = """
c.GPULabJobs.poll_interval = 0.3
c.GPULabJobs.stop_grace_seconds = 3
"""


def gate_folders(hub: RunningHub, users: list[str]) -> dict[str, Path]:
    """Each user's gated notebook (exp/gated.ipynb), and the folder where a test drops the
    release files its jobs wait for."""
    out = {}
    for u in users:
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


def key_of(user: str, name: str) -> str:
    """The ledger key of a user's (named) server."""
    return f"notebook:{user}/{name}"


def ledger(hub: RunningHub) -> dict[str, int]:
    """Every ledger holding, ``key -> milli`` (through the hub API)."""
    return {w["key"]: w["gpu_milli"] for w in hub.holdings()}


def devices(hub: RunningHub) -> dict:
    """The device packer's view (``/hub/api/gpulab/devices``)."""
    r = hub.api("GET", "/gpulab/devices")
    assert r.status_code == 200, r.text
    return r.json()


def packer_shares(view: dict) -> dict[str, list[tuple[int, int]]]:
    """``key -> [(device, milli), ...]`` as the packer placed them."""
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


def check_consistent(
    hub: RunningHub, milli: Mapping[str, int], expect_servers: set[tuple[str, str]]
) -> dict[str, list[tuple[int, int]]]:
    """The hub's servers, ledger and packer agree with the processes that run (``milli``: each
    profile's share); returns their shares."""
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
    want = {key_of(u, n): milli[m["user_options"]["profile"]] for (u, n), m in listed.items()}
    want.update({f"job:{i}": j["gpu_milli"] for i, j in jobs.items() if j["state"] not in FINAL})
    assert ledger(hub) == want
    # ... and the admin usage report's "now" says the same per team.
    now = {t["team"]: t["held_milli"] for t in hub.api("GET", "/gpulab/usage").json()["now"]}
    per_team: dict[str, int] = {}
    for w in hub.holdings():
        per_team[w["team"]] = per_team.get(w["team"], 0) + w["gpu_milli"]
    assert {t: now.get(t, 0) for t in per_team} == per_team
    return running
