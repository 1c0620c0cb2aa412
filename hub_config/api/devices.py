"""``GET /hub/api/gpulab/devices``: the single server's GPUs and who holds which share of each.

For admins (``custom:gpulab:admin``). It reads the device packer the spawners and
the job runner place work with, so an admin sees, after a hub restart too, which
server or job holds each share of each GPU; the packer holds nothing else. On
Kubernetes there is no packer in the hub (the scheduler places pods): 404 with
a sentence.
"""

from __future__ import annotations

from typing import Any

from tornado import web

from hub_config.api.base import GPULabAPIHandler
from hub_config.config.scopes import ADMIN
from spawner.core.packer import FULL, DevicePacker


def devices_view(packer: DevicePacker, source: str) -> dict[str, Any]:
    """Every device with its model, the milli-GPUs used and free, and each holder's share."""
    holders: dict[int, list[dict[str, Any]]] = {i: [] for i in packer.devices}
    for placement in sorted(packer.placements(), key=lambda p: p.key):
        for index, milli in placement.shares:
            holders[index].append({"key": placement.key, "milli": milli})
    devices = []
    for index, device in sorted(packer.devices.items()):
        used = packer.used(index)
        devices.append(
            {
                "index": index,
                "model": device.model,
                "memory_mib": device.memory_mib,
                "uuid": device.uuid,
                "used_milli": used,
                "free_milli": FULL - used,
                "holders": holders[index],
            }
        )
    return {"source": source, "devices": devices}


class DevicesHandler(GPULabAPIHandler):
    async def get(self) -> None:
        self.require_scope(ADMIN)
        from spawner.local.inventory import ensure_packer
        from spawner.local.spawner import GPULocalMixin

        spawner_class = self.settings.get("spawner_class")
        if not (isinstance(spawner_class, type) and issubclass(spawner_class, GPULocalMixin)):
            raise web.HTTPError(404, "this hub does not place GPUs itself (on Kubernetes the scheduler does)")
        runtime = self.gpulab
        packer = ensure_packer(runtime)
        with runtime.lock:
            view = devices_view(packer, runtime.inventory_source)
        self.write_json(view)


handlers = [(r"/api/gpulab/devices", DevicesHandler)]
