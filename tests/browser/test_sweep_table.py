"""A parameter sweep in a real browser (Debian's Chromium through Playwright) against a real
embedded hub and real JupyterLab, its runs real papermill notebooks on the local backend.

alice opens "Run as GPU job" on her notebook and types a grid: the dialog counts the runs
and says what is wrong with a bad line at the field; she submits 6 runs, at most 3 at once,
best by the lowest loss. The sidebar's Sweeps section shows the sweep; opened, it is a table
of the runs' parameters, state and metrics. When the runs end, the best run (lr = 0.0003,
seed = 0) is marked; the table sorts by any column (aria-sort says how), and the best run's
output notebook opens in one click; "Open in a tab" shows the same table in the main area.
Cancel sweep cancels what is still waiting.
Screenshots: docs/img/lab-sweep-dialog.png, lab-sweep-sidebar.png, lab-sweep-table.png
(scripts/screenshots).
"""

from __future__ import annotations

import time

import pytest

from tests.support.hub import RunningHub
from tests.support.jobs import write_parameterised_notebook
from tests.support.lab import open_notebook_and_sidebar, shot_docs

pytestmark = pytest.mark.docs_screenshots

CATALOG = """
inventory:
  - {model: H100-80GB, count: 1, memory_mib: 81559}
profiles:
  - {slug: cpu, display_name: "CPU only", gpus: 0}
  - {slug: h100-half, display_name: "0.5 × H100", gpus: 0.5, gpu_model: H100-80GB}
teams:
  - {name: vision, display_name: Computer vision, users: [alice], guarantee: 1, burst: 1,
     allowed_profiles: [cpu, h100-half]}
"""
EXTRA = """
c.GPULabJobs.poll_interval = 0.5
c.GPULabJobs.max_running_jobs_per_user = 0
c.GPULabSweeps.metrics_interval = 1
"""
BODY = (
    "import time\n"
    "from gpulab_run import log_metrics\n"
    "time.sleep(sleep_seconds)\n"
    "loss = round((lr - 0.0003) ** 2 * 1e6 + seed * 0.5, 4)\n"
    "log_metrics(loss=loss, accuracy=round(1 - loss / 10, 4))\n"
)


def prepare(hub: RunningHub) -> None:
    for name in ("train.ipynb", "long.ipynb"):
        path = write_parameterised_notebook(
            hub.home("alice") / "exp" / name, "lr = 0.001\nseed = 0\nsleep_seconds = 0", BODY
        )
        hub.give("alice", path)


@pytest.fixture(scope="module")
def hub(start_hub):
    return start_hub(CATALOG, extra_config=EXTRA, prepare=prepare)


@pytest.fixture(scope="module")
def lab(hub: RunningHub, browser):
    page = browser.new_page(viewport={"width": 1400, "height": 900})
    page.set_default_timeout(60_000)
    open_notebook_and_sidebar(page, hub.url, "alice", "vision:cpu", "exp/train.ipynb")
    yield page
    page.close()


def open_dialog(page):
    page.locator("#gpulab-panel").get_by_role("button", name="Run as GPU job…").click()
    dialog = page.get_by_role("dialog", name="Run as GPU job")
    dialog.locator(".gpulab-job-form").wait_for()
    return dialog


def header_labels(table) -> list[str]:
    """The column headers' words, without the sort mark."""
    return [h.replace("▲", "").replace("▼", "").strip() for h in table.locator("thead th").all_inner_texts()]


def rows_order(table) -> list[str]:
    return table.locator("tbody tr").evaluate_all("rows => rows.map(r => r.dataset.runIndex)")


