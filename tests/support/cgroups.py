"""The cgroups a test made below this process's own: find them, empty them, remove them."""

from __future__ import annotations

import os
import time
from pathlib import Path

from spawner.local.cgroups import this_machine


def remove_tree(folder: Path) -> None:
    """Kill what is in ``folder`` and below, then remove it, deepest first."""
    for child in [p for p in folder.iterdir() if p.is_dir()]:
        remove_tree(child)
    for pid in (folder / "cgroup.procs").read_text().split():
        try:
            os.kill(int(pid), 9)
        except ProcessLookupError:
            pass
    for _ in range(100):
        try:
            folder.rmdir()
            return
        except OSError:
            time.sleep(0.05)
    folder.rmdir()


def own_folder(controller: str, name: str) -> Path:
    mounts = this_machine()
    return mounts.v1[controller] / mounts.own.get(controller, "/").lstrip("/") / name


def cgroup_parent_folders(name: str) -> list[Path]:
    """The cgroup parent ``name`` (below this process's cgroup) in each hierarchy, where it exists."""
    mounts = this_machine()
    roots = [(root, mounts.own.get(c, "/")) for c, root in mounts.v1.items()]
    if mounts.v2 is not None:
        roots.append((mounts.v2, mounts.own.get("", "/")))
    folders = [root / own.lstrip("/") / name for root, own in roots]
    return [f for f in folders if f.is_dir()]


def remove_cgroup_parent(name: str) -> None:
    """Remove the cgroup parent ``name`` and the (empty, or emptying) cgroups below it."""
    for folder in cgroup_parent_folders(name):
        for child in sorted((p for p in folder.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts)):
            for _ in range(50):
                try:
                    child.rmdir()
                    break
                except OSError:
                    time.sleep(0.05)
        try:
            folder.rmdir()
        except OSError:
            pass
