"""Confining each user's servers and jobs on one server: ``c.UserLimits``.

Every server and notebook job of a user runs in a cgroup of its own
(:mod:`spawner.local.cgroups`) with the memory, CPU and process limits of its profile
and team (:mod:`spawner.core.limits`), may open only the GPU device nodes placed for
it (:mod:`spawner.local.devices`), and gets a private ``/tmp`` and ``/dev/shm``
(:mod:`spawner.local.namespaces`). Its processes enter all of that in the child,
before ``exec``: no user code ever runs outside it.

How, by the hub's isolation mode:

- **root**, no systemd as PID 1: the cgroup files directly (v1 or v2), under
  the hub's own cgroup (``<own>/gpulab/<workload>``); the child joins its cgroup,
  unshares its mount namespace, then switches to the user's uid.
- **root**, systemd as PID 1: ``systemd-run --scope`` with the limits as
  properties, then ``setpriv`` to the user (systemd owns the cgroup tree there).
- **sudo** (the hub is not root): in a cgroup subtree the admin delegated to
  the hub's account at install time (``c.UserLimits.cgroup_parent``, checked at
  start): the child that becomes ``sudo`` moves itself into the workload's
  cgroup, so the mediator and everything it starts run inside. Device rules
  need ``CAP_SYS_ADMIN`` (v1 ``devices.deny``) or ``CAP_BPF`` (v2), which a hub
  that is not root does not have: GPU device isolation is off in sudo mode, and
  the hub says so. The private ``/tmp`` is made by the mediator, as the user, in
  a user namespace (refused on kernels that forbid unprivileged ones: then off,
  and said).
- **not isolated**: nothing (everything runs as the hub's account anyway).

Plain Python: no tornado, no JupyterHub.
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from traitlets import Bool, CaselessStrEnum, Float, Int, List, Unicode
from traitlets.config import Configurable

from spawner.core.limits import LimitDefaults, WorkloadLimits
from spawner.core.units import UnitError, parse_memory

from .accounts import Account
from .cgroups import V1, Cgroup, CgroupError, CgroupTree, choose_tree, join_cgroup, systemd_scope_argv, this_machine
from .devices import allow_entries, deny_rules, nvidia_nodes
from .namespaces import GPULAB_IMPORT_ROOT, private_tmp
from .output_capture import DEFAULT_MAX_BYTES, capture_argv
from .sudo import NONE, ROOT, SUDO

log = logging.getLogger("gpulab.limits")


class LimitsUnavailable(RuntimeError):
    """``c.UserLimits.enabled = "on"`` but this hub cannot confine workloads; the message says why."""


class UserLimits(Configurable):
    """How each user's servers and jobs are confined on one server (``c.UserLimits.*``)."""

    enabled = CaselessStrEnum(
        ["auto", "on", "off"],
        "auto",
        config=True,
        help="""Confine every server and job: cgroup limits, GPU device rules, a private /tmp.
        `auto`: wherever this hub can (root, or sudo with a delegated cgroup subtree), and the
        hub says at start what is on and what is off and why. `on`: refuse to start unless
        cgroup limits can be applied. `off`: none of it.""",
    )
    cgroup_parent = Unicode(
        "gpulab",
        config=True,
        help="""Where the workloads' cgroups go, in every cgroup hierarchy. A relative path is
        put below the hub's own cgroup (`<hub's cgroup>/gpulab/<workload>`); an absolute one is
        taken from each hierarchy's root (`/gpulab` is `/sys/fs/cgroup/memory/gpulab`, ...). A hub
        that is not root needs an absolute folder the admin created and gave to the hub's
        account (docs/single-server.md#limits-in-sudo-mode).""",
    )
    memory_limit = Unicode(
        "",
        config=True,
        help="""Memory of a server or job whose profile and team name none, e.g. `"8G"`.
        Empty: not limited (the hub's start-up log names such profiles).""",
    )
    cpu_limit = Float(
        None,
        allow_none=True,
        config=True,
        help="CPU cores of a server or job whose profile and team name none (`None`: not limited).",
    )
    processes_max = Int(
        4096,
        config=True,
        help="""Most tasks (processes and threads) in one server or job (`pids.max`, `TasksMax=`),
        unless its team's `limits.processes` is lower. Stops a fork bomb inside its own
        workload. A JupyterLab server with a few kernels uses about 100.""",
    )
    private_tmp = Bool(
        True,
        config=True,
        help="""Give every server and job an empty, private /tmp and /dev/shm (a mount namespace
        with a tmpfs on each, gone with its last process), so no user sees another's files there.""",
    )
    tmp_size = Unicode(
        "",
        config=True,
        help="""Cap of each private tmpfs (/tmp, /dev/shm), e.g. `"2G"`. Empty: the workload's
        memory limit (tmpfs pages count against it anyway), else the kernel's default (half the RAM).""",
    )
    gpu_device_isolation = Bool(
        True,
        config=True,
        help="""Let a server or job open only the GPU device nodes (`/dev/nvidiaN`) placed for it:
        the devices cgroup (v1) or systemd's DeviceAllow=. The control nodes (`/dev/nvidiactl`,
        `/dev/nvidia-uvm`, ...) stay as the driver sets them.""",
    )
    device_dir = Unicode(
        "/dev",
        config=True,
        help="Folder holding the GPU device nodes (`nvidia0`, `nvidia1`, ...); tests point it elsewhere.",
    )
    server_output_max_bytes = Int(
        DEFAULT_MAX_BYTES,
        config=True,
        help="""A server's output (its and its kernels' stdout and stderr) goes to
        `~/.gpulab/logs/server[-<name>].log` in the user's home (0600), not to the hub's log;
        at this size it is rotated to `.log.1`, so at most twice this is kept.""",
    )
    systemd = CaselessStrEnum(
        ["auto", "yes", "no"],
        "auto",
        config=True,
        help="""Start a root hub's workloads under `systemd-run --scope` (`auto`: when PID 1 is
        systemd, which then owns the cgroup tree). `no`: write the cgroup files directly.""",
    )
    systemd_slice = Unicode("gpulab.slice", config=True, help="The systemd slice of the workloads' scopes.")
    systemd_device_allow = List(
        Unicode(),
        ["char-pts rw"],
        config=True,
        help="""With systemd, device rules are an allow-list (`DevicePolicy=closed`: the standard
        pseudo devices, the placed GPUs, the NVIDIA control nodes, and these `DeviceAllow=` entries;
        `char-pts` for terminals). Add what your users need, e.g. `"/dev/fuse rw"`.""",
    )

    def defaults(self) -> LimitDefaults:
        """The hub's defaults for what profiles and teams leave open (running jobs: ``c.GPULabJobs``)."""
        try:
            memory = parse_memory(self.memory_limit) if self.memory_limit else None
        except UnitError as e:
            raise ValueError(f"c.UserLimits.memory_limit: {e}") from None
        return LimitDefaults(memory=memory, cpu=self.cpu_limit, processes=self.processes_max, running_jobs=None)


