"""One version: the Python package, the lab extension, the Helm chart and the overlay's images
carry pyproject.toml's version (scripts/set-version writes them), and CHANGELOG.md describes it."""

from __future__ import annotations

import json
import re

import tomllib
import yaml

from tests.support import REPO


def version() -> str:
    return tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]


def test_every_copy_of_the_version_agrees():
    v = version()
    chart = yaml.safe_load((REPO / "helm/gpulab/Chart.yaml").read_text())
    overlay = yaml.safe_load((REPO / "helm/values-jupyterhub.yaml").read_text())
    lab = json.loads((REPO / "labextension/package.json").read_text())
    lock = json.loads((REPO / "labextension/package-lock.json").read_text())
    assert {
        "chart": chart["version"],
        "chart appVersion": chart["appVersion"],
        "hub image": overlay["hub"]["image"]["tag"],
        "singleuser image": overlay["singleuser"]["image"]["tag"],
        "lab extension": lab["version"],
        "lab lock": lock["version"],
        "lab lock root": lock["packages"][""]["version"],
    } == dict.fromkeys(
        ["chart", "chart appVersion", "hub image", "singleuser image", "lab extension", "lab lock", "lab lock root"], v
    )


def test_the_changelog_has_a_section_for_this_version():
    headings = re.findall(r"^## (\S+)", (REPO / "CHANGELOG.md").read_text(), flags=re.M)
    assert headings and headings[0] == version(), f"CHANGELOG.md's first section is {headings[:1]}, not {version()}"
