"""The "Run as GPU job" dialog in a real browser (Debian's Chromium through Playwright)
against a real embedded hub and real JupyterLab: it never changes a choice the user made,
and it follows the WAI-ARIA modal dialog pattern.

alice's server holds 0.5 × H100 of team vision's 0.5 GPU guarantee. She picks 1 × H100
as a batch job (it fits, above the guarantee), switches to training (it does not fit):
the profile stays 1 × H100, marked, with the reason and the spawn page's "what to do"
(her own server holds the guarantee), Submit is disabled and "Submit as batch instead
(preemptible)" is offered. Switching the team and back, and the arrow keys on the class,
change nothing else. Bad fields are said at the field; a parameter can be removed; batch
instead submits exactly 1 × H100 as batch. The next dialog does not preselect the
remembered 1 × H100 once it no longer fits. Cancelling the job asks once; its log and
output stay reachable. Tab and Shift+Tab go through every control
and wrap, Escape closes, focus returns; gpulab's commands are in the command palette; the
lab does not ask about Jupyter news (the embedded hub's default).
Screenshot: docs/img/lab-job-dialog-kept-choice.png (scripts/screenshots).
"""

from __future__ import annotations

import re
import time

import pytest

from tests.support.hub import RunningHub
from tests.support.lab import give_notebook, open_notebook_and_sidebar, shot_docs

pytestmark = pytest.mark.docs_screenshots

CATALOG = """
inventory:
  - {model: H100-80GB, count: 2, memory_mib: 81559}
profiles:
  - {slug: cpu, display_name: "CPU only", gpus: 0}
  - {slug: h100-quarter, display_name: "0.25 × H100", gpus: 0.25, gpu_model: H100-80GB}
  - {slug: h100-half, display_name: "0.5 × H100", gpus: 0.5, gpu_model: H100-80GB}
  - {slug: h100-1, display_name: "1 × H100", gpus: 1, gpu_model: H100-80GB}
teams:
  - {name: vision, display_name: Computer vision, users: [alice], guarantee: 0.5, burst: 2,
     allowed_profiles: [cpu, h100-quarter, h100-half, h100-1]}
  - {name: nlp, display_name: Language models, users: [alice], guarantee: 1, burst: 1,
     allowed_profiles: [h100-quarter, h100-1]}
"""
EXTRA = """
c.GPULabJobs.poll_interval = 0.5
"""


@pytest.fixture(scope="module")
def hub(start_hub):
    return start_hub(CATALOG, extra_config=EXTRA, prepare=lambda h: give_notebook(h, "alice", "greet.ipynb"))


@pytest.fixture(scope="module")
def lab(hub: RunningHub, browser):
    page = browser.new_page(viewport={"width": 1400, "height": 900})
    page.set_default_timeout(60_000)
    open_notebook_and_sidebar(page, hub.url, "alice", "vision:h100-half", "greet.ipynb")
    yield page
    page.close()


def open_dialog(page):
    opener = page.locator("#gpulab-panel").get_by_role("button", name="Run as GPU job…")
    opener.focus()
    page.keyboard.press("Enter")
    dialog = page.get_by_role("dialog", name="Run as GPU job")
    dialog.locator(".gpulab-job-form").wait_for()
    return dialog


def selected_label(select) -> str:
    return select.evaluate("el => el.selectedOptions[0].textContent")


