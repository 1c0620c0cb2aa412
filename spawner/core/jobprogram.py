"""What a job runs: a notebook (papermill) or a Python script with arguments, on how many nodes.

Pure: the jobs API validates a submission's program with these functions whichever
backend runs it, and the single-server runner builds its command line with
:func:`script_argv`.

- ``notebook``: a ``.ipynb`` run by papermill with its ``parameters``; one process,
  which sees all of the job's GPUs;
- ``script``: a ``.py`` run with its ``args`` (a list of strings: no shell ever parses
  them); a script over N local whole GPUs is started by ``torchrun
  --nproc_per_node=N``, one process per GPU;
- ``nodes``: a training job may take ``nodes`` × its profile's GPUs (a gang, admitted
  whole: :meth:`spawner.core.ledger.Ledger.reserve` with ``members``); only a script
  runs on more than one node, on whole GPUs.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import PurePosixPath
from typing import Any

from .units import MILLI_PER_GPU, format_gpus

NOTEBOOK = "notebook"
SCRIPT = "script"
KINDS = (NOTEBOOK, SCRIPT)
#: The file each kind runs, by its suffix.
SUFFIXES = {NOTEBOOK: ".ipynb", SCRIPT: ".py"}
MAX_PATH_LEN = 1024
#: Most arguments a script takes, and the longest one.
MAX_ARGS = 256
MAX_ARG_LEN = 4096


class JobSpecError(ValueError):
    """A job request is refused; ``status`` is the HTTP status to answer with."""

    def __init__(self, message: str, status: int = 400):
        super().__init__(message)
        self.status = status


def program_kind(body: dict[str, Any]) -> str:
    """``notebook`` or ``script``: which one the submission names (exactly one of them)."""
    has = [k for k in KINDS if body.get(k) not in (None, "")]
    if len(has) != 1:
        raise JobSpecError(
            "name exactly one of notebook (a .ipynb run by papermill) or script (a .py run with its args), "
            "e.g. {'script': 'train.py', 'args': ['--epochs', '3']}"
        )
    return has[0]


def validate_program_path(path: Any, kind: str = NOTEBOOK) -> str:
    """A notebook's or script's path relative to the user's home, normalised; refuses escapes.

    Refused: non-strings, absolute paths, any ``..`` component, NUL and control
    characters, an empty path, and a file of the other kind. Symlinks are checked
    by the caller against the real file system (that is I/O).
    """
    example = "experiments/train.ipynb" if kind == NOTEBOOK else "experiments/train.py"
    if not isinstance(path, str) or not path.strip():
        raise JobSpecError(f"{kind} must be a path relative to your home directory, e.g. {example!r}")
    if len(path) > MAX_PATH_LEN:
        raise JobSpecError(f"{kind} path is longer than {MAX_PATH_LEN} characters")
    if path.endswith("/"):
        raise JobSpecError(f"{kind} path ends with '/': name a {SUFFIXES[kind]} file, not a folder")
    if any(ord(ch) < 32 or ch == "\x7f" for ch in path) or "\\" in path:
        raise JobSpecError(f"{kind} path contains control characters or backslashes")
    p = PurePosixPath(path)
    if p.is_absolute() or path.startswith("~"):
        raise JobSpecError(f"{kind} path must be relative to your home directory, not absolute")
    if ".." in p.parts:
        raise JobSpecError(f"{kind} path must not contain '..'")
    parts = [x for x in p.parts if x != "."]
    if not parts:
        raise JobSpecError(f"{kind} path names no file")
    if not parts[-1].endswith(SUFFIXES[kind]):
        other = SCRIPT if kind == NOTEBOOK else NOTEBOOK
        hint = f"; a {SUFFIXES[other]} file is submitted as {other}" if parts[-1].endswith(SUFFIXES[other]) else ""
        raise JobSpecError(f"{kind} must be a {SUFFIXES[kind]} file{hint}")
    return str(PurePosixPath(*parts))


def validate_args(args: Any, kind: str, max_bytes: int) -> tuple[str, ...]:
    """A script's arguments: a list of strings (no shell parses them), at most ``max_bytes`` in all."""
    if args is None or args == []:
        return ()
    if kind != SCRIPT:
        raise JobSpecError("args are a script's command-line arguments; a notebook takes parameters")
    if not isinstance(args, list):
        raise JobSpecError("args must be a list of strings, e.g. ['--epochs', '3']")
    if len(args) > MAX_ARGS:
        raise JobSpecError(f"a script takes at most {MAX_ARGS} arguments, not {len(args)}", 413)
    for a in args:
        if not isinstance(a, str):
            raise JobSpecError(f"every argument must be a string, not {type(a).__name__}")
        if "\0" in a:
            raise JobSpecError("an argument contains a NUL character")
        if len(a) > MAX_ARG_LEN:
            raise JobSpecError(f"an argument is longer than {MAX_ARG_LEN} characters", 413)
    size = sum(len(a.encode()) + 1 for a in args)
    if size > max_bytes:
        raise JobSpecError(f"the arguments are {size} bytes; the limit is {max_bytes}", 413)
    return tuple(args)


