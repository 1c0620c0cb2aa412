"""What every jobs backend provides to :class:`~hub_config.jobs.service.JobService`."""

from __future__ import annotations

import abc
import logging
from typing import TYPE_CHECKING, Any

from traitlets.config.loader import LazyConfigValue

if TYPE_CHECKING:  # only for annotations: the service imports the backends, not the reverse
    from hub_config.jobs.models import JobRecord
    from hub_config.jobs.service import JobService
    from spawner.core.jobspec import Submission

#: A child of JupyterHub's logger, so job events land in the hub's log.
log = logging.getLogger("JupyterHub.gpulab.jobs")


def config_value(config: Any, section: str, key: str) -> Any:
    """``config[section][key]`` when the hub's config sets it, else ``None`` (never creates it).

    A value only appended to or updated (``c.KubeSpawner.tolerations.append(...)``, as
    Zero to JupyterHub's hub config writes many) is traitlets' ``LazyConfigValue``: it is
    resolved over an empty list or dict, as the trait's default would be.
    """
    try:
        sec = config[section] if section in config else None
        value = sec[key] if sec is not None and key in sec else None
    except (KeyError, TypeError):
        return None
    if isinstance(value, LazyConfigValue):
        return value.get_value({} if "update" in value.to_dict() else [])
    return value


class JobBackend(abc.ABC):
    """Runs admitted jobs somewhere and reports their states back to the service."""

    #: Short name stored on each job record (``local``, ``kubernetes``).
    name: str = ""
    #: Whether the hub can read the users' homes (check notebooks, serve logs and outputs).
    sees_homes: bool = False
    #: Whether the hub itself takes borrowed jobs back for another team's in-quota work
    #: (:mod:`hub_config.jobs.reclaim`); on Kubernetes Kueue reclaims.
    takes_back: bool = False

    def __init__(self, service: JobService):
        self.service = service
        self.settings = service.settings
        self.runtime = service.runtime

    @abc.abstractmethod
    def prepare(self, submission: Submission) -> int:
        """Check a validated submission can run here; the GPU milli it needs per device."""

    @abc.abstractmethod
    def submitted(self, rec: JobRecord) -> None:
        """A job was admitted and stored: start it (or queue it) without blocking."""

    @abc.abstractmethod
    async def cancel(self, rec: JobRecord, reason: str) -> None:
        """Stop a queued or running job; its record ends ``cancelled``."""

    @abc.abstractmethod
    async def recover(self) -> None:
        """After a hub restart: adopt what still runs, settle what ended meanwhile."""

    @abc.abstractmethod
    async def tick(self) -> None:
        """One poll: follow running jobs, start queued ones, enforce time limits."""

    def take_back(self, rec: JobRecord, reason: str) -> None:
        """Stop a job whose share reclaim took (``takes_back`` backends only): running, it is
        preempted and queued again; queued, it stays queued (without devices)."""
        raise NotImplementedError(f"the {self.name} backend does not take jobs back (takes_back is False)")

    def can_take_back(self, rec: JobRecord) -> bool:
        """Can :meth:`take_back` stop ``rec`` now (not mid-start, not already stopping)?"""
        return False

    def frees_within(self) -> float:
        """Seconds within which a job taken back has freed its devices (``takes_back`` backends)."""
        raise NotImplementedError(f"the {self.name} backend does not take jobs back (takes_back is False)")
