"""The admin page's quota tree in a real browser: departments over teams, each node's GPUs held,
guaranteed, burst and borrowed, and its pools, with a server really holding GPUs of a pool.
Screenshot: docs/img/admin-quota-tree.png (scripts/screenshots)."""

from __future__ import annotations

import pytest

from tests.support.browser import browser_login, screenshots_dir
from tests.support.catalogs import H100_HALF, H100_ONE, H100_QUARTER, h100_inventory

pytestmark = pytest.mark.docs_screenshots

SHOTS = screenshots_dir("docs")
CATALOG = (
    h100_inventory(2)
    + "pools:\n  - {name: h100, gpu_model: H100-80GB}\n"
    + "departments:\n  - {name: research, display_name: Research, guarantee: 1.5, burst: 2,"
    + " pools: {h100: {guarantee: 1.5, burst: 2}}}\n"
    + "profiles:\n"
    + H100_QUARTER
    + H100_HALF
    + H100_ONE
    + """teams:
  - {name: vision, users: [alice, bob], guarantee: 0.25, burst: 1.5, department: research, fair_share_weight: 2,
     pools: {h100: {guarantee: 0.25, burst: 1}}}
  - {name: nlp, users: [carol], guarantee: 1, burst: 1.5, department: research}
  - {name: ops, users: [otto], guarantee: 0.25, burst: 1}
"""
)


@pytest.fixture(scope="module")
def hub(start_hub):
    return start_hub(CATALOG)


def test_admin_page_shows_the_tree_with_held_guaranteed_and_borrowed(hub, browser):
    r = hub.api("POST", "/users/alice/server", json={"team": "vision", "profile": "h100-half"})
    assert r.status_code in (201, 202), r.text
    hub.wait_server("alice")
    ctx, page = browser_login(browser, hub.url, "admin", width=1400)
    try:
        page.goto(hub.url + "/hub/gpulab/admin")
        table = page.locator("#gpulab-tree-table")
        table.wait_for()
        rows = [" ".join(r.split()) for r in table.locator("tbody tr").all_inner_texts()]
        # node, held, guaranteed, burst, borrowed (GPUs), weight · share
        assert rows[0] == "Department Research 0.5 1.5 2 0"
        assert rows[1] == "pool h100 0.5 1.5 2 0"
        assert rows[2].startswith("Team vision 0.5 0.25 1.5 0.25 2 · share")
        assert rows[3] == "pool h100 0.5 0.25 1 0.25"
        assert rows[4].startswith("Team nlp 0 1 1.5 0 1")
        assert rows[5].startswith("Team ops 0 0.25 1 0")
        assert "h100: H100-80GB (h100-1, h100-half, h100-quarter)" in page.locator("#gpulab-pools").inner_text()
        page.locator("#gpulab-tree").screenshot(path=str(SHOTS / "admin-quota-tree.png"))
    finally:
        ctx.close()
        hub.api("DELETE", "/users/alice/server")
