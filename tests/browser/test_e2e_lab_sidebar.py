"""The GPU sidebar and the job dialog in a real browser (Debian's Chromium
through Playwright) against a real embedded hub and real JupyterLab, and the
same extension under a vanilla JupyterHub that has no gpulab.

alice starts "0.5 × H100": the sidebar names the profile, states its idle
policy and offers "Stop server and release GPU"; the job dialog starts from
her server's profile, offers a training job nothing that only a burst would
fit, and shows name and time limit without scrolling; the jobs list shows id,
submit and start time and the state history; the quota bar counts the running
job; the dialog remembers the last profile; "Stop server" makes the hub stop
the server (releasing the GPU) and the page says so. Screenshots go to
docs/img/lab-*.png.
"""

from __future__ import annotations

import os
import textwrap

import pytest
from playwright.sync_api import expect

from tests.support import VENV_BIN
from tests.support.hub import RunningHub
from tests.support.lab import give_notebook, login_and_spawn, shot_docs

pytestmark = pytest.mark.docs_screenshots

CATALOG = """
inventory:
  - {model: H100-80GB, count: 1, memory_mib: 81559}
profiles:
  - {slug: h100-quarter, display_name: "0.25 × H100", gpus: 0.25, gpu_model: H100-80GB}
  - {slug: h100-half, display_name: "0.5 × H100", gpus: 0.5, gpu_model: H100-80GB, idle_timeout: 45m}
teams:
  - {name: vision, display_name: Computer vision, users: [alice], guarantee: 0.5, burst: 1,
     allowed_profiles: [h100-quarter, h100-half]}
"""

EXTRA = """
c.GPULabJobs.poll_interval = 0.5
"""


@pytest.fixture(scope="module")
def hub(start_hub):
    return start_hub(CATALOG, extra_config=EXTRA, prepare=lambda h: give_notebook(h, "alice", "greet.ipynb"))


