"""Jobs, the pure part: a submission and its validation, and its output names.

The hub's jobs API and both job backends (single-server processes and
Kubernetes ``batch/v1`` Jobs) call these functions; none of them does I/O.

- a job class maps to a priority class (``batch`` -> BATCH, which may burst
  above the team guarantee as preemptible work; ``training`` -> TRAINING,
  never admitted over quota): :mod:`spawner.core.jobstates`, with the states;
- notebook paths, names and papermill parameters are validated here, so a
  request is refused the same way whichever backend would run it;
- the Kubernetes Job a submission becomes (:func:`kube_job_manifest`) and its state
  read back (:func:`kube_job_state`) live in :mod:`spawner.core.jobmanifest`.

Every public name of those two modules is re-exported here (``jobspec.QUEUED``,
``jobspec.kube_job_manifest``), so callers import jobs' words from one place.
"""

from __future__ import annotations

import json
import keyword
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import PurePosixPath
from typing import Any

from . import jobprogram
from .jobmanifest import DEFAULT_FS_GID as DEFAULT_FS_GID
from .jobmanifest import DEFAULT_UID as DEFAULT_UID
from .jobmanifest import NOTEBOOK_FAILED_EXIT_CODES as NOTEBOOK_FAILED_EXIT_CODES
from .jobmanifest import PAPERMILL_SCRIPT as PAPERMILL_SCRIPT
from .jobmanifest import SCRIPT_SHELL as SCRIPT_SHELL
from .jobmanifest import KubeJobRequest as KubeJobRequest
from .jobmanifest import job_container_name as job_container_name
from .jobmanifest import job_labels as job_labels
from .jobmanifest import job_pod_template as job_pod_template
from .jobmanifest import kube_job_manifest as kube_job_manifest
from .jobmanifest import kube_job_name as kube_job_name
from .jobmanifest import kube_job_state as kube_job_state
from .jobprogram import NOTEBOOK as NOTEBOOK
from .jobprogram import SCRIPT as SCRIPT
from .jobprogram import JobSpecError as JobSpecError
from .jobprogram import program_kind, validate_program_path
from .jobstates import CANCELLED as CANCELLED
from .jobstates import FAILED as FAILED
from .jobstates import FINAL_STATES as FINAL_STATES
from .jobstates import JOB_CLASSES as JOB_CLASSES
from .jobstates import KEPT_INPUT_SUFFIX as KEPT_INPUT_SUFFIX
from .jobstates import PREEMPTED as PREEMPTED
from .jobstates import QUEUED as QUEUED
from .jobstates import RUNNING as RUNNING
from .jobstates import STATES as STATES
from .jobstates import SUCCEEDED as SUCCEEDED
from .jobstates import TIMED_OUT as TIMED_OUT
from .jobstates import TRANSITIONS as TRANSITIONS
from .jobstates import kept_input_path as kept_input_path
from .jobstates import may_transition as may_transition
from .jobstates import priority_for as priority_for
from .jobstates import workload_key as workload_key
from .policy import SpawnRequest
from .priority import PriorityClass

# -- a submission ---------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class Submission:
    """A validated job submission: what the jobs service admits and each backend prepares.

    ``request`` is the catalog's team, profile and image (:class:`~spawner.core.policy.SpawnRequest`,
    resolved for the submitting user); everything else is checked by the functions below.
    ``to_json`` is the submission body it came from, normalised; ``from_json`` reads one
    back, resolving the choice with the ``resolve`` it is given.
    """

    request: SpawnRequest
    job_class: str
    #: The path of what runs: the notebook, or the script when ``kind`` is ``script``.
    notebook: str
    name: str
    parameters: Mapping[str, Any] = field(default_factory=dict)
    time_limit_seconds: int
    idempotency_key: str | None = None
    #: ``notebook`` (papermill) or ``script`` (Python with ``args``): :mod:`spawner.core.jobprogram`.
    kind: str = NOTEBOOK
    args: tuple[str, ...] = ()
    #: Nodes of the profile's GPUs (a gang when more than one): ``gpu_milli`` × ``nodes`` in all.
    nodes: int = 1

    @property
    def priority(self) -> PriorityClass:
        return priority_for(self.job_class)

    def to_json(self) -> dict[str, Any]:
        r = self.request
        out: dict[str, Any] = {
            "team": r.team.name,
            "profile": r.profile.slug,
            "job_class": self.job_class,
            self.kind: self.notebook,
            "name": self.name,
            "time_limit_seconds": self.time_limit_seconds,
        }
        if self.kind == SCRIPT:
            out["args"] = list(self.args)
        else:
            out["parameters"] = dict(self.parameters)
        if self.nodes != 1:
            out["nodes"] = self.nodes
        if r.image is not None:
            out["image"] = r.image.slug
        if self.idempotency_key is not None:
            out["idempotency_key"] = self.idempotency_key
        return out

    @classmethod
    def from_json(
        cls,
        data: Mapping[str, Any],
        resolve: Callable[[Mapping[str, Any]], SpawnRequest],
        *,
        max_parameters_bytes: int,
        default_time_limit: int,
        max_time_limit: int,
        max_nodes: int = 1,
    ) -> Submission:
        """A submission body checked field by field (:class:`JobSpecError` says which and why);
        ``resolve`` turns its ``team``/``profile``/``image`` into the catalog's choice."""
        job_class = str(data.get("job_class") or "")
        priority_for(job_class)  # an unknown class is refused first
        kind = program_kind(dict(data))
        path = validate_program_path(data.get(kind), kind)
        if kind == SCRIPT and data.get("parameters") not in (None, {}):
            raise JobSpecError("parameters are papermill's, for notebooks; give a script its args instead")
        args = jobprogram.validate_args(data.get("args"), kind, max_parameters_bytes)
        request = resolve({k: data[k] for k in ("team", "profile", "image") if data.get(k) is not None})
        nodes = jobprogram.validate_nodes(
            data.get("nodes"),
            kind=kind,
            job_class=job_class,
            profile_milli=request.profile.gpu_milli,
            max_nodes=max_nodes,
        )
        return cls(
            request=request,
            job_class=job_class,
            notebook=path,
            name=validate_name(data.get("name"), path),
            parameters=validate_parameters(data.get("parameters"), max_parameters_bytes),
            time_limit_seconds=validate_time_limit(data.get("time_limit_seconds"), default_time_limit, max_time_limit),
            idempotency_key=validate_idempotency_key(data.get("idempotency_key")),
            kind=kind,
            args=args,
            nodes=nodes,
        )