def test_the_dialog_submits_a_grid_and_the_sidebar_shows_the_sweep_as_a_table(hub: RunningHub, lab):
    page = lab
    dialog = open_dialog(page)
    dialog.locator('select[name="profile"]').select_option("cpu")
    dialog.locator("summary", has_text="Sweep").click()
    grid = dialog.locator('textarea[name="grid"]')
    grid.fill("lr = 0.0001, 0.0003, 0.001\nseed 0, 1")
    grid.blur()
    error = dialog.locator("#gpulab-err-grid")
    assert "Line 2: write it as name = value" in error.inner_text()
    assert grid.get_attribute("aria-invalid") == "true"
    grid.fill("lr = 0.0001, 0.0003, 0.001\nseed = 0, 1")
    assert dialog.locator(".gpulab-grid-runs").inner_text() == "6 runs, each a batch job of its own"
    assert error.count() == 0
    dialog.locator('input[name="max_parallel"]').fill("3")
    dialog.locator('input[name="objective"]').fill("loss")
    dialog.locator('input[name="name"]').fill("lr sweep")
    submit = dialog.get_by_role("button", name="Submit sweep (6 runs)")
    dialog.locator('select[name="direction"]').scroll_into_view_if_needed()
    shot_docs(page, "lab-sweep-dialog", dialog)
    submit.click()
    dialog.wait_for(state="detached")

    panel = page.locator("#gpulab-panel")
    sweep = panel.locator(".gpulab-sweep").first
    sweep.wait_for()
    assert "lr-sweep" in sweep.inner_text() and "at most 3 at once" in sweep.inner_text()
    sweep.get_by_role("button", name="lr-sweep").click()
    table = sweep.get_by_role("table", name="Runs of sweep lr-sweep")
    table.wait_for()
    headers = header_labels(table)
    assert headers[:4] == ["#", "lr", "seed", "State"], headers
    assert len(rows_order(table)) == 6

    # The runs end; their metrics come back and the best one is marked.
    deadline = time.monotonic() + 150
    while (
        table.locator('tbody tr[data-state="succeeded"]').count() < 6 or table.locator(".gpulab-best-run").count() != 1
    ):
        assert time.monotonic() < deadline, table.inner_text()
        time.sleep(0.5)
    deadline = time.monotonic() + 30
    while "–" in table.locator("tbody").inner_text():  # the last run's metrics, read once it ended
        assert time.monotonic() < deadline, table.inner_text()
        time.sleep(0.5)
    best = table.locator(".gpulab-best-run")
    assert best.get_attribute("data-run-index") == "2", table.inner_text()  # lr 0.0003, seed 0
    assert "★ best" in best.inner_text()
    headers = header_labels(table)
    assert headers[4] == "loss (min)" and headers[5] == "accuracy", headers

    # Sorting: by loss, ascending then descending; aria-sort says so.
    loss = table.locator('button[data-column="metric:loss"]')
    loss.click()
    assert rows_order(table)[0] == "2"
    assert loss.locator("xpath=..").get_attribute("aria-sort") == "ascending"
    loss.click()
    assert rows_order(table)[-1] == "2"
    assert loss.locator("xpath=..").get_attribute("aria-sort") == "descending"
    table.locator('button[data-column="parameter:lr"]').click()
    assert rows_order(table)[:2] == ["0", "1"]
    loss.click()
    shot_docs(page, "lab-sweep-sidebar", panel.locator(".gpulab-sweeps"))

    # The same table in a tab of the main area, where its columns have room.
    sweep.get_by_role("button", name="Open sweep lr-sweep in a tab").click()
    tab_table = page.locator(".gpulab-sweep-tab-widget").get_by_role("table", name="Runs of sweep lr-sweep")
    tab_table.wait_for()
    assert len(rows_order(tab_table)) == 6
    assert tab_table.locator(".gpulab-best-run").get_attribute("data-run-index") == "2"
    tab_table.locator('button[data-column="metric:loss"]').click()
    assert rows_order(tab_table)[0] == "2"
    shot_docs(page, "lab-sweep-table", page.locator(".jp-MainAreaWidget:has(.gpulab-sweep-tab-widget)"))

    # The best run's output notebook, one click away.
    best.get_by_role("button", name="Open the output notebook of run 2").click()
    tab = page.locator(".lm-TabBar-tab", has_text="lr-sweep-r2-")
    tab.wait_for()
    assert tab.count() == 1


def test_cancel_sweep_cancels_what_is_left(hub: RunningHub, lab):
    page = lab
    dialog = open_dialog(page)
    dialog.locator('input[name="notebook"]').fill("exp/long.ipynb")
    dialog.locator('select[name="profile"]').select_option("cpu")
    dialog.locator("summary", has_text="Sweep").click()
    dialog.locator('textarea[name="grid"]').fill("sleep_seconds = 120, 121, 122")
    dialog.locator('input[name="max_parallel"]').fill("1")
    dialog.locator('input[name="name"]').fill("long")
    dialog.get_by_role("button", name="Submit sweep (3 runs)").click()
    dialog.wait_for(state="detached")
    panel = page.locator("#gpulab-panel")
    sweep = panel.locator(".gpulab-sweep", has_text="long").first
    sweep.get_by_role("button", name="long").click()
    table = sweep.get_by_role("table")
    table.locator('tbody tr[data-state="waiting"]').first.wait_for()
    sweep.get_by_role("button", name="Cancel sweep long").click()
    page.get_by_role("button", name="Cancel sweep", exact=True).click()
    deadline = time.monotonic() + 30
    while table.locator('tbody tr[data-state="cancelled"]').count() < 3:
        assert time.monotonic() < deadline, table.inner_text()
        time.sleep(0.3)
    assert sweep.get_attribute("data-state") == "cancelled"
