"""cgroups for one server or job: memory, CPU, process count and (v1) GPU device rules.

Three ways, chosen once per hub process (:func:`detect`):

- **cgroup v1** (these machines: ``memory``, ``cpu``, ``pids``, ``devices``
  hierarchies under ``/sys/fs/cgroup/<controller>``): one folder per workload in
  each hierarchy, ``memory.limit_in_bytes`` (and ``memory.memsw.limit_in_bytes``,
  so swap is no way out), ``cpu.cfs_quota_us``/``cpu.cfs_period_us``,
  ``pids.max``, ``devices.deny`` for the GPUs not placed for it
  (Documentation/admin-guide/cgroup-v1/{memory,pids,devices}.rst).
- **cgroup v2** (the unified hierarchy, when it holds the ``memory`` and ``pids``
  controllers): one folder, ``memory.max`` + ``memory.swap.max``, ``cpu.max``,
  ``pids.max``, with the controllers enabled in the parent's
  ``cgroup.subtree_control`` (Documentation/admin-guide/cgroup-v2.rst). Device
  rules on v2 need an eBPF program (``BPF_PROG_TYPE_CGROUP_DEVICE``), which
  gpulab does not load: :attr:`CgroupTree.devices` is false there and the hub
  says so (with systemd as PID 1, systemd's own program does it, below).
- **systemd** as PID 1: the hub does not write into systemd's tree (systemd
  owns it); the process starts under ``systemd-run --scope`` with
  ``MemoryMax=``, ``CPUQuota=``, ``TasksMax=`` and ``DeviceAllow=``
  (:func:`systemd_scope_argv`).

A workload's processes join its cgroup in the child, before ``exec``: the first
instruction of user code already runs confined. :func:`join_cgroup` does that
(a root hub: in the child it forks; a hub that is not root: in the child that
becomes ``sudo``, which may move itself into a cgroup the hub's account owns).

Plain Python on files (``os``); no tornado, no JupyterHub.
"""

from __future__ import annotations

import errno
import logging
import os
import re
import signal
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from spawner.core.limits import WorkloadLimits

log = logging.getLogger("gpulab.cgroups")

V1, V2, SYSTEMD = "v1", "v2", "systemd"
#: The v1 hierarchies gpulab writes to (``devices`` only when device rules are on).
V1_CONTROLLERS = ("memory", "cpu", "pids", "devices")
#: The v2 controllers gpulab enables for its workloads.
V2_CONTROLLERS = ("memory", "cpu", "pids")
#: CFS period for CPU limits, in microseconds (the kernel's default).
CPU_PERIOD_US = 100_000
#: A cgroup name: one path component, no dots at the start (never ``..``).
_NAME_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.@-]{0,127}$")


class CgroupError(RuntimeError):
    """A cgroup cannot be made, joined or removed; the message says what to fix."""


@dataclass(frozen=True)
class DeviceRule:
    """A character device a workload may not open: ``c <major>:<minor> rwm`` (v1 ``devices.deny``)."""

    major: int
    minor: int
    path: str = ""

    def v1(self) -> str:
        return f"c {self.major}:{self.minor} rwm"


class CgroupFS:
    """The cgroup file system, as the kernel serves it: interface files appear with each folder.

    Every read and write of gpulab's cgroup code goes through one of these, so the
    tests can run the v2 code against a stand-in that follows cgroup-v2.rst on a
    machine without a v2 memory controller (``tests/support/cgroup2_fake.py``).
    """

    def mkdir(self, path: Path) -> None:
        path.mkdir()

    def rmdir(self, path: Path) -> None:
        path.rmdir()

    def exists(self, path: Path) -> bool:
        return path.exists()

    def read(self, path: Path) -> str:
        try:
            return path.read_text()
        except OSError:
            return ""

    def write(self, path: Path, value: str) -> None:
        """Write an interface file (it exists: never created here)."""
        fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC)
        try:
            os.write(fd, value.encode())
        finally:
            os.close(fd)

    def folders(self, path: Path) -> list[str]:
        try:
            return [e.name for e in os.scandir(path) if e.is_dir(follow_symlinks=False)]
        except OSError:
            return []

    def pids(self, procs_file: Path) -> list[int]:
        return [int(x) for x in self.read(procs_file).split() if x.isdigit()]


