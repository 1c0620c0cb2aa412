"""The catalog's ``inventory`` (GPUs declared for a single server without NVML), ``prices``,
and ``priority_class_names`` (Kubernetes)."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from spawner.core.priority import BY_SHORT_NAME

from .reader import Reader, kind

#: Highest price per GPU-hour: costs of a year of a whole cluster stay finite numbers.
MAX_PRICE = 1_000_000


@dataclass(frozen=True)
class DeviceSpec:
    """A declared GPU model on the single server (when NVML is absent)."""

    model: str
    count: int
    memory_mib: int


def read_inventory(r: Reader, value: Any) -> tuple[DeviceSpec, ...]:
    """``inventory``: a list of ``{model, count, memory_mib}``."""
    out: list[DeviceSpec] = []
    for i, spec in enumerate(r.items(value or [], ("inventory",))):
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
            out.append(DeviceSpec(model, count, mem))
    return tuple(out)


def read_prices(r: Reader, value: Any) -> dict[str, float]:
    """``prices``: price per GPU-hour by GPU model, ``"*"`` for any model."""
    prices: dict[str, float] = {}
    if value is None:
        return prices
    if not isinstance(value, Mapping):
        r.error(("prices",), f"expected a mapping of GPU model to price per GPU-hour, got {kind(value)}")
        return prices
    for model, price in value.items():
        # isinstance and the range also refuse booleans, NaN and infinity
        if isinstance(price, bool) or not isinstance(price, (int, float)) or not 0 <= price <= MAX_PRICE:
            r.error(
                ("prices", model),
                f"expected a non-negative price per GPU-hour of at most {MAX_PRICE:g}, got {str(price)[:40]}",
            )
        else:
            prices[str(model)] = float(price)
    return prices


#: A Kubernetes object name (DNS-1123 label, as the chart's schema checks).
_KUBE_NAME = re.compile(r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$")


def read_priority_class_names(r: Reader, value: Any) -> dict[str, str]:
    """``priority_class_names``: the cluster's PriorityClass per gpulab class, as the Helm
    chart names them after its release (``{development: staging-development, ...}``)."""
    names: dict[str, str] = {}
    if value is None:
        return names
    if not isinstance(value, Mapping):
        r.error(
            ("priority_class_names",), f"expected a mapping of gpulab class to PriorityClass name, got {kind(value)}"
        )
        return names
    classes = [*BY_SHORT_NAME, "over-quota"]
    for cls, name in value.items():
        if cls not in classes:
            r.error(
                ("priority_class_names", str(cls)),
                f"unknown class {str(cls)[:40]!r}; expected one of {', '.join(classes)}",
            )
        elif not isinstance(name, str) or not _KUBE_NAME.match(name):
            r.error(("priority_class_names", str(cls)), f"expected a Kubernetes object name, got {str(name)[:70]!r}")
        else:
            names[str(cls)] = name
    return names
