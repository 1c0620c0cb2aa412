"""The admin page in a real browser shows the servers the idle culler cannot see, with the reason.

On Kubernetes the culler reports a server whose pod no utilisation series names (a KAI
fraction: KAI's gpu-reservation pod holds the GPU, so dcgm-exporter names that pod). A real
hub with KubeSpawner pods is more than this tier runs, so the report is the culler's own, made
by its own code for such a server and sent the culler's way: :func:`idle_culler.attribution.
unattributed_servers` over the server's :class:`~idle_culler.targets.ServerTarget` (as the
culler reads it from the hub's REST API, KubeSpawner's pod in its state) with no series, then
:meth:`idle_culler.hub.HubClient.record_cycle` with the culler service's token and scopes to the
real hub's ``/gpulab/idle/cycle``. The admin logs in with the browser and reads the row.
"""

from __future__ import annotations

import asyncio
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timezone

import pytest

from hub_config.config.scopes import CULLER_SERVICE_SCOPES
from idle_culler.attribution import REASON_PREFIX, REASONS, unattributed_servers
from idle_culler.hub import HubClient
from idle_culler.targets import POD, ServerTarget
from spawner.core.idle_cycle import CycleRecords
from tests.support.browser import browser_login, screenshots_dir
from tests.support.catalogs import H100_PROFILES, VISION_TEAM, h100_inventory

SHOTS = screenshots_dir("admin")
CULLER_TOKEN = "culler-token-for-the-admin-page-test"
CATALOG = h100_inventory(2) + H100_PROFILES + "teams:\n" + VISION_TEAM
#: The culler as a hub service with its own token (externally run, as in the chart's hub config).
CULLER_SERVICE = f"""
c.JupyterHub.services = list(c.JupyterHub.services) + [
    {{"name": "gpulab-idle-culler", "api_token": "{CULLER_TOKEN}"}}]
c.JupyterHub.load_roles = list(c.JupyterHub.load_roles) + [
    {{"name": "gpulab-idle-culler", "scopes": {CULLER_SERVICE_SCOPES!r}, "services": ["gpulab-idle-culler"]}}]
"""


@pytest.fixture(scope="module")
def hub(start_hub):
    return start_hub(CATALOG, extra_config=CULLER_SERVICE)


def kai_fraction(started_at: float) -> ServerTarget:
    started = datetime.fromtimestamp(started_at, timezone.utc).isoformat().replace("+00:00", "Z")
    return ServerTarget(
        user="alice",
        server="",
        team="vision",
        profile="h100-quarter",
        gpu_milli=250,
        mapping=POD,
        namespace="gpulab-vision",
        pod="jupyter-alice",
        sharing="kai",
        started=started,
        started_at=started_at,
    )


def send_as_the_culler(hub, records: CycleRecords) -> None:
    """One cycle's records through the culler's hub client (its own event loop, in a thread:
    Playwright's sync API holds this thread's)."""

    async def send() -> None:
        client = HubClient(hub.url + "/hub/api", CULLER_TOKEN)
        try:
            await client.record_cycle(records)
        finally:
            await client.close()

    with ThreadPoolExecutor(1) as pool:
        pool.submit(asyncio.run, send()).result(timeout=60)


def test_admin_page_lists_the_server_the_culler_cannot_see_with_its_reason(hub, browser):
    SHOTS.mkdir(parents=True, exist_ok=True)
    now = time.time()
    target = kai_fraction(now - 600)
    found = unattributed_servers([target], {}, now, after_seconds=300)
    assert [u.code for _, u in found] == ["kai-reservation-pod"]
    send_as_the_culler(hub, CycleRecords(unattributed=tuple(u for _, u in found)))

    ctx, page = browser_login(browser, hub.url, "admin", width=1400)
    try:
        page.goto(hub.url + "/hub/gpulab/admin")
        row = page.locator('tr[data-idle-unattributed="kai-reservation-pod"]')
        row.wait_for()
        text = row.inner_text()
        assert "alice/" in text
        assert REASON_PREFIX + REASONS["kai-reservation-pod"] in " ".join(text.split())
        heading = page.locator("h4", has_text="Idle GPU reclaim is off for these servers")
        assert heading.count() == 1
        page.screenshot(path=str(SHOTS / "admin-reclaim-off.png"), full_page=True)
    finally:
        ctx.close()

    # The culler's next report without the server clears the row.
    send_as_the_culler(hub, CycleRecords(unattributed=()))
    ctx, page = browser_login(browser, hub.url, "admin", width=1400)
    try:
        page.goto(hub.url + "/hub/gpulab/admin")
        page.locator("h1").wait_for()
        assert page.locator("tr[data-idle-unattributed]").count() == 0
    finally:
        ctx.close()