# -- validation ---------------------------------------------------------------

MAX_PATH_LEN = jobprogram.MAX_PATH_LEN
MAX_NAME_LEN = 63
_NAME_RE = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9._-]{0,61}[A-Za-z0-9])?$")


def validate_notebook_path(path: Any) -> str:
    """A notebook path relative to the user's home, normalised; refuses escapes
    (:func:`spawner.core.jobprogram.validate_program_path`)."""
    return validate_program_path(path, NOTEBOOK)


def validate_name(name: Any, notebook: str) -> str:
    """The job's name (``runs/<name>-<timestamp>.ipynb``); default: the notebook's stem.

    A typed name like ``LR sweep #3`` becomes ``LR-sweep-3``: it names files.
    """
    if name is None or name == "":
        name = PurePosixPath(notebook).stem
    elif not isinstance(name, str) or len(name) > MAX_NAME_LEN:
        raise JobSpecError(f"name must be a string of at most {MAX_NAME_LEN} characters")
    slug = re.sub(r"[^A-Za-z0-9._-]+", "-", name).strip("-._")[:MAX_NAME_LEN].strip("-._")
    if not _NAME_RE.match(slug):
        raise JobSpecError("name must contain letters or digits")
    return slug


def validate_parameters(parameters: Any, max_bytes: int) -> dict[str, Any]:
    """Papermill parameters: a JSON object of identifiers to JSON values, at most ``max_bytes``."""
    if parameters is None:
        return {}
    if not isinstance(parameters, dict):
        raise JobSpecError("parameters must be a JSON object of name -> value")
    size = len(json.dumps(parameters).encode())
    if size > max_bytes:
        raise JobSpecError(f"parameters are {size} bytes as JSON; the limit is {max_bytes}", 413)
    for key in parameters:
        if not isinstance(key, str) or not key.isidentifier() or keyword.iskeyword(key):
            raise JobSpecError(f"parameter name {str(key)[:40]!r} is not a Python identifier")
    return dict(parameters)


def validate_time_limit(value: Any, default: int, maximum: int) -> int:
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int):
        raise JobSpecError("time_limit_seconds must be a whole number of seconds")
    if value < 1 or value > maximum:
        raise JobSpecError(f"time_limit_seconds must be between 1 and {maximum}")
    return value


def validate_idempotency_key(value: Any) -> str | None:
    if value is None or value == "":
        return None
    if not isinstance(value, str) or len(value) > 128 or any(ord(c) < 32 for c in value):
        raise JobSpecError("idempotency_key must be a string of at most 128 printable characters")
    return value


def output_paths(notebook: str, name: str, stamp: str, kind: str = NOTEBOOK) -> tuple[str, str]:
    """``(output notebook, log)`` beside the input: ``<dir>/runs/<name>-<stamp>.ipynb`` and ``.log``
    (a script has no output notebook: ``""``)."""
    base = _run_base(notebook, name, stamp)
    return (str(base) + ".ipynb" if kind == NOTEBOOK else ""), str(base) + ".log"


def checkpoint_path(notebook: str, name: str, stamp: str) -> str:
    """The job's checkpoint folder beside its outputs, ``<dir>/runs/<name>-<stamp>.checkpoints``:
    one per job, kept across its attempts (a preempted job resumes from it)."""
    return str(_run_base(notebook, name, stamp)) + ".checkpoints"


def _run_base(notebook: str, name: str, stamp: str) -> PurePosixPath:
    return PurePosixPath(notebook).parent / "runs" / f"{name}-{stamp}"


#: Re-run's choices: the notebook exactly as the job ran it (its kept copy), or as it is now.
RERUN_KEPT, RERUN_CURRENT = "kept", "current"
RERUN_CHOICES = (RERUN_KEPT, RERUN_CURRENT)
