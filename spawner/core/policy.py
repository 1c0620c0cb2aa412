"""Spawn-time policy: what a user may start, what is available, and why not.

Pure functions over a :class:`~spawner.core.catalog.Catalog` and a
:class:`~spawner.core.ledger.Ledger`. The spawn pages of both spawners, the jobs
API and the lab extension all build their choices and validate requests here,
so the form and the server can never disagree.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from .catalog import Catalog
from .ledger import Ledger, TeamUsage, notebook_key
from .model import ImageChoice, Profile, Team
from .packer import DevicePacker
from .units import format_gpus

#: Keys a spawn request (``user_options``) may carry; anything else is refused.
USER_OPTION_KEYS = frozenset({"team", "profile", "image"})
_MAX_OPTION_LEN = 128


class PolicyError(ValueError):
    """A request is refused. ``status`` is the HTTP status an adapter should use."""

    def __init__(self, message: str, status: int = 400):
        super().__init__(message)
        self.status = status


@dataclass(frozen=True)
class Capacity:
    """What the hardware says about a profile (single server: free devices)."""

    ok: bool
    #: e.g. "5 of 8 H100-80GB GPUs free on this server (declared, not detected)".
    summary: str = ""
    reason: str = ""


#: ``capacity(profile) -> Capacity``; ``None`` when the cluster decides (Kubernetes).
CapacityFn = Callable[[Profile], Capacity]


@dataclass(frozen=True)
class ProfileChoice:
    team: Team
    profile: Profile
    available: bool
    #: Why not, when unavailable (exact, human-readable).
    reason: str
    #: "3.5 of 8 GPUs free for team vision"
    team_summary: str
    capacity_summary: str = ""
    #: Would start above the team guarantee, i.e. preemptible.
    over_quota: bool = False
    #: GPU size actually allocated (after a sharing backend rounds up).
    effective_milli: int | None = None
    #: What blocks it when unavailable: ``"quota"`` (the team's or the user's
    #: limits) or ``"capacity"`` (no free device fits); ``""`` when available.
    blocked_by: str = ""
    #: GPUs the user already holds in this team (for the per-user cap).
    user_held_milli: int = 0
    #: The user's own notebook servers in this team: ``(server name, milli-GPUs)``
    #: (``""``: the default server), so a refusal can say what fills the team.
    own_servers: tuple[tuple[str, int], ...] = ()
    #: What the team holds now (the spawn page's header splits it: in quota, borrowable, free).
    team_usage: TeamUsage | None = None


@dataclass(frozen=True)
class SpawnRequest:
    """A validated request: every field comes from the catalog, not the form."""

    team: Team
    profile: Profile
    image: ImageChoice | None
    milli: int


def device_capacity(packer: DevicePacker, profile: Profile) -> Capacity:
    """Can ``profile`` be placed on this server's devices right now?"""
    models = {profile.gpu_model} if profile.gpu_model else None
    free = packer.free_milli(models)
    total = packer.total_milli(models)
    model = profile.gpu_model or "GPU"
    summary = f"{format_gpus(free)} of {format_gpus(total)} {model} free on this server"
    if packer.can_place(profile.gpu_milli, models):
        return Capacity(True, summary)
    if total == 0:
        return Capacity(False, summary, f"this server has no {model}")
    return Capacity(
        False, summary, f"no free {model} on this server fits {format_gpus(profile.gpu_milli)} GPU ({summary})"
    )


def team_summary(ledger: Ledger, team: Team) -> str:
    u = ledger.usage(team.name)
    return f"{format_gpus(u.free_milli)} of {format_gpus(team.burst_milli)} GPUs free for team {team.name}"


def pool_summary(
    catalog: Catalog, ledger: Ledger, team: Team, profile: Profile, usage: TeamUsage | None = None
) -> str | None:
    """ "2 of 4 H100-80GB free for team vision (3 of 6 GPUs in all)" when the team has a quota
    in ``profile``'s GPU pool; ``None`` when only its totals count that profile."""
    if not team.pools:
        return None
    pool = catalog.profile_pools.get(profile.slug, "")
    pu = ledger.pool_usage(team.name, pool) if pool else None
    if pu is None:
        return None
    u = usage or ledger.usage(team.name)
    label = catalog.pools[pool].label if pool in catalog.pools else pool
    return (
        f"{format_gpus(min(pu.free_milli, u.free_milli))} of {format_gpus(pu.burst_milli)} {label} free for team "
        f"{team.name} ({format_gpus(u.free_milli)} of {format_gpus(team.burst_milli)} GPUs in all)"
    )


