"""Telling who needs to know that a GPU server has no utilisation series naming it.

:mod:`idle_culler.attribution` says *why* (pure); this says it: in the culler's log once
per server session, in ``gpulab_culler_unattributed_servers{reason}`` every cycle, and to
the hub (the admin page, the user's GPU sidebar) whenever the list differs from the one
the hub already has.
"""

from __future__ import annotations

import logging

from spawner.core.idle_cycle import UNATTRIBUTED_CODES

from .attribution import REASON_PREFIX, hub_has_these, unattributed_servers
from .hub import CycleBatch
from .metrics import CullerMetrics
from .plan import CycleSummary, HubRead
from .targets import ServerTarget


class UnattributedReport:
    """The culler's memory of what it already logged, and the per-cycle report."""

    def __init__(self, log: logging.Logger | logging.LoggerAdapter, metrics: CullerMetrics) -> None:
        self.log = log
        self.metrics = metrics
        #: ``(server key, session)`` already logged as unattributed: said once per server session.
        self.told: set[tuple[str, str]] = set()

    def report(
        self,
        targets: list[ServerTarget],
        data: dict[str, list],
        read: HubRead,
        batch: CycleBatch,
        summary: CycleSummary,
        after_seconds: float,
    ) -> None:
        """Servers running longer than ``after_seconds`` with no series naming them: logged,
        counted, and put in ``batch`` for the hub when its list is not current."""
        found = unattributed_servers(targets, data, read.now, after_seconds)
        for t, u in found:
            summary.unattributed[t.key] = u.code
            if (t.key, t.started) not in self.told:
                self.told.add((t.key, t.started))
                self.log.warning(
                    "%s (pod %s/%s, %s): %s%s", t.key, t.namespace, t.pod, t.sharing or "?", REASON_PREFIX, u.reason
                )
        running = {(t.key, t.started) for t in targets}
        self.told &= running  # a server gone, or restarted, is told again when it recurs
        for code in UNATTRIBUTED_CODES:
            self.metrics.unattributed.labels(code).set(sum(1 for _, u in found if u.code == code))
        if not hub_has_these([u for _, u in found], read.unattributed):
            batch.unattributed = tuple(u for _, u in found)
