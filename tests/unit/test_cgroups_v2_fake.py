"""gpulab's cgroup v2 code against a stand-in that follows the kernel's cgroup-v2.rst.

These machines cannot run it for real: their v2 tree holds only hugetlb, and
the memory, cpu and pids controllers are on v1 (``tests/integration/test_limits_cgroups.py``
runs v1 on the real kernel). ``tests/support/cgroup2_fake.py`` imitates the documented
v2 interface (Documentation/admin-guide/cgroup-v2.rst: the top-down and the
no-internal-process constraints, ``cgroup.subtree_control``, ``memory.max``,
``cpu.max``, ``pids.max``, ``cgroup.kill``) in memory; no real cgroup is
touched and no process is signalled (the fake pids lie above the kernel's
PID_MAX_LIMIT).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from spawner.core.limits import WorkloadLimits
from spawner.local.cgroups import V2, CgroupError, Mounts, choose_tree, enable_v2_controllers
from tests.support.cgroup2_fake import FakeCgroup2

ROOT = Path("/gpulab-fake-cgroup2")  # never created: the fake lives in memory
HUB_PID, OTHER_PID, SERVER_PID = 5_000_001, 5_000_002, 5_000_003  # above PID_MAX_LIMIT (2**22)


def systemd_like() -> FakeCgroup2:
    """What systemd sets up with ``Delegate=yes``: the hub in its own unit's cgroup, controllers passed down."""
    fs = FakeCgroup2(ROOT)
    fs.write(ROOT / "cgroup.subtree_control", "+memory +cpu +pids")
    fs.mkdir(ROOT / "system.slice")
    fs.write(ROOT / "system.slice" / "cgroup.subtree_control", "+memory +cpu +pids")
    fs.mkdir(ROOT / "system.slice" / "gpulab.service")
    fs.add_process(ROOT / "system.slice" / "gpulab.service", HUB_PID)
    fs.add_process(ROOT, OTHER_PID)
    return fs


def mounts(own: str) -> Mounts:
    return Mounts(v1={}, v2=ROOT, v2_controllers=("cpu", "memory", "pids"), own={"": own}, systemd=False)


def test_v2_workload_cgroup_under_the_hubs_own_with_the_fake_kernel_interface():
    """The hub's cgroup holds the hub: its processes move to a leaf, then the controllers pass down."""
    fs = systemd_like()
    tree = choose_tree(mounts("/system.slice/gpulab.service"), "gpulab", devices=True)
    assert tree is not None and tree.version == V2 and not tree.devices  # v2: no device rules from gpulab
    tree.fs = fs
    tree.prepare()
    unit = ROOT / "system.slice" / "gpulab.service"
    assert fs.where(HUB_PID) == unit / "hub"
    assert fs.read(unit / "cgroup.subtree_control").split() == ["cpu", "memory", "pids"]
    assert tree.enabled == ("memory", "cpu", "pids")

    limits = WorkloadLimits(memory=512 << 20, cpu=1.5, processes=256)
    group = tree.create("jupyter-alice.server", limits)
    folder = unit / "gpulab" / "jupyter-alice.server"
    assert group.procs_files == [str(folder / "cgroup.procs")]
    assert fs.read(folder / "memory.max").strip() == str(512 << 20)
    assert fs.read(folder / "memory.swap.max").strip() == "0"
    assert fs.read(folder / "cpu.max").strip() == "150000 100000"
    assert fs.read(folder / "pids.max").strip() == "256"

    fs.add_process(unit / "hub", SERVER_PID)  # a child of the hub, then joins (what join_cgroup writes)
    fs.write(folder / "cgroup.procs", str(SERVER_PID))
    assert group.pids() == [SERVER_PID]
    assert group.remove() is False  # busy: rmdir refused with EBUSY
    group.kill_all()  # through cgroup.kill: nothing signalled
    assert group.pids() == [] and group.remove() is True
    assert fs.node(folder) is None


def test_v2_unlimited_values_are_max():
    fs = systemd_like()
    tree = choose_tree(mounts("/system.slice/gpulab.service"), "gpulab", devices=False)
    tree.fs = fs
    tree.prepare()
    tree.create("jupyter-bob.job-7", WorkloadLimits())
    folder = ROOT / "system.slice" / "gpulab.service" / "gpulab" / "jupyter-bob.job-7"
    assert [fs.read(folder / f).strip() for f in ("memory.max", "memory.swap.max", "cpu.max", "pids.max")] == [
        "max",
        "max",
        "max 100000",
        "max",
    ]


def test_v2_a_restarted_hub_finds_its_cgroups_where_the_first_run_left_them():
    """The first run moved the hub to ``<unit>/hub``; the next one must not nest below it."""
    fs = systemd_like()
    tree = choose_tree(mounts("/system.slice/gpulab.service"), "gpulab", devices=False)
    tree.fs = fs
    tree.prepare()
    tree.create("jupyter-alice.server", WorkloadLimits(memory=1 << 30))
    again = choose_tree(mounts("/system.slice/gpulab.service/hub"), "gpulab", devices=False)
    again.fs = fs
    again.prepare()
    assert again.parents[""] == tree.parents[""]
    assert [g.name for g in again.leftovers()] == ["jupyter-alice.server"]


def test_v2_delegated_subtree_without_the_controllers_is_refused_with_what_to_fix():
    """Top-down constraint: memory is not in the subtree's cgroup.controllers, so it cannot be enabled."""
    fs = FakeCgroup2(ROOT)
    fs.write(ROOT / "cgroup.subtree_control", "+cpu")  # memory and pids not passed down
    tree = choose_tree(mounts("/"), "/gpulab", devices=False)
    tree.fs = fs
    with pytest.raises(CgroupError, match="memory, pids controller is not passed down"):
        tree.prepare()


def test_v2_the_fake_enforces_the_no_internal_process_rule():
    """The stand-in itself refuses what the kernel refuses (so the tests above can fail)."""
    fs = systemd_like()
    unit = ROOT / "system.slice" / "gpulab.service"
    with pytest.raises(OSError) as refused:
        fs.write(unit / "cgroup.subtree_control", "+memory")
    assert refused.value.errno == 16  # EBUSY
    fs.mkdir(unit / "x")
    assert not fs.exists(unit / "x" / "memory.max")  # not enabled in the parent: no interface file
    with pytest.raises(OSError):
        fs.write(unit / "x" / "memory.max", "1")
    with pytest.raises(OSError):
        fs.write(ROOT / "system.slice" / "cgroup.subtree_control", "+nosuch")
    # enable_v2_controllers moves the processes first, then succeeds.
    assert enable_v2_controllers(unit, "hub", fs) == ("memory", "cpu", "pids")
    assert fs.exists(unit / "x" / "memory.max")
