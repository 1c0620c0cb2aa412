"""The end of a cycle: record it in the hub, then carry out only the reclaims the hub granted.

The hub is the one place that knows whether a user pressed "keep my GPU" after
the culler read the idle state, so nothing is stopped before the hub accepts
the claim (each claim is granted or refused on its own).
"""

from __future__ import annotations

import asyncio
import logging

from spawner.core.idle_cycle import ReclaimClaim

from .hub import CycleBatch, HubAPIError, HubClient
from .metrics import CullerMetrics
from .plan import CycleSummary
from .targets import ServerTarget


async def record_and_reclaim(
    hub: HubClient, batch: CycleBatch, summary: CycleSummary, metrics: CullerMetrics, log: logging.Logger
) -> None:
    """Record the whole cycle in ONE hub request, then stop what the hub let us reclaim.

    Claims go first: the hub refuses a claim (that item only) when the user kept the
    GPU after this cycle read the idle state, and nothing is stopped for it.
    """
    try:
        result = await hub.record_cycle(batch.records())
    except (HubAPIError, OSError) as e:
        metrics.errors.labels("record").inc()
        log.error("Recording this cycle's warnings and reclaims failed; stopping nothing: %s", e)
        return
    stops = []
    # One outcome per claim, in order; a shorter answer leaves the rest unreclaimed.
    for answer, (claim, t, base) in zip(result.reclaims, batch.claims, strict=False):
        if not answer.accepted:
            log.info("Not reclaiming %s: %s", t.key, answer.message or "refused by the hub")
            continue
        stops.append(carry_out(hub, claim, t, base, summary, metrics, log))
    if stops:
        await asyncio.gather(*stops)


async def carry_out(
    hub: HubClient,
    claim: ReclaimClaim,
    t: ServerTarget,
    base: str | None,
    summary: CycleSummary,
    metrics: CullerMetrics,
    log: logging.Logger,
) -> None:
    """Shut down the idle kernels or stop the server of one granted claim."""
    try:
        if claim.action == "shutdown-kernel":
            assert base is not None, "kernel reclaims are claimed only for servers with a URL"
            for kid in claim.kernel_ids:
                await hub.shutdown_kernel(base, kid)
                summary.kernels.append(f"{t.key}:{kid}")
            metrics.reclaims.labels(t.team, "shutdown-kernel").inc()
            return
        code = await hub.stop_server(t.user, t.server)
    except (HubAPIError, OSError) as e:
        metrics.errors.labels("stop").inc()
        log.error("Stopping %s failed after the reclaim was recorded: %s", t.key, e)
        return
    if code == 202:
        log.info("Server %s is slow to stop", t.key)
    metrics.reclaims.labels(t.team, "stop-server").inc()
    metrics.idle_gpu_hours.labels(t.team).inc(claim.idle_gpu_hours)
    metrics.reclaimed_gpus.labels(t.team).inc(t.gpu_milli / 1000)
    summary.reclaimed.append(t.key)
