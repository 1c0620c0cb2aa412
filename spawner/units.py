"""Exact unit parsing: GPUs as integer milli-GPUs, CPU cores, memory bytes.

GPUs are never floats inside gpulab. ``0.5`` in a YAML file becomes ``500``;
anything finer than a thousandth of a GPU is refused rather than rounded.
"""

from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation

MILLI_PER_GPU = 1000
#: Upper bound on any single GPU amount (a team, a profile): 1,000,000 GPUs.
MAX_MILLI = 1_000_000 * MILLI_PER_GPU


class UnitError(ValueError):
    """A value could not be read as the unit asked for; the message says why."""


def parse_gpus(value: object) -> int:
    """Read a GPU amount (``0.25``, ``"0.5"``, ``2``) as integer milli-GPUs.

    Booleans, negative numbers, NaN/infinity and values finer than 1/1000 GPU
    are refused with a :class:`UnitError`.
    """
    if isinstance(value, bool) or value is None:
        raise UnitError(f"expected a number of GPUs, got {value!r}")
    if isinstance(value, int):
        dec = Decimal(value)
    elif isinstance(value, float):
        # repr() gives the shortest string that round-trips, so 0.1 -> "0.1".
        dec = Decimal(repr(value))
    elif isinstance(value, str):
        try:
            dec = Decimal(value.strip())
        except InvalidOperation:
            raise UnitError(f"expected a number of GPUs, got {value!r}") from None
    else:
        raise UnitError(f"expected a number of GPUs, got {type(value).__name__}")
    if not dec.is_finite():
        raise UnitError(f"expected a finite number of GPUs, got {value!r}")
    if dec < 0:
        raise UnitError(f"a GPU amount cannot be negative (got {value!r})")
    milli = dec * MILLI_PER_GPU
    if milli != milli.to_integral_value():
        raise UnitError(
            f"{value!r} GPUs is finer than 1/1000 of a GPU; use at most 3 decimals"
        )
    result = int(milli)
    if result > MAX_MILLI:
        raise UnitError(f"{value!r} GPUs is larger than any cluster")
    return result


def parse_milli(value: object) -> int:
    """Read an amount already given in milli-GPUs (an integer, never a float)."""
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise UnitError(f"expected an integer number of milli-GPUs, got {value!r}")
    if isinstance(value, str):
        if not re.fullmatch(r"\s*\d{1,13}\s*", value):
            raise UnitError(f"expected an integer number of milli-GPUs, got {value!r}")
        value = int(value)
    if value < 0:
        raise UnitError(f"milli-GPUs cannot be negative (got {value})")
    if value > MAX_MILLI:
        raise UnitError(f"{value} milli-GPUs is larger than any cluster")
    return value


def format_gpus(milli: int) -> str:
    """``500`` -> ``"0.5"``, ``7500`` -> ``"7.5"``, ``2000`` -> ``"2"``."""
    whole, frac = divmod(int(milli), MILLI_PER_GPU)
    if frac == 0:
        return str(whole)
    return f"{whole}.{frac:03d}".rstrip("0")


def milli_to_fraction_str(milli: int) -> str:
    """Share as a decimal string for environment variables (``"0.25"``)."""
    return format_gpus(milli)


_MEM_SUFFIX = {
    "": 1,
    "K": 10**3, "M": 10**6, "G": 10**9, "T": 10**12,
    "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40,
}


def parse_memory(value: object) -> int:
    """Read a memory size (``"8G"``, ``"16Gi"``, ``512000000``) as bytes."""
    if isinstance(value, bool) or value is None:
        raise UnitError(f"expected a memory size, got {value!r}")
    if isinstance(value, int):
        if value < 0:
            raise UnitError("a memory size cannot be negative")
        return value
    if not isinstance(value, str):
        raise UnitError(f"expected a memory size such as '8G' or '16Gi', got {value!r}")
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([KMGT]i?)?\s*", value)
    if not m:
        raise UnitError(f"expected a memory size such as '8G' or '16Gi', got {value!r}")
    number = Decimal(m.group(1)) * _MEM_SUFFIX[m.group(2) or ""]
    return int(number)


def format_memory(num_bytes: int) -> str:
    """Bytes as a Kubernetes quantity, binary units when exact (``"16Gi"``)."""
    for suffix in ("Ti", "Gi", "Mi", "Ki"):
        unit = _MEM_SUFFIX[suffix]
        if num_bytes >= unit and num_bytes % unit == 0:
            return f"{num_bytes // unit}{suffix}"
    for suffix in ("T", "G", "M", "K"):
        unit = _MEM_SUFFIX[suffix]
        if num_bytes >= unit and num_bytes % unit == 0:
            return f"{num_bytes // unit}{suffix}"
    return str(num_bytes)


def parse_cpu(value: object) -> float:
    """Read a CPU amount (``2``, ``0.5``, ``"500m"``) as cores."""
    if isinstance(value, bool) or value is None:
        raise UnitError(f"expected a number of CPU cores, got {value!r}")
    if isinstance(value, (int, float)):
        cores = float(value)
    elif isinstance(value, str):
        m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)(m?)\s*", value)
        if not m:
            raise UnitError(f"expected a number of CPU cores such as 2 or '500m', got {value!r}")
        cores = float(m.group(1)) / (1000 if m.group(2) else 1)
    else:
        raise UnitError(f"expected a number of CPU cores, got {value!r}")
    if cores < 0 or cores != cores or cores > 100_000:
        raise UnitError(f"CPU cores out of range: {value!r}")
    return cores


_DURATION_RE = re.compile(r"^\s*(?:(\d+)\s*d)?\s*(?:(\d+)\s*h)?\s*(?:(\d+)\s*m)?\s*(?:(\d+)\s*s?)?\s*$")


def parse_duration(value: object) -> int:
    """Read a duration (``3600``, ``"90s"``, ``"30m"``, ``"4h"``, ``"1h30m"``) as seconds."""
    if isinstance(value, bool) or value is None:
        raise UnitError(f"expected a duration such as '30m' or 3600, got {value!r}")
    if isinstance(value, int):
        if value < 0:
            raise UnitError("a duration cannot be negative")
        return value
    if isinstance(value, str) and value.strip():
        m = _DURATION_RE.match(value)
        if m and any(m.groups()):
            d, h, mi, s = (int(g) if g else 0 for g in m.groups())
            return ((d * 24 + h) * 60 + mi) * 60 + s
    raise UnitError(f"expected a duration such as '30m', '4h' or 3600, got {value!r}")


def format_duration(seconds: int) -> str:
    """``5400`` -> ``"1h30m"``."""
    seconds = int(seconds)
    if seconds == 0:
        return "0s"
    parts = []
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60), ("s", 1)):
        n, seconds = divmod(seconds, size)
        if n:
            parts.append(f"{n}{unit}")
    return "".join(parts)
