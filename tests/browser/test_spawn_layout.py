"""The spawn page's size and what its cards say, measured in Chromium against a real hub.

Three teams of four profiles fit one 1400×900 screen (the page is no taller than the
viewport, the Start button included); at 800 px wide nothing is cut (no horizontal
scrolling, no element past the viewport's right edge, no clipped text); every card says
what its profile gives (GPU share and GPU memory, CPU, RAM, images) for a whole-GPU, a
fractional and a CPU profile; axe-core still finds nothing serious or critical.
Screenshots: docs/img/ (scripts/screenshots).
"""

from __future__ import annotations

import pytest

from tests.support.axe import axe_violations, blocking, describe
from tests.support.browser import browser_login, screenshots_dir
from tests.support.catalogs import SPAWN_THREE_TEAMS

pytestmark = pytest.mark.docs_screenshots

SHOTS = screenshots_dir("docs")

#: Every element of the form whose box ends right of the viewport, or whose content is wider
#: than its box while its overflow hides it (clipped text); an empty list when nothing is cut.
CUT_ELEMENTS = """() => {
  const width = document.documentElement.clientWidth;
  const cut = [];
  for (const el of document.querySelectorAll('#spawn_form *, .navbar, h1')) {
    const r = el.getBoundingClientRect();
    if (r.width === 0 && r.height === 0) continue;
    const style = getComputedStyle(el);
    const hides = ['hidden', 'clip'].includes(style.overflowX) || style.textOverflow === 'ellipsis';
    if (r.right > width + 0.5 || (hides && el.scrollWidth > el.clientWidth + 1)) {
      cut.push(`${el.tagName.toLowerCase()}#${el.id}.${el.className} right=${Math.round(r.right)}`);
    }
  }
  return cut;
}"""


@pytest.fixture(scope="module")
def hub(start_hub):
    return start_hub(SPAWN_THREE_TEAMS)


def card(page, value: str) -> str:
    return page.locator(f'label[data-choice="{value}"]').inner_text()


def test_three_teams_of_four_profiles_fit_one_1400_by_900_screen(hub, browser):
    ctx, page = browser_login(browser, hub.url, "alice", width=1400)
    page.set_viewport_size({"width": 1400, "height": 900})
    assert "/hub/spawn" in page.url, page.url
    assert page.locator("label.gpulab-profile").count() == 12
    height = page.evaluate("() => document.documentElement.scrollHeight")
    start = page.locator("#spawn_form button[type=submit]").bounding_box()
    bottom = page.evaluate("() => document.getElementById('spawn_form').getBoundingClientRect().bottom")
    print(f"spawn page at 1400×900, 3 teams × 4 profiles: {height} px tall, the form ends at {bottom:.0f} px")
    page.screenshot(path=str(SHOTS / "spawn-three-teams.png"), full_page=True)
    assert height <= 900, f"the page is {height} px tall: it does not fit a 900 px screen"
    assert start is not None and start["y"] + start["height"] <= 900
    found = blocking(axe_violations(page))
    assert not found, describe(found)
    ctx.close()


def test_at_800_px_wide_nothing_is_cut(hub, browser):
    ctx, page = browser_login(browser, hub.url, "alice", width=800)
    page.set_viewport_size({"width": 800, "height": 900})
    scroll = page.evaluate("() => [document.documentElement.scrollWidth, document.documentElement.clientWidth]")
    assert scroll[0] <= scroll[1], f"the page scrolls sideways at 800 px: {scroll}"
    cut = page.evaluate(CUT_ELEMENTS)
    assert not cut, cut
    page.screenshot(path=str(SHOTS / "spawn-800px.png"), full_page=True)
    ctx.close()


def test_each_card_says_what_its_profile_gives(hub, browser):
    ctx, page = browser_login(browser, hub.url, "alice", width=1400)
    # A whole GPU: the device's memory as the inventory declares it (81559 MiB), its CPU and RAM limits.
    one = card(page, "vision:h100-1")
    assert "1 × H100-80GB · 79.6 GiB GPU memory" in one, one
    assert "up to 16 CPU · up to 64 GiB RAM" in one, one
    # A fraction: its share of the device's memory, a CPU guarantee below the limit, two images.
    half = card(page, "nlp:h100-half")
    assert "0.5 × H100-80GB · 39.8 GiB GPU memory" in half, half
    assert "2 CPU guaranteed, up to 8 · up to 32 GiB RAM" in half, half
    images = page.locator('select[name="image-nlp:h100-half"] option').all_inner_texts()
    assert images == ["PyTorch", "Base"], images  # the image choices, in the card's own select
    quarter = card(page, "vision:h100-quarter")
    assert "0.25 × H100-80GB · 19.9 GiB GPU memory" in quarter and "CPU not limited" in quarter, quarter
    cpu = card(page, "speech:cpu")
    assert "No GPU" in cpu and "up to 2 CPU · 2 GiB RAM guaranteed, up to 4 GiB" in cpu, cpu
    # The facts are the start of each radio's description, so a screen reader says them too.
    described = page.locator("#gpulab-vision--h100-1").get_attribute("aria-describedby") or ""
    assert described.split()[0] == "gpulab-vision--h100-1-gives0"
    # The team's heading splits what it holds; its per-user cap is said once, there.
    heading = page.locator('fieldset[data-team="vision"] h3').inner_text()
    assert "at most 1.5 GPUs per user, you hold 0" in heading, heading
    assert "per-user cap" not in one
    split = page.locator('fieldset[data-team="vision"] .gpulab-quota-split').inner_text()
    assert split == "in quota 0 of 1 · borrowable 1 above the guarantee (preemptible) · 2 free in all", split
    # Team speech's 0.5-GPU burst leaves its whole GPU unavailable, with the reason and what to do.
    speech = card(page, "speech:h100-1")
    assert "Unavailable:" in speech and "Start 0.5 × H100, which fits now" in speech, speech
    ctx.close()
