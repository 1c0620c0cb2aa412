"""Does the KAI queue a server's pod names exist?

KAI's scheduler skips a pod group whose queue does not exist, with nothing but a
debug log line (NVIDIA/KAI-Scheduler v0.20.1 ``pkg/scheduler/cache/cluster_info/
cluster_info.go``: "The Queue ... does not exist, ignore it."), so a pod naming a
queue nobody created waits, without an event, until the spawn times out. The gpulab
chart creates the teams' queues and tells the hub their names (the catalog's
``sharing.kai.queue``); a hub configured with other names is refused here, before
anything is created. Reading a queue needs ``get`` on ``scheduling.run.ai`` queues,
which the chart grants the hub when the kai backend is in use; without it the check
is skipped.
"""

from __future__ import annotations

from typing import Any

from kubernetes_asyncio.client import CustomObjectsApi
from kubernetes_asyncio.client.rest import ApiException

KAI_QUEUE_GROUP, KAI_QUEUE_VERSION, KAI_QUEUE_PLURAL = "scheduling.run.ai", "v2", "queues"


async def kai_queue_exists(api_client: Any, name: str) -> bool | None:
    """``True``/``False`` whether KAI has queue ``name``; ``None`` when the hub may not read
    queues (no ``get`` on them: the check is the chart's RBAC's to allow)."""
    try:
        await CustomObjectsApi(api_client).get_cluster_custom_object(
            KAI_QUEUE_GROUP, KAI_QUEUE_VERSION, KAI_QUEUE_PLURAL, name
        )
    except ApiException as e:
        if e.status == 404:  # no such queue (or no KAI: its Queue kind is not served)
            return False
        if e.status in (401, 403):
            return None
        raise
    return True


def missing_queue_sentence(queue: str, team: str, template: str) -> str:
    """What the spawn page says when the pod's KAI queue does not exist."""
    return (
        f"The KAI scheduler has no queue {queue!r}, so it would never place this server. Ask an admin: the "
        f"hub's catalog names team {team}'s queue {queue!r} (sharing.kai.queue {template!r}), which the "
        f"gpulab chart did not create."
    )


__all__ = ["kai_queue_exists", "missing_queue_sentence"]
