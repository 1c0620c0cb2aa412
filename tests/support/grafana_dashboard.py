"""The chart's Grafana dashboard as Grafana would run its queries (Grafana itself is AGPL and
never used here): its panels' PromQL, its template variables, and the substitution Grafana's
Prometheus data source makes before it sends a query.

Substitution follows Grafana's documented behaviour ("Prometheus template variables" and
"Global variables" in Grafana's docs; the data source's ``interpolateQueryExpr``):

- ``$__range``: the dashboard's time range in seconds, as ``<n>s``;
- ``$__interval``: the range over the panel's max data points, at least the data source's
  scrape interval; ``$__rate_interval``: max(``$__interval`` + scrape interval, 4 x scrape
  interval);
- a query variable (``$name`` or ``${name}``): one chosen value with regex metacharacters
  escaped when the variable is multi-value or has "All" (a plain value otherwise); several
  values (or "All" without a custom all value: every option) as ``(a|b)``.
"""

from __future__ import annotations

import json
import math
import re
import subprocess
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from tests.support import REPO

DASHBOARD = REPO / "helm" / "gpulab" / "dashboards" / "gpulab.json"
GENERATOR_BUILD = REPO / "scripts" / "build-grafana-dashboard.sh"
#: Grafana's default max data points of a panel about 1,000 px wide.
MAX_DATA_POINTS = 1000
_REGEX_META = re.compile(r"[\\^$*+?.()|{}\[\]]")


@dataclass(frozen=True)
class Query:
    panel: str
    ref_id: str
    expr: str

    @property
    def name(self) -> str:
        return f"panel {self.panel!r} query {self.ref_id}"


def load(text: str | None = None) -> dict[str, Any]:
    return json.loads(text if text is not None else DASHBOARD.read_text())


def queries(dashboard: Mapping[str, Any]) -> Iterator[Query]:
    """Every PromQL target of every panel (rows' panels included)."""
    for panel in dashboard.get("panels") or []:
        for inner in [panel, *(panel.get("panels") or [])]:
            for target in inner.get("targets") or []:
                if target.get("expr"):
                    yield Query(inner.get("title", ""), target.get("refId", ""), target["expr"])


def query_variables(dashboard: Mapping[str, Any]) -> list[dict[str, Any]]:
    return [v for v in (dashboard.get("templating") or {}).get("list") or [] if v.get("type") == "query"]


def variable_query(variable: Mapping[str, Any]) -> str:
    query = variable.get("query")
    return str(query.get("query") if isinstance(query, Mapping) else query)


def _escape(value: str) -> str:
    return _REGEX_META.sub(lambda m: "\\\\" + m.group(0), value)


def variable_value(variable: Mapping[str, Any], chosen: Sequence[str], options: Sequence[str]) -> str:
    """What Grafana puts in place of ``variable`` with ``chosen`` (``["$__all"]``: All) selected."""
    values = list(chosen)
    if values == ["$__all"]:
        if variable.get("allValue"):
            return str(variable["allValue"])
        values = list(options)
    if not (variable.get("multi") or variable.get("includeAll")):
        return values[0] if values else ""
    escaped = [_escape(v) for v in values]
    return escaped[0] if len(escaped) == 1 else "(" + "|".join(escaped) + ")"


def rate_interval(range_seconds: float, scrape_interval: float) -> tuple[float, float]:
    """``($__interval, $__rate_interval)`` in seconds for a panel over ``range_seconds``."""
    interval = max(scrape_interval, math.ceil(range_seconds / MAX_DATA_POINTS))
    return interval, max(interval + scrape_interval, 4 * scrape_interval)


def interpolate(expr: str, variables: Mapping[str, str], *, range_seconds: float, scrape_interval: float) -> str:
    """``expr`` with the global and the dashboard's variables replaced as Grafana replaces them."""
    interval, rate = rate_interval(range_seconds, scrape_interval)
    globals_ = {
        "__rate_interval": f"{rate:g}s",
        "__interval_ms": f"{interval * 1000:g}",
        "__interval": f"{interval:g}s",
        "__range_ms": f"{range_seconds * 1000:g}",
        "__range_s": f"{range_seconds:g}",
        "__range": f"{range_seconds:g}s",
    }
    values = {**globals_, **variables}
    names = sorted(values, key=len, reverse=True)  # $__range_s before $__range
    pattern = re.compile(
        r"\$\{(" + "|".join(map(re.escape, names)) + r")\}|\$(" + "|".join(map(re.escape, names)) + ")"
    )
    return pattern.sub(lambda m: values[m.group(1) or m.group(2)], expr)


def generated() -> str:
    """The dashboard as scripts/grafana-dashboard generates it (built once per SDK version and source)."""
    binary = subprocess.run([str(GENERATOR_BUILD)], check=True, stdout=subprocess.PIPE, text=True, timeout=1200)
    return subprocess.run([binary.stdout.strip()], check=True, stdout=subprocess.PIPE, text=True, timeout=60).stdout


def check(path: str) -> subprocess.CompletedProcess[str]:
    """The generator's strict check of a dashboard file (its exit status and what it says)."""
    binary = subprocess.run([str(GENERATOR_BUILD)], check=True, stdout=subprocess.PIPE, text=True, timeout=1200)
    return subprocess.run([binary.stdout.strip(), "-check", path], capture_output=True, text=True, timeout=60)
