"""Limits per server and job (profile, team, defaults), their catalog form, and the pieces around them.

No cgroup is touched here: the v1 cgroups run for real in
``tests/integration/test_limits_cgroups.py``, v2 against the stand-in in
``tests/unit/test_cgroups_v2_fake.py``.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from spawner.core.catalog import CatalogError, catalog_from_dict
from spawner.core.catalog.write import catalog_to_dict
from spawner.core.limits import (
    LimitDefaults,
    WorkloadLimits,
    running_jobs_cap,
    running_jobs_reason,
    workload_limits,
)
from spawner.core.model import Profile, Team, TeamLimits
from spawner.core.packer import GPUDevice
from spawner.local.account_spawner import server_cgroup_name
from spawner.local.cgroups import V1, V2, DeviceRule, choose_tree, read_mounts, systemd_scope_argv
from spawner.local.devices import DeviceNode, allow_entries, deny_rules, placed_minors
from spawner.local.output_capture import server_log_path, write_bounded

CATALOG = {
    "profiles": [
        {"slug": "small", "display_name": "Small", "gpus": 0, "memory": {"limit": "2Gi"}, "cpu": {"limit": 4}},
        {"slug": "bare", "display_name": "Bare", "gpus": 0},
    ],
    "teams": [
        {
            "name": "vision",
            "users": ["alice"],
            "guarantee": 1,
            "limits": {"memory": "1Gi", "cpu": "1500m", "processes": 256, "running_jobs": 2},
        },
        {"name": "open", "users": ["bob"], "guarantee": 1},
    ],
}


def test_team_limits_are_read_and_round_trip():
    catalog = catalog_from_dict(CATALOG)
    vision = catalog.team("vision")
    assert vision.limits == TeamLimits(memory=1 << 30, cpu=1.5, processes=256, running_jobs=2)
    assert catalog.team("open").limits.empty
    again = catalog_from_dict(catalog_to_dict(catalog))
    assert again.team("vision").limits == vision.limits
    assert "limits" not in next(t for t in catalog_to_dict(catalog)["teams"] if t["name"] == "open")


@pytest.mark.parametrize(
    "limits, where",
    [
        ({"memory": "lots"}, "limits.memory"),
        ({"memory": "1M"}, "limits.memory"),
        ({"cpu": 0}, "limits.cpu"),
        ({"processes": 3}, "limits.processes"),
        ({"processes": True}, "limits.processes"),
        ({"running_jobs": 0}, "limits.running_jobs"),
        ({"running_jobs": "2"}, "limits.running_jobs"),
        ({"gpus": 1}, "limits"),
        ("8G", "limits"),
    ],
)
def test_bad_team_limits_are_refused_at_their_key(limits, where):
    data = {"teams": [{"name": "t", "users": ["a"], "guarantee": 0, "limits": limits}]}
    with pytest.raises(CatalogError) as e:
        catalog_from_dict(data)
    assert where in str(e.value)


def test_workload_limits_profile_then_default_never_above_the_team():
    catalog = catalog_from_dict(CATALOG)
    small, bare = catalog.profile("small"), catalog.profile("bare")
    vision, open_team = catalog.team("vision"), catalog.team("open")
    defaults = LimitDefaults(memory=4 << 30, cpu=None, processes=4096)
    assert workload_limits(small, open_team, defaults) == WorkloadLimits(2 << 30, 4.0, 4096)
    assert workload_limits(bare, open_team, defaults) == WorkloadLimits(4 << 30, None, 4096)
    assert workload_limits(small, vision, defaults) == WorkloadLimits(1 << 30, 1.5, 256)  # the team caps
    assert workload_limits(bare, vision, LimitDefaults(processes=None)) == WorkloadLimits(1 << 30, 1.5, 256)
    assert workload_limits(bare, None, LimitDefaults(processes=None)).empty
    assert WorkloadLimits(1 << 30, 1.5, 256).words() == "memory 1Gi, 1.5 CPUs, 256 processes"


def test_running_jobs_cap_team_over_default_and_its_reason():
    vision = Team("vision", limits=TeamLimits(running_jobs=2))
    assert running_jobs_cap(vision, LimitDefaults(running_jobs=4)) == 2
    assert running_jobs_cap(Team("open"), LimitDefaults(running_jobs=4)) == 4
    assert running_jobs_cap(None, LimitDefaults(running_jobs=None)) is None
    assert running_jobs_reason("alice", 2, 2, vision) == (
        "waiting: alice already runs 2 jobs, the most one member of team vision may run at once"
    )
    assert "the most a user may run" in running_jobs_reason("bob", 1, 1, Team("open"))


def test_cgroup_mounts_of_a_v1_machine_like_these():
    """/proc/self/mountinfo and /proc/self/cgroup as these machines show them (proc(5) formats)."""
    mountinfo = "\n".join(
        [
            "30 25 0:26 / /sys/fs/cgroup ro,nosuid - tmpfs tmpfs ro,mode=755",
            "31 30 0:27 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw",
            "32 30 0:28 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory",
            "33 30 0:29 / /sys/fs/cgroup/cpu,cpuacct rw,relatime - cgroup cgroup rw,cpu,cpuacct",
            "34 30 0:30 / /sys/fs/cgroup/pids rw,relatime - cgroup cgroup rw,pids",
            "35 30 0:31 / /sys/fs/cgroup/devices rw,relatime - cgroup cgroup rw,devices",
        ]
    )
    self_cgroup = "5:devices:/\n4:memory:/process_api/abc\n3:cpu,cpuacct:/\n2:pids:/\n0::/\n"
    m = read_mounts(mountinfo, self_cgroup, "sh\n")
    assert m.v1["cpu"] == Path("/sys/fs/cgroup/cpu,cpuacct") and m.own["memory"] == "/process_api/abc"
    assert not m.systemd
    m = type(m)(m.v1, m.v2, ("hugetlb",), m.own, m.systemd)  # the v2 tree holds only hugetlb: v1 it is
    tree = choose_tree(m, "gpulab", devices=True)
    assert tree.version == V1 and tree.devices
    assert tree.parents["memory"] == Path("/sys/fs/cgroup/memory/process_api/abc/gpulab")
    assert tree.parents["pids"] == Path("/sys/fs/cgroup/pids/gpulab")
    delegated = choose_tree(m, "/gpulab", devices=False)
    assert delegated.parents["memory"] == Path("/sys/fs/cgroup/memory/gpulab") and "devices" not in delegated.parents


def test_cgroup_mounts_of_a_systemd_v2_machine():
    m = read_mounts(
        "29 23 0:26 / /sys/fs/cgroup rw,nosuid - cgroup2 cgroup2 rw,nsdelegate",
        "0::/system.slice/jupyterhub.service\n",
        "systemd\n",
    )
    assert m.systemd and m.v2 == Path("/sys/fs/cgroup") and m.v1 == {}
    m = type(m)(m.v1, m.v2, ("cpu", "memory", "pids"), m.own, m.systemd)
    tree = choose_tree(m, "gpulab", devices=True)
    assert tree.version == V2 and tree.parents[""] == Path("/sys/fs/cgroup/system.slice/jupyterhub.service/gpulab")


def test_systemd_scope_command_line():
    """systemd-run(1) --scope with systemd.resource-control(5) properties, then the command."""
    argv = systemd_scope_argv(
        "gpulab-jupyter-alice.server-1a2b3c",
        WorkloadLimits(memory=2 << 30, cpu=1.5, processes=512),
        slice_name="gpulab.slice",
        device_allow=["/dev/nvidia1 rw", "/dev/nvidiactl rw", "char-pts rw"],
    )
    assert argv == [
        "systemd-run",
        "--scope",
        "--quiet",
        "--collect",
        "--unit=gpulab-jupyter-alice.server-1a2b3c",
        "--slice=gpulab.slice",
        "-p",
        f"MemoryMax={2 << 30}",
        "-p",
        "MemorySwapMax=0",
        "-p",
        "CPUQuota=150%",
        "-p",
        "TasksMax=512",
        "-p",
        "DevicePolicy=closed",
        "-p",
        "DeviceAllow=/dev/nvidia1 rw",
        "-p",
        "DeviceAllow=/dev/nvidiactl rw",
        "-p",
        "DeviceAllow=char-pts rw",
        "--",
    ]
    assert "DevicePolicy=closed" not in systemd_scope_argv("u", WorkloadLimits())


def test_device_rules_deny_only_the_gpus_not_placed():
    nodes = [
        DeviceNode("/dev/nvidia0", 195, 0, 0),
        DeviceNode("/dev/nvidia1", 195, 1, 1),
        DeviceNode("/dev/nvidia2", 195, 2, 2),
        DeviceNode("/dev/nvidiactl", 195, 255, None),
        DeviceNode("/dev/nvidia-uvm", 509, 0, None),
    ]
    devices = {0: GPUDevice(0, "H100", minor=2), 1: GPUDevice(1, "H100", minor=0), 2: GPUDevice(2, "H100")}
    placed = placed_minors([0], devices)  # NVML index 0 is /dev/nvidia2
    assert placed == {2}
    assert deny_rules(nodes, placed) == [DeviceRule(195, 0, "/dev/nvidia0"), DeviceRule(195, 1, "/dev/nvidia1")]
    assert DeviceRule(195, 0).v1() == "c 195:0 rwm"
    assert allow_entries(nodes, placed, ["char-pts rw"]) == [
        "/dev/nvidia2 rw",
        "/dev/nvidiactl rw",
        "/dev/nvidia-uvm rw",
        "char-pts rw",
    ]
    assert placed_minors([2], devices) == {2}  # no NVML minor: the index


def test_server_cgroup_and_log_names_are_safe():
    assert server_cgroup_name("jupyter-alice", "") == "jupyter-alice.server"
    assert server_cgroup_name("jupyter-alice", "gpu-1") == "jupyter-alice.server-gpu-1"
    odd = server_cgroup_name("jupyter-alice", "../x y")
    assert "/" not in odd and ".." not in odd and odd.startswith("jupyter-alice.server-")
    assert server_log_path("/home/a", "") == Path("/home/a/.gpulab/logs/server.log")
    assert server_log_path("/home/a", "../../etc") == Path("/home/a/.gpulab/logs/server-------etc.log")


def test_output_capture_is_bounded_and_rotates(tmp_path):
    read_end, write_end = os.pipe()
    path = tmp_path / "server.log"
    data = b"".join(b"line %06d forged [I JupyterHub] admin logged in\n" % i for i in range(20000))
    pid = os.fork()
    if pid == 0:
        os.close(read_end)
        os.write(write_end, data[: len(data) // 2])
        os.write(write_end, data[len(data) // 2 :])
        os._exit(0)
    os.close(write_end)
    write_bounded(read_end, path, 64 << 10)
    os.waitpid(pid, 0)
    rotated = path.with_name("server.log.1")
    assert path.stat().st_size <= 64 << 10 and rotated.stat().st_size == 64 << 10
    assert (rotated.read_bytes() + path.read_bytes()) == data[-(rotated.stat().st_size + path.stat().st_size) :]
    assert oct(path.stat().st_mode & 0o777) == "0o600"


def test_output_capture_keeps_draining_when_the_file_cannot_be_written(tmp_path):
    """A symlink in the file's place (or a full disk) must not block or kill the server."""
    path = tmp_path / "server.log"
    path.symlink_to(tmp_path / "elsewhere")
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read_end)
        for _ in range(64):
            os.write(write_end, b"x" * 65536)  # 4 MiB: blocks forever unless someone reads
        os._exit(0)
    os.close(write_end)
    write_bounded(read_end, path, 1 << 20)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0 and not (tmp_path / "elsewhere").exists()


def test_limit_defaults_from_config():
    from spawner.local.confinement import UserLimits

    assert UserLimits(memory_limit="8Gi", processes_max=100).defaults() == LimitDefaults(
        memory=8 << 30, cpu=None, processes=100, running_jobs=None
    )
    with pytest.raises(ValueError, match="memory_limit"):
        UserLimits(memory_limit="eight").defaults()
    assert V2 == "v2" and Profile("p", "P").mem_limit is None