KERNEL = CgroupFS()


@dataclass
class Cgroup:
    """One workload's cgroup: a folder per hierarchy (v1) or one folder (v2)."""

    name: str
    version: str
    #: The folders, one per v1 controller (``{"": folder}`` on v2).
    folders: dict[str, Path]
    devices: bool = False
    fs: CgroupFS = KERNEL

    @property
    def procs_files(self) -> list[str]:
        """Where a process writes its pid to join (every hierarchy)."""
        return [str(f / "cgroup.procs") for f in self.folders.values()]

    def pids(self) -> list[int]:
        seen: set[int] = set()
        for f in self.folders.values():
            seen.update(self.fs.pids(f / "cgroup.procs"))
        return sorted(seen)

    def oom_kills(self) -> int:
        """Processes the kernel's OOM killer ended inside this cgroup (v1 ``memory.oom_control``, v2 ``memory.events``)."""
        folder = self.folders.get("memory") or self.folders.get("")
        if folder is None:
            return 0
        name = "memory.oom_control" if self.version == V1 else "memory.events"
        for line in self.fs.read(folder / name).splitlines():
            key, _, value = line.partition(" ")
            if key == "oom_kill" and value.strip().isdigit():
                return int(value)
        return 0

    def kill_all(self, rounds: int = 50) -> None:
        """SIGKILL every process in it (root: a stopped server's leftovers, a fork bomb).

        v2 has ``cgroup.kill`` (5.14+); v1 has none, so kill what is listed until the
        list stays empty (``pids.max`` bounds how many there can be).
        """
        kill_file = self.folders.get("", Path("/nonexistent")) / "cgroup.kill"
        if self.version == V2 and self.fs.exists(kill_file):
            try:
                self.fs.write(kill_file, "1")
            except OSError as e:
                log.warning("gpulab: cannot kill cgroup %s: %s", self.name, e)
        for _ in range(rounds):
            pids = self.pids()
            if not pids:
                return
            refused = 0
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                except PermissionError:
                    refused += 1
            if refused == len(pids):
                return  # not ours to kill (a hub that is not root): they stay
            time.sleep(0.02)

    def remove(self) -> bool:
        """Remove its folders (deepest first); ``False`` while processes are still in it."""
        gone = True
        for folder in self.folders.values():
            try:
                self.fs.rmdir(folder)
            except FileNotFoundError:
                pass
            except OSError as e:
                if e.errno not in (errno.EBUSY, errno.ENOTEMPTY):
                    log.warning("gpulab: cannot remove cgroup %s: %s", folder, e)
                gone = False
        return gone


