"""The right-size line in the JupyterLab sidebar, in Chromium against a real hub and lab.

alice's last sessions of 1 × H100 peaked at 11 GiB with utilisation p95 18 % (recorded in
the hub's usage history: tests/support/usage_history.py); the sidebar of her running
1 × H100 server says 0.25 × H100 would have done, the hub's own line
(``GET /hub/api/gpulab/me``), and changes nothing. Screenshot: docs/img/lab-right-size.png.
"""

from __future__ import annotations

import pytest

from tests.support.lab import open_gpu_sidebar, shot_docs
from tests.support.usage_history import record_sessions

pytestmark = pytest.mark.docs_screenshots

CATALOG = """
inventory:
  - {model: H100-80GB, count: 1, memory_mib: 81920}
profiles:
  - {slug: h100, display_name: "1 × H100", gpus: 1, gpu_model: H100-80GB}
  - {slug: h100-quarter, display_name: "0.25 × H100", gpus: 0.25, gpu_model: H100-80GB}
teams:
  - {name: vision, users: [alice], guarantee: 1, burst: 1}
"""


@pytest.fixture(scope="module")
def hub(start_hub):
    h = start_hub(CATALOG)
    record_sessions(h, "alice", "h100", 10, peak_mib=11 * 1024, util=(18.0, 4.0))
    return h


def test_the_sidebar_says_a_smaller_profile_would_have_done(hub, browser):
    page = browser.new_page(viewport={"width": 1400, "height": 900})
    page.set_default_timeout(60_000)
    try:
        panel = open_gpu_sidebar(page, hub.url, "alice", "vision:h100", "1 × H100")
        line = panel.locator(".gpulab-right-size")
        line.wait_for()
        expected = next(p for p in hub.me("alice")["teams"][0]["profiles"] if p["slug"] == "h100")["right_size"]
        assert expected.startswith("Last 10 sessions of 1 × H100: peak 11 GiB of 80 GiB GPU memory")
        assert line.inner_text() == expected + ". Pick it next time on the spawn page."
        shot_docs(page, "lab-right-size", panel.locator(".gpulab-panel"))
        # advice only: the server runs the profile alice chose
        assert [h["profile"] for h in hub.me("alice")["holdings"]] == ["h100"]
    finally:
        page.close()
