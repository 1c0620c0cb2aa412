"""The import rules (scripts/import_rules.py) hold, and they catch what they promise to."""

from __future__ import annotations

import importlib.util
import shutil
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
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
    units = tree / "spawner" / "units.py"
    units.write_text(units.read_text() + "\nfrom . import catalog  # noqa\n")
    problems = import_rules.violations(tree)
    assert any("spawner.catalog" in p and "spawner.units" in p for p in problems), problems


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
        ("spawner/ledger.py", "import tornado.web", "imports the framework tornado.web"),
        ("spawner/packer.py", "from .nvml import detect_gpus", "imports the adapter spawner.nvml"),
        ("spawner/local.py", "from hub_config.storage.db import utcnow", "spawner/ imports hub_config"),
        ("idle_culler/hub.py", "from hub_config.config import scopes", "idle_culler imports hub_config"),
    ],
)
def test_each_layer_rule_is_caught(tree: Path, path: str, line: str, words: str):
    f = tree / path
    f.write_text(f.read_text() + f"\n{line}  # noqa\n")
    problems = import_rules.violations(tree)
    assert any(words in p for p in problems), problems
