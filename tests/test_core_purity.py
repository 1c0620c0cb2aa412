"""The policy core imports nothing from tornado, kubernetes or jupyterhub."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
#: Adapters (allowed to import the frameworks); everything else in spawner/ is core.
ADAPTERS = {
    "local",
    "kube",
    "kube_conventions",
    "nvml",
    "config",
    "accounts",
    "sudo",
    "mediator",
    "mediator_client",
    "home_files",
    "processes",
    "account_spawner",
    "kube_ledger",
    "cgroups",
    "devices",
    "namespaces",
    "output_capture",
    "confinement",
    "__init__",
}


def test_core_modules_import_no_framework():
    core = sorted(p.stem for p in (REPO / "spawner").glob("*.py") if p.stem not in ADAPTERS)
    assert {"catalog", "ledger", "packer", "policy", "units", "priority", "labels"} <= set(core)
    code = (
        "import sys\n"
        + "".join(f"import spawner.{m}\n" for m in core)
        + "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('tornado', 'kubernetes', 'kubernetes_asyncio', 'jupyterhub', 'kubespawner'))\n"
        + "print(','.join(bad))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, check=True)
    assert out.stdout.strip() == "", f"core modules pulled in: {out.stdout}"
