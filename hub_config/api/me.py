"""``GET /hub/api/gpulab/me``: the caller's teams, quota, profiles and GPU sessions.

The lab extension's sidebar and the job dialog read this; admins may pass
``?user=NAME`` to see another user's view.
"""

from __future__ import annotations

import logging
from dataclasses import replace
from typing import Any

from tornado import web

from hub_config.api.base import GPULabAPIHandler
from hub_config.config.scopes import ADMIN, JOBS
from spawner.admission import user_groups
from spawner.core.idle import idle_policy_text, idle_timeout_for, max_lifetime_for
from spawner.core.jobspec import JOB_CLASSES
from spawner.core.ledger import Ledger, TeamUsage
from spawner.core.model import Team
from spawner.core.policy import (
    CapacityFn,
    ProfileChoice,
    choices_for_user,
    device_capacity,
    team_summary,
    what_to_do,
)
from spawner.queue_page import right_size_line

LOG = logging.getLogger("gpulab.me")


def quota_view(team: Team, usage: TeamUsage) -> dict[str, Any]:
    """A team's limits and what it holds now, in milli-GPUs (the sidebar and the admin page)."""
    return {
        "display_name": team.display_name,
        "guarantee_milli": team.guarantee_milli,
        "burst_milli": team.burst_milli,
        "per_user_cap_milli": team.per_user_cap_milli,
        "held_milli": usage.held_milli,
        "in_quota_milli": usage.in_quota_milli,
        "over_quota_milli": usage.over_quota_milli,
    }


def job_class_choices(
    ledger: Ledger, choices: list[ProfileChoice], user: str, capacity: CapacityFn | None
) -> dict[str, list[ProfileChoice]]:
    """The user's choices as a job of each class would find them now (same order as ``choices``).

    A job's class, not the profile's priority class, decides whether it may
    burst above the team guarantee (``batch`` may, ``training`` never), so the
    job dialog reads these instead of the profile's own availability.
    """
    out: dict[str, list[ProfileChoice]] = {}
    for name, priority in JOB_CLASSES.items():
        decided = []
        for c in choices:
            milli = c.effective_milli or c.profile.gpu_milli
            d = ledger.admit(c.team.name, user, milli, may_burst=priority.may_burst, profile=c.profile.slug)
            cap = capacity(c.profile) if capacity is not None and c.profile.is_gpu else None
            capacity_reason = cap.reason if cap is not None and not cap.ok else ""
            decided.append(
                replace(
                    c,
                    available=d.allowed and not capacity_reason,
                    reason=d.reason or capacity_reason,
                    over_quota=d.over_quota,
                    blocked_by="quota" if not d.allowed else ("capacity" if capacity_reason else ""),
                )
            )
        out[name] = decided
    return out


def job_offer(choice: ProfileChoice, same_class: list[ProfileChoice], admin_contact: str) -> dict[str, Any]:
    """One class's offer as the dialog shows it: may it run now, above the guarantee, why not, what to do."""
    return {
        "available": choice.available,
        "over_quota": choice.over_quota,
        "reason": choice.reason,
        "todo": "" if choice.available else what_to_do(choice, same_class, admin_contact),
    }


def user_view(runtime, user_name: str, groups: list[str]) -> dict[str, Any]:
    """JSON-ready view of what ``user_name`` may start and holds now."""
    packer = runtime.packer
    capacity = (lambda p: device_capacity(packer, p)) if packer is not None else None
    choices = choices_for_user(runtime.catalog, runtime.ledger, user_name, groups, capacity)
    by_class = job_class_choices(runtime.ledger, choices, user_name, capacity)
    teams: dict[str, dict[str, Any]] = {}
    for team in runtime.catalog.teams_for(user_name, groups):
        u = runtime.ledger.usage(team.name)
        teams[team.name] = {
            "name": team.name,
            **quota_view(team, u),
            "display_name": team.label,
            "free_milli": u.free_milli,
            "user_held_milli": runtime.ledger.user_held(team.name, user_name),
            "summary": team_summary(runtime.ledger, team),
            "profiles": [],
        }
    for i, c in enumerate(choices):
        timeout, source = idle_timeout_for(c.profile, c.team, 0)
        teams[c.team.name]["profiles"].append(
            {
                "slug": c.profile.slug,
                "display_name": c.profile.display_name,
                "description": c.profile.description,
                "gpu_milli": c.profile.gpu_milli,
                "gpu_model": c.profile.gpu_model,
                "priority_class": c.profile.priority_class.name,
                "available": c.available,
                "reason": c.reason,
                "over_quota": c.over_quota,
                "capacity": c.capacity_summary,
                "images": [{"slug": i.slug, "display_name": i.display_name} for i in c.profile.images],
                # None: neither the profile nor the team sets one; the culler's default applies.
                "idle_timeout_seconds": None if source == "default" else timeout,
                # None: unlimited; else the session is stopped this long after its start, after a warning.
                "max_lifetime_seconds": (max_lifetime_for(c.profile, c.team) or (None,))[0],
                # What happens to an idle GPU, as the spawn page says it (one sentence for all pages).
                "idle_policy": idle_policy_text(c.profile, c.team, runtime.idle_facts),
                # "Last 10 sessions of ...: ... would have done" from the user's own sessions ('' for none).
                "right_size": right_size_line(runtime, user_name, c.profile, LOG) if c.profile.is_gpu else "",
                "job_classes": {
                    name: job_offer(same_class[i], same_class, runtime.admin_contact)
                    for name, same_class in by_class.items()
                },
            }
        )
    holdings = [
        {
            "key": w.key,
            "team": w.team,
            "profile": w.profile,
            "gpu_milli": w.milli,
            "kind": w.kind,
            "over_quota": w.over_quota,
            "state": w.state,
        }
        for w in runtime.ledger.workloads()
        if w.user == user_name
    ]
    return {"user": user_name, "teams": list(teams.values()), "holdings": holdings}


class MeHandler(GPULabAPIHandler):
    async def get(self) -> None:
        if not self.current_user:
            raise web.HTTPError(403, "Missing or invalid credentials.")
        target = self.get_argument("user", None)
        if target is None:
            target = self.caller_name
            if getattr(self.current_user, "kind", "user") != "user":
                raise web.HTTPError(400, "a service must name a user with ?user=NAME")
            if not (self.has_scope(JOBS, target) or self.has_scope("read:users", target)):
                raise web.HTTPError(403, f"requires {JOBS}")
        else:
            if len(target) > 255:
                raise web.HTTPError(400, "user name too long")
            if not (self.has_scope(ADMIN) or self.has_scope(JOBS, target)):
                raise web.HTTPError(403, f"requires {ADMIN} to read another user's GPU view")
        user = self.find_user(target)
        if user is None:
            raise web.HTTPError(404, f"no such user {target!r}")
        self.write_json(user_view(self.gpulab, user.name, user_groups(user)))


handlers = [(r"/api/gpulab/me", MeHandler)]
