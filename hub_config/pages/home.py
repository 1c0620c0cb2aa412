"""What gpulab adds to JupyterHub's home page and where users land after login.

- ``gpulab_home`` (a ``c.JupyterHub.template_vars`` callable of the user):
  "Start again with 0.5 × H100 (team vision)" from the user's last started
  choice, and which GPU each of the user's servers holds, from the ledger
  and (single server) the device packer.
- :func:`default_url`: a gpulab admin who is in no team lands on the GPU
  admin page (where they can add themselves to a team) instead of an empty
  spawn page; everyone else gets JupyterHub's default.
"""

from __future__ import annotations

from functools import cached_property
from typing import Any

from hub_config.config.scopes import ADMIN
from spawner.admission import user_groups
from spawner.core.ledger import notebook_key
from spawner.core.policy import PolicyError, resolve_request
from spawner.core.units import format_gpus
from spawner.runtime import get_runtime


def held_words(runtime, user_name: str, server_name: str) -> str:
    """ "0.5 × H100 on GPU 0 (H100-80GB) · team vision · in quota" for a server, or ''."""
    key = notebook_key(user_name, server_name)
    w = runtime.ledger.get(key)
    if w is None:
        return ""
    profile = runtime.catalog.profile(w.profile)
    what = profile.display_name if profile is not None else f"{format_gpus(w.milli)} GPU"
    if w.milli <= 0:
        return f"{what} · no GPU · team {w.team}"
    packer = runtime.packer
    placement = packer.placement(key) if packer is not None else None
    if placement is not None and placement.shares:
        devices = [packer.devices[i] for i, _ in placement.shares if i in packer.devices]
        where = " on " + ", ".join(f"GPU {d.index}" for d in devices)
        if devices:
            where += f" ({devices[0].model})"
    else:
        where = ""
    quota = "preemptible (over quota)" if w.over_quota else "in quota"
    return f"{what}{where} · team {w.team} · {quota}"


class HomeView:
    """Evaluated lazily by the templates that use it (every page gets the variable)."""

    def __init__(self, user: Any, config: Any):
        self.user = user
        self.config = config

    @cached_property
    def runtime(self):
        return get_runtime(config=self.config)

    @cached_property
    def start_again(self) -> dict[str, Any] | None:
        """``{"label", "choice", "available", "reason"}`` for the last started choice still offered."""
        try:
            last = self.runtime.last_choice(self.user.name)
        except Exception:
            return None
        if not last:
            return None
        runtime = self.runtime
        try:
            request = resolve_request(
                runtime.catalog,
                self.user.name,
                user_groups(self.user),
                {"team": last["team"], "profile": last["profile"]},
            )
        except PolicyError:
            return None  # retired, or no longer in that team: nothing to suggest
        decision = runtime.ledger.admit(
            request.team.name,
            self.user.name,
            request.milli,
            may_burst=request.profile.priority_class.may_burst,
            profile=request.profile.slug,
        )
        return {
            "label": f"Start again with {request.profile.display_name} (team {request.team.name})",
            "choice": f"{request.team.name}:{request.profile.slug}",
            "available": decision.allowed,
            "reason": decision.reason,
        }

    @cached_property
    def budget_banners(self) -> list[dict[str, Any]]:
        """The GPU-hour budgets of the user's teams (and their own) at 80 % or more."""
        book = self.runtime.budgets
        if book is None:
            return []
        try:
            teams = [t.name for t in self.runtime.catalog.teams_for(self.user.name, user_groups(self.user))]
            return [b for b in book.for_user(self.user.name, teams) if b["level"] != "ok"]
        except Exception:  # a banner never breaks the page it is on
            return []

    @cached_property
    def servers(self) -> dict[str, str]:
        """Server name ('' = default) -> what it holds, for the user's active servers."""
        out = {}
        for name, spawner in getattr(self.user, "spawners", {}).items():
            if getattr(spawner, "active", False):
                words = held_words(self.runtime, self.user.name, name)
                if words:
                    out[name] = words
        return out


def make_home_view(config: Any):
    """The ``template_vars`` callable: JupyterHub calls it with the current user (or None)."""

    def gpulab_home(user: Any) -> HomeView | None:
        return HomeView(user, config) if user is not None else None

    return gpulab_home


def is_gpulab_admin(user: Any) -> bool:
    """Whether the user's roles grant gpulab's admin scope (right after login too, when the
    handler's own scopes still describe the anonymous request)."""
    from jupyterhub.scopes import get_scopes_for

    return ADMIN in get_scopes_for(user)


def default_url(handler: Any) -> str:
    """Where a user lands after login: '' (JupyterHub's default) except for an admin in no team."""
    user = handler.current_user
    if user is None or user.spawner.active or not is_gpulab_admin(user):
        return ""
    runtime = get_runtime(config=handler.settings.get("config"))
    if runtime.catalog.teams_for(user.name, user_groups(user)):
        return ""
    return handler.hub.base_url + "gpulab/admin?welcome=no-team"
