"""End to end in a real browser: Debian's Chromium driven by Playwright against
a real embedded hub, real JupyterLab with the prebuilt gpulab extension, and a
real papermill job.

alice logs in, starts a 0.25-GPU profile, opens the GPU sidebar (session and
team quota), submits the open notebook as a batch job with a parameter from the
"Run as GPU job" dialog, watches it reach `succeeded` in the sidebar, opens its
output notebook and sees the parameter's effect; she edits the notebook, and the
jobs list's Re-run runs it as the job ran it, "Run current" as it is now. Screenshots go to
gpulab-test-output/e2e-lab/ under the temporary folder (sidebar, dialog, finished job, output, dark
theme), and the Re-run choices to docs/img/lab-job-rerun.png (scripts/screenshots).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.support.browser import screenshots_dir
from tests.support.catalogs import H100_PROFILES, VISION_TEAM, h100_inventory
from tests.support.hub import ADMIN_AND_CULLER_SCOPES, RunningHub
from tests.support.lab import give_notebook, shot_docs

pytestmark = pytest.mark.docs_screenshots

SHOTS = screenshots_dir("e2e-lab")
CATALOG = h100_inventory(1) + H100_PROFILES + "teams:\n" + VISION_TEAM


@pytest.fixture(scope="module")
def hub(start_hub):
    # the test also plays the idle culler
    return start_hub(
        CATALOG, admin_scopes=ADMIN_AND_CULLER_SCOPES, prepare=lambda h: give_notebook(h, "alice", "greet.ipynb")
    )


def shot(page, name: str, locator=None) -> Path:
    SHOTS.mkdir(parents=True, exist_ok=True)
    path = SHOTS / f"{name}.png"
    (locator or page).screenshot(path=str(path))
    return path


def test_sidebar_dialog_job_and_output(hub: RunningHub, browser):
    page = browser.new_page(viewport={"width": 1400, "height": 900})
    page.set_default_timeout(60_000)
    try:
        run_scenario(hub, page)
    except Exception:
        shot(page, "failure")
        raise
    finally:
        page.close()


def run_scenario(hub: RunningHub, page) -> None:
    # Log in and start a 0.25-GPU server from the spawn page.
    page.goto(hub.url + "/hub/login")
    page.fill("input[name=username]", "alice")
    page.fill("input[name=password]", "gpulab-demo")
    page.click("input[type=submit], button[type=submit]")
    page.wait_for_url("**/hub/spawn**")
    page.check('input[name=choice][value="vision:h100-quarter"]')
    page.click("form input[type=submit], form button[type=submit]")
    page.wait_for_url("**/user/alice/lab**", timeout=90_000)

    # Open the notebook, then the GPU sidebar.
    page.goto(hub.url + "/user/alice/lab/tree/greet.ipynb")
    page.wait_for_selector(".jp-NotebookPanel .jp-Cell", timeout=90_000)
    page.click('.jp-SideBar [data-id="gpulab-panel"]')
    panel = page.locator("#gpulab-panel")
    panel.locator(".gpulab-profile", has_text="0.25 × H100").wait_for()
    panel.locator(".gpulab-share", has_text="0.25 × H100-80GB").wait_for()
    panel.locator(".gpulab-quota-bar").wait_for()
    quota = panel.locator(".gpulab-quota-bar").get_attribute("aria-label")
    assert quota.startswith("Team vision: 0.25 GPUs in quota, 0 burst, 0.75 free"), quota
    assert "No utilisation data" in panel.inner_text()  # no NVIDIA driver on this machine
    panel.locator(".gpulab-muted", has_text="No jobs yet.").wait_for()
    shot(page, "sidebar", panel)

    # "Run as GPU job" from the notebook toolbar: the form is pre-filled.
    page.click(".jp-NotebookPanel-toolbar .gpulab-toolbar-button")
    dialog = page.locator(".jp-Dialog .gpulab-job-form")
    dialog.wait_for()
    assert dialog.locator('input[name="notebook"]').input_value() == "greet.ipynb"
    assert dialog.locator('input[name="param-who"]').input_value() == "world"
    assert dialog.locator('input[name="param-repeat"]').input_value() == "1"
    options = dialog.locator('select[name="profile"] option').all_inner_texts()
    assert any(o.startswith("0.25 × H100 (0.25 GPU) — available") for o in options), options
    assert dialog.locator('input[name="job_class"][value="batch"]').is_checked()
    dialog.locator('input[name="param-who"]').fill("gpulab e2e")
    dialog.locator('input[name="param-repeat"]').fill("2")
    dialog.locator('input[name="time_limit"]').fill("10")
    page.locator(".jp-Dialog-body").evaluate("el => { el.scrollTop = 0; }")
    shot(page, "dialog", page.locator(".jp-Dialog-content"))

    # A bad request first: the hub's error is shown in the dialog as such.
    dialog.locator('input[name="notebook"]').fill("no-such.ipynb")
    page.click(".jp-Dialog button.jp-mod-accept")
    error = page.locator(".jp-Dialog .gpulab-form-errors")
    error.wait_for()
    assert "The hub refused the job:" in error.inner_text()
    assert "no-such.ipynb" in error.inner_text(), error.inner_text()
    shot(page, "dialog-error", page.locator(".jp-Dialog-content"))
    page.locator('.jp-Dialog input[name="notebook"]').fill("greet.ipynb")
    page.click(".jp-Dialog button.jp-mod-accept")
    page.locator(".jp-Dialog").wait_for(state="detached")

    # The job appears in the sidebar and reaches succeeded.
    job = panel.locator(".gpulab-job").first
    job.wait_for()
    panel.locator('.gpulab-job[data-state="succeeded"]').wait_for(timeout=120_000)
    job_id = job.get_attribute("data-job-id")
    job = panel.locator(f'.gpulab-job[data-job-id="{job_id}"]')
    record = hub.api("GET", f"/gpulab/jobs/{job_id}").json()
    assert record["user"] == "alice" and record["job_class"] == "batch"
    assert record["profile"] == "h100-quarter" and record["gpu_milli"] == 250
    assert record["parameters"] == {"who": "gpulab e2e", "repeat": 2, "pause": 0}
    assert record["time_limit_seconds"] == 600
    assert "0.25 GPU" in job.inner_text() and "batch" in job.inner_text()
    shot(page, "sidebar-job-succeeded", panel)

    # Logs open in the main area.
    job.get_by_role("button", name="Logs of job").click()
    page.locator(".gpulab-logs-head", has_text="log complete").wait_for()

    # The output notebook opens and shows the parameter's effect.
    job.get_by_role("button", name="Open the output notebook").click()
    out = page.locator(".jp-NotebookPanel .jp-OutputArea-output", has_text="hello gpulab e2e! hello gpulab e2e!")
    out.wait_for(timeout=60_000)
    assert page.locator(".lm-TabBar-tab.lm-mod-current").last.inner_text().endswith(".ipynb")
    shot(page, "output-notebook")

    # From the sidebar's button: a slow job, cancelled while it runs.
    panel.get_by_role("button", name="Run as GPU job…").click()
    # (the dialog starts from the notebook in front: now the output notebook)
    assert page.locator('.jp-Dialog input[name="notebook"]').input_value().startswith("runs/greet-")
    page.locator('.jp-Dialog input[name="notebook"]').fill("greet.ipynb")
    page.locator('.jp-Dialog input[name="param-pause"]').fill("60")
    page.click(".jp-Dialog button.jp-mod-accept")
    page.locator(".jp-Dialog").wait_for(state="detached")
    slow = panel.locator(f'.gpulab-job:not([data-job-id="{job_id}"])')
    slow.wait_for()
    slow.get_by_role("button", name="Cancel job").click()
    page.locator(".jp-Dialog").get_by_role("button", name="Cancel job", exact=True).click()  # asked once
    panel.locator('.gpulab-job[data-state="cancelled"]').wait_for(timeout=30_000)
    slow_id = slow.get_attribute("data-job-id")
    slow_record = hub.api("GET", f"/gpulab/jobs/{slow_id}").json()
    assert slow_record["state"] == "cancelled" and slow_record["parameters"]["pause"] == 60
    # The notebook is edited after the first job ran; Re-run runs it as that job ran it (its kept
    # copy), "Run current" runs it as it is now; both with the same parameters.
    greet = hub.home("alice") / "greet.ipynb"
    edited = json.loads(greet.read_text())
    edited["cells"][-1]["source"] = 'print("edited since")'
    greet.write_text(json.dumps(edited))
    job.get_by_role("button", name="Run job greet again with its notebook as it ran").click()
    panel.locator(".gpulab-job").nth(2).wait_for()
    jobs = hub.api("GET", "/gpulab/jobs", params={"user": "alice"}).json()["jobs"]
    assert len(jobs) == 3
    rerun = [j for j in jobs if str(j["id"]) not in (job_id, slow_id)][0]
    assert rerun["parameters"] == record["parameters"] and rerun["notebook"] == "greet.ipynb"
    assert rerun["rerun_of"] == int(job_id)
    job.get_by_role("button", name="Run the current greet.ipynb with the settings of job greet").click()
    panel.locator(".gpulab-job").nth(3).wait_for()
    jobs = hub.api("GET", "/gpulab/jobs", params={"user": "alice"}).json()["jobs"]
    current = [j for j in jobs if str(j["id"]) not in (job_id, slow_id, str(rerun["id"]))][0]
    assert current["parameters"] == record["parameters"] and current["rerun_of"] is None

    def printed(job_record: dict) -> str:
        panel.locator(f'.gpulab-job[data-job-id="{job_record["id"]}"][data-state="succeeded"]').wait_for(timeout=90_000)
        nb = hub.api("GET", f"/gpulab/jobs/{job_record['id']}/output").json()
        return "".join("".join(o.get("text", "")) for c in nb["cells"] for o in c.get("outputs", []))

    assert "hello gpulab e2e! hello gpulab e2e!" in printed(rerun) and "edited since" not in printed(rerun)
    assert "edited since" in printed(current)
    shot_docs(page, "lab-job-rerun", panel.locator(".gpulab-jobs"))

    # The culler warns: a countdown and "Keep my GPU", which clears the warning.
    r = hub.api(
        "POST",
        "/gpulab/idle/warnings",
        json={
            "user": "alice",
            "server": "",
            "grace_seconds": 900,
            "gpu_milli": 250,
            "reason": "GPU 0 at 0% for 30 minutes",
            "evidence": {"source": "e2e test"},
        },
    )
    assert r.status_code == 201, r.text
    warning = panel.locator(".gpulab-idle")
    warning.wait_for(timeout=30_000)
    assert "GPU 0 at 0% for 30 minutes" in warning.inner_text()
    countdown = warning.locator(".gpulab-countdown").inner_text()
    assert countdown.startswith(("15:", "14:")), countdown
    shot(page, "sidebar-idle-warning", panel)
    # Wherever the user is: a notification with the reclaim time and "Keep my GPU", and the status bar.
    toast = page.locator(".Toastify__toast", has_text="will be reclaimed at")
    toast.wait_for(timeout=45_000)
    assert "Keep my GPU" in toast.inner_text()
    status = page.locator(".gpulab-idle-status")
    status.wait_for(timeout=30_000)
    assert status.inner_text().startswith("GPU idle: reclaimed at"), status.inner_text()
    shot(page, "idle-notification")
    warning.get_by_role("button", name="Keep my GPU").click()
    warning.wait_for(state="detached")
    panel.locator(".gpulab-status", has_text="Your GPU is kept.").wait_for()
    idle = hub.api("GET", "/gpulab/idle", params={"user": "alice", "server": ""}).json()
    assert idle["warning"] is None and idle["keepalive"]["used"] == 1
    toast.wait_for(state="detached", timeout=45_000)  # the next poll sees no warning: the toast goes

    # The dark theme: same panel, readable (theme variables only).
    xsrf = next(c["value"] for c in page.context.cookies() if c["name"] == "_xsrf")
    r = page.request.put(
        hub.url + "/user/alice/lab/api/settings/@jupyterlab/apputils-extension:themes",
        data=json.dumps({"raw": json.dumps({"theme": "JupyterLab Dark"})}),
        headers={"X-XSRFToken": xsrf, "Content-Type": "application/json"},
    )
    assert r.ok, r.text()
    page.goto(hub.url + "/user/alice/lab")
    page.wait_for_selector('body[data-jp-theme-light="false"]', state="attached", timeout=60_000)
    page.click('.jp-SideBar [data-id="gpulab-panel"]')
    panel.locator(f'.gpulab-job[data-job-id="{job_id}"][data-state="succeeded"]').wait_for()
    shot(page, "sidebar-dark", panel)

    # The other ways in: the file browser's context menu on a notebook ...
    page.click('.jp-SideBar [data-id="filebrowser"]')
    page.locator('.jp-DirListing-item[data-file-type="notebook"][title*="greet.ipynb"]').first.click(button="right")
    page.locator(".lm-Menu-item", has_text="Run as GPU job…").click()
    page.locator(".jp-Dialog .gpulab-job-form").wait_for()
    assert page.locator('.jp-Dialog input[name="notebook"]').input_value() == "greet.ipynb"
    page.click(".jp-Dialog button.jp-mod-reject")
    page.locator(".jp-Dialog").wait_for(state="detached")
    # ... and the Launcher's "GPU" category.
    page.locator(".lm-TabBar-addButton:not(.lm-mod-hidden)").first.click()
    section = page.locator(".jp-Launcher-section", has=page.locator(".jp-Launcher-sectionTitle", has_text="GPU"))
    card = section.locator(".jp-LauncherCard", has_text="GPU job")
    card.wait_for()
    shot(page, "launcher-dark", page.locator(".jp-Launcher-body"))
    card.click()
    page.locator(".jp-Dialog .gpulab-job-form").wait_for()
    page.click(".jp-Dialog button.jp-mod-reject")
