"""Taking a single-server job back for another team's in-quota work (:mod:`hub_config.jobs.reclaim`
decides and records; this stops the job as any preemption does)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from hub_config.jobs.models import JobRecord
from spawner.core import jobspec


class JobTakeBack:
    """The take-back part of :class:`~hub_config.jobs.backends.local.LocalJobBackend`."""

    service: Any
    settings: Any
    pids: dict[int, int]
    busy: dict[int, Any]
    stopping: dict[int, tuple[float, str | None]]
    #: Borrowed jobs are taken back here for other teams' in-quota work.
    takes_back = True

    #: LocalJobBackend's: SIGTERM now and SIGKILL at the deadline, then ``then``; free devices;
    #: when a runner told to stop now is killed at the latest.
    _terminate: Callable[[int, str | None], None]
    _release_devices: Callable[[int], None]
    _kill_deadline: Callable[[], float]

    def frees_within(self) -> float:
        """The stop grace, the hub's kill margin and one poll: a job taken back is gone by then."""
        return self._kill_deadline() - time.monotonic() + self.settings.poll_interval

    def can_take_back(self, rec: JobRecord) -> bool:
        """Running and not already stopping, or queued and not being started."""
        if rec.state == jobspec.RUNNING:
            return rec.id in self.pids and rec.id not in self.stopping
        return rec.state == jobspec.QUEUED and rec.id not in self.busy and rec.id not in self.pids

    def take_back(self, rec: JobRecord, reason: str) -> None:
        """Reclaim took ``rec``'s share: a running job is preempted (its grace, then queued again,
        waiting to be admitted); a queued one gives up any devices it was placed on."""
        if rec.state == jobspec.RUNNING:
            self.service.transition(rec.id, jobspec.PREEMPTED, reason)
            self._terminate(rec.id, jobspec.QUEUED)
        else:
            self._release_devices(rec.id)
            self.service.set_reason(rec.id, reason)


__all__ = ["JobTakeBack"]
