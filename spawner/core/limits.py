"""What one server or job may use on a single server: memory, CPU, processes, running jobs.

The profile says what a workload of it needs (``memory.limit``, ``cpu.limit``, as
KubeSpawner's ``mem_limit`` / ``cpu_limit``); the team caps what each of its
members' workloads may take (``limits`` in the catalog); the hub's defaults
(``c.UserLimits``) fill what neither says. The adapters enforce the result with
cgroups (:mod:`spawner.local.cgroups`) and the job queue. Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .model import Profile, Team, TeamLimits
from .units import format_memory, parse_cpu, parse_memory

#: The keys of a team's ``limits`` mapping in the catalog.
TEAM_LIMIT_KEYS = {"memory", "cpu", "processes", "running_jobs"}
#: Fewest tasks a server or job may be held to: a JupyterLab server and one kernel use ~60.
MIN_PROCESSES = 32
#: Least memory a server or job may be held to (its interpreter alone needs more).
MIN_MEMORY = 32 << 20


@dataclass(frozen=True)
class LimitDefaults:
    """The hub's defaults, for what neither the profile nor the team says."""

    memory: int | None = None
    cpu: float | None = None
    processes: int | None = 4096
    running_jobs: int | None = 4


@dataclass(frozen=True)
class WorkloadLimits:
    """The limits one server or job runs under (``None``: not limited)."""

    memory: int | None = None  # bytes
    cpu: float | None = None  # cores
    processes: int | None = None  # tasks: processes and threads

    @property
    def empty(self) -> bool:
        return self.memory is None and self.cpu is None and self.processes is None

    def words(self) -> str:
        """ "memory 4Gi, 2 CPUs, 1024 processes" (the log and the progress page)."""
        parts = [
            f"memory {format_memory(self.memory)}" if self.memory is not None else "memory not limited",
            f"{self.cpu:g} CPUs" if self.cpu is not None else "CPU not limited",
            f"{self.processes} processes" if self.processes is not None else "processes not limited",
        ]
        return ", ".join(parts)


def _capped(wanted: Any, cap: Any) -> Any:
    if cap is None:
        return wanted
    return cap if wanted is None else min(wanted, cap)


def workload_limits(profile: Profile, team: Team | None, defaults: LimitDefaults) -> WorkloadLimits:
    """The limits of one server or job of ``profile`` in ``team``.

    The profile's limit, else the hub's default; never above the team's cap.
    """
    caps = team.limits if team is not None else TeamLimits()
    memory = profile.mem_limit if profile.mem_limit is not None else defaults.memory
    cpu = profile.cpu_limit if profile.cpu_limit is not None else defaults.cpu
    return WorkloadLimits(
        memory=_capped(memory, caps.memory),
        cpu=_capped(cpu, caps.cpu),
        processes=_capped(defaults.processes, caps.processes),
    )


def running_jobs_cap(team: Team | None, defaults: LimitDefaults) -> int | None:
    """Most jobs one member of ``team`` runs at once (``None``: no cap)."""
    if team is not None and team.limits.running_jobs is not None:
        return team.limits.running_jobs
    return defaults.running_jobs


def running_jobs_reason(user: str, running: int, cap: int, team: Team | None) -> str:
    """Why a job waits: "waiting: alice already runs 2 jobs, the most one member of team vision may run at once"."""
    whose = f"one member of team {team.name}" if team is not None and team.limits.running_jobs is not None else "a user"
    jobs = "job" if running == 1 else "jobs"
    return f"waiting: {user} already runs {running} {jobs}, the most {whose} may run at once"


def read_team_limits(
    value: Any,
    mapping: Callable[[Any], dict[str, Any] | None],
    convert: Callable[[Callable[[Any], Any], Any, str], Any],
    error: Callable[[str, str], None],
) -> TeamLimits:
    """A team's ``limits`` mapping from the catalog: ``memory``, ``cpu``, ``processes``, ``running_jobs``.

    ``mapping(value)`` checks the keys, ``convert(fn, value, key)`` and ``error(key,
    message)`` report a problem at the key (the catalog reader's, with file lines).
    """
    if value is None:
        return TeamLimits()
    d = mapping(value)
    if d is None:
        return TeamLimits()
    memory = convert(parse_memory, d["memory"], "memory") if d.get("memory") is not None else None
    if memory is not None and memory < MIN_MEMORY:
        error("memory", f"a memory limit below {format_memory(MIN_MEMORY)} leaves no room for a Python interpreter")
    cpu = convert(parse_cpu, d["cpu"], "cpu") if d.get("cpu") is not None else None
    if cpu is not None and cpu <= 0:
        error("cpu", "a CPU limit must be above 0")
    counts: dict[str, int | None] = {}
    for key, least in (("processes", MIN_PROCESSES), ("running_jobs", 1)):
        raw = d.get(key)
        if raw is None:
            counts[key] = None
        elif isinstance(raw, bool) or not isinstance(raw, int) or raw < least or raw > 1_000_000:
            error(key, f"expected a whole number from {least} to 1000000, got {raw!r}")
            counts[key] = None
        else:
            counts[key] = raw
    return TeamLimits(memory=memory, cpu=cpu, processes=counts["processes"], running_jobs=counts["running_jobs"])


def team_limits_to_dict(limits: TeamLimits) -> dict[str, Any]:
    """The catalog's ``limits`` mapping for ``limits`` (round-trips through :func:`read_team_limits`)."""
    d: dict[str, Any] = {}
    if limits.memory is not None:
        d["memory"] = format_memory(limits.memory)
    if limits.cpu is not None:
        d["cpu"] = limits.cpu
    if limits.processes is not None:
        d["processes"] = limits.processes
    if limits.running_jobs is not None:
        d["running_jobs"] = limits.running_jobs
    return d
