"""A stand-in for the kernel's cgroup v2 file system, for machines without a v2 memory controller.

It imitates the interface documented in the kernel's
Documentation/admin-guide/cgroup-v2.rst (Linux 6.x), in memory, under a path
that never exists on disk, so gpulab's v2 code (:mod:`spawner.local.cgroups`) can be
run where only cgroup v1 is usable (these machines: the v2 tree holds only
hugetlb). What it follows, with the section of cgroup-v2.rst:

- "Mounting" / "Organizing Processes": every cgroup folder has ``cgroup.procs``,
  ``cgroup.controllers``, ``cgroup.subtree_control``, ``cgroup.events`` and
  (5.14+) ``cgroup.kill``; writing a pid to ``cgroup.procs`` moves the process
  (all its threads) out of its old cgroup; ``rmdir`` of a cgroup with children
  or live processes fails with ``EBUSY``.
- "Enabling and Disabling": ``cgroup.subtree_control`` takes ``+name`` and
  ``-name``; only controllers listed in ``cgroup.controllers`` may be enabled
  (``ENOENT`` otherwise); a child's ``cgroup.controllers`` is its parent's
  ``cgroup.subtree_control``, and a controller's interface files appear in
  the children when it is enabled.
- "Top-down Constraint" and "No Internal Process Constraint": a non-root
  cgroup holding processes cannot enable domain controllers for its children
  (``EBUSY``), and a process cannot join a non-root cgroup whose
  ``subtree_control`` enables them (``EBUSY``).
- "Memory Interface Files": ``memory.max`` / ``memory.swap.max`` take bytes or
  ``max``; ``memory.events`` has an ``oom_kill`` line. "CPU Interface Files":
  ``cpu.max`` is ``$MAX $PERIOD``. "PID Interface Files": ``pids.max`` is a
  number or ``max``. Anything else is ``EINVAL``.

Processes are numbers only: nothing is ever signalled. It is a test fixture.
"""

from __future__ import annotations

import errno
import os
from dataclasses import dataclass, field
from pathlib import Path

from spawner.local.cgroups import CgroupFS

#: Controllers a typical v2 root offers (cgroup-v2.rst, "Controllers").
ROOT_CONTROLLERS = ("cpuset", "cpu", "io", "memory", "hugetlb", "pids", "rdma", "misc")
DOMAIN = {"cpuset", "cpu", "io", "memory", "hugetlb", "pids", "rdma", "misc"}
CORE_FILES = ("cgroup.procs", "cgroup.controllers", "cgroup.subtree_control", "cgroup.events", "cgroup.kill")
CONTROLLER_FILES = {
    "memory": {"memory.max": "max", "memory.swap.max": "max", "memory.current": "0", "memory.events": ""},
    "cpu": {"cpu.max": "max 100000", "cpu.weight": "100"},
    "pids": {"pids.max": "max", "pids.current": "0"},
}


def _err(code: int, path: Path) -> OSError:
    return OSError(code, os.strerror(code), str(path))


@dataclass
class Node:
    controllers: set[str]
    subtree: set[str] = field(default_factory=set)
    procs: set[int] = field(default_factory=set)
    files: dict[str, str] = field(default_factory=dict)
    children: dict[str, Node] = field(default_factory=dict)


