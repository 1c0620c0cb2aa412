"""The test tiers come from the folders (tests/conftest.py), so a new module cannot forget them."""

from __future__ import annotations

import ast
from types import SimpleNamespace

import pytest

from tests import conftest
from tests.support import REPO


def item(rel: str) -> SimpleNamespace:
    return SimpleNamespace(path=REPO / "tests" / rel)


@pytest.mark.parametrize(
    ("rel", "tier", "markers"),
    [
        ("unit/test_ledger.py", "unit", ()),
        ("integration/test_admin_api.py", "integration", ("integration",)),
        ("browser/test_admin_page.py", "browser", ("integration", "browser")),
        ("kube/test_kube_spawner.py", "kube", ("integration", "kube")),
    ],
)
def test_each_folder_gives_its_markers(rel: str, tier: str, markers: tuple[str, ...]):
    assert conftest._tier(item(rel)) == tier
    assert conftest.TIERS[tier] == markers


def test_a_module_outside_the_tier_folders_is_refused_with_the_folders_named():
    with pytest.raises(pytest.UsageError, match=r"tests/test_new\.py: a test module lives in a tier folder"):
        conftest._tier(item("test_new.py"))
    with pytest.raises(pytest.UsageError, match="tests/unit/, tests/integration/"):
        conftest._tier(item("misc/test_new.py"))


def imported_modules(path) -> set[str]:
    """The absolute names a module imports (relative ones resolved against its package)."""
    package = ".".join(path.relative_to(REPO).parent.parts)
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = package.rsplit(".", node.level - 1)[0] if node.level else ""
            module = ".".join(x for x in (base, node.module or "") if x)
            out.update({module} | {f"{module}.{a.name}" for a in node.names})
    return out


def test_every_test_module_is_in_a_tier_folder_and_no_test_module_imports_another():
    tests = REPO / "tests"
    for path in tests.rglob("test_*.py"):
        rel = path.relative_to(tests)
        assert rel.parts[0] in conftest.TIERS, rel
        imported = {m for m in imported_modules(path) if m.split(".")[-1].startswith("test_")}
        assert not imported, f"{rel} imports the test module(s) {sorted(imported)}: share through tests/support/"


def test_benchmarks_import_the_support_package_not_test_modules():
    for path in (REPO / "benchmarks").glob("*.py"):
        for module in imported_modules(path):
            if module.startswith("tests."):
                assert module.startswith(("tests.support", "tests.kube.bed")), f"{path.name} imports {module}"
