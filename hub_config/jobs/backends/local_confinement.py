"""What confines a single-server job: its cgroup (the profile's and team's limits, its GPUs
only) and private /tmp, made before its runner starts and removed, with what is still in it,
after it ended; and what the cgroup says about an out-of-memory end."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from hub_config.jobs.backends.base import log
from hub_config.jobs.models import JobRecord
from spawner.core.limits import workload_limits
from spawner.core.model import Profile
from spawner.local.accounts import Account
from spawner.local.cgroups import CgroupError
from spawner.local.confinement import Confinement, Confiner, get_confiner
from spawner.local.devices import placed_minors
from spawner.local.sudo import ROOT, SUDO


class JobConfinement:
    """The confinement part of :class:`~hub_config.jobs.backends.local.LocalJobBackend`."""

    service: Any
    runtime: Any
    sudo: bool
    user_limits: Any
    packer: Any
    #: Where the runner of a job's attempt writes its exit status (its folder is kept writable).
    status_path: Callable[[JobRecord, int], Path]

    @property
    def confiner(self) -> Confiner:
        return get_confiner(self.user_limits, SUDO if self.sudo else ROOT)

    def cgroup_name(self, rec: JobRecord) -> str:
        return f"{self.service.accounts.name_for(rec.user)}.job-{rec.id}"

    def _oom_note(self, job_id: int) -> str:
        """ "; it reached its memory limit: ..." when the OOM killer ended processes in the job's cgroup."""
        rec = self.service.get_job(job_id)
        if rec is None or not self.service.owner_accounts:
            return ""
        kills = self.confiner.oom_kills(self.cgroup_name(rec))
        if not kills:
            return ""
        return f"; it reached its memory limit: the kernel ended {kills} of its processes (out of memory)"

    def _confine(
        self, rec: JobRecord, account: Account | None, shares: list[list[int]], home: Path
    ) -> Confinement | None:
        """The job's cgroup (profile's and team's limits, its GPUs only) and private /tmp; ``None`` without accounts."""
        if account is None:
            return None
        profile = self.runtime.catalog.profile(rec.profile)
        team = self.runtime.catalog.team(rec.team)
        # A profile edited away while the job waited: the defaults, under the team's cap.
        limits = workload_limits(profile or Profile(rec.profile, rec.profile), team, self.user_limits.defaults())
        gpus = placed_minors((int(i) for i, _ in shares), self.packer.devices)
        status_folder = self.status_path(rec, rec.attempts + 1).parent
        confinement = self.confiner.prepare(self.cgroup_name(rec), account, limits, gpus, home, (status_folder,))
        log.info("gpulab jobs: job %d runs with %s", rec.id, confinement.words)
        return confinement

    def _release_confinement(self, job_id: int) -> None:
        rec = self.service.get_job(job_id)
        if rec is None or not self.service.owner_accounts:
            return
        try:
            self.confiner.release(self.cgroup_name(rec))
        except (CgroupError, OSError) as e:
            log.warning("gpulab jobs: cannot remove the cgroup of job %d: %s", job_id, e)
