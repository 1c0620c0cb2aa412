"""Catalogs from YAML text, with each problem pointing at its file line; GPU model checks.

The validation itself is :func:`spawner.core.catalog.catalog_from_dict`; this module
maps YAML nodes to line numbers so that every :class:`~spawner.core.catalog.ConfigIssue`
names the line an operator has to fix.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import yaml

from .catalog import Catalog
from .read import catalog_from_dict
from .reader import CatalogError, ConfigIssue, KeyPath, closest_match


def _line_map(node: yaml.Node, path: KeyPath = (), out: dict[KeyPath, int] | None = None) -> dict[KeyPath, int]:
    out = {} if out is None else out
    out.setdefault(path, node.start_mark.line + 1)
    if isinstance(node, yaml.MappingNode):
        for key_node, value_node in node.value:
            key = key_node.value
            out[path + (key,)] = key_node.start_mark.line + 1
            _line_map(value_node, path + (key,), out)
            out[path + (key,)] = key_node.start_mark.line + 1
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            _line_map(item, path + (i,), out)
    return out


def catalog_from_yaml(text: str, source: str = "<yaml>") -> Catalog:
    """Parse and validate YAML text; errors carry ``source`` and line numbers."""
    try:
        data = yaml.safe_load(text)
        node = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        line = mark.line + 1 if mark is not None else None
        raise CatalogError(source, [ConfigIssue((), f"not valid YAML: {getattr(e, 'problem', e)}", line)]) from None
    lines = _line_map(node) if node is not None else {}
    return catalog_from_dict(data, source, lines)


def gpu_model_issues(text: str, known_models: Iterable[str]) -> list[ConfigIssue]:
    """Profiles (in catalog YAML ``text``) whose ``gpu_model`` is not one of ``known_models``.

    With their line numbers; the caller decides whether that is an error (a
    single server can only offer the GPUs it has) or a warning (a cluster
    may gain nodes of another model).
    """
    known = sorted(set(known_models))
    data = yaml.safe_load(text) or {}
    node = yaml.compose(text, Loader=yaml.SafeLoader)
    lines = _line_map(node) if node is not None else {}
    out = []
    for i, p in enumerate(data.get("profiles") or [] if isinstance(data, Mapping) else []):
        model = p.get("gpu_model") if isinstance(p, Mapping) else None
        if isinstance(model, str) and model not in known:
            path: KeyPath = ("profiles", i, "gpu_model")
            out.append(ConfigIssue(path, unknown_gpu_model(model, known), lines.get(path)))
    return out


def unknown_gpu_model(model: str, known_models: Iterable[str]) -> str:
    """ "GPU model 'H100-80G' is not known here (did you mean 'H100-80GB'?); known: ..."."""
    known = sorted(set(known_models))
    hint = closest_match(model, set(known))
    return (
        f"GPU model {model!r} is not known here"
        + (f" (did you mean '{hint}'?)" if hint else "")
        + "; known: "
        + (", ".join(known) or "none")
    )
