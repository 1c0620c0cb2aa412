"""The spawn admission flow both spawners run, and the one refusal type.

resolve (the choice checked against the catalog: team membership, profile, image) ->
reserve (the quota, checked and recorded in one step under the ledger's lock) ->
confirm (the server runs) or release (it did not start, or it stopped) -> remember the
choice (the "Start again" of the spawn page). :mod:`spawner.local.spawner` adds device
placement and the process; :mod:`spawner.kube.spawner` the pod's traits. The jobs API
names users' groups the same way (:func:`user_groups`) and reserves on the same ledger.

Every refusal is JupyterHub's ``SpawnException`` (:func:`refusal`): a sentence the spawn
page and the REST API show as is, an HTTP status, and a ``reason`` that labels the
spawn-failure metric (``invalid-options``, ``forbidden``, ``quota``, ``capacity``, ...).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any, TypeVar

from jupyterhub.spawner import SpawnException  # JupyterHub >= 6: a refusal shown without a traceback

from spawner.core.budgets import ALLOW, REFUSE
from spawner.core.ledger import Decision
from spawner.core.policy import PolicyError, SpawnRequest, resolve_request
from spawner.runtime import GPULabRuntime, current_runtime

T = TypeVar("T")


def refusal(message: str, status: int = 400, reason: str = "gpulab") -> SpawnException:
    """A refused spawn: the spawn page and the REST API show ``message`` as is."""
    e = SpawnException(message, reason=reason, status_code=status)
    e.jupyterhub_message = message  # the form shows this instead of "403 SpawnException(...)"
    return e


def policy_refusal(e: PolicyError, message: str | None = None) -> SpawnException:
    """A :class:`PolicyError` as a refusal: 400 (malformed options) or its own status."""
    return refusal(message or str(e), e.status, "invalid-options" if e.status == 400 else "forbidden")


def user_groups(user: Any) -> list[str]:
    """The JupyterHub group names of a user (a team may name groups as members), and the
    teams and departments the identity provider's rules grant them (:class:`TeamGrant`,
    :class:`DepartmentGrant`, :mod:`spawner.core.identity`)."""
    names = [getattr(g, "name", g) for g in getattr(user, "groups", None) or []]
    runtime = current_runtime()
    name = getattr(user, "name", None)
    if runtime is None or not isinstance(name, str):
        return names
    return [*names, *runtime.identity_grants(name, names)]


class Admission:
    """One server's way through the ledger: ``key`` is its ledger key (one per user and server)."""

    def __init__(self, runtime: GPULabRuntime, user: str, groups: list[str], key: str, log: logging.Logger):
        self.runtime = runtime
        self.user = user
        self.groups = groups
        self.key = key
        self.log = log
        #: Seconds within which work reclaim took back for this server frees its devices
        #: (``None``: none was taken back).
        self.reclaim_wait: float | None = None

    def resolve(self, options: Any) -> SpawnRequest:
        """The team, profile and image ``options`` ask for, or a refusal that says why not
        (a GPU-hour budget that refuses new work included: the form says so before anything starts)."""
        try:
            request = resolve_request(self.runtime.catalog, self.user, self.groups, options)
        except PolicyError as e:
            raise policy_refusal(e) from None
        if request.milli:
            may_burst = request.profile.priority_class.may_burst
            budget = self.runtime.budget_verdict(request.team.name, self.user, may_burst)
            if budget.action == REFUSE:
                raise refusal(budget.sentence, 403, "budget")
        return request

    def reserve(self, request: SpawnRequest, milli: int, sentence: Callable[[str], str] = str) -> Decision:
        """Reserve ``milli`` of the team's quota, or refuse (403, reason ``quota``) with
        ``sentence(reason)``. Nothing else holds the lock between the check and the record.

        First the team's GPU-hour budgets: one at 100 % refuses (403, reason ``budget``) or
        lets the work start only over quota, as the admin chose. In-quota work held back by
        its department's borrowers has the runtime take their work back first
        (``runtime.take_back``; :attr:`reclaim_wait` then says how long their devices may take)."""
        profile = request.profile
        may_burst = profile.priority_class.may_burst
        budget = self.runtime.budget_verdict(request.team.name, self.user, may_burst) if milli else None
        if budget is not None and budget.action == REFUSE:
            self.log.info("gpulab: refused %s (%s): %s", self.key, profile.slug, budget.sentence)
            raise refusal(budget.sentence, 403, "budget")
        preemptible = budget is not None and budget.action != ALLOW
        if budget is not None and preemptible:
            self.log.info("gpulab: %s starts over quota only: %s", self.key, budget.sentence)
        kinds = self.runtime.reclaim_kinds

        def reserve() -> Decision:
            return self.runtime.ledger.reserve(
                self.key,
                request.team.name,
                self.user,
                milli,
                profile=profile.slug,
                kind="notebook",
                may_burst=may_burst,
                preemptible=preemptible,
                reclaim_kinds=kinds,
            )

        decision = reserve()
        self.reclaim_wait = None
        if not decision.allowed and decision.reclaim and not decision.over_quota and kinds is not None:
            # In-quota work its department's borrowers hold back: their work gives its share back.
            what = f"{self.user}'s server ({profile.display_name}) in team {request.team.name}"
            self.reclaim_wait = self.runtime.take_back(decision, what)
            if self.reclaim_wait is not None:
                decision = reserve()
        if not decision.allowed:
            self.log.info("gpulab: refused %s (%s): %s", self.key, profile.slug, decision.reason)
            raise refusal(sentence(decision.reason), 403, "quota")
        return decision

    async def placed(self, place: Callable[[], T | None]) -> T | None:
        """``place()``, and while work taken back for this server frees its devices
        (:attr:`reclaim_wait`), again until it fits or that time is over."""
        placement = place()
        if placement is None and self.reclaim_wait:
            deadline = asyncio.get_running_loop().time() + self.reclaim_wait
            while placement is None and asyncio.get_running_loop().time() < deadline:
                await asyncio.sleep(0.25)
                placement = place()
        return placement

    def confirm(self) -> None:
        """The server runs: its reservation becomes a running workload."""
        self.runtime.ledger.confirm(self.key)

    def release(self) -> None:
        """The server did not start or stopped: its share is free at once."""
        if self.runtime.ledger.release(self.key) is not None:
            self.log.info("gpulab: released %s", self.key)

    def remember_choice(self, request: SpawnRequest) -> None:
        """Record the started choice for "Start again" (a failure to write only costs the suggestion)."""
        try:
            image = request.image.slug if request.image else ""
            self.runtime.remember_choice(self.user, request.team.name, request.profile.slug, image)
        except Exception as e:
            self.log.warning("gpulab: cannot record the last choice of %s: %s", self.user, e)
