"""How every catalog section reads: key paths, issues with their YAML lines, one reader.

A section reader (:mod:`.profiles`, :mod:`.teams`, :mod:`.sharing`, :mod:`.inventory`)
takes the :class:`Reader`, a value and its key path, and returns what it could read;
the reader collects every problem, so ``gpulab check-config`` lists them all at once.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

from spawner.core.model import is_slug
from spawner.core.units import UnitError, parse_gpus

#: Where a value sits in the catalog: ``("profiles", 3, "cpu", "limit")``.
KeyPath = tuple[Any, ...]
T = TypeVar("T")


@dataclass(frozen=True)
class ConfigIssue:
    path: KeyPath
    message: str
    line: int | None = None

    def format(self, source: str) -> str:
        where = f"{source}:{self.line}" if self.line else source
        return f"{where}: {format_path(self.path) or '(top level)'}: {self.message}"


def format_path(path: KeyPath) -> str:
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


class Reader:
    """Collects issues while converting a plain dict into catalog objects."""

    def __init__(self, lines: Mapping[KeyPath, int] | None = None):
        self.issues: list[ConfigIssue] = []
        self.lines = lines or {}

    def error(self, path: KeyPath, message: str) -> None:
        line = None
        for n in range(len(path), -1, -1):
            if path[:n] in self.lines:
                line = self.lines[path[:n]]
                break
        self.issues.append(ConfigIssue(path, message, line))

    def mapping(
        self, value: Any, path: KeyPath, allowed: set[str], required: Iterable[str] = ()
    ) -> dict[str, Any] | None:
        if not isinstance(value, Mapping):
            self.error(path, f"expected a mapping, got {kind(value)}")
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

    def convert(self, fn: Callable[[Any], T], value: Any, path: KeyPath, default: T | None = None) -> T | None:
        try:
            return fn(value)
        except UnitError as e:
            self.error(path, str(e))
            return default

    def optional(self, fn: Callable[[Any], T], spec: Mapping[str, Any], key: str, path: KeyPath) -> T | None:
        """``spec[key]`` converted by ``fn``, or ``None`` when it is absent or null."""
        if spec.get(key) is None:
            return None
        return self.convert(fn, spec[key], path + (key,))

    def gpus(self, spec: Mapping[str, Any], key: str, path: KeyPath) -> int | None:
        """An amount of GPUs (``spec[key]``) in milli-GPUs, or ``None`` when absent."""
        if key not in spec:
            return None
        return self.convert(parse_gpus, spec[key], path + (key,))

    def string(self, value: Any, path: KeyPath, *, max_len: int = 256) -> str | None:
        if not isinstance(value, str):
            self.error(path, f"expected a string, got {kind(value)}")
            return None
        if len(value) > max_len:
            self.error(path, f"longer than {max_len} characters")
            return None
        return value

    def slug(self, value: Any, path: KeyPath, what: str) -> str | None:
        if not is_slug(value):
            self.error(
                path,
                f"{what} {value!r} must be lowercase letters, digits and '-', "
                "1-63 characters, starting and ending with a letter or digit",
            )
            return None
        return value

    def string_list(self, value: Any, path: KeyPath) -> list[str]:
        if value is None:
            return []
        if not isinstance(value, list):
            self.error(path, f"expected a list, got {kind(value)}")
            return []
        out = []
        for i, item in enumerate(value):
            s = self.string(item, path + (i,))
            if s is not None:
                out.append(s)
        return out

    def items(self, value: Any, path: KeyPath) -> list[Any]:
        """A list section's items (nothing, with an issue, when it is not a list)."""
        if not isinstance(value, list):
            self.error(path, f"expected a list, got {kind(value)}")
            return []
        return value


def kind(value: Any) -> str:
    """What a value is, in the words of an error message (``"a mapping"``, ``"nothing"``)."""
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
    if not isinstance(key, str):
        return None
    match = difflib.get_close_matches(key, sorted(allowed), n=1, cutoff=0.7)
    return match[0] if match else None
