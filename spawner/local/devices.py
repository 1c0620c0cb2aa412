"""Which GPU device nodes one server or job may open, as Slurm's ConstrainDevices does.

An NVIDIA GPU is the character device ``/dev/nvidia<minor>`` (major 195); CUDA
also opens the control and memory nodes (``/dev/nvidiactl``, ``/dev/nvidia-uvm``,
``/dev/nvidia-uvm-tools``, ``/dev/nvidia-modeset``, ``/dev/nvidia-caps/*``), which
every GPU user needs and which are left exactly as the driver sets them. A
workload is denied the GPU nodes not placed for it: the v1 devices cgroup's
``devices.deny`` (:class:`spawner.local.cgroups.DeviceRule`), or, with systemd, an
allow-list for ``systemd-run``'s ``DeviceAllow=``. Rules name a node by
major:minor, so a copy of the node elsewhere (``mknod`` needs root anyway, and
``/tmp`` is ``nodev`` in a private namespace) opens nothing either.

``CUDA_VISIBLE_DEVICES`` alone is not isolation: it is a variable the user's
code may unset. Plain Python (``os``, ``stat``).
"""

from __future__ import annotations

import os
import re
import stat
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from spawner.core.packer import GPUDevice

from .cgroups import DeviceRule

#: ``nvidia0``, ``nvidia1``, ...: one per GPU (not ``nvidiactl``, ``nvidia-uvm``, ...).
GPU_NODE = re.compile(r"^nvidia(\d+)$")


@dataclass(frozen=True)
class DeviceNode:
    """A character device node in the device folder."""

    path: str
    major: int
    minor: int
    #: ``N`` of ``nvidiaN`` for a GPU node; ``None`` for a control node.
    gpu: int | None


def nvidia_nodes(device_dir: str | Path) -> list[DeviceNode]:
    """The ``nvidia*`` character devices in ``device_dir`` (and ``nvidia-caps/``), sorted by path."""
    out: list[DeviceNode] = []
    folder = Path(device_dir)
    candidates: list[Path] = []
    for sub in (folder, folder / "nvidia-caps"):
        try:
            candidates += [sub / e.name for e in os.scandir(sub) if e.name.startswith("nvidia")]
        except OSError:
            continue
    for path in candidates:
        try:
            st = os.lstat(path)
        except OSError:
            continue
        if not stat.S_ISCHR(st.st_mode):
            continue
        m = GPU_NODE.match(path.name) if path.parent == folder else None
        out.append(DeviceNode(str(path), os.major(st.st_rdev), os.minor(st.st_rdev), int(m.group(1)) if m else None))
    return sorted(out, key=lambda n: n.path)


def placed_minors(device_indices: Iterable[int], devices: Mapping[int, GPUDevice]) -> set[int]:
    """The ``nvidia<N>`` numbers of the placed devices (NVML's minor number, else the index)."""
    out = set()
    for i in device_indices:
        d = devices.get(int(i))
        out.add(d.minor if d is not None and d.minor is not None else int(i))
    return out


def deny_rules(nodes: Sequence[DeviceNode], placed: set[int]) -> list[DeviceRule]:
    """v1 ``devices.deny`` rules: every GPU node not placed for the workload (control nodes stay open)."""
    return [DeviceRule(n.major, n.minor, n.path) for n in nodes if n.gpu is not None and n.gpu not in placed]


def allow_entries(nodes: Sequence[DeviceNode], placed: set[int], extra: Sequence[str] = ()) -> list[str]:
    """systemd ``DeviceAllow=`` entries: the placed GPU nodes, every control node, and ``extra``."""
    entries = [f"{n.path} rw" for n in nodes if n.gpu is None or n.gpu in placed]
    return [*entries, *extra]