def choices_for_user(
    catalog: Catalog,
    ledger: Ledger,
    user: str,
    groups: Iterable[str] = (),
    capacity: CapacityFn | None = None,
    effective_milli: Callable[[Profile], int] | None = None,
) -> list[ProfileChoice]:
    """Every (team, profile) the user may pick, with live availability."""
    out: list[ProfileChoice] = []
    for team in catalog.teams_for(user, groups):
        summary = team_summary(ledger, team)
        held = ledger.user_held(team.name, user)
        own = own_servers(ledger, team.name, user)
        usage = ledger.usage(team.name)
        by_pool: dict[str, str | None] = {}  # one summary per pool of the team, not per profile
        for profile in catalog.profiles_for(team):
            pool = catalog.profile_pools.get(profile.slug, "") if team.pools else ""
            if pool and pool not in by_pool:
                by_pool[pool] = pool_summary(catalog, ledger, team, profile, usage)
            milli = effective_milli(profile) if effective_milli else profile.gpu_milli
            decision = ledger.admit(
                team.name, user, milli, may_burst=profile.priority_class.may_burst, profile=profile.slug
            )
            cap = capacity(profile) if capacity and profile.is_gpu else Capacity(True)
            reason = decision.reason or (cap.reason if not cap.ok else "")
            blocked_by = "quota" if not decision.allowed else ("capacity" if not cap.ok else "")
            out.append(
                ProfileChoice(
                    team=team,
                    profile=profile,
                    available=decision.allowed and cap.ok,
                    reason=reason,
                    team_summary=by_pool.get(pool) or summary,
                    capacity_summary=cap.summary,
                    over_quota=decision.over_quota,
                    effective_milli=milli if milli != profile.gpu_milli else None,
                    blocked_by=blocked_by,
                    user_held_milli=held,
                    own_servers=own,
                    team_usage=usage,
                )
            )
    return out


def own_servers(ledger: Ledger, team: str, user: str) -> tuple[tuple[str, int], ...]:
    """``user``'s notebook servers holding GPUs in ``team``: ``(server name, milli-GPUs)``, largest first."""
    if ledger.user_held(team, user) == 0:
        return ()  # holds nothing there: no walk over every workload (thousands on a big cluster)
    prefix = notebook_key(user, "")
    held = [
        (w.key[len(prefix) :], w.milli)
        for w in ledger.workloads(team)
        if w.kind == "notebook" and w.user == user and w.milli > 0 and w.key.startswith(prefix)
    ]
    return tuple(sorted(held, key=lambda s: -s[1]))


def server_words(name: str) -> str:
    """``""`` -> "your default server"; ``"big"`` -> "your server “big”"."""
    return f"your server “{name}”" if name else "your default server"


def quota_split_words(usage: TeamUsage) -> str:
    """A team's GPUs now, split as the spawn page's header says it:
    "in quota 0.25 of 0.5 · borrowable 0.5 above the guarantee (preemptible) · 0.75 free in all"."""
    guaranteed_left = max(0, usage.guarantee_milli - usage.in_quota_milli)
    borrowable = max(0, usage.free_milli - guaranteed_left)
    return (
        f"in quota {format_gpus(usage.in_quota_milli)} of {format_gpus(usage.guarantee_milli)}"
        f" · borrowable {format_gpus(borrowable)} above the guarantee (preemptible)"
        f" · {format_gpus(usage.free_milli)} free in all"
    )


def smaller_fit(choice: ProfileChoice, choices: Iterable[ProfileChoice]) -> ProfileChoice | None:
    """The largest available GPU profile of the same team (and model) smaller than ``choice``'s."""
    model = choice.profile.gpu_model
    fits = [
        c
        for c in choices
        if c.available
        and c.team.name == choice.team.name
        and 0 < c.profile.gpu_milli < choice.profile.gpu_milli
        and (model is None or c.profile.gpu_model in (None, model))
    ]
    return max(fits, key=lambda c: c.profile.gpu_milli, default=None)