@dataclass
class Confinement:
    """What one workload runs in: a cgroup (or a systemd scope), device rules, a private /tmp."""

    name: str
    limits: WorkloadLimits
    cgroup: Cgroup | None = None
    #: Command words before the workload's command (systemd-run ... setpriv ...).
    argv_prefix: list[str] = field(default_factory=list)
    #: The size cap of its private /tmp and /dev/shm, or ``None`` for no private /tmp.
    tmp_size: int | None = None
    private_tmp: bool = False
    #: Folders under /tmp to keep visible (the home, when it lies there).
    keep: tuple[str, ...] = ()
    #: The systemd scope unit, when systemd-run starts it.
    unit: str = ""
    words: str = ""

    @property
    def join_files(self) -> list[str]:
        return self.cgroup.procs_files if self.cgroup is not None else []

    def root_preexec(self, account: Account | None, chdir: str | None = None) -> Callable[[], None]:
        """``preexec_fn`` for a root hub's child: join the cgroup, private /tmp, then become ``account``.

        With systemd, ``setpriv`` (in :attr:`argv_prefix`) switches user after
        systemd-run made the scope, so the child stays root here.
        """
        join = self.join_files
        tmp, size, keep = self.private_tmp, self.tmp_size, self.keep
        switch = account is not None and not self.unit

        def preexec() -> None:
            if join:
                join_cgroup(join)
            if tmp:
                private_tmp(size, keep)
            if switch and account is not None:
                os.setgroups(list(account.groups))
                os.setgid(account.gid)
                os.setuid(account.uid)
            if chdir:
                try:
                    os.chdir(chdir)
                except OSError:
                    pass

        return preexec

    def sudo_preexec(self) -> Callable[[], None] | None:
        """``preexec_fn`` for the child that becomes ``sudo``: it joins the workload's cgroup."""
        join = self.join_files
        if not join:
            return None
        return lambda: join_cgroup(join)

    def mediator_request(self) -> dict[str, Any]:
        """What the mediator must set up itself, as the user (a private /tmp)."""
        return {"private_tmp": {"size": self.tmp_size}} if self.private_tmp else {}


