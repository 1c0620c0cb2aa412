"""The spawn page's queue in Chromium against a real hub (single server, one declared H100).

bob finds 1 × H100 full (alice holds it), presses **Queue me** on its card, and the page
comes back saying he is next in line, with a predicted start line, **Leave the queue**
and **Notify me when it starts**. When alice stops her server the hub's queue runner
starts bob's by itself; the page, still open, sees it, says so, sends the browser
notification bob allowed, and takes him to his server. Screenshots: docs/img/spawn-queue-me.png, docs/img/spawn-queue.png
(scripts/screenshots).
"""

from __future__ import annotations

import json
import time

import pytest

from tests.support.axe import axe_violations, blocking, describe
from tests.support.browser import browser_login, screenshots_dir

pytestmark = pytest.mark.docs_screenshots

SHOTS = screenshots_dir("docs")

CATALOG = """
inventory:
  - {model: H100-80GB, count: 1, memory_mib: 81559}
profiles:
  - {slug: h100, display_name: "1 × H100", gpus: 1, gpu_model: H100-80GB}
  - {slug: h100-half, display_name: "0.5 × H100", gpus: 0.5, gpu_model: H100-80GB}
  - {slug: cpu, display_name: "CPU only", gpus: 0}
teams:
  - {name: vision, users: [alice, bob], guarantee: 1, burst: 1}
"""

#: Records each browser notification the page sends (its body) in sessionStorage, which
#: outlives the page's own navigation to the server: the real Notification is still shown.
RECORD_NOTIFICATIONS = """
(() => {
  const Real = window.Notification;
  if (!Real) return;
  function Recorded(title, options) {
    const seen = JSON.parse(sessionStorage.getItem('gpulab-notifications') || '[]');
    seen.push((options && options.body) || title);
    sessionStorage.setItem('gpulab-notifications', JSON.stringify(seen));
    return new Real(title, options);
  }
  Object.defineProperty(Recorded, 'permission', {get: () => Real.permission});
  Recorded.requestPermission = (...a) => Real.requestPermission(...a);
  window.Notification = Recorded;
})();
"""


@pytest.fixture(scope="module")
def hub(start_hub):
    return start_hub(CATALOG, extra_config="c.GPULabQueue.retry_seconds = 2\n")


def test_queue_me_then_the_server_starts_by_itself(hub, browser):
    r = hub.api("POST", "/users/alice/server", data=json.dumps({"team": "vision", "profile": "h100"}))
    assert r.status_code in (201, 202), r.text
    hub.wait_server("alice")
    ctx, page = browser_login(browser, hub.url, "bob", width=1280)
    ctx.grant_permissions(["notifications"], origin=hub.url)
    ctx.add_init_script(RECORD_NOTIFICATIONS)
    page.goto(hub.url + "/hub/spawn")
    full = page.locator('label[data-choice="vision:h100"]')
    assert "Unavailable" in full.inner_text()
    # Enter in the form starts (its first submit button is Start): Queue me is no submit button
    assert page.locator("#spawn_form button[type=submit]").all_inner_texts() == ["Start"]
    queue_me = full.get_by_role("button", name="Queue me for 1 × H100 in team vision")
    page.screenshot(path=str(SHOTS / "spawn-queue-me.png"), full_page=True)
    queue_me.click()
    page.wait_for_load_state("networkidle")
    where = page.locator("[id^=gpulab-queue-][id$=-where]")
    assert where.count() == 1, (page.url, page.locator("body").inner_text()[:1500])
    assert where.inner_text() == "You are next in line for 1 × H100 in team vision."
    assert page.get_by_role("button", name="Leave the queue").is_visible()
    # notifications already allowed: the page does not ask again
    assert not page.get_by_role("button", name="Notify me when it starts").is_visible()
    found = blocking(axe_violations(page))
    assert not found, describe(found)
    page.screenshot(path=str(SHOTS / "spawn-queue.png"), full_page=True)

    r = hub.api("DELETE", "/users/alice/server")
    assert r.status_code in (202, 204), r.text
    deadline = time.monotonic() + 90
    while "/spawn-pending/bob" not in page.url and "/user/bob" not in page.url:
        assert time.monotonic() < deadline, f"the page did not follow bob's start: {page.url}"
        page.wait_for_timeout(500)
    assert hub.wait_server("bob", timeout=90)
    seen = json.loads(page.evaluate("() => sessionStorage.getItem('gpulab-notifications') || '[]'"))
    assert seen == ["Your server is starting: 1 × H100 in team vision is free now."], seen
    ctx.close()


def test_leave_the_queue_from_the_page(hub, browser):
    # bob holds the GPU now; alice queues and leaves
    ctx, page = browser_login(browser, hub.url, "alice", width=1280)
    page.goto(hub.url + "/hub/spawn")
    page.locator('label[data-choice="vision:h100"]').get_by_role(
        "button", name="Queue me for 1 × H100 in team vision"
    ).click()
    page.wait_for_load_state("networkidle")
    assert page.get_by_role("button", name="Leave the queue").is_visible()
    page.get_by_role("button", name="Leave the queue").click()
    page.wait_for_load_state("networkidle")
    assert page.locator("#gpulab-queue-notice").inner_text() == "You left the queue."
    assert page.get_by_role("button", name="Leave the queue").count() == 0
    ctx.close()
