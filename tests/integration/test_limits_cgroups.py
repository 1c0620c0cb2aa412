"""Confinement on the real kernel: cgroup v1 limits, GPU device rules, private /tmp (as root).

These machines run cgroup v1 (memory, cpu, pids, devices under
/sys/fs/cgroup/<controller>), so this is v1 for real; v2 runs against a
stand-in in ``tests/unit/test_cgroups_v2_fake.py``. Every cgroup here lies under a
parent of this run's own (``gpulab-test-<hex>``, below this process's cgroup)
with tight limits set before anything runs in it, and is removed at the end.
The confined processes run as ``nobody``, with no capability, as a user's code
would: a memory hog, a fork bomb, a reader of device nodes made here with
``mknod`` (major 195, NVIDIA's, and no driver behind them: an allowed open
fails with ENXIO, a denied one with EPERM).
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from spawner.core.limits import WorkloadLimits
from spawner.local.accounts import Account, can_switch_users, lookup
from spawner.local.cgroups import V1, join_cgroup, this_machine
from spawner.local.confinement import Confiner, UserLimits
from spawner.local.sudo import ROOT
from tests.support.cgroups import own_folder, remove_tree

pytestmark = [
    pytest.mark.skipif(not can_switch_users(), reason="making cgroups and device nodes needs root (CI runs as root)"),
]

OPEN_NODES = r"""
import errno, json, os, sys
out = {}
for path in sys.argv[1:]:
    try:
        os.close(os.open(path, os.O_RDONLY))
        out[path] = "opened"
    except OSError as e:
        out[path] = errno.errorcode.get(e.errno, str(e.errno))
print(json.dumps(out))
"""


def nobody() -> Account:
    account = lookup("nobody")
    assert account is not None and account.uid != 0
    return account


@pytest.fixture()
def parent():
    """A cgroup parent of this test's own; removed (with anything left in it) at the end."""
    name = f"gpulab-test-{secrets.token_hex(4)}"
    yield name
    for controller in this_machine().v1:
        folder = own_folder(controller, name)
        if folder.exists():
            remove_tree(folder)


def confiner(parent: str, mode: str = ROOT, **traits) -> Confiner:
    c = Confiner(UserLimits(cgroup_parent=parent, **traits), mode)
    assert c.tree is not None and c.tree.version == V1, c.status.lines()
    return c


def run_confined(confinement, account: Account, code: str, *args: str, timeout: float = 60):
    return subprocess.run(
        [sys.executable, "-c", code, *args],
        preexec_fn=confinement.root_preexec(account, chdir="/"),
        capture_output=True,
        text=True,
        timeout=timeout,
        env={"PATH": os.environ["PATH"]},
    )


def test_v1_memory_hog_is_oom_killed_inside_its_cgroup_and_nothing_else(parent):
    c = confiner(parent)
    me = nobody()
    confinement = c.prepare("gt-hog.job-1", me, WorkloadLimits(memory=64 << 20, processes=64), set(), "/")
    hog = "b = bytearray(512 << 20)\nprint('survived')"
    result = run_confined(confinement, me, hog)
    assert result.returncode == -9 and "survived" not in result.stdout  # SIGKILL from the OOM killer
    assert c.oom_kills("gt-hog.job-1") == 1
    # The same allocation outside the cgroup (the hub, other users) is untouched.
    outside = subprocess.run([sys.executable, "-c", hog], capture_output=True, text=True, timeout=60)
    assert outside.returncode == 0 and "survived" in outside.stdout
    assert c.release("gt-hog.job-1")


def test_v1_cpu_limit_is_written_as_a_cfs_quota(parent):
    c = confiner(parent)
    c.prepare("gt-cpu.server", nobody(), WorkloadLimits(cpu=0.5, processes=64), set(), "/")
    folder = c.tree.cgroup("gt-cpu.server").folders["cpu"]
    assert (folder / "cpu.cfs_quota_us").read_text().strip() == "50000"
    assert (folder / "cpu.cfs_period_us").read_text().strip() == "100000"
    assert c.release("gt-cpu.server")


