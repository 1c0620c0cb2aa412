"""Reader for GPU cluster traces in the Alibaba ``cluster-trace-gpu-v2023`` format.

Pods (tasks): ``name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,
pod_phase,creation_time,deletion_time,scheduled_time``. Only ``name``,
``num_gpu`` and ``gpu_milli`` are required; ``gpu_spec`` (allowed GPU models,
``|``-separated, empty = any), ``qos`` and the times are used when present
(``openb_pod_list_multigpu20.csv`` has no times, so it can be used for the
inflation measure but not for a time replay). Columns are found by name, so
their order does not matter and extra columns are ignored.

Nodes: ``sn,cpu_milli,memory_mib,gpu,model``; ``sn``, ``gpu`` and ``model``
are required. Each node becomes ``gpu`` :class:`spawner.core.packer.GPUDevice`
entries of its model.

Errors name the file, the line and the column.
"""

from __future__ import annotations

import csv
import os
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from spawner.core.packer import GPUDevice

POD_REQUIRED = ("name", "num_gpu", "gpu_milli")
NODE_REQUIRED = ("sn", "gpu", "model")


class TraceError(ValueError):
    """A trace file is malformed; the message says where."""


@dataclass(frozen=True)
class TraceTask:
    """One GPU task of the trace."""

    name: str
    num_gpu: int
    #: The GPU share asked for when ``num_gpu == 1``, in milli-GPUs.
    gpu_milli: int
    #: Allowed GPU models; empty = any model.
    models: frozenset[str] = frozenset()
    qos: str = ""
    creation: int | None = None
    deletion: int | None = None
    #: Row number in the file (1 = first data row): the tie-breaker for "trace order".
    row: int = 0

    @property
    def request_milli(self) -> int:
        """What the task asked for, in milli-GPUs: a share of one GPU, or whole GPUs."""
        return self.gpu_milli if self.num_gpu == 1 else self.num_gpu * 1000


@dataclass
class PodTrace:
    path: str
    tasks: list[TraceTask]
    #: Rows read, and rows left out with the reason (e.g. ``num_gpu == 0``).
    rows: int = 0
    skipped: dict[str, int] = field(default_factory=dict)
    has_times: bool = False


def _int(value: str, path: str, line: int, column: str, *, optional: bool = False) -> int | None:
    value = (value or "").strip()
    if value == "":
        if optional:
            return None
        raise TraceError(f"{path}:{line}: column {column!r} is empty")
    try:
        number = int(value)
    except ValueError:
        try:
            as_float = float(value)
        except ValueError:
            raise TraceError(f"{path}:{line}: column {column!r}: expected an integer, got {value!r}") from None
        if not as_float.is_integer():
            raise TraceError(f"{path}:{line}: column {column!r}: expected an integer, got {value!r}") from None
        number = int(as_float)
    if number < 0:
        raise TraceError(f"{path}:{line}: column {column!r}: negative value {number}")
    return number


def _reader(path: str | os.PathLike, required: Iterable[str]) -> tuple[csv.DictReader, object]:
    f = open(path, newline="")
    reader = csv.DictReader(f)
    header = reader.fieldnames or []
    missing = [c for c in required if c not in header]
    if missing:
        f.close()
        raise TraceError(f"{path}:1: missing column(s) {', '.join(missing)}; header is {','.join(header)}")
    return reader, f