@dataclass
class CgroupTree:
    """Where this hub makes its workloads' cgroups, and how (v1 or v2)."""

    version: str
    #: The parent folder of the workloads' cgroups per v1 controller (``{"": parent}`` on v2).
    parents: dict[str, Path]
    #: Can this tree take device rules (v1 with the ``devices`` hierarchy, as root)?
    devices: bool = False
    #: v2: controllers enabled for the children (filled by :meth:`prepare`).
    enabled: tuple[str, ...] = field(default_factory=tuple)
    #: v2: the hub's own cgroup when the parent lies below it (controllers are enabled from there).
    own: Path | None = None
    #: v2: where the processes of a cgroup on the way go, so that it may pass controllers down.
    hub_leaf: str = "hub"
    fs: CgroupFS = KERNEL

    def describe(self) -> str:
        where = ", ".join(str(p) for p in self.parents.values())
        if self.version == V1:
            controllers = [c for c in self.parents if c != "devices" or self.devices]
            return f"cgroup v1 ({', '.join(controllers)}) under {where}"
        return f"cgroup v2 ({', '.join(self.enabled or V2_CONTROLLERS)}) under {where}"

    def prepare(self) -> None:
        """Make the parent folders; on v2 enable the controllers down to the children."""
        for parent in self.parents.values():
            try:
                missing = [p for p in [parent, *parent.parents] if not self.fs.exists(p)]
                for folder in reversed(missing):
                    self.fs.mkdir(folder)
            except OSError as e:
                raise CgroupError(f"cannot create the cgroup folder {parent}: {e}") from None
        if self.version == V2:
            parent = self.parents[""]
            chain = [parent]
            if self.own is not None:  # under the hub's own cgroup: from there down
                chain = [self.own, *[p for p in reversed(parent.parents) if self.own in p.parents], parent]
            for folder in chain:
                self.enabled = enable_v2_controllers(folder, self.hub_leaf, self.fs)
            absent = [c for c in ("memory", "pids") if c not in self.enabled]
            if absent:
                raise CgroupError(
                    f"the {', '.join(absent)} controller is not passed down to {parent}: enable it in the "
                    "cgroup.subtree_control of every folder above (systemd: Delegate=yes on the hub's unit)"
                )

    def cgroup(self, name: str) -> Cgroup:
        """The cgroup ``name`` (made or not)."""
        if not _NAME_RE.match(name):
            raise CgroupError(f"invalid cgroup name {name!r}")
        folders = {c: p / name for c, p in self.parents.items()}
        return Cgroup(name, self.version, folders, devices=self.devices, fs=self.fs)

    def create(self, name: str, limits: WorkloadLimits, deny: Sequence[DeviceRule] = ()) -> Cgroup:
        """Make (or reuse) the cgroup ``name`` and write its limits.

        A folder left by an earlier run of the same workload is reused: its
        leftover processes are killed first (a root hub; the workload had stopped).
        """
        group = self.cgroup(name)
        if any(self.fs.exists(f) for f in group.folders.values()) and group.pids():
            group.kill_all()
        for folder in group.folders.values():
            try:
                if not self.fs.exists(folder):
                    self.fs.mkdir(folder)
            except OSError as e:
                raise CgroupError(f"cannot create the cgroup {folder}: {e}") from None
        try:
            if self.version == V1:
                _write_v1_limits(self.fs, group, limits, deny if self.devices else ())
            else:
                _write_v2_limits(self.fs, group.folders[""], limits, self.enabled)
        except OSError as e:
            group.remove()
            raise CgroupError(f"cannot set the limits of cgroup {name}: {e}") from None
        return group

    def leftovers(self) -> list[Cgroup]:
        """Cgroups under the parents (a hub restart finds those of the last run)."""
        names: set[str] = set()
        for parent in self.parents.values():
            names.update(n for n in self.fs.folders(parent) if _NAME_RE.match(n) and n != self.hub_leaf)
        return [self.cgroup(n) for n in sorted(names)]


def _write_v1_limits(fs: CgroupFS, group: Cgroup, limits: WorkloadLimits, deny: Sequence[DeviceRule]) -> None:
    memory = group.folders.get("memory")
    if memory is not None:
        value = str(limits.memory) if limits.memory is not None else "-1"
        # memsw (memory + swap) must stay >= the memory limit: lower it last, raise it first.
        memsw = memory / "memory.memsw.limit_in_bytes"
        if fs.exists(memsw) and limits.memory is None:
            fs.write(memsw, value)
        fs.write(memory / "memory.limit_in_bytes", value)
        if fs.exists(memsw) and limits.memory is not None:
            fs.write(memsw, value)
    cpu = group.folders.get("cpu")
    if cpu is not None:
        fs.write(cpu / "cpu.cfs_period_us", str(CPU_PERIOD_US))
        quota = int(limits.cpu * CPU_PERIOD_US) if limits.cpu is not None else -1
        fs.write(cpu / "cpu.cfs_quota_us", str(max(quota, 1000) if quota != -1 else -1))
    pids = group.folders.get("pids")
    if pids is not None:
        fs.write(pids / "pids.max", str(limits.processes) if limits.processes is not None else "max")
    devices = group.folders.get("devices")
    if devices is not None and group.devices:
        for rule in deny:
            fs.write(devices / "devices.deny", rule.v1())


