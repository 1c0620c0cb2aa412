"""The catalog: teams, profiles, sharing defaults and declared GPUs, validated.

One reader for every source: traitlets config (a dict), a YAML file (text),
and the admin page (a dict from the database). Every problem is reported with
the source, the key path and, for YAML, the line, and all problems are
collected before failing, so ``gpulab check-config`` can list them all.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from functools import cached_property
from typing import Any, TypeVar

from .catalog_kube import (
    NODE_TERM_KEYS,
    PREFERRED_TERM_KEYS,
    TOLERATION_KEYS,
    check_node_term,
    check_preferred_term,
    check_toleration,
)
from .limits import TEAM_LIMIT_KEYS, read_team_limits
from .model import SLUG_RE, ImageChoice, Profile, Team, is_slug
from .priority import BY_SHORT_NAME, get_priority_class
from .sharing import SHARING_BACKENDS, sharing_config_issues
from .units import (
    UnitError,
    format_gpus,
    parse_cpu,
    parse_duration,
    parse_gpus,
    parse_memory,
    parse_milli,
)

Path = tuple[Any, ...]
T = TypeVar("T")


@dataclass(frozen=True)
class ConfigIssue:
    path: Path
    message: str
    line: int | None = None

    def format(self, source: str) -> str:
        where = f"{source}:{self.line}" if self.line else source
        return f"{where}: {format_path(self.path) or '(top level)'}: {self.message}"


def format_path(path: Path) -> str:
    out = ""
    for part in path:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += f".{part}" if out else str(part)
    return out


class CatalogError(ValueError):
    """The configuration is invalid; ``issues`` lists every problem found."""

    def __init__(self, source: str, issues: list[ConfigIssue]):
        self.source = source
        self.issues = issues
        super().__init__("\n".join(i.format(source) for i in issues))


@dataclass(frozen=True)
class DeviceSpec:
    """A declared GPU model on the single server (when NVML is absent)."""

    model: str
    count: int
    memory_mib: int


@dataclass(frozen=True)
class Catalog:
    teams: Mapping[str, Team] = field(default_factory=dict)
    profiles: Mapping[str, Profile] = field(default_factory=dict)
    #: Cluster-wide sharing defaults: ``{"backend": "timeslice", "timeslice": {...}}``.
    sharing: Mapping[str, Any] = field(default_factory=lambda: {"backend": "whole"})
    inventory: tuple[DeviceSpec, ...] = ()
    #: Price per GPU-hour by GPU model, ``"*"`` for any model (cost reports).
    prices: Mapping[str, float] = field(default_factory=dict)

    def team(self, name: str) -> Team | None:
        return self.teams.get(name)

    def profile(self, slug: str) -> Profile | None:
        return self.profiles.get(slug)

    def teams_for(self, user: str, groups: Iterable[str] = ()) -> list[Team]:
        """The teams ``user`` (with JupyterHub ``groups``) belongs to, by name.

        Looked up in a member index, so the cost follows the user's own teams,
        not the number of teams in the catalog.
        """
        by_user, by_group = self._member_index
        found = {t.name: t for t in by_user.get(user, ())}
        for group in groups:
            found.update((t.name, t) for t in by_group.get(group, ()))
        return [found[name] for name in sorted(found)]

    @cached_property
    def _member_index(self) -> tuple[dict[str, tuple[Team, ...]], dict[str, tuple[Team, ...]]]:
        """``(user -> teams, group -> teams)``, built once per catalog (catalogs are immutable)."""
        by_user: dict[str, list[Team]] = {}
        by_group: dict[str, list[Team]] = {}
        for t in self.teams.values():
            for u in t.users:
                by_user.setdefault(u, []).append(t)
            for g in t.groups:
                by_group.setdefault(g, []).append(t)
        return ({k: tuple(v) for k, v in by_user.items()}, {k: tuple(v) for k, v in by_group.items()})

    def team_may_use(self, team: Team, profile: Profile) -> bool:
        if profile.teams and team.name not in profile.teams:
            return False
        if team.allowed_profiles is not None and profile.slug not in team.allowed_profiles:
            return False
        return True

    def profiles_for(self, team: Team, *, include_retired: bool = False) -> list[Profile]:
        """Profiles ``team`` may start, in catalog order."""
        return [p for p in self.profiles.values() if (include_retired or not p.retired) and self.team_may_use(team, p)]

    def with_team(self, team: Team) -> Catalog:
        return replace(self, teams={**self.teams, team.name: team})


# --------------------------------------------------------------------------
# Reading


class _Reader:
    """Collects issues while converting a plain dict into catalog objects."""

    def __init__(self, lines: Mapping[Path, int] | None = None):
        self.issues: list[ConfigIssue] = []
        self.lines = lines or {}

    def error(self, path: Path, message: str) -> None:
        line = None
        for n in range(len(path), -1, -1):
            if path[:n] in self.lines:
                line = self.lines[path[:n]]
                break
        self.issues.append(ConfigIssue(path, message, line))

    def mapping(self, value: Any, path: Path, allowed: set[str], required: Iterable[str] = ()) -> dict[str, Any] | None:
        if not isinstance(value, Mapping):
            self.error(path, f"expected a mapping, got {_kind(value)}")
            return None
        for key in value:
            if not isinstance(key, str) or key not in allowed:
                hint = closest_match(key, allowed)
                self.error(
                    path + (key,),
                    "unknown key"
                    + (f" (did you mean '{hint}'?)" if hint else "")
                    + "; allowed: "
                    + ", ".join(sorted(allowed)),
                )
        for key in required:
            if key not in value:
                self.error(path, f"missing required key '{key}'")
        return dict(value)

    def convert(self, fn: Callable[[Any], T], value: Any, path: Path, default: T | None = None) -> T | None:
        try:
            return fn(value)
        except UnitError as e:
            self.error(path, str(e))
            return default

    def string(self, value: Any, path: Path, *, max_len: int = 256) -> str | None:
        if not isinstance(value, str):
            self.error(path, f"expected a string, got {_kind(value)}")
            return None
        if len(value) > max_len:
            self.error(path, f"longer than {max_len} characters")
            return None
        return value

    def slug(self, value: Any, path: Path, what: str) -> str | None:
        if not is_slug(value):
            self.error(
                path,
                f"{what} {value!r} must be lowercase letters, digits and '-', "
                "1-63 characters, starting and ending with a letter or digit",
            )
            return None
        return value

    def string_list(self, value: Any, path: Path) -> list[str]:
        if value is None:
            return []
        if not isinstance(value, list):
            self.error(path, f"expected a list, got {_kind(value)}")
            return []
        out = []
        for i, item in enumerate(value):
            s = self.string(item, path + (i,))
            if s is not None:
                out.append(s)
        return out


def _kind(value: Any) -> str:
    if value is None:
        return "nothing"
    return {
        dict: "a mapping",
        list: "a list",
        str: "a string",
        bool: "a boolean",
        int: "a number",
        float: "a number",
    }.get(type(value), type(value).__name__)


def closest_match(key: Any, allowed: set[str]) -> str | None:
    import difflib

    if not isinstance(key, str):
        return None
    match = difflib.get_close_matches(key, sorted(allowed), n=1, cutoff=0.7)
    return match[0] if match else None


_PROFILE_KEYS = {
    "slug",
    "display_name",
    "description",
    "gpus",
    "gpu_milli",
    "gpu_model",
    "cpu",
    "memory",
    "images",
    "priority_class",
    "teams",
    "sharing",
    "idle_timeout",
    "retired",
    "tolerations",
    "node_affinity_required",
    "node_affinity_preferred",
    "start_timeout",
}

_TEAM_KEYS = {
    "name",
    "display_name",
    "users",
    "groups",
    "guarantee",
    "burst",
    "per_user_cap",
    "allowed_profiles",
    "namespace",
    "idle_timeout",
    "limits",
}
#: Highest price per GPU-hour: costs of a year of a whole cluster stay finite numbers.
MAX_PRICE = 1_000_000

_TOP_KEYS = {"teams", "profiles", "sharing", "inventory", "prices"}


def _read_gpu_amount(r: _Reader, spec: Mapping[str, Any], key: str, path: Path) -> int | None:
    if key not in spec:
        return None
    return r.convert(parse_gpus, spec[key], path + (key,))


def _read_profile(r: _Reader, spec: Any, path: Path) -> Profile | None:
    d = r.mapping(spec, path, _PROFILE_KEYS, required=("slug",))
    if d is None or "slug" not in d:
        return None
    n_before = len(r.issues)
    slug = r.slug(d["slug"], path + ("slug",), "profile slug")
    display = r.string(d.get("display_name", slug or ""), path + ("display_name",))
    description = r.string(d.get("description", ""), path + ("description",), max_len=2000)
    if "gpus" in d and "gpu_milli" in d:
        r.error(path, "give either 'gpus' or 'gpu_milli', not both")
    milli: int | None = 0
    if "gpus" in d:
        milli = r.convert(parse_gpus, d["gpus"], path + ("gpus",), 0)
    elif "gpu_milli" in d:
        milli = r.convert(parse_milli, d["gpu_milli"], path + ("gpu_milli",), 0)
    milli = milli or 0
    if milli and milli > 1000 and milli % 1000:
        r.error(path + ("gpus",), f"{format_gpus(milli)} GPUs: more than one GPU must be a whole number of GPUs")
    gpu_model = d.get("gpu_model")
    if gpu_model is not None:
        gpu_model = r.string(gpu_model, path + ("gpu_model",), max_len=64)
    cpu_g = cpu_l = mem_g = mem_l = None
    if "cpu" in d:
        cpu = r.mapping(d["cpu"], path + ("cpu",), {"guarantee", "limit"}) or {}
        if "guarantee" in cpu:
            cpu_g = r.convert(parse_cpu, cpu["guarantee"], path + ("cpu", "guarantee"))
        if "limit" in cpu:
            cpu_l = r.convert(parse_cpu, cpu["limit"], path + ("cpu", "limit"))
        if cpu_g is not None and cpu_l is not None and cpu_l < cpu_g:
            r.error(path + ("cpu", "limit"), f"CPU limit {cpu_l} is below the guarantee {cpu_g}")
    if "memory" in d:
        mem = r.mapping(d["memory"], path + ("memory",), {"guarantee", "limit"}) or {}
        if "guarantee" in mem:
            mem_g = r.convert(parse_memory, mem["guarantee"], path + ("memory", "guarantee"))
        if "limit" in mem:
            mem_l = r.convert(parse_memory, mem["limit"], path + ("memory", "limit"))
        if mem_g is not None and mem_l is not None and mem_l < mem_g:
            r.error(path + ("memory", "limit"), "memory limit is below the guarantee")
    images: list[ImageChoice] = []
    raw_images = d.get("images", [])
    if not isinstance(raw_images, list):
        r.error(path + ("images",), f"expected a list, got {_kind(raw_images)}")
        raw_images = []
    for i, img in enumerate(raw_images):
        ip = path + ("images", i)
        im = r.mapping(img, ip, {"slug", "display_name", "image"}, required=("slug", "image"))
        if not im or "slug" not in im or "image" not in im:
            continue
        islug = r.slug(im["slug"], ip + ("slug",), "image slug")
        iref = r.string(im["image"], ip + ("image",), max_len=512)
        idisp = r.string(im.get("display_name", im["slug"]), ip + ("display_name",))
        if islug and iref and idisp is not None:
            if any(c.slug == islug for c in images):
                r.error(ip + ("slug",), f"duplicate image slug {islug!r}")
            images.append(ImageChoice(islug, idisp, iref))
    pc = BY_SHORT_NAME["development"]
    if "priority_class" in d:
        try:
            pc = get_priority_class(d["priority_class"])
        except (KeyError, TypeError) as e:
            r.error(path + ("priority_class",), str(e.args[0]) if e.args else str(e))
    teams = r.string_list(d.get("teams"), path + ("teams",))
    sharing = d.get("sharing")
    if sharing is not None and sharing not in SHARING_BACKENDS:
        r.error(
            path + ("sharing",), f"unknown sharing backend {sharing!r}; expected one of " + ", ".join(SHARING_BACKENDS)
        )
    idle = None
    if d.get("idle_timeout") is not None:
        idle = r.convert(parse_duration, d["idle_timeout"], path + ("idle_timeout",))
    retired = d.get("retired", False)
    if not isinstance(retired, bool):
        r.error(path + ("retired",), f"expected true or false, got {_kind(retired)}")
    tolerations = _read_objects(r, d.get("tolerations"), path + ("tolerations",), TOLERATION_KEYS, check_toleration)
    required = _read_objects(
        r, d.get("node_affinity_required"), path + ("node_affinity_required",), NODE_TERM_KEYS, check_node_term
    )
    preferred = _read_objects(
        r,
        d.get("node_affinity_preferred"),
        path + ("node_affinity_preferred",),
        PREFERRED_TERM_KEYS,
        check_preferred_term,
    )
    start_timeout = None
    if d.get("start_timeout") is not None:
        start_timeout = r.convert(parse_duration, d["start_timeout"], path + ("start_timeout",))
    if len(r.issues) > n_before or slug is None:
        return None
    return Profile(
        slug=slug,
        display_name=display or slug,
        description=description or "",
        gpu_milli=milli or 0,
        gpu_model=gpu_model,
        cpu_guarantee=cpu_g,
        cpu_limit=cpu_l,
        mem_guarantee=mem_g,
        mem_limit=mem_l,
        images=tuple(images),
        priority_class=pc,
        teams=tuple(teams),
        sharing=sharing,
        idle_timeout_seconds=idle,
        retired=bool(retired),
        tolerations=tolerations,
        node_affinity_required=required,
        node_affinity_preferred=preferred,
        start_timeout_seconds=start_timeout,
    )


def _read_objects(
    r: _Reader, value: Any, path: Path, allowed: set[str], check: Callable[[dict[str, Any]], str | None]
) -> tuple[dict[str, Any], ...]:
    """A list of Kubernetes objects (tolerations, affinity terms): known fields, checked shapes."""
    if value is None:
        return ()
    if not isinstance(value, list):
        r.error(path, f"expected a list, got {_kind(value)}")
        return ()
    out = []
    for i, item in enumerate(value):
        d = r.mapping(item, path + (i,), allowed)
        if d is None:
            continue
        problem = check(d)
        if problem:
            r.error(path + (i,), problem)
        else:
            out.append(dict(d))
    return tuple(out)


def _read_team(r: _Reader, spec: Any, path: Path, name: str | None = None) -> Team | None:
    d = r.mapping(spec, path, _TEAM_KEYS, required=() if name else ("name",))
    if d is None:
        return None
    n_before = len(r.issues)
    name = name if name is not None else d.get("name")
    if name is None:
        return None
    name = r.slug(name, path + ("name",), "team name")
    display = r.string(d.get("display_name", ""), path + ("display_name",))
    users = r.string_list(d.get("users"), path + ("users",))
    groups = r.string_list(d.get("groups"), path + ("groups",))
    guarantee = _read_gpu_amount(r, d, "guarantee", path) or 0
    burst = _read_gpu_amount(r, d, "burst", path)
    if burst is None:
        burst = guarantee
    if burst < guarantee:
        r.error(
            path + ("burst",),
            f"burst limit ({format_gpus(burst)} GPUs) is below the guarantee ({format_gpus(guarantee)} GPUs)",
        )
    cap = _read_gpu_amount(r, d, "per_user_cap", path)
    allowed = None
    if "allowed_profiles" in d and d["allowed_profiles"] is not None:
        allowed = tuple(r.string_list(d["allowed_profiles"], path + ("allowed_profiles",)))
    namespace = d.get("namespace")
    if namespace is not None:
        namespace = r.slug(namespace, path + ("namespace",), "namespace")
    idle = None
    if d.get("idle_timeout") is not None:
        idle = r.convert(parse_duration, d["idle_timeout"], path + ("idle_timeout",))
    limits = read_team_limits(
        d.get("limits"),
        lambda v: r.mapping(v, path + ("limits",), TEAM_LIMIT_KEYS),
        lambda fn, v, key: r.convert(fn, v, path + ("limits", key)),
        lambda key, message: r.error(path + ("limits", key), message),
    )
    if len(r.issues) > n_before or name is None:
        return None
    return Team(
        name=name,
        display_name=display or "",
        users=frozenset(users),
        groups=frozenset(groups),
        guarantee_milli=guarantee,
        burst_milli=burst,
        per_user_cap_milli=cap,
        allowed_profiles=allowed,
        namespace=namespace,
        idle_timeout_seconds=idle,
        limits=limits,
    )


def catalog_from_dict(data: Any, source: str = "<config>", lines: Mapping[Path, int] | None = None) -> Catalog:
    """Validate ``data`` (the YAML/config structure) into a :class:`Catalog`.

    Raises :class:`CatalogError` listing every problem found.
    """
    r = _Reader(lines)
    if data is None:
        data = {}
    top = r.mapping(data, (), _TOP_KEYS)
    if top is None:
        raise CatalogError(source, r.issues)

    profiles: dict[str, Profile] = {}
    raw_profiles = top.get("profiles") or []
    if isinstance(raw_profiles, Mapping):
        raw_profiles = [{"slug": k, **(v or {})} if isinstance(v, Mapping) else v for k, v in raw_profiles.items()]
    if not isinstance(raw_profiles, list):
        r.error(("profiles",), f"expected a list, got {_kind(raw_profiles)}")
        raw_profiles = []
    for i, spec in enumerate(raw_profiles):
        p = _read_profile(r, spec, ("profiles", i))
        if p is None:
            continue
        if p.slug in profiles:
            r.error(("profiles", i, "slug"), f"duplicate profile slug {p.slug!r}")
            continue
        profiles[p.slug] = p

    teams: dict[str, Team] = {}
    raw_teams = top.get("teams") or []
    items: list[tuple[Path, Any, str | None]]
    if isinstance(raw_teams, Mapping):
        items = [(("teams", k), v, k) for k, v in raw_teams.items()]
    elif isinstance(raw_teams, list):
        items = [(("teams", i), v, None) for i, v in enumerate(raw_teams)]
    else:
        r.error(("teams",), f"expected a list or mapping, got {_kind(raw_teams)}")
        items = []
    for path, spec, name in items:
        t = _read_team(r, spec, path, name)
        if t is None:
            continue
        if t.name in teams:
            r.error(path + ("name",), f"duplicate team name {t.name!r}")
            continue
        teams[t.name] = t

    # Cross references (against every name written, valid or not, so one
    # broken profile does not cascade into "unknown profile" errors).
    written_slugs = {p.get("slug") for p in raw_profiles if isinstance(p, Mapping)}
    written_teams = {name or (spec.get("name") if isinstance(spec, Mapping) else None) for _, spec, name in items}
    for path, spec, _ in items:
        if isinstance(spec, Mapping) and isinstance(spec.get("allowed_profiles"), list):
            for j, slug in enumerate(spec["allowed_profiles"]):
                if isinstance(slug, str) and slug not in written_slugs:
                    hint = closest_match(slug, {x for x in written_slugs if isinstance(x, str)})
                    r.error(
                        path + ("allowed_profiles", j),
                        f"unknown profile {slug!r}" + (f" (did you mean '{hint}'?)" if hint else ""),
                    )
    for i, p in enumerate(raw_profiles):
        if isinstance(p, Mapping) and isinstance(p.get("teams"), list):
            for j, tname in enumerate(p["teams"]):
                if isinstance(tname, str) and tname not in written_teams:
                    r.error(("profiles", i, "teams", j), f"unknown team {tname!r}")

    sharing: dict[str, Any] = {"backend": "whole"}
    if "sharing" in top and top["sharing"] is not None:
        s = r.mapping(top["sharing"], ("sharing",), {"backend", *SHARING_BACKENDS})
        if s is not None:
            backend = s.get("backend", "whole")
            if backend not in SHARING_BACKENDS:
                r.error(
                    ("sharing", "backend"),
                    f"unknown sharing backend {backend!r}; expected one of " + ", ".join(SHARING_BACKENDS),
                )
            for k in SHARING_BACKENDS:
                if k in s and not isinstance(s[k], Mapping):
                    r.error(("sharing", k), f"expected a mapping, got {_kind(s[k])}")
            for sub, message in sharing_config_issues({k: v for k, v in s.items() if isinstance(v, Mapping)}):
                r.error(("sharing",) + sub, message)
            sharing = s
            sharing.setdefault("backend", "whole")

    inventory: list[DeviceSpec] = []
    raw_inv = top.get("inventory") or []
    if not isinstance(raw_inv, list):
        r.error(("inventory",), f"expected a list, got {_kind(raw_inv)}")
        raw_inv = []
    for i, spec in enumerate(raw_inv):
        ip = ("inventory", i)
        d = r.mapping(spec, ip, {"model", "count", "memory_mib"}, required=("model", "count"))
        if not d or "model" not in d or "count" not in d:
            continue
        model = r.string(d["model"], ip + ("model",), max_len=64)
        count, mem = d["count"], d.get("memory_mib", 0)
        if isinstance(count, bool) or not isinstance(count, int) or not 0 < count <= 1024:
            r.error(ip + ("count",), f"expected a whole number of GPUs from 1 to 1024, got {count!r}")
            continue
        if isinstance(mem, bool) or not isinstance(mem, int) or mem < 0:
            r.error(ip + ("memory_mib",), f"expected a whole number of MiB, got {mem!r}")
            continue
        if model:
            inventory.append(DeviceSpec(model, count, mem))

    prices: dict[str, float] = {}
    if top.get("prices") is not None:
        pr = top["prices"]
        if not isinstance(pr, Mapping):
            r.error(("prices",), f"expected a mapping of GPU model to price per GPU-hour, got {_kind(pr)}")
        else:
            for model, price in pr.items():
                if (
                    isinstance(price, bool) or not isinstance(price, (int, float)) or not 0 <= price <= MAX_PRICE
                ):  # also NaN and infinity
                    r.error(
                        ("prices", model),
                        f"expected a non-negative price per GPU-hour of at most {MAX_PRICE:g}, got {str(price)[:40]}",
                    )
                else:
                    prices[str(model)] = float(price)

    if r.issues:
        raise CatalogError(source, r.issues)
    return Catalog(teams=teams, profiles=profiles, sharing=sharing, inventory=tuple(inventory), prices=prices)


__all__ = [
    "SHARING_BACKENDS",
    "SLUG_RE",
    "Catalog",
    "CatalogError",
    "ConfigIssue",
    "DeviceSpec",
    "catalog_from_dict",
]