def test_sidebar_dialog_jobs_list_and_stop(hub: RunningHub, browser):
    page = browser.new_page(viewport={"width": 1400, "height": 900})
    page.set_default_timeout(60_000)
    try:
        login_and_spawn(page, hub.url, "alice", "vision:h100-half")
        page.goto(hub.url + "/user/alice/lab/tree/greet.ipynb")
        page.wait_for_selector(".jp-NotebookPanel .jp-Cell", timeout=90_000)
        page.click('.jp-SideBar [data-id="gpulab-panel"]')
        panel = page.locator("#gpulab-panel")

        # The session by the profile's name, its idle policy, and the stop button.
        panel.locator(".gpulab-profile", has_text="0.5 × H100").wait_for()
        policy = panel.locator(".gpulab-idle-policy")
        policy.wait_for()
        # The hub's one idle sentence, as the spawn page says it: no NVIDIA driver here, so no culler runs.
        assert "Idle timeout 45m, not enforced: the GPU idle culler is off on this hub" in policy.inner_text()
        assert "so the server keeps its GPU until it is stopped" in policy.inner_text()
        assert hub.me("alice")["teams"][0]["profiles"][1]["idle_policy"] in policy.inner_text()  # the hub's words
        stop = panel.get_by_role("button", name="Stop server and release GPU")
        assert stop.is_enabled()
        quota = panel.locator(".gpulab-quota-bar").get_attribute("aria-label")
        assert quota.startswith("Team vision: 0.5 GPUs in quota, 0 burst, 0.5 free"), quota
        shot_docs(page, "lab-sidebar", panel.locator(".gpulab-panel"))

        # The dialog: the server's profile, not "CPU only"; name and time limit in view.
        panel.get_by_role("button", name="Run as GPU job…").click()
        dialog = page.locator(".jp-Dialog .gpulab-job-form")
        dialog.wait_for()
        profile = dialog.locator('select[name="profile"]')
        assert profile.input_value() == "h100-half"
        body = page.locator(".jp-Dialog-body")
        for name in ("name", "time_limit", "notebook"):
            assert in_view(body, dialog.locator(f'input[name="{name}"]')), name
        assert body.evaluate("el => el.scrollTop") == 0
        # The server holds the whole 0.5 guarantee: a batch job may burst, a training job is offered nothing.
        batch_options = profile.locator("option").all_inner_texts()
        assert "0.25 × H100 (0.25 GPU) — available above the guarantee (preemptible)" in batch_options, batch_options
        dialog.locator('input[name="job_class"][value="training"]').check()
        training_options = profile.locator("option").all_inner_texts()
        assert all("not now: team vision holds 0.5 of its 0.5 GPU guarantee" in o for o in training_options), (
            training_options
        )
        assert not any("preemptible" in o or "burst" in o for o in training_options), training_options
        # The choice stays (h100-half), marked as not fitting, and Submit waits.
        assert profile.input_value() == "h100-half"
        assert dialog.locator("#gpulab-job-choice-status").inner_text().startswith("Does not fit now: team vision")
        assert page.get_by_role("button", name="Submit job").is_disabled()
        dialog.locator('input[name="job_class"][value="batch"]').check()
        profile.select_option("h100-quarter")
        dialog.locator('input[name="param-pause"]').fill("45")
        dialog.locator('input[name="time_limit"]').fill("10")
        dialog.locator('input[name="name"]').fill("greet-long")
        shot_docs(page, "lab-job-dialog", page.locator(".jp-Dialog-content"))
        page.click(".jp-Dialog button.jp-mod-accept")
        page.locator(".jp-Dialog").wait_for(state="detached")

        # The jobs list: id, submit and start time, the state history; the quota bar counts the job.
        job = panel.locator('.gpulab-job[data-state="running"]')
        job.wait_for(timeout=90_000)
        job_id = job.get_attribute("data-job-id")
        record = hub.api("GET", f"/gpulab/jobs/{job_id}").json()
        assert f"#{job_id}" in job.locator(".gpulab-job-name").inner_text()
        assert job.locator(".gpulab-job-submitted").get_attribute("datetime") == record["created_at"]
        job.locator(".gpulab-job-started").wait_for()
        assert job.locator(".gpulab-job-started").inner_text() != "not yet"
        job.locator(".gpulab-job-history summary").click()
        history = job.locator(".gpulab-job-history ol").inner_text()
        assert "queued" in history and "running" in history and "admitted over quota (preemptible)" in history
        # Drawn in the same tick that first listed the job (the quota is asked again when a job
        # appears or changes state), so no waiting here.
        bar = panel.locator(".gpulab-quota-bar").get_attribute("aria-label")
        assert bar.startswith("Team vision: 0.5 GPUs in quota, 0.25 burst, 0.25 free"), bar
        shot_docs(page, "lab-jobs-list", panel.locator(".gpulab-panel"))

        # The dialog remembers the last profile used (in the browser, per user), across a reload.
        page.reload()
        page.wait_for_selector(".jp-NotebookPanel .jp-Cell", timeout=90_000)
        page.click(".jp-NotebookPanel-toolbar .gpulab-toolbar-button")
        page.locator(".jp-Dialog .gpulab-job-form").wait_for()
        assert page.locator('.jp-Dialog select[name="profile"]').input_value() == "h100-quarter"
        page.click(".jp-Dialog button.jp-mod-reject")
        page.locator(".jp-Dialog").wait_for(state="detached")
        hub.api("POST", f"/gpulab/jobs/{job_id}/cancel", json={})

        # Stop server and release GPU: confirm, the hub stops it, the page says what happened.
        if not panel.is_visible():
            page.click('.jp-SideBar [data-id="gpulab-panel"]')
        panel.get_by_role("button", name="Stop server and release GPU").click()
        confirm = page.locator(".jp-Dialog", has_text="Stop this server?")
        confirm.wait_for()
        assert "releases its GPU share (0.5 × H100-80GB)" in confirm.inner_text()
        confirm.get_by_role("button", name="Stop server").click()
        toast = page.locator(".Toastify__toast", has_text="This server is stopping")
        toast.wait_for(timeout=60_000)
        # The toast and the panel follow the same signal; the panel re-renders a moment later.
        status = panel.locator(".gpulab-stop [role=status]")
        expect(status).to_contain_text("releases its GPU as soon as the server has shut down", timeout=30_000)
        assert panel.get_by_role("button", name="Stop server and release GPU").is_disabled()
        page.wait_for_timeout(1500)  # let the toast finish sliding in, for the picture
        shot_docs(page, "lab-server-stopping")
        # The hub stops it (kernels first, so this takes a while) and the GPU goes back to the team.
        hub.wait_server("alice", ready=False, timeout=150)
        assert [h for h in hub.me("alice")["holdings"] if h["kind"] == "notebook"] == []
        go = toast.get_by_role("button", name="Go to the hub")
        assert go.is_visible()
        page.on("dialog", lambda d: d.accept())  # "leave the page?" for a notebook the lab thinks unsaved
        go.dispatch_event("click")  # (the toast stack keeps sliding while the lab's own errors arrive)
        page.wait_for_url("**/hub/home**")
    except Exception:
        shot_docs(page, "lab-sidebar-failure", failure=True)
        raise
    finally:
        page.close()