def _write_v2_limits(fs: CgroupFS, folder: Path, limits: WorkloadLimits, enabled: Sequence[str]) -> None:
    if "memory" in enabled:
        fs.write(folder / "memory.max", str(limits.memory) if limits.memory is not None else "max")
        swap = folder / "memory.swap.max"
        if fs.exists(swap):  # no swap accounting without CONFIG_MEMCG_SWAP: nothing to close then
            fs.write(swap, "0" if limits.memory is not None else "max")
    if "cpu" in enabled:
        quota = f"{max(int(limits.cpu * CPU_PERIOD_US), 1000)}" if limits.cpu is not None else "max"
        fs.write(folder / "cpu.max", f"{quota} {CPU_PERIOD_US}")
    if "pids" in enabled:
        fs.write(folder / "pids.max", str(limits.processes) if limits.processes is not None else "max")


def enable_v2_controllers(folder: Path, leaf_for_processes: str = "hub", fs: CgroupFS = KERNEL) -> tuple[str, ...]:
    """Enable memory, cpu and pids for ``folder``'s children; the ones enabled.

    A controller can be enabled only where the parent passes it down
    (``cgroup.controllers``), and -- the "no internal processes" rule -- only in
    a cgroup without processes of its own (cgroup-v2.rst, "Top-down Constraint"
    and "No Internal Process Constraint"). When ``folder`` holds processes (the
    hub's own cgroup, systemd's ``Delegate=yes`` unit), they first move to a leaf
    child ``leaf_for_processes``, as cgroup-v2.rst's "Delegation" expects of a
    delegatee.
    """
    available = fs.read(folder / "cgroup.controllers").split()
    enabled = fs.read(folder / "cgroup.subtree_control").split()
    wanted = [c for c in V2_CONTROLLERS if c in available and c not in enabled]
    if wanted:
        request = " ".join(f"+{c}" for c in wanted)
        try:
            fs.write(folder / "cgroup.subtree_control", request)
        except OSError as e:
            if e.errno != errno.EBUSY or not fs.pids(folder / "cgroup.procs"):
                raise CgroupError(
                    f"cannot enable {', '.join(wanted)} in {folder}/cgroup.subtree_control: {e}"
                ) from None
            leaf = folder / leaf_for_processes
            try:
                if not fs.exists(leaf):
                    fs.mkdir(leaf)
                for pid in fs.pids(folder / "cgroup.procs"):
                    try:
                        fs.write(leaf / "cgroup.procs", str(pid))
                    except ProcessLookupError:
                        pass
                fs.write(folder / "cgroup.subtree_control", request)
            except OSError as e2:
                raise CgroupError(
                    f"cannot enable {', '.join(wanted)} in {folder}: it holds processes and moving them "
                    f"to {leaf} failed: {e2}"
                ) from None
            log.info("gpulab: moved the processes of %s to %s to enable %s for its children", folder, leaf, request)
    enabled = fs.read(folder / "cgroup.subtree_control").split()
    return tuple(c for c in V2_CONTROLLERS if c in enabled)


def join_cgroup(procs_files: Sequence[str]) -> None:
    """Move the calling process into a cgroup (one ``cgroup.procs`` per hierarchy).

    Runs in a freshly forked child before ``exec`` (``preexec_fn``): only ``os``
    calls, no logging, no locks.
    """
    pid = str(os.getpid()).encode()
    for path in procs_files:
        fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC)
        try:
            os.write(fd, pid)
        finally:
            os.close(fd)


# -- finding the hierarchies ---------------------------------------------------------


@dataclass(frozen=True)
class Mounts:
    """The cgroup file systems this process sees, and its own place in each."""

    #: v1: controller -> mount point (only hierarchies with one of gpulab's controllers).
    v1: dict[str, Path]
    #: The v2 (unified) mount point, if any, and the controllers its root offers.
    v2: Path | None
    v2_controllers: tuple[str, ...]
    #: controller -> this process's cgroup (``""`` for v2), from /proc/self/cgroup.
    own: dict[str, str]
    #: PID 1 is systemd.
    systemd: bool