@dataclass
class LimitsStatus:
    """What this hub enforces, for the start-up log and ``check-isolation``."""

    cgroups: str = ""  # "" = off
    devices: str = ""
    private_tmp: str = ""
    off: list[str] = field(default_factory=list)

    def lines(self) -> list[str]:
        out = [
            f"limits: {self.cgroups or 'off'}",
            f"GPU device isolation: {self.devices or 'off'}",
            f"private /tmp and /dev/shm: {self.private_tmp or 'off'}",
        ]
        return out + [f"{what} is off: {why}" for what, why in (o.split(": ", 1) for o in self.off)]


class Confiner:
    """The hub process's one way to confine workloads, chosen once (:func:`get_confiner`)."""

    def __init__(self, settings: UserLimits, mode: str):
        self.settings = settings
        self.mode = mode
        self.lock = threading.Lock()
        self.tree: CgroupTree | None = None
        self.systemd = False
        self.status = LimitsStatus()
        self._choose()

    # -- choosing, once ------------------------------------------------------------

    def _choose(self) -> None:
        s, status = self.settings, self.status
        if s.enabled == "off" or self.mode == NONE:
            status.off.append(
                "limits: "
                + ("c.UserLimits.enabled is off" if s.enabled == "off" else "users are not isolated (no root, no sudo)")
            )
            return
        mounts = this_machine()
        use_systemd = self.mode == ROOT and (s.systemd == "yes" or (s.systemd == "auto" and mounts.systemd))
        if use_systemd:
            if shutil.which("systemd-run") is None or shutil.which("setpriv") is None:
                raise LimitsUnavailable("systemd is PID 1 but systemd-run or setpriv is missing (util-linux)")
            self.systemd = True
            status.cgroups = f"systemd-run --scope in {s.systemd_slice} (MemoryMax=, CPUQuota=, TasksMax=)"
            if s.gpu_device_isolation:
                status.devices = "systemd DeviceAllow= (an allow-list: c.UserLimits.systemd_device_allow)"
        else:
            self._choose_tree(mounts)
        self._choose_tmp()
        if s.enabled == "on" and not status.cgroups:
            why = "; ".join(o.split(": ", 1)[1] for o in status.off if o.startswith("limits: "))
            raise LimitsUnavailable(f"c.UserLimits.enabled is on but no cgroup limits can be applied: {why}")

    def _choose_tree(self, mounts: Any) -> None:
        s, status = self.settings, self.status
        parent = s.cgroup_parent
        tree = choose_tree(mounts, parent, devices=s.gpu_device_isolation and self.mode == ROOT)
        if tree is None:
            status.off.append(
                "limits: this machine has no cgroup v1 memory hierarchy and no cgroup v2 memory controller"
            )
            return
        try:
            tree.prepare()
        except CgroupError as e:
            status.off.append(
                f"limits: {e}" + (" (is the subtree delegated to the hub's account?)" if self.mode == SUDO else "")
            )
            return
        self.tree = tree
        status.cgroups = tree.describe()
        if s.gpu_device_isolation:
            if tree.devices:
                status.devices = "devices cgroup (v1 devices.deny for the GPUs not placed)"
            elif self.mode == SUDO:
                status.off.append(
                    "GPU device isolation: a hub that is not root cannot write device rules "
                    "(v1 devices.deny needs CAP_SYS_ADMIN, a v2 device program CAP_BPF); CUDA_VISIBLE_DEVICES "
                    "is a budget, not a wall: run the hub as root to isolate GPUs"
                )
            elif tree.version != V1:
                status.off.append(
                    "GPU device isolation: cgroup v2 controls devices with an eBPF program, which gpulab does "
                    "not load; with systemd as PID 1 it uses systemd's DeviceAllow= instead"
                )
            else:
                status.off.append("GPU device isolation: the v1 devices hierarchy is not mounted")

    def _choose_tmp(self) -> None:
        s, status = self.settings, self.status
        if not s.private_tmp:
            status.off.append("private /tmp: c.UserLimits.private_tmp is off")
        elif self.mode == ROOT:
            status.private_tmp = "a mount namespace per server and job, tmpfs on /tmp and /dev/shm"
        else:
            problem = probe_user_namespace()
            if problem:
                status.off.append(f"private /tmp: the mediator cannot make one as the user: {problem}")
            else:
                status.private_tmp = "a user and mount namespace per server and job, made by the mediator as the user"

    # -- per workload -------------------------------------------------------------------

    @property
    def active(self) -> bool:
        return self.tree is not None or self.systemd

    def prepare(
        self,
        name: str,
        account: Account,
        limits: WorkloadLimits,
        placed_gpus: set[int],
        home: str | Path,
        keep: tuple[str | Path, ...] = (),
    ) -> Confinement:
        """Make the cgroup (or the scope's command line) of workload ``name``; raises :class:`CgroupError`.

        ``home`` and ``keep`` (folders the workload needs, such as a job's status
        folder) stay reachable should they lie under /tmp, as does gpulab's Python.
        """
        s = self.settings
        c = Confinement(name, limits)
        c.private_tmp = bool(self.status.private_tmp)
        c.tmp_size = parse_memory(s.tmp_size) if s.tmp_size else limits.memory
        c.keep = tuple(dict.fromkeys(os.path.realpath(p) for p in (home, *keep, sys.prefix, GPULAB_IMPORT_ROOT)))
        nodes = nvidia_nodes(s.device_dir) if self.status.devices else []
        if self.systemd:
            c.unit = f"gpulab-{name}-{os.urandom(3).hex()}"
            allow = allow_entries(nodes, placed_gpus, s.systemd_device_allow) if self.status.devices else None
            c.argv_prefix = systemd_scope_argv(c.unit, limits, slice_name=s.systemd_slice, device_allow=allow) + [
                shutil.which("setpriv") or "setpriv",
                f"--reuid={account.uid}",
                f"--regid={account.gid}",
                f"--groups={','.join(str(g) for g in account.groups)}",
                "--inh-caps=-all",
                "--",
            ]
        elif self.tree is not None:
            with self.lock:
                c.cgroup = self.tree.create(name, limits, deny_rules(nodes, placed_gpus))
        devices = f"; GPU nodes {sorted(placed_gpus)} only" if self.status.devices and nodes else ""
        c.words = f"{limits.words()}{devices}{'; private /tmp' if c.private_tmp else ''}"
        return c

    def release(self, name: str, kill: bool | None = None) -> bool:
        """Remove workload ``name``'s cgroup (killing what is left in it as root); whether it is gone."""
        if self.systemd or self.tree is None:
            return True
        group = self.tree.cgroup(name)
        if kill if kill is not None else self.mode == ROOT:
            group.kill_all()
        with self.lock:
            return group.remove()

    def oom_kills(self, name: str) -> int:
        return self.tree.cgroup(name).oom_kills() if self.tree is not None else 0

    def remove_leftovers(self, prefix: str) -> None:
        """Remove empty cgroups of accounts named ``prefix...`` that an earlier run left (busy ones stay)."""
        if self.tree is None:
            return
        with self.lock:
            for group in self.tree.leftovers():
                if group.name.startswith(prefix) and not group.pids():
                    group.remove()