def load_pods(path: str | os.PathLike, limit: int | None = None) -> PodTrace:
    """Read the GPU tasks of a pod list (tasks with ``num_gpu == 0`` are skipped and counted).

    ``limit`` stops after that many GPU tasks.
    """
    path = str(path)
    reader, f = _reader(path, POD_REQUIRED)
    header = reader.fieldnames or []
    has_times = "creation_time" in header and "deletion_time" in header
    trace = PodTrace(path=path, tasks=[], has_times=has_times)
    try:
        for row_no, row in enumerate(reader, start=1):
            if limit is not None and len(trace.tasks) >= limit:
                break
            line = row_no + 1
            trace.rows += 1
            num_gpu = _int(row["num_gpu"], path, line, "num_gpu")
            gpu_milli = _int(row["gpu_milli"], path, line, "gpu_milli")
            if num_gpu == 0:
                trace.skipped["no GPU (num_gpu = 0)"] = trace.skipped.get("no GPU (num_gpu = 0)", 0) + 1
                continue
            if num_gpu == 1 and not 0 < gpu_milli <= 1000:
                raise TraceError(
                    f"{path}:{line}: column 'gpu_milli': a one-GPU task must ask for "
                    f"1..1000 milli-GPUs, got {gpu_milli}"
                )
            spec = (row.get("gpu_spec") or "").strip()
            models = frozenset(m.strip() for m in spec.split("|") if m.strip())
            creation = deletion = None
            if has_times:
                creation = _int(row["creation_time"], path, line, "creation_time")
                deletion = _int(row["deletion_time"], path, line, "deletion_time", optional=True)
            trace.tasks.append(
                TraceTask(
                    name=row["name"],
                    num_gpu=num_gpu,
                    gpu_milli=gpu_milli,
                    models=models,
                    qos=(row.get("qos") or "").strip(),
                    creation=creation,
                    deletion=deletion,
                    row=row_no,
                )
            )
    finally:
        f.close()
    return trace


def load_nodes(path: str | os.PathLike) -> list[GPUDevice]:
    """Every GPU of every node, as packer devices (``node`` = the node's ``sn``)."""
    path = str(path)
    reader, f = _reader(path, NODE_REQUIRED)
    devices: list[GPUDevice] = []
    seen: set[str] = set()
    try:
        for row_no, row in enumerate(reader, start=1):
            line = row_no + 1
            sn = (row["sn"] or "").strip()
            if not sn:
                raise TraceError(f"{path}:{line}: column 'sn' is empty")
            if sn in seen:
                raise TraceError(f"{path}:{line}: duplicate node {sn!r}")
            seen.add(sn)
            count = _int(row["gpu"], path, line, "gpu")
            model = (row["model"] or "").strip()
            if count and not model:
                raise TraceError(f"{path}:{line}: node {sn} has {count} GPUs but no model")
            for _ in range(count):
                devices.append(GPUDevice(index=len(devices), model=model, node=sn))
    finally:
        f.close()
    return devices


def subset_nodes(devices: list[GPUDevice], min_gpus: int) -> list[GPUDevice]:
    """A smaller cluster: whole nodes spread evenly over the node list, at least ``min_gpus`` GPUs.

    Nodes are taken at evenly spaced positions of the file's node order, so
    the model mix follows the full cluster's; the devices are renumbered.
    """
    nodes: dict[str, list[GPUDevice]] = {}
    for d in devices:
        nodes.setdefault(d.node, []).append(d)
    order = list(nodes)
    total = len(devices)
    if min_gpus >= total:
        return list(devices)
    for n in range(1, len(order) + 1):
        picked = [order[int((k + 0.5) * len(order) / n)] for k in range(n)]
        if sum(len(nodes[p]) for p in picked) >= min_gpus:
            break
    out: list[GPUDevice] = []
    for p in picked:
        for d in nodes[p]:
            out.append(GPUDevice(index=len(out), model=d.model, node=d.node))
    return out


def default_trace_dir() -> Path:
    """``$GPULAB_TRACE_DIR``, else ``../shared/data/alibaba-gpu-v2023`` beside the checkout.

    In a ``git worktree`` the folder is also looked for beside the main
    checkout (the worktree's ``.git`` file names it).
    """
    env = os.environ.get("GPULAB_TRACE_DIR")
    if env:
        return Path(env)
    repo = Path(__file__).resolve().parent.parent
    tail = Path("shared") / "data" / "alibaba-gpu-v2023"
    candidates = [repo.parent / tail]
    git = repo / ".git"
    if git.is_file():
        text = git.read_text(errors="replace").strip()
        if text.startswith("gitdir:"):
            gitdir = Path(text[len("gitdir:") :].strip())  # <main>/.git/worktrees/<name>
            if not gitdir.is_absolute():
                gitdir = (repo / gitdir).resolve()
            candidates.append(gitdir.parent.parent.parent.parent / tail)
    return next((c for c in candidates if c.is_dir()), candidates[0])