def read_mounts(mountinfo: str, self_cgroup: str, pid1_comm: str = "") -> Mounts:
    """Parse ``/proc/self/mountinfo`` and ``/proc/self/cgroup`` (proc(5))."""
    v1: dict[str, Path] = {}
    v2: Path | None = None
    for line in mountinfo.splitlines():
        left, _, right = line.partition(" - ")
        fields, rfields = left.split(), right.split()
        if len(fields) < 5 or len(rfields) < 3:
            continue
        point, fstype, options = Path(fields[4]), rfields[0], rfields[2].split(",")
        if fstype == "cgroup2":
            v2 = point
        elif fstype == "cgroup":
            for c in V1_CONTROLLERS:
                if c in options and c not in v1:
                    v1[c] = point
    own: dict[str, str] = {}
    for line in self_cgroup.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        _, names, path = parts
        if names == "":
            own[""] = path
        for c in names.split(","):
            if c in V1_CONTROLLERS:
                own[c] = path
    controllers: tuple[str, ...] = ()
    if v2 is not None:
        controllers = tuple(KERNEL.read(v2 / "cgroup.controllers").split())
    return Mounts(v1, v2, controllers, own, pid1_comm.strip() == "systemd")


def this_machine() -> Mounts:
    """The cgroup mounts of this machine, as this process sees them."""
    return read_mounts(*(KERNEL.read(Path(f)) for f in ("/proc/self/mountinfo", "/proc/self/cgroup", "/proc/1/comm")))


def choose_tree(mounts: Mounts, parent: str, devices: bool, hub_leaf: str = "hub") -> CgroupTree | None:
    """The tree gpulab's workloads get, or ``None`` when this machine has no usable one.

    v2 when the unified hierarchy holds the memory and pids controllers (a
    "hybrid" machine whose v2 tree holds only hugetlb uses v1); else v1 when the
    memory hierarchy is mounted. ``parent``: an absolute path inside each
    hierarchy (an admin's delegated subtree), or a relative one, put under this
    process's own cgroup there (the default ``gpulab``). ``devices``: add the v1
    devices hierarchy for GPU device rules.
    """

    def place(root: Path, own: str) -> Path:
        inside = parent if parent.startswith("/") else f"{own.rstrip('/')}/{parent}"
        return root / inside.lstrip("/")

    if mounts.v2 is not None and {"memory", "pids"} <= set(mounts.v2_controllers):
        own = mounts.own.get("", "/")
        if own.rstrip("/").endswith("/" + hub_leaf):  # moved there by an earlier run: its parent is ours
            own = own.rstrip("/")[: -len(hub_leaf) - 1] or "/"
        under_own = None if parent.startswith("/") else mounts.v2 / own.lstrip("/")
        return CgroupTree(V2, {"": place(mounts.v2, own)}, own=under_own, hub_leaf=hub_leaf)
    if "memory" in mounts.v1:
        wanted = [c for c in V1_CONTROLLERS if c in mounts.v1 and (c != "devices" or devices)]
        parents = {c: place(mounts.v1[c], mounts.own.get(c, "/")) for c in wanted}
        return CgroupTree(V1, parents, devices="devices" in parents)
    return None


# -- systemd ------------------------------------------------------------------------


def systemd_scope_argv(
    unit: str,
    limits: WorkloadLimits,
    *,
    slice_name: str = "",
    device_allow: Sequence[str] | None = None,
    systemd_run: str = "systemd-run",
) -> list[str]:
    """``systemd-run --scope`` with the workload's limits; the command follows.

    systemd-run (as root) registers a transient scope holding its own pid, then
    ``exec``s the command in it (systemd-run(1), "--scope"); the properties are
    systemd.resource-control(5)'s. ``device_allow``: an allow-list
    (``DevicePolicy=closed`` keeps the standard pseudo devices; each entry is a
    ``DeviceAllow=`` value such as ``/dev/nvidia0 rw`` or ``char-pts rw``);
    ``None``: no device rules.
    """
    argv = [systemd_run, "--scope", "--quiet", "--collect", f"--unit={unit}"]
    if slice_name:
        argv.append(f"--slice={slice_name}")
    if limits.memory is not None:
        argv += ["-p", f"MemoryMax={limits.memory}", "-p", "MemorySwapMax=0"]
    if limits.cpu is not None:
        argv += ["-p", f"CPUQuota={max(int(round(limits.cpu * 100)), 1)}%"]
    if limits.processes is not None:
        argv += ["-p", f"TasksMax={limits.processes}"]
    if device_allow is not None:
        argv += ["-p", "DevicePolicy=closed"]
        for entry in device_allow:
            argv += ["-p", f"DeviceAllow={entry}"]
    return [*argv, "--"]
