"""Priority classes: production > training > development > batch.

This is data, not behaviour: the spawners put ``priorityClassName`` on pods,
the jobs backends pick a class per job class, the Helm chart renders the
Kubernetes ``PriorityClass`` objects, and the single-server job queue orders
work by ``value``. All of them read it from here.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class PriorityClass:
    name: str
    #: The Kubernetes PriorityClass value; higher preempts lower.
    value: int
    #: Kubernetes ``preemptionPolicy`` of pods in this class.
    preemption_policy: str
    #: May work in this class run above the team's guarantee (as preemptible)?
    may_burst: bool
    description: str


PRODUCTION = PriorityClass(
    "gpulab-production", 100000, "PreemptLowerPriority", False,
    "Inference endpoints. Never preempted by gpulab; never admitted over quota.",
)
TRAINING = PriorityClass(
    "gpulab-training", 50000, "PreemptLowerPriority", False,
    "Training jobs. Preempted only by production; never admitted over quota.",
)
DEVELOPMENT = PriorityClass(
    "gpulab-development", 10000, "PreemptLowerPriority", True,
    "Notebooks within the team guarantee. Preempted by training and production.",
)
BATCH = PriorityClass(
    "gpulab-batch", 1000, "Never",
    True, "Sweeps and background jobs on otherwise idle GPUs; preemptible.",
)
#: Over-quota (burst) work of any burstable class runs in this class, so that
#: in-quota work of every class can preempt it.
OVER_QUOTA = PriorityClass(
    "gpulab-over-quota", 100, "Never", True,
    "Work running above its team's guarantee on borrowed capacity; first to be preempted.",
)

#: Highest first. ``OVER_QUOTA`` is deliberately not a user-selectable class.
PRIORITY_CLASSES: tuple[PriorityClass, ...] = (PRODUCTION, TRAINING, DEVELOPMENT, BATCH)
ALL_PRIORITY_CLASSES: tuple[PriorityClass, ...] = PRIORITY_CLASSES + (OVER_QUOTA,)

#: Short names used in config files and APIs.
BY_SHORT_NAME: dict[str, PriorityClass] = {
    "production": PRODUCTION,
    "training": TRAINING,
    "development": DEVELOPMENT,
    "batch": BATCH,
}


def get_priority_class(short_name: str) -> PriorityClass:
    """Look up ``production`` / ``training`` / ``development`` / ``batch``."""
    try:
        return BY_SHORT_NAME[short_name]
    except KeyError:
        raise KeyError(
            f"unknown priority class {short_name!r}; expected one of "
            + ", ".join(BY_SHORT_NAME)
        ) from None


def short_name(pc: PriorityClass) -> str:
    for key, value in BY_SHORT_NAME.items():
        if value == pc:
            return key
    return "over-quota"


def effective_priority_class(pc: PriorityClass, over_quota: bool) -> PriorityClass:
    """The class a workload actually runs in: over-quota work is demoted."""
    return OVER_QUOTA if over_quota else pc
