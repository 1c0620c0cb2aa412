"""How the Prometheus source measures holes in the samples: the recording rule's ages where it
covers the window, the subquery's where it does not, and failed scrapes, which neither age sees.

A mixin of :class:`idle_culler.prometheus_source.PrometheusSource` (its query helpers, scrape
interval and tolerated hole); the stats it reads and writes are described there.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping
from typing import TYPE_CHECKING

from spawner.core.idle import max_gap_for

from .promql import KEEP_BY_METRIC, KEEP_LABELS, POD_LABELS, TAG, duration, regex_literal, union, uuid_label
from .sources import percent

#: Most series whose holes are measured with a subquery by name (a ``UUID=~`` set) rather
#: than for the whole selector.
MAX_NAMED_SERIES = 1000


class HoleMeasures:
    """The second and third queries of a fetch, and the widest hole of each series."""

    if TYPE_CHECKING:  # PrometheusSource's traits and query helpers
        scrape_interval: float
        rule_interval: float
        sample_age_rule: str
        max_gap_seconds: float | None
        log: logging.Logger
        last_subquery_series: int
        last_stale_checked_series: int
        _warned_no_rule: bool

        def _selector(self, metric: str, extra: str = "") -> str: ...

        def hole_query(self, wanted: Mapping[tuple[str, str], set[str] | None]) -> str: ...

        async def _ask(self, query: str, at: float) -> tuple[dict[tuple, dict[str, float]], dict[tuple, dict]]: ...

    @property
    def evaluation_step(self) -> float:
        """The recording rule group's interval (the scrape interval unless set)."""
        return self.rule_interval or self.scrape_interval

    @property
    def hole_tolerance(self) -> float:
        """The widest hole the culler tolerates (its ``max_sample_gap``), or that of two missed scrapes."""
        return self.max_gap_seconds or max_gap_for(self.scrape_interval, 2)

    def _keep_covered_holes(self, stats: dict, windows: list[float]) -> None:
        """Drop the ``hole`` numbers of windows the rule group did not run over at every interval."""
        runs: dict[tuple[str, str], float] = {}
        for key in [k for k, st in stats.items() if "evaluations" in st]:
            runs[key[:2]] = stats.pop(key)["evaluations"]
        needed = {duration(w): math.floor(w / self.evaluation_step + 1e-9) for w in windows}
        for key, st in stats.items():
            if "hole" in st and not runs.get(key[:2], 0.0) >= needed.get(key[0], math.inf):
                del st["hole"]

    async def _measure_uncovered_holes(
        self, stats: dict, windows: list[float], at: float, threshold_percent: float | None
    ) -> None:
        """Second query: the subquery's ``max_age`` for idle-looking series the rule does not cover."""
        keys = []
        for key, st in stats.items():
            metric = key[1]
            peak, hole = st.get("peak", math.nan), st.get("hole", math.nan)
            if math.isfinite(hole) or not math.isfinite(peak) or "start" not in st:
                continue  # covered by the rule, or not idle whatever its holes
            if threshold_percent is not None and percent(metric, peak) > threshold_percent:
                continue
            keys.append(key)
        self.last_subquery_series = len(keys)
        if not keys:
            return
        wanted = named_series(keys)
        if not self._warned_no_rule:
            self._warned_no_rule = True
            self.log.warning(
                "Prometheus' recording rule %s does not cover the window for %d GPU series: measuring their holes with a "
                "subquery (slower; it grows with window / scrape interval). Install the recording rules "
                "(helm/gpulab/rules/idle-culler.rules.yaml, docs/idle-culler.md) with an evaluation "
                "interval of %gs; a rule newer than the idle timeout covers the window only later.",
                self.sample_age_rule.format(metric="<metric>"),
                len(keys),
                self.evaluation_step,
            )
        more, _ = await self._ask(self.hole_query(wanted), at)
        for key in keys:
            if "max_age" in more.get(key, {}):
                stats[key]["max_age"] = more[key]["max_age"]

    def _could_hide_a_wide_hole(
        self, st: Mapping[str, float], window: float, threshold_percent: float | None, metric: str
    ) -> bool:
        """An idle-looking series (a sample before the window, no measured hole too wide already)
        missing more samples than a tolerated hole holds: its missing ones may be one stale hole."""
        peak, samples = st.get("peak", math.nan), st.get("samples", 0.0)
        if not math.isfinite(peak) or "start" not in st or not math.isfinite(samples):
            return False
        if threshold_percent is not None and percent(metric, peak) > threshold_percent:
            return False
        step, tolerance = self.scrape_interval, self.hole_tolerance
        if self._widest(st) > tolerance:
            return False  # not idle whatever else it misses
        # At most floor(window / step) + 1 scrapes fall in a closed range (Prometheus 2; 3's are
        # left-open); a hole of k missed scrapes in a row is k + 1 intervals wide.
        missing = math.floor(window / step + 1e-9) + 1 - samples
        return (missing + 1) * step > tolerance + 1e-9

    async def _measure_stale_holes(
        self, stats: dict, windows: list[float], at: float, threshold_percent: float | None
    ) -> None:
        """The ``covered`` steps of the series that could hide a stale hole, by device, in one query."""
        seconds = {duration(w): w for w in windows}
        keys = [
            key
            for key, st in stats.items()
            if key[0] in seconds and self._could_hide_a_wide_hole(st, seconds[key[0]], threshold_percent, key[1])
        ]
        self.last_stale_checked_series = len(keys)
        if not keys:
            return
        step, tolerance = duration(self.scrape_interval), duration(self.hole_tolerance)
        parts = []
        for (w, metric), uuids in sorted(named_series(keys).items(), key=lambda kv: kv[0]):
            extra = uuid_matcher(metric, uuids)
            near = f"count_over_time(count_over_time({self._selector(metric, extra)}[{tolerance}])[{w}:{step}])"
            # Staleness is per scrape target: every series of one device is stale together, so
            # the worst series of the device speaks for each of its pods (and KAI's joins).
            by = ",".join(k for k in KEEP_BY_METRIC.get(metric, KEEP_LABELS) if k not in POD_LABELS)
            parts.append(f'label_replace(min by ({by}) ({near}), "{TAG}", "covered/{metric}/{w}", "", "")')
            every = f"count_over_time(vector(1)[{w}:{step}])"  # the subquery's steps, as this Prometheus counts them
            parts.append(f'label_replace({every}, "{TAG}", "covered/steps/{w}", "", "")')
        more, _ = await self._ask(union(parts), at)
        steps = {key[0]: st.get("covered", 0.0) for key, st in more.items() if key[1] == "steps"}
        covered = {device_of(key): st.get("covered", 0.0) for key, st in more.items() if key[1] != "steps"}
        for key in keys:
            # No answer for the device: not one step had a sample within the tolerance.
            stats[key]["stale"] = max(0.0, steps.get(key[0], 0.0) - covered.get(device_of(key), 0.0))

    def _widest(self, st: Mapping[str, float]) -> float:
        """The widest hole in the series' window, from the rule's ``hole`` or the subquery's ``max_age``;
        unbounded when a stale hole wider than tolerated was found (its width is not measured)."""
        if st.get("stale", 0.0) > 0:
            return math.inf
        hole = st.get("hole", math.nan)
        if math.isfinite(hole):
            return hole + self.evaluation_step
        tail = st.get("tail", math.inf)
        phase = tail % self.scrape_interval if math.isfinite(tail) else 0.0
        return st.get("max_age", math.inf) - phase + self.scrape_interval


