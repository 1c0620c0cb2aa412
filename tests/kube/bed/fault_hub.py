"""A hub process to kill: GPUKubeSpawner objects starting servers, as JupyterHub runs them.

``python -m tests.kube.bed.fault_hub SPEC.json OUT_DIR`` (the test or benchmark sets
``KUBECONFIG`` to the hub ServiceAccount's): starts ``spec["running"]`` servers and waits
for them, then starts ``spec["in_flight"]`` at once and waits to be killed. What a
JupyterHub database would hold is written as it would be committed: after a start
returns, ``state-<user>.json`` (``spawner.orm_spawner.state = spawner.get_state()``,
jupyterhub/user.py ``spawn``, after ``await spawner.start()``); a start still under way
has its Server row and its user options committed but no state (see
:func:`restarted_hub_state`). ``running.ready`` and ``in-flight.started`` mark the phases.
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path
from typing import Any

from kubernetes_asyncio.config import kube_config
from kubespawner import KubeSpawner
from traitlets.config import Config

from tests.support.kube_spawner import BASE_IMAGE, GPU_TOLERATION, spawner_for

#: What the servers run: the node agent starts no process and reports the pod Running.
SLEEP = ["sleep", "infinity"]


def hub_config(spec: dict[str, Any]) -> Config:
    """The hub's GPUKubeSpawner config from a plain spec (teams with their namespaces,
    profiles, sharing, the hub's namespace): the same in the hub process and after it."""
    c = Config()
    c.GPULab.teams = spec["teams"]
    c.GPULab.profiles = spec["profiles"]
    c.GPULab.sharing = spec.get("sharing", {})
    c.KubeSpawner.namespace = spec["hub_namespace"]
    c.KubeSpawner.image = BASE_IMAGE
    c.KubeSpawner.cmd = SLEEP
    c.KubeSpawner.start_timeout = spec.get("start_timeout", 120)
    c.KubeSpawner.delete_grace_period = 0
    c.KubeSpawner.tolerations = [GPU_TOLERATION]
    if spec.get("all_namespaces"):
        c.GPUKubeSpawner.ledger_namespaces = ["*"]
    return c


def make_spawner(config: Config, server: dict[str, Any]) -> KubeSpawner:
    return spawner_for(
        config, server["user"], {"team": server["team"], "profile": server["profile"]}, groups=tuple(server["groups"])
    )


async def _start(config: Config, server: dict[str, Any], out: Path) -> None:
    s = make_spawner(config, server)
    try:
        await s.start()
    except Exception as e:
        (out / f"refused-{server['user']}.txt").write_text(str(getattr(e, "jupyterhub_message", None) or e))
        return
    # The commit after start: what the restarted hub loads.
    (out / f"state-{server['user']}.json").write_text(json.dumps(s.get_state()))


async def amain(spec: dict[str, Any], out: Path) -> None:
    config = hub_config(spec)
    gate = asyncio.Semaphore(spec.get("concurrency", 24))

    async def gated(server: dict[str, Any]) -> None:
        async with gate:
            await _start(config, server, out)

    await asyncio.gather(*(gated(srv) for srv in spec["running"]))
    (out / "running.ready").write_text("")
    tasks = [asyncio.ensure_future(_start(config, srv, out)) for srv in spec["in_flight"]]
    (out / "in-flight.started").write_text("")
    await asyncio.gather(*tasks)
    await asyncio.sleep(3600)  # killed before this ends


def restarted_hub_state(server: dict[str, Any], out: Path) -> dict[str, Any] | None:
    """What JupyterHub's database holds for ``server`` after the hub died: its saved state
    if its start returned; ``{}`` if it was starting (jupyterhub/user.py ``spawn`` commits
    the Server row and the user options before ``spawner.start()``, clears the state in
    memory and saves it only after the start); ``None`` if it was refused (no server)."""
    state = out / f"state-{server['user']}.json"
    if state.exists():
        return json.loads(state.read_text())
    if (out / f"refused-{server['user']}.txt").exists():
        return None
    return {}


def main() -> int:
    spec = json.loads(Path(sys.argv[1]).read_text())
    out = Path(sys.argv[2])
    kube_config.KUBE_CONFIG_DEFAULT_LOCATION = spec["kubeconfig"]
    asyncio.run(amain(spec, out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
