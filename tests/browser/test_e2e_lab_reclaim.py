"""After the idle culler reclaims a GPU, JupyterLab says so in words, in a real browser.

A real embedded hub and alice's real JupyterLab in Debian's Chromium. The culler's
part is played through its own hub API with its own service token and scopes:
one cycle records the warning (the sidebar shows it with its countdown), a second
cycle claims the reclaim once the grace has passed, and the server is stopped
through the hub's REST API, as ``gpulab-idle-culler`` does. The page must then say
"Your GPU was reclaimed at HH:MM after N minutes at 0 % — start again", never
JupyterLab's raw "server connection lost"; the hub's spawn page says it too.
"""

from __future__ import annotations

import os
import time

import pytest

from tests.support.culler_service import as_culler, culler_token_config
from tests.support.hub import RunningHub
from tests.support.lab import open_gpu_sidebar, shot_docs

pytestmark = pytest.mark.docs_screenshots

CATALOG = """
inventory:
  - {model: H100-80GB, count: 1, memory_mib: 81559}
profiles:
  - {slug: h100-half, display_name: "0.5 × H100", gpus: 0.5, gpu_model: H100-80GB, idle_timeout: 45m}
teams:
  - {name: vision, users: [alice], guarantee: 1, burst: 1, allowed_profiles: [h100-half]}
"""
CULLER_TOKEN = "culler-" + os.urandom(8).hex()
EXTRA = culler_token_config(CULLER_TOKEN)
GRACE = 4
TIMEOUT = 45 * 60


@pytest.fixture(scope="module")
def hub(start_hub):
    return start_hub(CATALOG, extra_config=EXTRA)


def test_the_page_says_the_gpu_was_reclaimed_and_offers_to_start_again(hub: RunningHub, browser):
    page = browser.new_page(viewport={"width": 1400, "height": 900})
    page.set_default_timeout(60_000)
    try:
        panel = open_gpu_sidebar(page, hub.url, "alice", "vision:h100-half", "0.5 × H100")

        # The culler's first cycle: a warning for this session, with its evidence.
        user = as_culler(hub, CULLER_TOKEN, "GET", "/users/alice").json()
        session = user["servers"][""]["started"]
        evidence = {"idle_timeout_seconds": TIMEOUT, "devices": {"local/gpu0": [{"max": 0.0, "count": 90}]}}
        item = {
            "user": "alice",
            "server": "",
            "session": session,
            "gpu_milli": 500,
            "evidence": evidence,
            "reason": "GPU at 0 % for 45 minutes",
        }
        r = as_culler(hub, CULLER_TOKEN, "POST", "/gpulab/idle/cycle", {"warnings": [{**item, "grace_seconds": GRACE}]})
        assert r.status_code == 200, r.text
        assert r.json()["warnings"] == 1

        # The sidebar shows the warning and its countdown (the model polls the idle state).
        panel.locator(".gpulab-idle", has_text="GPU at 0 % for 45 minutes").wait_for(timeout=45_000)
        panel.locator(".gpulab-countdown").wait_for()

        # The grace passes; the culler's second cycle claims the reclaim, then stops the server.
        time.sleep(GRACE + 1)
        claim = {
            **item,
            "action": "stop-server",
            "idle_gpu_hours": 0.5 * TIMEOUT / 3600,
            "idle_since": time.time() - TIMEOUT - GRACE,
        }
        r = as_culler(hub, CULLER_TOKEN, "POST", "/gpulab/idle/cycle", {"reclaims": [claim]})
        assert r.status_code == 200, r.text
        assert r.json()["reclaims"][0]["accepted"], r.text
        r = as_culler(hub, CULLER_TOKEN, "DELETE", "/users/alice/server")
        assert r.status_code in (202, 204), r.text
        hub.wait_server("alice", ready=False)

        # JupyterLab says why, in words, and offers to start again.
        dialog = page.locator(".jp-Dialog", has_text="Your GPU was reclaimed")
        dialog.wait_for(timeout=60_000)
        text = dialog.inner_text()
        assert "Your GPU was reclaimed at" in text and "minutes at 0 %" in text, text
        assert "start again" in text, text
        assert "Server connection" not in text and "Server unavailable" not in text, text
        assert dialog.get_by_role("button", name="Start again").is_visible()
        shot_docs(page, "lab-reclaimed")
        # The sidebar says the same, instead of the errors of a server that no longer answers.
        dialog.get_by_role("button", name="Close").click()
        reclaimed = panel.locator(".gpulab-reclaimed")
        reclaimed.wait_for(timeout=30_000)
        assert "Your GPU was reclaimed at" in reclaimed.inner_text()
        assert panel.locator(".gpulab-error").count() == 0, panel.inner_text()
        assert reclaimed.get_by_role("link", name="Start again").get_attribute("href").endswith("/hub/home")
        shot_docs(page, "lab-sidebar-reclaimed", panel)

        # So does the hub's spawn page.
        session_http = hub.login("alice")
        html = hub.spawn_page(session_http).text
        assert "Your GPU was reclaimed at" in html, html[:2000]
    except Exception:
        shot_docs(page, "reclaim-failure", failure=True)
        raise
    finally:
        page.close()
