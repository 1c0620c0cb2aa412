"""The import rules (scripts/import_rules.py) hold, and they catch what they promise to."""

from __future__ import annotations

import importlib.util
import shutil
import sys
from pathlib import Path

import pytest

from tests.support import REPO

_spec = importlib.util.spec_from_file_location("import_rules", REPO / "scripts" / "import_rules.py")
import_rules = importlib.util.module_from_spec(_spec)
sys.modules["import_rules"] = import_rules
_spec.loader.exec_module(import_rules)


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    """A copy of gpulab's Python packages to break on purpose."""
    for pkg in import_rules.PACKAGES:
        shutil.copytree(
            REPO / pkg,
            tmp_path / pkg,
            ignore=shutil.ignore_patterns(
                "node_modules", "__pycache__", "lib", "labextension_static", "*.ts", "*.tsx", "*.json", "*.css"
            ),
        )
    return tmp_path


def test_the_source_tree_follows_the_import_rules():
    assert import_rules.violations() == []


def test_a_cycle_hidden_inside_a_function_is_caught(tree: Path):
    db = tree / "hub_config" / "storage" / "db.py"
    db.write_text(
        db.read_text() + "\n\ndef _late():\n    from hub_config.jobs.service import JobService\n    return JobService\n"
    )
    problems = import_rules.violations(tree)
    assert any(
        p.startswith("import cycle between") and "hub_config.storage.db" in p and "hub_config.jobs.service" in p
        for p in problems
    ), problems


def test_a_relative_import_cycle_in_the_core_is_caught(tree: Path):
    units = tree / "spawner" / "core" / "units.py"
    units.write_text(units.read_text() + "\nfrom .catalog import read  # noqa\n")
    problems = import_rules.violations(tree)
    assert any("spawner.core.catalog.read" in p and "spawner.core.units" in p for p in problems), problems


def test_a_new_core_module_is_checked_by_its_path(tree: Path):
    """Nothing lists the core's modules: a file added under spawner/core/ is held to its rules."""
    (tree / "spawner" / "core" / "quotas.py").write_text("from jupyterhub.spawner import SpawnException  # noqa\n")
    problems = import_rules.violations(tree)
    assert any(p.startswith("spawner.core.quotas: the policy core imports the framework jupyterhub") for p in problems)


def test_annotation_only_imports_do_not_count(tree: Path):
    db = tree / "hub_config" / "storage" / "db.py"
    db.write_text(
        db.read_text() + "\nfrom typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
        "    from hub_config.jobs.service import JobService\n"
    )
    assert import_rules.violations(tree) == []


@pytest.mark.parametrize(
    ("path", "line", "words"),
    [
        ("spawner/core/ledger.py", "import tornado.web", "imports the framework tornado.web"),
        (
            "spawner/core/packer.py",
            "from spawner.local.nvml import detect_gpus",
            "imports the adapter spawner.local.nvml",
        ),
        ("spawner/core/policy.py", "from spawner.kube import spawner", "imports the adapter spawner.kube.spawner"),
        ("spawner/core/policy.py", "from spawner.runtime import get_runtime", "imports the adapter spawner.runtime"),
        ("spawner/core/sharing.py", "import requests", "neither spawner.core nor the standard library"),
        ("spawner/local/spawner.py", "from hub_config.storage.db import utcnow", "spawner/ imports hub_config"),
        (
            "spawner/kube/spawner.py",
            "from spawner.local.inventory import ensure_packer",
            "adapters never import each other",
        ),
        ("spawner/local/sudo.py", "from spawner.kube.conventions import safe_slug", "adapters never import each other"),
        ("spawner/runtime.py", "from spawner.local.nvml import detect_gpus", "spawner may import only spawner.core"),
        ("idle_culler/hub.py", "from hub_config.config import scopes", "idle_culler imports hub_config"),
    ],
)
def test_each_layer_rule_is_caught(tree: Path, path: str, line: str, words: str):
    f = tree / path
    f.write_text(f.read_text() + f"\n{line}  # noqa\n")
    problems = import_rules.violations(tree)
    assert any(words in p for p in problems), problems
