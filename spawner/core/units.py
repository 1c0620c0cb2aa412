"""Exact unit parsing: GPUs as integer milli-GPUs, CPU cores, memory bytes.

GPUs are never floats inside gpulab. ``0.5`` in a YAML file becomes ``500``;
anything finer than a thousandth of a GPU is refused rather than rounded.
"""

from __future__ import annotations

import re
from decimal import Decimal, DecimalException

MILLI_PER_GPU = 1000
#: Upper bound on any single GPU amount (a team, a profile): 1,000,000 GPUs.
MAX_MILLI = 1_000_000 * MILLI_PER_GPU
#: Longest number written as text that any unit accepts: thousands of digits or
#: an exponent of a billion are refused before arithmetic can overflow or stall.
MAX_NUMBER_CHARS = 32
#: Largest memory size (1 EiB) and duration (100 years) any setting may hold.
MAX_MEMORY_BYTES = 2**60
MAX_DURATION_SECONDS = 100 * 365 * 86400


class UnitError(ValueError):
    """A value could not be read as the unit asked for; the message says why."""


def _short(value: str, what: str) -> str:
    """``value`` stripped, refused when it is longer than any sensible number."""
    value = value.strip()
    if len(value) > MAX_NUMBER_CHARS:
        raise UnitError(f"{what} is written with more than {MAX_NUMBER_CHARS} characters: {value[:20]!r}...")
    return value


def parse_gpus(value: object) -> int:
    """Read a GPU amount (``0.25``, ``"0.5"``, ``2``) as integer milli-GPUs.

    Booleans, negative numbers, NaN/infinity and values finer than 1/1000 GPU
    are refused with a :class:`UnitError`.
    """
    if isinstance(value, bool) or value is None:
        raise UnitError(f"expected a number of GPUs, got {value!r}")
    if isinstance(value, int) and abs(value) > MAX_MILLI:
        raise UnitError("that many GPUs is larger than any cluster")
    try:
        if isinstance(value, int):
            dec = Decimal(value)
        elif isinstance(value, float):
            # repr() gives the shortest string that round-trips, so 0.1 -> "0.1".
            dec = Decimal(repr(value))
        elif isinstance(value, str):
            dec = Decimal(_short(value, "a GPU amount"))
        else:
            raise UnitError(f"expected a number of GPUs, got {type(value).__name__}")
        if not dec.is_finite():
            raise UnitError(f"expected a finite number of GPUs, got {value!r}")
        if dec < 0:
            raise UnitError(f"a GPU amount cannot be negative (got {value!r})")
        if dec > MAX_MILLI:
            raise UnitError(f"{value!r} GPUs is larger than any cluster")
        if dec and dec.adjusted() < -3:  # also 1e-999999999, which Decimal would round to 0
            raise UnitError(f"{value!r} GPUs is finer than 1/1000 of a GPU; use at most 3 decimals")
        milli = dec * MILLI_PER_GPU
    except DecimalException:  # malformed, or an exponent beyond what Decimal holds
        raise UnitError(f"expected a number of GPUs, got {str(value)[:40]!r}") from None
    if milli != milli.to_integral_value():
        raise UnitError(f"{value!r} GPUs is finer than 1/1000 of a GPU; use at most 3 decimals")
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
        raise UnitError(f"more than {MAX_MILLI} milli-GPUs is larger than any cluster")
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
    "K": 10**3,
    "M": 10**6,
    "G": 10**9,
    "T": 10**12,
    "Ki": 2**10,
    "Mi": 2**20,
    "Gi": 2**30,
    "Ti": 2**40,
}


def parse_memory(value: object) -> int:
    """Read a memory size (``"8G"``, ``"16Gi"``, ``512000000``) as bytes."""
    if isinstance(value, bool) or value is None:
        raise UnitError(f"expected a memory size, got {value!r}")
    if isinstance(value, int):
        if value < 0:
            raise UnitError("a memory size cannot be negative")
        number = value
    elif isinstance(value, str):
        m = re.fullmatch(r"(\d+(?:\.\d+)?)\s*([KMGT]i?)?", _short(value, "a memory size"))
        if not m:
            raise UnitError(f"expected a memory size such as '8G' or '16Gi', got {value!r}")
        number = int(Decimal(m.group(1)) * _MEM_SUFFIX[m.group(2) or ""])
    else:
        raise UnitError(f"expected a memory size such as '8G' or '16Gi', got {value!r}")
    if number > MAX_MEMORY_BYTES:
        raise UnitError("a memory size larger than 1 EiB is not one")
    return number


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
    if isinstance(value, int) and abs(value) > 100_000:
        raise UnitError("CPU cores out of range")
    if isinstance(value, (int, float)):
        cores = float(value)
    elif isinstance(value, str):
        m = re.fullmatch(r"(\d+(?:\.\d+)?)(m?)", _short(value, "a CPU amount"))
        if not m:
            raise UnitError(f"expected a number of CPU cores such as 2 or '500m', got {value!r}")
        cores = float(m.group(1)) / (1000 if m.group(2) else 1)
    else:
        raise UnitError(f"expected a number of CPU cores, got {value!r}")
    if not 0 <= cores <= 100_000:  # also NaN and infinity
        raise UnitError(f"CPU cores out of range: {value!r}")
    return cores


_DURATION_RE = re.compile(r"^\s*(?:(\d+)\s*d)?\s*(?:(\d+)\s*h)?\s*(?:(\d+)\s*m)?\s*(?:(\d+)\s*s?)?\s*$")


def parse_duration(value: object) -> int:
    """Read a duration (``3600``, ``"90s"``, ``"30m"``, ``"4h"``, ``"1h30m"``) as seconds."""
    if isinstance(value, bool) or value is None:
        raise UnitError(f"expected a duration such as '30m' or 3600, got {value!r}")
    seconds = None
    if isinstance(value, int):
        if value < 0:
            raise UnitError("a duration cannot be negative")
        seconds = value
    elif isinstance(value, str) and value.strip():
        m = _DURATION_RE.match(_short(value, "a duration"))
        if m and any(m.groups()):
            d, h, mi, s = (int(g) if g else 0 for g in m.groups())
            seconds = ((d * 24 + h) * 60 + mi) * 60 + s
    if seconds is not None:
        if seconds > MAX_DURATION_SECONDS:
            raise UnitError("a duration longer than 100 years is not one")
        return seconds
    raise UnitError(f"expected a duration such as '30m', '4h' or 3600, got {value!r}")


def parse_lifetime(value: object) -> int:
    """A maximum lifetime: a duration (:func:`parse_duration`) longer than zero."""
    seconds = parse_duration(value)
    if seconds <= 0:
        raise UnitError("a maximum lifetime must be longer than 0s, e.g. '24h' (leave it out for no limit)")
    return seconds


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
