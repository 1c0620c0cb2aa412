"""Jobs' classes and states, and the notebook a job keeps: the words every job module shares.

Pure. :mod:`spawner.core.jobspec` (submissions) and :mod:`spawner.core.jobmanifest`
(the Kubernetes Job) both read these; ``jobspec`` re-exports them, so
``jobspec.QUEUED`` and ``jobspec.kept_input_path`` keep working.
"""

from __future__ import annotations

from .jobprogram import JobSpecError
from .priority import BATCH, TRAINING, PriorityClass

# -- classes and states -------------------------------------------------------

JOB_CLASSES: dict[str, PriorityClass] = {"batch": BATCH, "training": TRAINING}

QUEUED = "queued"
RUNNING = "running"
PREEMPTED = "preempted"
SUCCEEDED = "succeeded"
FAILED = "failed"
CANCELLED = "cancelled"
TIMED_OUT = "timed-out"
STATES = (QUEUED, RUNNING, PREEMPTED, SUCCEEDED, FAILED, CANCELLED, TIMED_OUT)
#: States a job never leaves.
FINAL_STATES = frozenset({SUCCEEDED, FAILED, CANCELLED, TIMED_OUT})
#: Which state may follow which; anything else is a bug, refused loudly.
TRANSITIONS: dict[str, frozenset[str]] = {
    QUEUED: frozenset({RUNNING, PREEMPTED, CANCELLED, FAILED, TIMED_OUT}),
    RUNNING: frozenset({SUCCEEDED, FAILED, CANCELLED, TIMED_OUT, PREEMPTED}),
    PREEMPTED: frozenset({QUEUED, RUNNING, CANCELLED, FAILED}),
}


def priority_for(job_class: str) -> PriorityClass:
    """``batch`` / ``training`` -> its :class:`PriorityClass`."""
    try:
        return JOB_CLASSES[job_class]
    except (KeyError, TypeError):
        raise JobSpecError(f"job_class must be one of {', '.join(JOB_CLASSES)}, not {str(job_class)[:40]!r}") from None


def may_transition(old: str, new: str) -> bool:
    return new in TRANSITIONS.get(old, frozenset())


def workload_key(job_id: int) -> str:
    """Ledger key of a job (one per job id, across re-runs and requeues)."""
    return f"job:{job_id}"


# -- the notebook a job keeps ----------------------------------------------------

#: The suffix of the notebook a job runs, kept beside its output as it was submitted.
KEPT_INPUT_SUFFIX = ".input.ipynb"


def kept_input_path(output_path: str) -> str:
    """The job's own copy of its notebook as submitted, beside its output and log:
    ``<dir>/runs/<name>-<stamp>.input.ipynb``. The job runs this copy, and Re-run runs it again."""
    return output_path.removesuffix(".ipynb") + KEPT_INPUT_SUFFIX


class AdmissionRefused(JobSpecError):
    """The ledger has no share for the job now (its team's quota, the free GPUs): a submission is
    refused with the ledger's words; a sweep's run waits and is tried again."""
