"""Reclaim on the single server: borrowed jobs give their GPUs back to a team's guarantee.

A department guarantees its teams' guarantees, so a team's in-quota work is only ever held
back by teams of its department *borrowing*. When the ledger refuses such work, its
:class:`~spawner.core.ledger.Decision` names the reclaim choice: borrowed (over-quota)
jobs, from the team furthest over its weighted share first
(:func:`spawner.core.quota_tree.reclaim_choice`). On a backend that runs jobs itself
(``JobBackend.takes_back``: the local one) :func:`take_back` executes it:

* each chosen job gives its share back to the ledger at once and is recorded without one
  (``JobRecord.quota_held = False``), so the in-quota work is admitted in the same request;
* a running one is preempted as any preemption is (SIGTERM to its process group, the
  grace, then SIGKILL), recorded ``preempted`` with the reason, then ``queued``; its next run
  is a new attempt (``GPULAB_ATTEMPT`` one higher: the checkpoint contract, docs/jobs.md);
  a queued one (admitted, waiting for devices) just goes back to waiting;
* a job without its share waits, queued, to be admitted again (:func:`readmit`, every tick),
  through the same ledger as any submission: when capacity is idle again, over quota,
  and behind other teams' fair shares.

Only jobs are taken back: a busy notebook has no checkpoint contract, and an idle one is the
culler's to reclaim with its warning and grace, so the choice is made from jobs alone
(``reclaim_kinds``). Kubernetes: Kueue's fair-sharing preemption reclaims; nothing here runs.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from hub_config.jobs.backends.base import log
from hub_config.jobs.models import JobRecord
from spawner.core import jobspec
from spawner.core.budgets import ALLOW, REFUSE
from spawner.core.ledger import Decision

if TYPE_CHECKING:
    from hub_config.jobs.service import JobService

#: The work reclaim may take back on this server.
RECLAIM_KINDS = frozenset({"job"})
JOB_PREFIX = jobspec.workload_key(0)[:-1]


def take_back(service: JobService, decision: Decision, for_what: str) -> list[int]:
    """Take back the jobs ``decision.reclaim`` names, for ``for_what`` ("team audio's job 7"):
    the ids of the jobs that gave their share back. Nothing when the choice names work this
    backend cannot stop."""
    ids = [int(k[len(JOB_PREFIX) :]) for k in decision.reclaim if k.startswith(JOB_PREFIX)]
    if not decision.reclaim or len(ids) != len(decision.reclaim):
        return []
    records = [service.get_job(i) for i in ids]
    backend = service.backend
    if any(r is None or not r.quota_held or not backend.can_take_back(r) for r in records):
        return []  # changed since the choice, or mid-start: the requester is refused with the ledger's words
    ledger = service.runtime.ledger
    taken = []
    for rec in records:
        assert rec is not None
        team = ledger.team(rec.team)
        weight = f"{team.fair_share_weight:g}" if team is not None else "1"
        reason = (
            f"reclaimed for {for_what}, within its team's guarantee: team {rec.team} (weight {weight}) "
            "is furthest over its weighted share of the department's idle capacity"
        )
        with service.db() as s:
            row = s.get(JobRecord, rec.id)
            if row is None:
                continue
            row.quota_held = False
            s.commit()
        ledger.release(jobspec.workload_key(rec.id))
        service.backend.take_back(rec, reason)
        log.info("gpulab jobs: job %d of team %s taken back: %s", rec.id, rec.team, reason)
        taken.append(rec.id)
    return taken


def install(service: JobService) -> None:
    """Let notebook spawns take back borrowed jobs too (``runtime.take_back``), on a backend
    that takes jobs back: the answer is the seconds within which their devices are free (the
    stop grace and the hub's kill margin)."""
    if not service.backend.takes_back:
        return
    runtime = service.runtime
    runtime.reclaim_kinds = RECLAIM_KINDS

    def taken_back(decision: Decision, for_what: str) -> float | None:
        return service.backend.frees_within() if take_back(service, decision, for_what) else None

    runtime.take_back = taken_back


def readmit(service: JobService) -> int:
    """Admit again, through the ledger, the queued jobs reclaim took the share of, in the
    schedule's order (priority, then age); each one refused says why. How many went in."""
    waiting = [r for r in service.active_jobs(service.backend.name) if r.state == jobspec.QUEUED and not r.quota_held]
    waiting.sort(key=lambda r: (-jobspec.priority_for(r.job_class).rank, r.id))
    ledger = service.runtime.ledger
    admitted = 0
    for rec in waiting:
        may_burst = jobspec.priority_for(rec.job_class).may_burst
        budget = service.runtime.budget_verdict(rec.team, rec.user, may_burst) if rec.gpu_milli else None
        if budget is not None and budget.action == REFUSE:
            service.set_reason(rec.id, f"waiting to be admitted again: {budget.sentence}")
            continue
        preemptible = budget is not None and budget.action != ALLOW
        decision = ledger.reserve(
            jobspec.workload_key(rec.id),
            rec.team,
            rec.user,
            rec.gpu_milli,
            profile=rec.profile,
            kind="job",
            may_burst=may_burst,
            members=rec.nodes,
            preemptible=preemptible,
        )
        if not decision.allowed:
            service.set_reason(rec.id, f"waiting to be admitted again: {decision.reason}")
            continue
        with service.db() as s:
            row = s.get(JobRecord, rec.id)
            if row is None or row.state != jobspec.QUEUED:  # cancelled meanwhile
                ledger.release(jobspec.workload_key(rec.id))
                continue
            row.quota_held = True
            row.over_quota = decision.over_quota
            row.reason = "admitted again " + (
                "over quota (preemptible)" if decision.over_quota else "within the team guarantee"
            )
            s.commit()
        log.info("gpulab jobs: job %d of team %s admitted again (%s)", rec.id, rec.team, decision.quota_label)
        admitted += 1
    return admitted


__all__ = ["RECLAIM_KINDS", "install", "readmit", "take_back"]