def test_a_choice_that_stops_fitting_stays_and_says_why(hub: RunningHub, lab):
    page = lab
    dialog = open_dialog(page)
    try:
        profile = dialog.locator('select[name="profile"]')
        submit = dialog.get_by_role("button", name="Submit job")
        status = dialog.locator("#gpulab-job-choice-status")
        profile.select_option("h100-1")
        assert selected_label(profile) == "1 × H100 (1 GPU) — available above the guarantee (preemptible)"
        assert submit.is_enabled()

        # Training may not burst: the choice stays, marked, with the reason and what to do.
        dialog.get_by_role("radio", name="Training", exact=True).check()
        assert profile.input_value() == "h100-1"
        assert selected_label(profile).startswith("1 × H100 (1 GPU) — not now: team vision holds 0.5 of its 0.5")
        assert profile.get_attribute("aria-invalid") == "true"
        text = status.inner_text()
        assert "Does not fit now: team vision holds 0.5 of its 0.5 GPU guarantee" in text, text
        assert "Stop your default server, which holds 0.5 GPU of team vision's GPUs" in text, text
        assert "ask an admin about team vision's quota" in text, text
        assert submit.is_disabled()
        batch_instead = dialog.get_by_role("button", name="Submit as batch instead (preemptible)")
        assert batch_instead.is_enabled()
        shot_docs(page, "lab-job-dialog-kept-choice", dialog)

        # Another team where it fits, then back: the profile never moves.
        dialog.locator('select[name="team"]').select_option("nlp")
        assert profile.input_value() == "h100-1" and submit.is_enabled()
        assert batch_instead.count() == 0
        dialog.locator('select[name="team"]').select_option("vision")
        assert profile.input_value() == "h100-1" and submit.is_disabled()
        # The arrow keys on the class change the class, nothing else.
        dialog.get_by_role("radio", name="Training", exact=True).focus()
        page.keyboard.press("ArrowUp")
        assert dialog.get_by_role("radio", name="Batch", exact=True).is_checked()
        assert profile.input_value() == "h100-1" and submit.is_enabled()
        page.keyboard.press("ArrowDown")
        assert dialog.get_by_role("radio", name="Training", exact=True).is_checked()
        assert profile.input_value() == "h100-1" and submit.is_disabled()

        # The form's own problems, at the field; a parameter can be removed.
        time_limit = dialog.locator('input[name="time_limit"]')
        time_limit.fill("0")
        time_limit.blur()
        assert time_limit.get_attribute("aria-invalid") == "true"
        err = dialog.locator("#" + time_limit.get_attribute("aria-describedby"))
        assert err.inner_text() == "The time limit must be a whole number of minutes above 0."
        time_limit.fill("10")
        assert time_limit.get_attribute("aria-invalid") is None
        dialog.get_by_role("button", name="Remove repeat").click()
        assert dialog.locator('input[name="param-repeat"]').count() == 0
        dialog.locator('input[name="param-pause"]').fill("60")

        # Batch instead: exactly the chosen profile, as batch.
        batch_instead.click()
        page.locator(".gpulab-job-dialog").wait_for(state="detached")
    except Exception:
        shot_docs(page, "job-dialog-failure", failure=True)
        raise
    job = page.locator('#gpulab-panel .gpulab-job[data-state="running"]')
    job.wait_for(timeout=90_000)
    record = hub.api("GET", f"/gpulab/jobs/{job.get_attribute('data-job-id')}").json()
    assert (record["job_class"], record["team"], record["profile"], record["gpu_milli"]) == (
        "batch",
        "vision",
        "h100-1",
        1000,
    )
    assert record["parameters"] == {"who": "world", "pause": 60}
    assert record["time_limit_seconds"] == 600

    # The job holds 1 more GPU (1.5 of burst 2): the remembered 1 × H100 no longer fits and is not preselected.
    dialog = open_dialog(page)
    profile = dialog.locator('select[name="profile"]')
    assert profile.input_value() != "h100-1"
    assert " — available" in selected_label(profile), selected_label(profile)
    assert dialog.get_by_role("button", name="Submit job").is_enabled()
    page.keyboard.press("Escape")
    page.locator(".gpulab-job-dialog").wait_for(state="detached")

    # Cancel asks once ("Keep running" keeps it); the log and the output written so far stay.
    row = page.locator(f'#gpulab-panel .gpulab-job[data-job-id="{record["id"]}"]')
    row.get_by_role("button", name=re.compile("^Cancel job")).click()
    confirm = page.locator(".jp-Dialog", has_text=f"Cancel job #{record['id']}?")
    assert "Its log and the output notebook written so far stay" in confirm.inner_text()
    confirm.get_by_role("button", name="Keep running").click()
    confirm.wait_for(state="detached")
    assert hub.api("GET", f"/gpulab/jobs/{record['id']}").json()["state"] == "running"
    row.get_by_role("button", name=re.compile("^Cancel job")).click()
    confirm.get_by_role("button", name="Cancel job").click()
    page.locator(f'#gpulab-panel .gpulab-job[data-job-id="{record["id"]}"][data-state="cancelled"]').wait_for()
    output = row.get_by_role("button", name=re.compile("^Open the output notebook"))
    assert output.is_enabled() and row.get_by_role("button", name=re.compile("^Logs of job")).is_enabled()
    output.click()  # the notebook as far as papermill wrote it (the parameters cell ran; the pause did not end)
    page.locator("#gpulab-panel .gpulab-status", has_text="Opened output").wait_for()


def focused(page) -> str:
    """The focused control, as a test names it: tag, name or label."""
    return page.evaluate(
        """() => { const el = document.activeElement;
                   return [el.tagName.toLowerCase(), el.getAttribute('name') || el.getAttribute('aria-label')
                           || el.textContent.trim()].join(':'); }"""
    )


def test_keyboard_focus_wraps_escape_closes_and_focus_returns(lab):
    page = lab
    dialog = open_dialog(page)
    assert focused(page) == "input:notebook"
    seen = [focused(page)]
    for _ in range(40):
        page.keyboard.press("Tab")
        here = focused(page)
        assert dialog.evaluate("(el, _) => el.contains(document.activeElement)", None), here
        if here == seen[0]:
            break
        seen.append(here)
    else:
        raise AssertionError(f"Tab never came back to the notebook field: {seen}")
    for control in (
        "input:name",
        "input:time_limit",
        "input:job_class",
        "select:team",
        "select:profile",
        "input:Name of parameter 1",
        "input:param-who",
        "button:Remove who",
        "button:Add parameter",
        "summary:Sweep: run it once per combination of parameter values",
        "button:Cancel",
        "button:Submit job",
    ):
        assert control in seen, (control, seen)
    # Shift+Tab from the first control goes to the last.
    page.keyboard.press("Shift+Tab")
    assert focused(page) == seen[-1]
    # Escape closes; focus returns to the button that opened the dialog.
    page.keyboard.press("Escape")
    page.locator(".gpulab-job-dialog").wait_for(state="detached")
    assert focused(page) == "button:Run as GPU job…"


