"""What one user's process tries against another user and the hub (run as that user).

``python isolation_probe.py TARGETS.json`` prints one JSON object: for each
attempt, ``"denied"`` (the kernel refused), ``"allowed"``, or ``"absent"``
(nothing to attack). The attacker tests run it as alice twice: as a process
with her terminal's credentials and as a cell of her notebook job.

TARGETS.json: ``{"read": {label: path}, "write": {label: folder},
"list": {label: folder}, "environ": {label: pid}, "signal": {label: pid},
"secrets": [token, ...]}``.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path


def attempt(fn) -> str:
    try:
        fn()
    except PermissionError:
        return "denied"
    except FileNotFoundError:
        return "absent"
    except ProcessLookupError:
        return "absent"
    return "allowed"


def probe(targets: dict) -> dict:
    out: dict = {"uid": os.getuid(), "euid": os.geteuid(), "groups": sorted(os.getgroups())}
    for label, path in targets.get("read", {}).items():
        out[f"read {label}"] = attempt(lambda p=path: Path(p).read_bytes())
    for label, folder in targets.get("write", {}).items():
        out[f"write {label}"] = attempt(lambda f=folder: Path(f, ".probe-from-attacker").write_text("x"))
    for label, folder in targets.get("list", {}).items():
        out[f"list {label}"] = attempt(lambda f=folder: os.listdir(f))
    for label, pid in targets.get("environ", {}).items():
        out[f"environ {label}"] = attempt(lambda p=pid: Path(f"/proc/{p}/environ").read_bytes())
    for label, pid in targets.get("signal", {}).items():
        out[f"signal {label}"] = attempt(lambda p=pid: os.kill(p, 0))
    # Every place a token could leak to another account: environments and command lines.
    secrets = [s.encode() for s in targets.get("secrets", [])]
    leaks = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        for name in ("environ", "cmdline"):
            try:
                data = (entry / name).read_bytes()
            except OSError:
                continue
            if any(s in data for s in secrets) and int(entry.name) != os.getpid():
                leaks.append(f"/proc/{entry.name}/{name}")
    out["secret leaks"] = leaks
    return out


if __name__ == "__main__":
    print("PROBE " + json.dumps(probe(json.loads(Path(sys.argv[1]).read_text()))), flush=True)
