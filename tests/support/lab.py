"""Shared steps of the JupyterLab browser tests: a notebook to run, login and spawn, screenshots."""

from __future__ import annotations

from pathlib import Path

import nbformat

from tests.support.browser import screenshots_dir
from tests.support.hub import RunningHub

#: Screenshots the docs show (docs/jupyterlab.md): docs/img under scripts/screenshots only.
DOCS_IMG = screenshots_dir("docs")
#: Failure screenshots (not for the docs).
FAILURES = screenshots_dir("e2e-lab")


def give_notebook(hub: RunningHub, user: str, rel: str) -> None:
    """The greeting notebook at ``rel`` in ``user``'s home, owned by their account."""
    write_notebook(hub.home(user) / rel)
    hub.give(user, hub.home(user) / rel)


def write_notebook(path: Path) -> None:
    """A tiny notebook with a ``parameters`` cell (who, repeat, pause) that prints a greeting."""
    nb = nbformat.v4.new_notebook()
    params = nbformat.v4.new_code_cell('who = "world"\nrepeat = 1\npause = 0')
    params.metadata["tags"] = ["parameters"]
    nb.cells = [
        nbformat.v4.new_markdown_cell("# Greeting\nA tiny notebook to run as a GPU job."),
        params,
        nbformat.v4.new_code_cell(
            'import time\ntime.sleep(pause)\nmessage = " ".join([f"hello {who}!"] * repeat)\nprint(message)'
        ),
    ]
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    path.parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(nb, str(path))


def login_and_spawn(page, url: str, user: str, choice: str, field: str = "choice") -> None:
    """Log in on the embedded hub's form and start ``choice`` (``team:profile``) from the spawn page
    (its radio buttons' ``field``: ``choice`` on one server, ``profile`` in GPUKubeSpawner's form)."""
    page.goto(url + "/hub/login")
    page.fill("input[name=username]", user)
    page.fill("input[name=password]", "gpulab-demo")
    page.click("input[type=submit], button[type=submit]")
    page.wait_for_url("**/hub/spawn**")
    page.check(f'input[name={field}][value="{choice}"]')
    page.click("form input[type=submit], form button[type=submit]")
    page.wait_for_url(f"**/user/{user}/lab**", timeout=90_000)


def shot_docs(page, name: str, locator=None, failure: bool = False) -> Path:
    """A screenshot for the docs (``docs/img/<name>.png`` under scripts/screenshots), or of a failure."""
    folder = FAILURES if failure else DOCS_IMG
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}.png"
    (locator or page).screenshot(path=str(path))
    return path


def open_notebook_and_sidebar(page, url: str, user: str, choice: str, notebook: str) -> None:
    """Log in, start ``choice``, open ``notebook`` in JupyterLab and the GPU sidebar, once its quota shows."""
    login_and_spawn(page, url, user, choice)
    page.goto(f"{url}/user/{user}/lab/tree/{notebook}")
    page.wait_for_selector(".jp-NotebookPanel .jp-Cell", timeout=90_000)
    page.click('.jp-SideBar [data-id="gpulab-panel"]')
    page.locator("#gpulab-panel .gpulab-quota-bar").wait_for()


def open_gpu_sidebar(page, url: str, user: str, choice: str, profile_label: str, field: str = "choice"):
    """Log in, start ``choice`` and open the lab's GPU sidebar once it shows ``profile_label``: the panel."""
    login_and_spawn(page, url, user, choice, field)
    page.wait_for_selector(".jp-LabShell", timeout=90_000)
    page.click('.jp-SideBar [data-id="gpulab-panel"]')
    panel = page.locator("#gpulab-panel")
    panel.locator(".gpulab-profile", has_text=profile_label).wait_for()
    return panel