def in_view(container, element) -> bool:
    """Is ``element`` wholly inside the visible part of the scrolling ``container``?"""
    box, outer = element.bounding_box(), container.bounding_box()
    return bool(box and outer and box["y"] >= outer["y"] and box["y"] + box["height"] <= outer["y"] + outer["height"])


# -- a hub without gpulab -------------------------------------------------------


class VanillaHub(RunningHub):
    """JupyterHub with its own SimpleLocalProcessSpawner and dummy login: no gpulab in the
    hub, while the single-user servers run from this virtualenv (with the lab extension)."""

    def __init__(self, workdir):
        super().__init__(workdir, "")
        home = self.workdir / "home"
        home.mkdir(exist_ok=True)
        args = ["--allow-root"] if os.geteuid() == 0 else []
        self.config_path.write_text(
            textwrap.dedent(f"""
            c = get_config()
            c.JupyterHub.bind_url = "{self.url}"
            c.JupyterHub.hub_port = {self.hub_port}
            c.ConfigurableHTTPProxy.api_url = "http://127.0.0.1:{self.api_port}"
            c.ConfigurableHTTPProxy.pid_file = "{self.state_dir / "jupyterhub-proxy.pid"}"
            c.JupyterHub.db_url = "sqlite:///{self.state_dir / "jupyterhub.sqlite"}"
            c.JupyterHub.cookie_secret_file = "{self.state_dir / "cookie_secret"}"
            c.JupyterHub.authenticator_class = "dummy"
            c.Authenticator.allow_all = True
            c.JupyterHub.spawner_class = "simple"
            c.Spawner.cmd = ["{VENV_BIN / "jupyterhub-singleuser"}"]
            c.Spawner.args = {args!r}
            c.Spawner.default_url = "/lab"
            c.SimpleLocalProcessSpawner.home_dir_template = "{home}/{{username}}"
            c.JupyterHub.services = [{{"name": "test-admin", "api_token": "{self.token}"}}]
            c.JupyterHub.load_roles = [{{"name": "test-admin", "scopes": ["admin:users", "admin:servers", "read:users",
                                        "read:servers"], "services": ["test-admin"]}}]
        """)
        )
        self.state_dir.mkdir(parents=True, exist_ok=True)


@pytest.fixture(scope="module")
def vanilla(tmp_path_factory):
    h = VanillaHub(tmp_path_factory.mktemp("e2e-lab-vanilla"))
    h.start()
    yield h
    h.close()


def test_panel_explains_a_hub_without_gpulab(vanilla: VanillaHub, browser):
    page = browser.new_page(viewport={"width": 1200, "height": 800})
    page.set_default_timeout(60_000)
    try:
        page.goto(vanilla.url + "/hub/login")
        page.fill("input[name=username]", "dora")
        page.fill("input[name=password]", "any")
        page.click("input[type=submit], button[type=submit]")
        page.wait_for_url("**/user/dora/lab**", timeout=90_000)
        page.wait_for_selector('.jp-SideBar [data-id="gpulab-panel"]', timeout=90_000)
        page.click('.jp-SideBar [data-id="gpulab-panel"]')
        panel = page.locator("#gpulab-panel")
        note = panel.locator(".gpulab-absent")
        note.wait_for(timeout=30_000)
        assert note.inner_text() == "This hub does not run gpulab; the GPU panel has nothing to show."
        text = panel.inner_text()
        assert "{" not in text and "Not Found" not in text and "HTTP" not in text, text
        assert panel.locator(".gpulab-error").count() == 0
        shot_docs(page, "lab-no-gpulab", panel.locator(".gpulab-panel"))
    except Exception:
        shot_docs(page, "lab-no-gpulab-failure", failure=True)
        raise
    finally:
        page.close()
