"""A GPU server at its maximum lifetime, in a real browser: JupyterLab says it is the lifetime,
not idleness, and "Keep my GPU" cannot extend it.

A real embedded hub (its catalog gives the profile ``max_lifetime``) and alice's real
JupyterLab in Debian's Chromium. The culler's part is played through its own hub API with
its own service token, as in test_e2e_lab_reclaim.py: one cycle records the warning the culler
sends at the lifetime (its reason and evidence, as ``idle_culler.plan`` writes them), a second
claims the reclaim after the grace, and the server is stopped through the hub's REST API.
"""

from __future__ import annotations

import json
import os
import time

import pytest

from idle_culler.targets import parse_time
from tests.support.culler_service import as_culler, culler_token_config
from tests.support.hub import RunningHub
from tests.support.lab import open_gpu_sidebar, shot_docs

LIFETIME = 5
CATALOG = f"""
inventory:
  - {{model: H100-80GB, count: 1, memory_mib: 81559}}
profiles:
  - {{slug: h100-half, display_name: "0.5 × H100", gpus: 0.5, gpu_model: H100-80GB, max_lifetime: {LIFETIME}s}}
teams:
  - {{name: vision, users: [alice], guarantee: 1, burst: 1, allowed_profiles: [h100-half]}}
"""
CULLER_TOKEN = "culler-" + os.urandom(8).hex()
EXTRA = culler_token_config(CULLER_TOKEN)
GRACE = 4


@pytest.fixture(scope="module")
def hub(start_hub):
    return start_hub(CATALOG, extra_config=EXTRA)


def test_the_lab_says_the_lifetime_is_reached_and_keep_my_gpu_cannot_extend_it(hub: RunningHub, browser):
    page = browser.new_page(viewport={"width": 1400, "height": 900})
    page.set_default_timeout(60_000)
    try:
        panel = open_gpu_sidebar(page, hub.url, "alice", "vision:h100-half", "0.5 × H100")
        # The idle policy the sidebar states says the lifetime (the hub's one idle sentence).
        assert f"stopped after {LIFETIME}s, whatever it does, after a warning and its grace" in panel.inner_text()

        session = as_culler(hub, CULLER_TOKEN, "GET", "/users/alice").json()["servers"][""]["started"]
        started_at = parse_time(session)
        assert started_at is not None
        time.sleep(max(0.0, started_at + LIFETIME - time.time()))
        reason = f"maximum lifetime {LIFETIME}s of profile h100-half reached"
        evidence = {
            "max_lifetime_seconds": LIFETIME,
            "max_lifetime_from": "profile h100-half",
            "session_started_at": started_at,
            "lifetime_ends_at": started_at + LIFETIME,
        }
        item = {"user": "alice", "server": "", "session": session, "gpu_milli": 500, "evidence": evidence}
        r = as_culler(
            hub,
            CULLER_TOKEN,
            "POST",
            "/gpulab/idle/cycle",
            {"warnings": [{**item, "reason": reason, "grace_seconds": GRACE}]},
        )
        assert r.status_code == 200 and r.json()["warnings"] == 1, r.text

        # The sidebar: the lifetime, not idleness, and no "Keep my GPU" to press.
        warning = panel.locator(".gpulab-idle", has_text=reason)
        warning.wait_for(timeout=45_000)
        assert "Maximum lifetime:" in warning.inner_text() and "Idle GPU" not in warning.inner_text()
        assert warning.get_by_role("button").count() == 0  # nothing to press: nothing extends it
        assert 'Maximum lifetime reached: "Keep my GPU" cannot extend it' in warning.inner_text()
        # The notification says it too, without a "Keep my GPU" action.
        toast = page.locator(".Toastify__toast", has_text="reached its maximum lifetime")
        toast.wait_for(timeout=30_000)
        assert toast.get_by_role("button", name="Keep my GPU").count() == 0
        # And the hub refuses a press anyway (the sidebar is not the only way to ask).
        token = hub.api("POST", "/users/alice/tokens", data=json.dumps({"note": "lifetime test"})).json()["token"]
        r = hub.api("POST", "/gpulab/idle/keepalive", token=token, data=json.dumps({"user": "alice", "server": ""}))
        assert r.status_code == 409 and "maximum lifetime" in r.json()["message"], r.text

        time.sleep(GRACE + 1)
        claim = {**item, "reason": reason, "action": "stop-server", "idle_since": started_at + LIFETIME}
        r = as_culler(hub, CULLER_TOKEN, "POST", "/gpulab/idle/cycle", {"reclaims": [claim]})
        assert r.status_code == 200 and r.json()["reclaims"][0]["accepted"], r.text
        r = as_culler(hub, CULLER_TOKEN, "DELETE", "/users/alice/server")
        assert r.status_code in (202, 204), r.text
        hub.wait_server("alice", ready=False)

        dialog = page.locator(".jp-Dialog", has_text="Your GPU was reclaimed")
        dialog.wait_for(timeout=60_000)
        text = dialog.inner_text()
        assert "the session reached its maximum lifetime of 5 s" in text and "minutes at" not in text, text
        dialog.get_by_role("button", name="Close").click()
        html = hub.spawn_page(hub.login("alice")).text
        assert "the session reached the maximum lifetime (5s of profile h100-half)" in html, html[:2000]
    except Exception:
        shot_docs(page, "lifetime-failure", failure=True)
        raise
    finally:
        page.close()