def validate_nodes(nodes: Any, *, kind: str, job_class: str, profile_milli: int, max_nodes: int) -> int:
    """How many nodes of the profile's GPUs the job takes (1 unless a training script asks for more)."""
    if nodes is None:
        return 1
    if isinstance(nodes, bool) or not isinstance(nodes, int):
        raise JobSpecError("nodes must be a whole number, e.g. 2")
    if nodes < 1 or nodes > max_nodes:
        raise JobSpecError(f"nodes must be between 1 and {max_nodes}")
    if nodes == 1:
        return 1
    if job_class != "training":
        raise JobSpecError("only a training job runs on several nodes; a batch job takes nodes: 1")
    if kind != SCRIPT:
        raise JobSpecError("a notebook runs as one process on one node; run a script on several nodes (torchrun)")
    if profile_milli <= 0 or profile_milli % MILLI_PER_GPU:
        raise JobSpecError(
            f"a job on several nodes takes whole GPUs on each; this profile holds {format_gpus(profile_milli)}"
        )
    return nodes


def total_words(nodes: int, profile_milli: int, gpu_label: str) -> str:
    """``"2 × 8 H100 = 16 GPUs"``: what a job of ``nodes`` of the profile holds in all."""
    per = format_gpus(profile_milli)
    label = f" {gpu_label}" if gpu_label else ""
    return f"{nodes} × {per}{label} = {format_gpus(nodes * profile_milli)} GPUs"


def processes_per_node(milli: int) -> int:
    """One process per whole GPU of a node's share (at least one: a fraction or CPU-only runs one)."""
    return max(1, milli // MILLI_PER_GPU)


def script_argv(python: str, launcher: Sequence[str], script: str, args: Sequence[str], nproc: int) -> list[str]:
    """The command that runs a script: ``python script args`` for one process, else
    ``launcher --nproc_per_node=N script args`` (torchrun starts one worker per GPU and gives each its
    ``RANK``/``LOCAL_RANK``/``WORLD_SIZE``/``MASTER_ADDR``/``MASTER_PORT``)."""
    if nproc <= 1:
        return [python, script, *args]
    return [*launcher, "--standalone", "--nnodes=1", f"--nproc_per_node={int(nproc)}", script, *args]


# -- Kubernetes: the container's shell ---------------------------------------------------

#: Counts the attempts in the checkpoint folder (it survives them; the pod does not) and exports
#: ``GPULAB_ATTEMPT``; only digits are read back from the user's own file.
#: The nodes of a multi-node job share the folder: each counts its own starts (they restart together).
_ATTEMPT_SHELL = (
    'if [ -n "$GPULAB_CHECKPOINT_DIR" ]; then mkdir -p "$GPULAB_CHECKPOINT_DIR" || exit 1; '
    'counter="$GPULAB_CHECKPOINT_DIR/.attempts${PET_NODE_RANK:+-$PET_NODE_RANK}"; '
    'n=$(tr -cd 0-9 2>/dev/null < "$counter" | cut -c1-9); '
    'GPULAB_ATTEMPT=$(( ${n:-0} + 1 )); echo "$GPULAB_ATTEMPT" > "$counter"; '
    "else GPULAB_ATTEMPT=1; fi; export GPULAB_ATTEMPT; "
)


def rank_log_path(log_path: str, rank: int) -> str:
    """The log of node ``rank`` of a multi-node job: rank 0 writes the job's log, rank N
    ``<log without .log>.rank-N.log`` beside it (the shell of :func:`kube_shell` names it so)."""
    return log_path if rank == 0 else f"{log_path.removesuffix('.log')}.rank-{int(rank)}.log"


#: The shell's half of :func:`rank_log_path`: a node of rank N > 0 (the engines' PET_NODE_RANK)
#: writes its own log.
_RANK_LOG_SHELL = (
    'case "${PET_NODE_RANK:-0}" in 0) ;; *[!0-9]*) exit 1 ;; '
    '*) GPULAB_LOG="${GPULAB_LOG%.log}.rank-$PET_NODE_RANK.log" ;; esac; '
)


def kube_shell(prepare: str, program: str) -> str:
    """A job container's ``/bin/sh -c`` command around ``program`` (its output into ``$GPULAB_LOG``,
    or a node's own log: :func:`rank_log_path`).

    No user value is ever parsed by the shell: paths come in ``GPULAB_*`` variables, a
    script's arguments as its positional parameters. The command replaces the image's
    entrypoint (docker-stacks' tini), so the shell is the container's PID 1, and PID 1
    receives only the signals it has a handler for (pid_namespaces(7)): an exec'd program
    without one would ignore the SIGTERM of a cancel, a preemption or a drain and die only at
    SIGKILL after ``terminationGracePeriodSeconds``. The shell stays PID 1 instead, forwards
    SIGTERM and SIGINT to the program (a signal that came before it started too), waits for it
    (again, after a trapped signal cut the wait short) and exits with its status.
    """
    return (
        'trap \'stop=1; [ -n "$child" ] && kill -TERM "$child" 2>/dev/null\' TERM INT; '
        + _RANK_LOG_SHELL
        + 'cd "$GPULAB_HOME" && mkdir -p "$(dirname "$GPULAB_LOG")" || exit 1; '
        + _ATTEMPT_SHELL
        + prepare
        + program
        + '> "$GPULAB_LOG" 2>&1 & child=$!; '
        '[ -n "$stop" ] && kill -TERM "$child"; '  # a signal before the program started
        'wait "$child"; status=$?; '
        'while kill -0 "$child" 2>/dev/null; do wait "$child"; status=$?; done; '
        'exit "$status"'
    )