class FakeCgroup2(CgroupFS):
    """An in-memory cgroup2 mount at ``root`` (a path that is never touched on disk)."""

    def __init__(self, root: Path):
        self.root = root
        self.tree = Node(set(ROOT_CONTROLLERS))
        self._add_files(self.tree)

    # -- the tree ------------------------------------------------------------------

    def _add_files(self, node: Node) -> None:
        for c in node.controllers:
            for name, value in CONTROLLER_FILES.get(c, {}).items():
                node.files.setdefault(
                    name, value if name != "memory.events" else "low 0\nhigh 0\nmax 0\noom 0\noom_kill 0"
                )

    def _split(self, path: Path) -> list[str]:
        rel = Path(path).relative_to(self.root)
        return [p for p in rel.parts if p]

    def node(self, path: Path) -> Node | None:
        try:
            parts = self._split(path)
        except ValueError:
            return None
        node = self.tree
        for part in parts:
            node = node.children.get(part)  # type: ignore[assignment]
            if node is None:
                return None
        return node

    def _file(self, path: Path) -> tuple[Node, str]:
        node = self.node(Path(path).parent)
        name = Path(path).name
        if node is None or not (name in CORE_FILES or name in node.files):
            raise _err(errno.ENOENT, path)
        return node, name

    def where(self, pid: int) -> Path | None:
        """The cgroup holding ``pid`` (for the tests' checks)."""

        def walk(node: Node, at: Path) -> Path | None:
            if pid in node.procs:
                return at
            for name, child in node.children.items():
                found = walk(child, at / name)
                if found is not None:
                    return found
            return None

        return walk(self.tree, self.root)

    def add_process(self, path: Path, pid: int) -> None:
        """Put a process there, as if it had been started in it."""
        node = self.node(path)
        assert node is not None, path
        node.procs.add(pid)

    # -- CgroupFS --------------------------------------------------------------------

    def mkdir(self, path: Path) -> None:
        parent = self.node(Path(path).parent)
        if parent is None:
            raise _err(errno.ENOENT, path)
        name = Path(path).name
        if name in parent.children or name in CORE_FILES or name in parent.files:
            raise _err(errno.EEXIST, path)
        child = Node(set(parent.subtree))
        self._add_files(child)
        parent.children[name] = child

    def rmdir(self, path: Path) -> None:
        parent = self.node(Path(path).parent)
        node = self.node(path)
        if parent is None or node is None:
            raise _err(errno.ENOENT, path)
        if node.children or node.procs:
            raise _err(errno.EBUSY, path)
        del parent.children[Path(path).name]

    def exists(self, path: Path) -> bool:
        if Path(path) in self.root.parents:  # the folders the mount point lies in
            return True
        if self.node(path) is not None:
            return True
        try:
            self._file(path)
            return True
        except OSError:
            return False

    def read(self, path: Path) -> str:
        try:
            node, name = self._file(path)
        except OSError:
            return ""
        if name == "cgroup.procs":
            return "".join(f"{p}\n" for p in sorted(node.procs))
        if name == "cgroup.controllers":
            return " ".join(c for c in ROOT_CONTROLLERS if c in node.controllers) + "\n"
        if name == "cgroup.subtree_control":
            return " ".join(c for c in ROOT_CONTROLLERS if c in node.subtree) + "\n"
        if name == "cgroup.events":
            return f"populated {int(bool(node.procs))}\nfrozen 0\n"
        if name == "cgroup.kill":
            raise _err(errno.EINVAL, path)  # write-only
        return node.files[name] + "\n"

    def write(self, path: Path, value: str) -> None:
        node, name = self._file(path)
        value = value.strip()
        is_root = node is self.tree
        if name == "cgroup.procs":
            pid = int(value) if value.isdigit() else -1
            if pid <= 0:
                raise _err(errno.EINVAL, path)
            if not is_root and node.subtree & DOMAIN:
                raise _err(errno.EBUSY, path)  # No Internal Process Constraint
            holder = self.where(pid)
            if holder is None:
                raise _err(errno.ESRCH, path)
            self.node(holder).procs.discard(pid)  # type: ignore[union-attr]
            node.procs.add(pid)
        elif name == "cgroup.subtree_control":
            changes = value.split()
            for token in changes:
                if token[:1] not in "+-" or token[1:] not in ROOT_CONTROLLERS:
                    raise _err(errno.EINVAL, path)
                if token[0] == "+" and token[1:] not in node.controllers:
                    raise _err(errno.ENOENT, path)  # Top-down Constraint
            if any(t[0] == "+" for t in changes) and node.procs and not is_root:
                raise _err(errno.EBUSY, path)  # No Internal Process Constraint
            for token in changes:
                if token[0] == "+":
                    node.subtree.add(token[1:])
                else:
                    if any(token[1:] in child.subtree for child in node.children.values()):
                        raise _err(errno.EBUSY, path)
                    node.subtree.discard(token[1:])
            for child in node.children.values():
                child.controllers = set(node.subtree)
                self._add_files(child)
        elif name == "cgroup.kill":
            if value != "1":
                raise _err(errno.EINVAL, path)

            def kill(n: Node) -> None:
                n.procs.clear()
                for c in n.children.values():
                    kill(c)

            kill(node)
        elif name in ("memory.max", "memory.swap.max", "pids.max"):
            if value != "max" and not value.isdigit():
                raise _err(errno.EINVAL, path)
            node.files[name] = value
        elif name == "cpu.max":
            parts = value.split()
            if not 1 <= len(parts) <= 2 or not (parts[0] == "max" or parts[0].isdigit()):
                raise _err(errno.EINVAL, path)
            period = parts[1] if len(parts) == 2 else node.files["cpu.max"].split()[1]
            if not period.isdigit() or not 1000 <= int(period) <= 1_000_000:
                raise _err(errno.EINVAL, path)
            node.files[name] = f"{parts[0]} {period}"
        else:
            raise _err(errno.EACCES, path)  # read-only (memory.current, ...)

    def folders(self, path: Path) -> list[str]:
        node = self.node(path)
        return sorted(node.children) if node is not None else []

    def pids(self, procs_file: Path) -> list[int]:
        return [int(x) for x in self.read(procs_file).split() if x.isdigit()]