def test_gpulab_commands_are_in_the_command_palette(lab):
    page = lab
    page.locator(".jp-NotebookPanel:visible .jp-Cell").first.click()
    page.keyboard.press("Escape")
    page.keyboard.press("Control+Shift+C")
    search = page.locator(".lm-CommandPalette-input")
    search.wait_for()
    search.fill("GPU")
    labels = page.locator(".lm-CommandPalette-item .lm-CommandPalette-itemLabel").all_inner_texts()
    for command in ("Run as GPU job…", "Show the GPU panel", "Stop server and release GPU", "Keep my GPU"):
        assert command in labels, (command, labels)
    page.keyboard.press("Escape")


def test_the_lab_does_not_ask_about_jupyter_news(hub: RunningHub, lab):
    """The embedded hub's default (GPULAB_LAB_NEWS=off), as the user's lab reads its settings."""
    settings = lab.evaluate(
        """async url => {
            const xsrf = (document.cookie.match(/(?:^|; )_xsrf=([^;]*)/) || [])[1] || '';
            const r = await fetch(url, { headers: { 'X-XSRFToken': decodeURIComponent(xsrf) } });
            return { status: r.status, ...(await r.json()) };
        }""",
        hub.url + "/user/alice/lab/api/settings/@jupyterlab/apputils-extension:notification",
    )
    assert settings["status"] == 200, settings
    # The platform's defaults are the schema's defaults the server sends; the user set nothing.
    defaults = {k: v.get("default") for k, v in settings["schema"]["properties"].items()}
    assert (defaults["fetchNews"], defaults["checkForUpdates"]) == ("false", False), defaults
    assert "fetchNews" not in settings["settings"]
    assert lab.get_by_text("official Jupyter news").count() == 0


def test_a_script_with_arguments_and_nodes_from_the_dialog(hub: RunningHub, lab):
    """alice types a script with arguments, asks for 2 nodes as training: the dialog shows the
    total, the hub's refusal (one server is one node) appears in the dialog, and with 1 node
    the script runs with exactly the arguments she typed.
    Screenshot: docs/img/lab-job-dialog-script.png (scripts/screenshots)."""
    page = lab
    script = hub.home("alice") / "train.py"
    script.write_text("import json, sys\nprint('argv', json.dumps(sys.argv[1:]))\n")
    hub.give("alice", script)
    dialog = open_dialog(page)
    try:
        dialog.locator('input[name="notebook"]').fill("train.py")
        args = dialog.locator('input[name="args"]')
        args.fill('--epochs 3 --name "a b"')
        assert dialog.locator(".gpulab-params").count() == 0  # a script takes arguments, not parameters
        dialog.locator('select[name="team"]').select_option("nlp")
        dialog.locator('select[name="profile"]').select_option("h100-1")
        dialog.get_by_role("radio", name="Training", exact=True).check()
        nodes = dialog.locator('input[name="nodes"]')
        nodes.fill("2")
        total = dialog.locator("#gpulab-nodes-total")
        assert total.inner_text() == "2 × 1 H100-80GB = 2 GPUs, admitted all at once or not at all"
        shot_docs(page, "lab-job-dialog-script", dialog)
        dialog.get_by_role("button", name="Submit job").click()
        alert = dialog.get_by_role("alert")
        alert.wait_for()
        assert "this server is one node" in alert.inner_text(), alert.inner_text()
        nodes.fill("1")
        assert total.inner_text() == "1 × 1 H100-80GB = 1 GPUs"
        dialog.get_by_role("button", name="Submit job").click()
        page.locator(".gpulab-job-dialog").wait_for(state="detached")
    except Exception:
        shot_docs(page, "job-dialog-script-failure", failure=True)
        raise
    jobs = hub.api("GET", "/gpulab/jobs", params={"user": "alice"}).json()["jobs"]
    record = next(j for j in jobs if j["kind"] == "script")
    assert (record["script"], record["args"], record["job_class"], record["team"], record["nodes"]) == (
        "train.py",
        ["--epochs", "3", "--name", "a b"],
        "training",
        "nlp",
        1,
    )
    deadline = time.monotonic() + 90
    while hub.api("GET", f"/gpulab/jobs/{record['id']}").json()["state"] not in ("succeeded", "failed"):
        assert time.monotonic() < deadline, "the script job never ended"
        time.sleep(0.5)
    done = hub.api("GET", f"/gpulab/jobs/{record['id']}").json()
    assert done["state"] == "succeeded", done
    log = hub.api("GET", f"/gpulab/jobs/{record['id']}/logs").json()["text"]
    assert 'argv ["--epochs", "3", "--name", "a b"]' in log, log