def probe_user_namespace(timeout: float = 10) -> str:
    """Can an account that is not root make a user + mount namespace with a tmpfs? ``""`` or why not."""
    code = "from spawner.local.namespaces import private_tmp; private_tmp(1 << 20, user_namespace=True)"
    try:
        proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=timeout, cwd="/")
    except (OSError, subprocess.TimeoutExpired) as e:
        return str(e)
    if proc.returncode != 0:
        return (proc.stderr.strip().splitlines() or [f"exited with {proc.returncode}"])[-1][:300]
    return ""


_confiner: Confiner | None = None
_confiner_lock = threading.Lock()


def _key(settings: UserLimits) -> tuple[Any, ...]:
    return tuple(getattr(settings, name) for name in sorted(settings.trait_names(config=True)))


def get_confiner(settings: UserLimits, mode: str) -> Confiner:
    """The process's :class:`Confiner`, made (and logged) on first use, and again if the settings changed."""
    global _confiner
    with _confiner_lock:
        if _confiner is None or _confiner.mode != mode or _key(_confiner.settings) != _key(settings):
            _confiner = Confiner(settings, mode)
            for line in _confiner.status.lines():
                log.info("gpulab: %s", line)
        return _confiner


def set_confiner(confiner: Confiner | None) -> None:
    """Install (or clear) the process's confiner; for tests."""
    global _confiner
    with _confiner_lock:
        _confiner = confiner


def server_capture_argv(home: str | Path, server_name: str, max_bytes: int, python: str = sys.executable) -> list[str]:
    """The output capture in front of a server's command (its output into the user's own file)."""
    from .output_capture import server_log_path

    return capture_argv(python, server_log_path(home, server_name), max_bytes)


__all__ = [
    "Confinement",
    "Confiner",
    "LimitsStatus",
    "LimitsUnavailable",
    "UserLimits",
    "get_confiner",
    "probe_user_namespace",
    "server_capture_argv",
]
