"""The catalog's ``profiles`` section: what a server or a job may ask for.

:func:`read_profile` reads one profile as a list of named steps, one per group of keys
(GPUs, CPU and memory limits, images, priority, sharing, idle and start timeouts,
Kubernetes scheduling fields), each reporting its problems under the profile's path.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from spawner.core.model import ImageChoice, Profile
from spawner.core.priority import BY_SHORT_NAME, PriorityClass, get_priority_class
from spawner.core.units import (
    format_gpus,
    parse_cpu,
    parse_duration,
    parse_gpus,
    parse_lifetime,
    parse_memory,
    parse_milli,
)

from .kube_fields import read_scheduling
from .reader import KeyPath, Reader, kind
from .sharing import check_profile_backend

N = TypeVar("N", int, float)

PROFILE_KEYS = {
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
    "max_lifetime",
    "retired",
    "tolerations",
    "node_affinity_required",
    "node_affinity_preferred",
    "start_timeout",
    "pool",
}


def profile_specs(r: Reader, value: Any) -> list[Any]:
    """The section's entries as written: a list, or a mapping of slug to profile."""
    raw = value or []
    if isinstance(raw, Mapping):
        raw = [{"slug": k, **(v or {})} if isinstance(v, Mapping) else v for k, v in raw.items()]
    return r.items(raw, ("profiles",))


def read_profiles(r: Reader, specs: list[Any]) -> dict[str, Profile]:
    """Every valid profile by slug; a repeated slug is an issue."""
    profiles: dict[str, Profile] = {}
    for i, spec in enumerate(specs):
        p = read_profile(r, spec, ("profiles", i))
        if p is None:
            continue
        if p.slug in profiles:
            r.error(("profiles", i, "slug"), f"duplicate profile slug {p.slug!r}")
            continue
        profiles[p.slug] = p
    return profiles


def read_profile(r: Reader, spec: Any, path: KeyPath) -> Profile | None:
    """One profile, or ``None`` (with its issues recorded) when any part of it is wrong."""
    d = r.mapping(spec, path, PROFILE_KEYS, required=("slug",))
    if d is None or "slug" not in d:
        return None
    n_before = len(r.issues)
    slug = r.slug(d["slug"], path + ("slug",), "profile slug")
    display = r.string(d.get("display_name", slug or ""), path + ("display_name",))
    description = r.string(d.get("description", ""), path + ("description",), max_len=2000)
    milli = _read_gpus(r, d, path)
    gpu_model = d.get("gpu_model")
    if gpu_model is not None:
        gpu_model = r.string(gpu_model, path + ("gpu_model",), max_len=64)
    cpu_g, cpu_l = _read_limits(
        r, d, path, "cpu", parse_cpu, lambda g, lim: f"CPU limit {lim} is below the guarantee {g}"
    )
    mem_g, mem_l = _read_limits(
        r, d, path, "memory", parse_memory, lambda g, lim: "memory limit is below the guarantee"
    )
    images = _read_images(r, d, path)
    pc = _read_priority(r, d, path)
    teams = r.string_list(d.get("teams"), path + ("teams",))
    check_profile_backend(r, d.get("sharing"), path + ("sharing",))
    idle = r.optional(parse_duration, d, "idle_timeout", path)
    lifetime = r.optional(parse_lifetime, d, "max_lifetime", path)
    retired = d.get("retired", False)
    if not isinstance(retired, bool):
        r.error(path + ("retired",), f"expected true or false, got {kind(retired)}")
    tolerations, required, preferred = read_scheduling(r, d, path)
    start_timeout = r.optional(parse_duration, d, "start_timeout", path)
    pool = d.get("pool")
    if pool is not None:
        pool = r.slug(pool, path + ("pool",), "pool name")
    if len(r.issues) > n_before or slug is None:
        return None
    return Profile(
        slug=slug,
        display_name=display or slug,
        description=description or "",
        gpu_milli=milli,
        gpu_model=gpu_model,
        cpu_guarantee=cpu_g,
        cpu_limit=cpu_l,
        mem_guarantee=mem_g,
        mem_limit=mem_l,
        images=images,
        priority_class=pc,
        teams=tuple(teams),
        sharing=d.get("sharing"),
        idle_timeout_seconds=idle,
        max_lifetime_seconds=lifetime,
        retired=bool(retired),
        tolerations=tolerations,
        node_affinity_required=required,
        node_affinity_preferred=preferred,
        start_timeout_seconds=start_timeout,
        pool=pool,
    )


def _read_gpus(r: Reader, d: Mapping[str, Any], path: KeyPath) -> int:
    """``gpus`` (``0.5``, ``"2"``) or ``gpu_milli`` (``500``): milli-GPUs, 0 for a CPU profile."""
    if "gpus" in d and "gpu_milli" in d:
        r.error(path, "give either 'gpus' or 'gpu_milli', not both")
    milli: int | None = 0
    if "gpus" in d:
        milli = r.convert(parse_gpus, d["gpus"], path + ("gpus",), 0)
    elif "gpu_milli" in d:
        milli = r.convert(parse_milli, d["gpu_milli"], path + ("gpu_milli",), 0)
    milli = milli or 0
    if milli > 1000 and milli % 1000:
        r.error(path + ("gpus",), f"{format_gpus(milli)} GPUs: more than one GPU must be a whole number of GPUs")
    return milli


def _read_limits(
    r: Reader,
    d: Mapping[str, Any],
    path: KeyPath,
    key: str,
    parse: Callable[[Any], N],
    below: Callable[[N, N], str],
) -> tuple[N | None, N | None]:
    """``cpu`` or ``memory``: ``{guarantee, limit}``, the limit not below the guarantee."""
    if key not in d:
        return None, None
    block = r.mapping(d[key], path + (key,), {"guarantee", "limit"}) or {}
    guarantee = r.convert(parse, block["guarantee"], path + (key, "guarantee")) if "guarantee" in block else None
    limit = r.convert(parse, block["limit"], path + (key, "limit")) if "limit" in block else None
    if guarantee is not None and limit is not None and limit < guarantee:
        r.error(path + (key, "limit"), below(guarantee, limit))
    return guarantee, limit


def _read_images(r: Reader, d: Mapping[str, Any], path: KeyPath) -> tuple[ImageChoice, ...]:
    """``images``: ``[{slug, image, display_name}]``, slugs unique within the profile."""
    images: list[ImageChoice] = []
    raw = d.get("images", [])
    if not isinstance(raw, list):
        r.error(path + ("images",), f"expected a list, got {kind(raw)}")
        raw = []
    for i, img in enumerate(raw):
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
    return tuple(images)


def _read_priority(r: Reader, d: Mapping[str, Any], path: KeyPath) -> PriorityClass:
    """``priority_class`` by its short name; development when not given."""
    if "priority_class" not in d:
        return BY_SHORT_NAME["development"]
    try:
        return get_priority_class(d["priority_class"])
    except (KeyError, TypeError) as e:
        r.error(path + ("priority_class",), str(e.args[0]) if e.args else str(e))
        return BY_SHORT_NAME["development"]
