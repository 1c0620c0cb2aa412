"""The catalog's ``sharing`` section: which backend maps a fraction of a GPU, and its options.

The mapping itself (a fraction to pod resources) is :mod:`spawner.core.sharing`; this
module checks what an operator may write for it, once for the catalog file, the chart
values and the admin page, and names the GPU models a profile may ask for.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any

from spawner.core.sharing import DEFAULT_GPU_PRODUCTS, MIG_NAME_RE, SHARING_BACKENDS, SharingError

from .catalog import Catalog
from .reader import KeyPath, Reader, kind

_RESOURCE_NAME = re.compile(
    r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
    r"[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$"
)
_LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")


#: Options each backend accepts (every backend also takes ``node_selector``).
BACKEND_OPTIONS: dict[str, dict[str, str]] = {
    "whole": {
        "resource": "extended resource for whole GPUs (default nvidia.com/gpu)",
    },
    "timeslice": {
        "resource": "time-sliced resource name (default nvidia.com/gpu.shared)",
        "replicas": "replicas per GPU in the device plugin's timeSlicing config (default 4)",
        "fail_requests_greater_than_one": "the device plugin refuses requests > 1 replica (default true)",
        "whole_resource": "resource for requests of one GPU or more (default nvidia.com/gpu)",
    },
    "mig": {
        "profiles": "extra or replacement MIG profiles per GPU model, e.g. {A30-24GB: [1g.6gb, 2g.12gb, 4g.24gb]}",
        "whole_resource": "resource for requests of one GPU or more (default nvidia.com/gpu)",
    },
    "hami": {
        "resource": "HAMi GPU count resource (default nvidia.com/gpu)",
        "memory_percentage_resource": "default nvidia.com/gpumem-percentage",
        "cores_resource": "default nvidia.com/gpucores",
        "scheduler_name": "scheduler for HAMi pods (default hami-scheduler)",
    },
    "kai": {
        "scheduler_name": "default kai-scheduler",
        "queue": "queue name template, {team} is the team name (default {team})",
        "queue_label": "default kai.scheduler/queue",
        "fraction_annotation": "default gpu-fraction",
        "whole_resource": "resource for requests of one GPU or more (default nvidia.com/gpu)",
    },
}
_COMMON_OPTIONS = {"node_selector": "node labels per GPU model, e.g. {H100-80GB: {nvidia.com/gpu.product: ...}}"}


def sharing_config_issues(config: Any) -> list[tuple[tuple[str, ...], str]]:
    """Problems in a ``sharing`` mapping as ``(key path, message)`` pairs (empty = valid)."""
    issues: list[tuple[tuple[str, ...], str]] = []
    if not isinstance(config, Mapping):
        return [((), f"expected a mapping, got {type(config).__name__}")]
    for backend in SHARING_BACKENDS:
        opts = config.get(backend)
        if opts is None:
            continue
        if not isinstance(opts, Mapping):
            issues.append(((backend,), f"expected a mapping, got {type(opts).__name__}"))
            continue
        allowed = {**BACKEND_OPTIONS[backend], **_COMMON_OPTIONS}
        for key in opts:
            if key not in allowed:
                issues.append(((backend, str(key)), f"unknown option; {backend} accepts " + ", ".join(sorted(allowed))))
        issues.extend(((backend,) + p, m) for p, m in _option_issues(backend, opts))
    return issues


def _option_issues(backend: str, opts: Mapping[str, Any]) -> list[tuple[tuple[str, ...], str]]:
    out: list[tuple[tuple[str, ...], str]] = []
    for key in ("resource", "whole_resource", "memory_percentage_resource", "cores_resource", "queue_label"):
        if key in opts and (
            not isinstance(opts[key], str) or not _RESOURCE_NAME.match(opts[key]) or len(opts[key]) > 253
        ):
            out.append(((key,), f"expected a Kubernetes resource or label name like nvidia.com/gpu, got {opts[key]!r}"))
    for key in ("scheduler_name", "fraction_annotation"):
        if key in opts and not (isinstance(opts[key], str) and 0 < len(opts[key]) <= 253):
            out.append(((key,), f"expected a non-empty name, got {opts[key]!r}"))
    if "replicas" in opts:
        r = opts["replicas"]
        if isinstance(r, bool) or not isinstance(r, int) or not 1 <= r <= 1000:
            out.append((("replicas",), f"expected a whole number of replicas per GPU from 1 to 1000, got {r!r}"))
    if "fail_requests_greater_than_one" in opts and not isinstance(opts["fail_requests_greater_than_one"], bool):
        out.append((("fail_requests_greater_than_one",), "expected true or false"))
    if "queue" in opts:
        q = opts["queue"]
        try:
            rendered = q.format(team="team") if isinstance(q, str) else None
        except (KeyError, IndexError, ValueError):
            rendered = None
        if rendered is None or not _LABEL_VALUE.match(rendered) or len(rendered) > 63:
            out.append((("queue",), f"expected a queue name template using only {{team}}, got {q!r}"))
    if "profiles" in opts:
        prof = opts["profiles"]
        if not isinstance(prof, Mapping):
            out.append((("profiles",), "expected a mapping of GPU model to a list of MIG profiles"))
        else:
            for model, names in prof.items():
                if not isinstance(names, list) or not names:
                    out.append((("profiles", str(model)), "expected a non-empty list like [1g.10gb, 3g.40gb, 7g.80gb]"))
                    continue
                for i, name in enumerate(names):
                    if not isinstance(name, str) or not MIG_NAME_RE.match(name):
                        out.append(
                            (
                                ("profiles", str(model), str(i)),
                                f"expected a MIG profile name like 3g.40gb, got {name!r}",
                            )
                        )
    if "node_selector" in opts:
        ns = opts["node_selector"]
        if not isinstance(ns, Mapping):
            out.append((("node_selector",), "expected a mapping of GPU model to node labels"))
        else:
            for model, labels in ns.items():
                if not isinstance(labels, Mapping) or not all(
                    isinstance(k, str)
                    and _RESOURCE_NAME.match(k)
                    and isinstance(v, str)
                    and _LABEL_VALUE.match(v)
                    and len(v) <= 63
                    for k, v in labels.items()
                ):
                    out.append(
                        (
                            ("node_selector", str(model)),
                            "expected node labels like {nvidia.com/gpu.product: NVIDIA-H100-80GB-HBM3}",
                        )
                    )
    return out


def validate_sharing_config(config: Any) -> None:
    """Raise :class:`SharingError` listing every problem in ``config``."""
    issues = sharing_config_issues(config)
    if issues:
        raise SharingError("; ".join(f"sharing.{'.'.join(p)}: {m}" if p else f"sharing: {m}" for p, m in issues))


def known_gpu_models(catalog: Catalog, kubernetes: bool, detected: Iterable[str] = ()) -> set[str]:
    """GPU models a profile may name.

    On Kubernetes: the models whose nodes the sharing backends can select
    (:data:`DEFAULT_GPU_PRODUCTS` and every ``node_selector`` configured).
    On a single server: the GPUs it has -- ``detected`` (NVML) and the
    declared ``inventory``. ``gpulab check-config`` and the admin API ask here.
    """
    if kubernetes:
        known = set(DEFAULT_GPU_PRODUCTS)
        for options in catalog.sharing.values():
            if isinstance(options, Mapping):
                known.update(str(m) for m in (options.get("node_selector") or {}))
        return known
    return set(detected) | {s.model for s in catalog.inventory}


def unknown_backend(name: Any) -> str:
    """The one sentence for a sharing backend gpulab does not know."""
    return f"unknown sharing backend {name!r}; expected one of " + ", ".join(SHARING_BACKENDS)


def read_sharing(r: Reader, value: Any) -> dict[str, Any]:
    """The top-level ``sharing`` block: a default backend and per-backend options."""
    if value is None:
        return {"backend": "whole"}
    s = r.mapping(value, ("sharing",), {"backend", *SHARING_BACKENDS})
    if s is None:
        return {"backend": "whole"}
    backend = s.get("backend", "whole")
    if backend not in SHARING_BACKENDS:
        r.error(("sharing", "backend"), unknown_backend(backend))
    for k in SHARING_BACKENDS:
        if k in s and not isinstance(s[k], Mapping):
            r.error(("sharing", k), f"expected a mapping, got {kind(s[k])}")
    for sub, message in sharing_config_issues({k: v for k, v in s.items() if isinstance(v, Mapping)}):
        r.error(("sharing",) + sub, message)
    s.setdefault("backend", "whole")
    return s


def check_profile_backend(r: Reader, value: Any, path: KeyPath) -> None:
    """A profile's own ``sharing`` (a backend name), when it has one."""
    if value is not None and value not in SHARING_BACKENDS:
        r.error(path, unknown_backend(value))