def test_v1_fork_bomb_stops_at_pids_max_and_is_killed_whole(parent):
    c = confiner(parent)
    me = nobody()
    name = "gt-bomb.server"
    confinement = c.prepare(name, me, WorkloadLimits(memory=256 << 20, processes=40), set(), "/")
    bomb = subprocess.Popen(
        ["bash", "-c", "bomb() { bomb | bomb & }; bomb; sleep 30"],
        preexec_fn=confinement.root_preexec(me, chdir="/"),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        group = c.tree.cgroup(name)
        pids_file = group.folders["pids"]
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and int((pids_file / "pids.current").read_text()) < 40:
            time.sleep(0.1)
        time.sleep(1)
        assert int((pids_file / "pids.current").read_text()) <= 40
        events = (pids_file / "pids.events").read_text() if (pids_file / "pids.events").exists() else "max 1"
        assert int(events.split()[1]) > 0  # forks were refused at the limit
        # This process (the hub) still forks as it likes.
        assert subprocess.run(["true"], timeout=10).returncode == 0
    finally:
        assert c.release(name)  # kills everything in it, then removes it
        bomb.wait(10)
    assert group.pids() == []


def test_v1_devices_a_workload_opens_only_its_placed_gpu_nodes(parent, tmp_path_factory):
    folder = Path(f"/var/tmp/gpulab-test-dev-{secrets.token_hex(4)}")  # outside /tmp: private /tmp hides that
    folder.mkdir()
    try:
        for minor in range(4):
            os.mknod(folder / f"nvidia{minor}", 0o666 | 0o020000, os.makedev(195, minor))
        os.mknod(folder / "nvidiactl", 0o666 | 0o020000, os.makedev(195, 255))
        for p in folder.iterdir():
            os.chmod(p, 0o666)
        c = confiner(parent, device_dir=str(folder))
        assert c.status.devices, c.status.lines()
        me = nobody()
        confinement = c.prepare("gt-gpu.server", me, WorkloadLimits(processes=64), {2}, "/")
        nodes = [str(folder / n) for n in ("nvidia0", "nvidia1", "nvidia2", "nvidia3", "nvidiactl")]
        inside = json.loads(run_confined(confinement, me, OPEN_NODES, *nodes).stdout)
        assert inside == {
            nodes[0]: "EPERM",
            nodes[1]: "EPERM",
            nodes[2]: "ENXIO",  # allowed: no driver behind it
            nodes[3]: "EPERM",
            nodes[4]: "ENXIO",  # the control node stays as the driver set it
        }
        assert c.release("gt-gpu.server")
        # Released: a new process of the same account is not held by the old rules.
        free = subprocess.run(
            [sys.executable, "-c", OPEN_NODES, *nodes], capture_output=True, text=True, user=me.uid, group=me.gid
        )
        assert set(json.loads(free.stdout).values()) == {"ENXIO"}
    finally:
        shutil.rmtree(folder)


TMP_WRITER = r"""
import os, sys, time
tag = sys.argv[1]
for folder in ("/tmp", "/dev/shm"):
    with open(f"{folder}/{tag}", "w") as f:
        f.write("private")
print(sorted(os.listdir("/tmp")), sorted(os.listdir("/dev/shm")), os.path.isdir(sys.argv[2]), flush=True)
time.sleep(float(sys.argv[3]))
"""


def test_private_tmp_each_workload_sees_only_its_own_files(parent, tmp_path):
    c = confiner(parent)
    assert c.status.private_tmp
    me = nobody()
    keep = tmp_path / "home-under-tmp"  # a home below /tmp (as on test machines) stays reachable
    keep.mkdir()
    os.chmod(tmp_path, 0o755)
    a = c.prepare("gt-tmp-a.server", me, WorkloadLimits(memory=128 << 20, processes=64), set(), keep)
    b = c.prepare("gt-tmp-b.server", me, WorkloadLimits(memory=128 << 20, processes=64), set(), keep)
    tag = f"gpulab-secret-{secrets.token_hex(4)}"
    writer = subprocess.Popen(
        [sys.executable, "-c", TMP_WRITER, tag, str(keep), "5"],
        preexec_fn=a.root_preexec(me, chdir="/"),
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        # Empty but for its own file and the folder on the way to the kept home.
        scaffold = keep.relative_to("/tmp").parts[0]
        first = writer.stdout.readline()
        assert first.startswith(f"{sorted([tag, scaffold])} ['{tag}'] True"), first
        reader = run_confined(b, me, "import os; print(os.listdir('/tmp'), os.listdir('/dev/shm'))")
        assert reader.stdout.startswith(f"['{scaffold}'] []"), reader.stdout
        assert not (Path("/tmp") / tag).exists() and not (Path("/dev/shm") / tag).exists()  # the host's
    finally:
        writer.kill()
        writer.wait()
    assert c.release("gt-tmp-a.server") and c.release("gt-tmp-b.server")


def test_private_tmp_in_a_user_namespace_as_the_user(tmp_path):
    """Sudo mode: the mediator, not root, makes the private /tmp in a user namespace of its own."""
    me = nobody()
    code = (
        "from spawner.local.namespaces import private_tmp\n"
        "import os\nprivate_tmp(8 << 20, user_namespace=True)\n"
        "open('/tmp/x', 'w').write('1')\nprint(os.getuid(), os.listdir('/tmp'), os.listdir('/dev/shm'))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, user=me.uid, group=me.gid, cwd="/", timeout=30
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == [str(me.uid), "['x']", "[]"]  # still its own uid; the host's /tmp untouched
    assert not Path("/tmp/x").exists() or Path("/tmp/x").stat().st_uid != me.uid


def test_sudo_mode_delegated_subtree_a_hub_that_is_not_root_confines_its_child(parent):
    """An admin gave the hub's account a cgroup subtree and started the hub in it (what systemd's
    Delegate=yes does); the hub, not root, makes a workload's cgroup below its own, and the child that
    would become sudo joins it before exec: a hog started from there is OOM-killed inside."""
    hub = nobody()
    delegated = []
    for controller in ("memory", "cpu", "pids"):
        folder = own_folder(controller, parent)
        folder.mkdir()
        delegated.append(str(folder / "cgroup.procs"))
        for p in [folder, *folder.iterdir()]:
            os.chown(p, hub.uid, hub.gid)
    code = r"""
import sys, subprocess
from spawner.local.confinement import Confiner, UserLimits
from spawner.local.accounts import lookup
from spawner.core.limits import WorkloadLimits
from spawner.local.sudo import SUDO
c = Confiner(UserLimits(private_tmp=False), SUDO)  # the default parent: gpulab, below the hub's own cgroup
print("STATUS", c.status.lines(), flush=True)
conf = c.prepare("gt-sudo.job-1", lookup("nobody"), WorkloadLimits(memory=64 << 20, processes=64), set(), "/")
hog = subprocess.run([sys.executable, "-c", "b = bytearray(512 << 20)"], preexec_fn=conf.sudo_preexec())
print("HOG", hog.returncode, c.oom_kills("gt-sudo.job-1"), c.release("gt-sudo.job-1"))
"""

    def start_in_delegated_subtree() -> None:
        join_cgroup(delegated)  # as root, as the admin's service manager would
        os.setgid(hub.gid)
        os.setuid(hub.uid)

    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        preexec_fn=start_in_delegated_subtree,
        cwd="/",
        timeout=60,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert f"/{parent}/gpulab" in out.stdout
    assert "GPU device isolation is off: a hub that is not root cannot write device rules" in out.stdout
    assert out.stdout.split("HOG ")[1].split() == ["-9", "1", "True"], out.stdout


def test_sudo_mode_without_a_delegated_subtree_says_limits_are_off(parent):
    """A hub that is not root in a cgroup it does not own: the mkdir is refused, and it says so."""
    code = (
        "from spawner.local.confinement import Confiner, UserLimits\nfrom spawner.local.sudo import SUDO\n"
        f"print(Confiner(UserLimits(cgroup_parent={parent!r}, private_tmp=False), SUDO).status.lines())"
    )
    me = nobody()
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, user=me.uid, group=me.gid, cwd="/", timeout=30
    )
    assert "'limits: off'" in out.stdout and "Permission denied" in out.stdout, out.stdout
    assert "is the subtree delegated to the hub's account?" in out.stdout