def device_of(key: tuple) -> tuple[str, ...]:
    """An answer key's window, metric and device (GPU, MIG instance or vGPU), without its pod."""
    labels = dict(zip(KEEP_LABELS, key[2:], strict=True))
    return (key[0], key[1], *(labels[k] for k in KEEP_BY_METRIC.get(key[1], KEEP_LABELS) if k not in POD_LABELS))


def named_series(keys: list[tuple]) -> dict[tuple[str, str], set[str] | None]:
    """``{(window, metric): UUIDs}`` of answer keys, to ask for those series by name; ``None``
    (every series of the selector) where a UUID is not a plain literal or there are too many."""
    wanted: dict[tuple[str, str], set[str] | None] = {}
    for key in keys:
        uuid = key[2 + KEEP_LABELS.index(uuid_label(key[1]))]
        group = wanted.setdefault((key[0], key[1]), set())
        if group is not None:
            if uuid and regex_literal(uuid):
                group.add(uuid)
            else:
                wanted[(key[0], key[1])] = None
    return {k: None if v is not None and len(v) > MAX_NAMED_SERIES else v for k, v in wanted.items()}


def uuid_matcher(metric: str, uuids: set[str] | None) -> str:
    """The label matcher naming ``uuids`` of ``metric`` ("" for every series)."""
    if uuids is None:
        return ""
    return f'{uuid_label(metric)}=~"{"|".join(regex_literal(u) for u in sorted(uuids))}"'
