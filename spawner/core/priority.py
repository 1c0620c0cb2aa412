"""Priority classes: production > training > development > batch, and over-quota.

This is data, not behaviour: the spawners put ``priorityClassName`` on pods,
the jobs backends pick a class per job class, the Helm chart renders the
Kubernetes ``PriorityClass`` objects, and the single-server job queue orders
work by ``rank``. All of them read it from here.

Two orders live here, on purpose:

- ``rank`` is gpulab's order of the classes (production > training >
  development > batch > over-quota). It decides which queued job starts
  first, and which class may be admitted above the guarantee.
- ``value`` is the Kubernetes pod priority. The kube-scheduler preempts any
  pod of strictly lower value on a node, whatever its namespace: it knows
  nothing of teams. Distinct values per class would let team A's in-quota
  training evict team B's in-quota notebooks. So every in-quota class has the
  same value (the "guaranteed" band) and work above a team's guarantee runs
  in ``gpulab-over-quota``, below it: in-quota work of any team can take GPUs
  back only from borrowed work, never from another team's guarantee. Within
  one team, in-quota work never has to evict the team's own in-quota work:
  the ledger admits it only while the guarantee has room.
- KAI scheduler treats priority values of 100 and above as non-preemptible
  and lets such workloads use only in-quota resources of their queue
  (KAI docs, "Priority and preemption": "priorityClass ... >= 100 are
  non-preemptible"). The guaranteed band is above that threshold, the
  over-quota class below it, so borrowed work may use over-quota resources
  and be reclaimed.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

#: KAI scheduler: pods with a priority value at or above this are non-preemptible.
KAI_NON_PREEMPTIBLE_MIN = 100
#: Kubernetes priority value of every in-quota class.
GUARANTEED_VALUE = 10000
#: Kubernetes priority value of borrowed (over-quota) work: below KAI's threshold.
OVER_QUOTA_VALUE = 50

#: What gpulab's in-quota pods do to other tenants' pods on a shared cluster, as the chart's
#: ``priorityClasses.otherTenants`` chooses: the (in-quota, over-quota) priority values.
#: Pods without a PriorityClass have priority 0 (the cluster may set a ``globalDefault``).
#: ``preempt``: in-quota work (10000) may evict any pod of lower priority on a node it needs,
#: other tenants' priority-0 pods included; works with KAI (in-quota >= 100).
#: ``protect``: in-quota work has priority 0 and evicts only gpulab's own borrowed work
#: (-50), which other tenants' priority-0 pods may evict too; refused with KAI, which would
#: treat in-quota work below 100 as preemptible.
OTHER_TENANTS_VALUES: dict[str, tuple[int, int]] = {
    "preempt": (GUARANTEED_VALUE, OVER_QUOTA_VALUE),
    "protect": (0, -50),
}


@dataclass(frozen=True)
class PriorityClass:
    name: str
    #: The Kubernetes PriorityClass value; a pending pod may preempt pods of lower value.
    value: int
    #: Kubernetes ``preemptionPolicy`` of pods in this class.
    preemption_policy: str
    #: May work in this class run above the team's guarantee (as preemptible)?
    may_burst: bool
    description: str
    #: gpulab's order of the classes: higher starts first in a queue.
    rank: int = 0


PRODUCTION = PriorityClass(
    "gpulab-production",
    GUARANTEED_VALUE,
    "PreemptLowerPriority",
    False,
    "Inference endpoints, in quota. Never preempted; never admitted over quota.",
    rank=4,
)
TRAINING = PriorityClass(
    "gpulab-training",
    GUARANTEED_VALUE,
    "PreemptLowerPriority",
    False,
    "Training jobs, in quota. Never preempted; never admitted over quota.",
    rank=3,
)
DEVELOPMENT = PriorityClass(
    "gpulab-development",
    GUARANTEED_VALUE,
    "PreemptLowerPriority",
    True,
    "Notebooks within the team guarantee. Never preempted; above it they run as over-quota.",
    rank=2,
)
BATCH = PriorityClass(
    "gpulab-batch",
    GUARANTEED_VALUE,
    "PreemptLowerPriority",
    True,
    "Sweeps and background jobs within the team guarantee; above it they run as over-quota.",
    rank=1,
)
#: Over-quota (burst) work of any burstable class runs in this class, so that
#: in-quota work of every team can preempt it, and it preempts nobody.
OVER_QUOTA = PriorityClass(
    "gpulab-over-quota",
    OVER_QUOTA_VALUE,
    "Never",
    True,
    "Work running above its team's guarantee on borrowed capacity; preempted by any in-quota work.",
    rank=0,
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
        raise KeyError(f"unknown priority class {short_name!r}; expected one of " + ", ".join(BY_SHORT_NAME)) from None


def short_name(pc: PriorityClass) -> str:
    for key, value in BY_SHORT_NAME.items():
        if value == pc:
            return key
    return "over-quota"


def cluster_priority_class_name(pc: PriorityClass, names: Mapping[str, str] | None = None) -> str:
    """The Kubernetes PriorityClass of ``pc`` on this cluster.

    The Helm chart names its classes after the release (``<release>-<class>``, so a
    staging and a production release can share a cluster) and writes the names into the
    catalog it renders (``priority_class_names``); without them, the names of the
    release the docs install (``gpulab``): :attr:`PriorityClass.name`.
    """
    return (names or {}).get(short_name(pc)) or pc.name


def effective_priority_class(pc: PriorityClass, over_quota: bool) -> PriorityClass:
    """The class a workload actually runs in: over-quota work is demoted."""
    return OVER_QUOTA if over_quota else pc


def may_preempt(preemptor: PriorityClass, victim: PriorityClass) -> bool:
    """Would the kube-scheduler let a pending pod of ``preemptor`` evict a ``victim`` pod?

    Kubernetes: only with ``preemptionPolicy: PreemptLowerPriority`` and only
    pods of strictly lower priority value (scheduling.k8s.io PriorityClass).
    """
    return preemptor.preemption_policy == "PreemptLowerPriority" and victim.value < preemptor.value
