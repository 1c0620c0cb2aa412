"""The policy core imports nothing from tornado, kubernetes or jupyterhub.

Every module under ``spawner/core/`` is imported, found by its path: a new core module
is checked without being listed anywhere.
"""

from __future__ import annotations

import subprocess
import sys

from tests.support import REPO

CORE = REPO / "spawner" / "core"


def core_modules() -> list[str]:
    """Every module under spawner/core/, by its import name."""
    out = []
    for path in sorted(CORE.rglob("*.py")):
        parts = list(path.relative_to(REPO).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out.append(".".join(parts))
    return out


def test_core_modules_import_no_framework():
    core = core_modules()
    assert {
        "spawner.core.catalog",
        "spawner.core.ledger",
        "spawner.core.packer",
        "spawner.core.policy",
        "spawner.core.units",
        "spawner.core.priority",
        "spawner.core.labels",
    } <= set(core)
    code = (
        "import sys\n"
        + "".join(f"import {m}\n" for m in core)
        + "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('tornado', 'kubernetes', 'kubernetes_asyncio', 'jupyterhub', 'kubespawner'))\n"
        + "print(','.join(bad))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, check=True)
    assert out.stdout.strip() == "", f"core modules pulled in: {out.stdout}"