def what_to_do(choice: ProfileChoice, choices: Iterable[ProfileChoice], admin_contact: str = "") -> str:
    """What a user can do about an unavailable profile, as one sentence.

    A smaller profile of the same team that fits now, the user's own servers
    that hold GPUs of the team (often what fills it), when this one will fit
    (quota frees when a teammate stops a server; capacity when a GPU frees),
    and whom to ask for more (``c.GPULab.admin_contact``, else "an admin").
    """
    steps = []
    smaller = smaller_fit(choice, choices)
    if smaller is not None:
        steps.append(f"start {smaller.profile.display_name}, which fits now")
    team = choice.team
    where = "on this server" if choice.blocked_by == "capacity" else f"of team {team.name}'s GPUs"
    for name, milli in choice.own_servers[:2]:
        steps.append(f"stop {server_words(name)}, which holds {format_gpus(milli)} GPU {where}")
    if choice.blocked_by == "capacity":
        steps.append("try again when a GPU on this server frees up")
    elif "one user may hold" in choice.reason:
        if not choice.own_servers:  # a job holds it: the servers named above are not the cause
            steps.append("stop one of your servers or jobs in team " + team.name)
    else:
        steps.append(f"try again when quota frees (when someone in team {team.name} stops a server)")
    who = admin_contact.strip() or "an admin"
    limit = "this server's GPUs" if choice.blocked_by == "capacity" else f"team {team.name}'s quota"
    steps.append(f"ask {who} about {limit}")
    text = ", ".join(steps[:-1]) + (", or " if len(steps) > 2 else " or ") + steps[-1]
    return text[0].upper() + text[1:] + "."


def _option(options: Mapping[str, Any], key: str) -> str | None:
    value = options.get(key)  # typed: forms unwrap their one-item lists before this
    if value is None:
        return None
    if not isinstance(value, str):
        raise PolicyError(f"'{key}' must be a string, not {type(value).__name__}")
    if len(value) > _MAX_OPTION_LEN:
        raise PolicyError(f"'{key}' is longer than {_MAX_OPTION_LEN} characters")
    return value


def resolve_request(
    catalog: Catalog,
    user: str,
    groups: Iterable[str],
    options: Mapping[str, Any],
) -> SpawnRequest:
    """Validate ``user_options`` from a form or the REST API.

    Raises :class:`PolicyError` (400 for malformed, 403 for not allowed) with a
    message fit to show on the spawn page. Does not check quota: reserving does.
    """
    if not isinstance(options, Mapping):
        raise PolicyError("spawn options must be a JSON object")
    unknown = sorted(str(k) for k in options if k not in USER_OPTION_KEYS)
    if unknown:
        raise PolicyError(
            "unknown spawn option(s): "
            + ", ".join(repr(k[:40]) for k in unknown[:5])
            + "; GPU size, resources and priority come from the profile"
        )
    teams = catalog.teams_for(user, groups)
    if not teams:
        raise PolicyError(f"{user} is not a member of any GPU team; ask an admin to add you", 403)
    slug = _option(options, "profile")
    if not slug:
        raise PolicyError("choose a profile")
    team_name = _option(options, "team")
    if team_name is None:
        if len(teams) > 1:
            raise PolicyError("you are in several teams: choose which team pays for this server")
        team = teams[0]
    else:
        chosen = next((t for t in teams if t.name == team_name), None)
        if chosen is None:
            raise PolicyError(f"you are not a member of team {team_name!r}", 403)
        team = chosen
    profile = catalog.profile(slug)
    if profile is None:
        raise PolicyError(f"unknown profile {slug!r}")
    if profile.retired:
        raise PolicyError(f"profile {slug!r} is retired and no longer offered", 403)
    if not catalog.team_may_use(team, profile):
        raise PolicyError(f"team {team.name} may not use profile {slug!r}", 403)
    image_slug = _option(options, "image")
    image = profile.image_for(image_slug)
    if profile.images and image is None:
        raise PolicyError(f"profile {slug!r} offers no image {image_slug!r}")
    if not profile.images and image_slug:
        raise PolicyError(f"profile {slug!r} offers no image choice")
    return SpawnRequest(team=team, profile=profile, image=image, milli=profile.gpu_milli)
