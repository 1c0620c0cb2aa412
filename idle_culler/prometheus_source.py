"""The Prometheus utilisation source: ONE PromQL query per cycle for every GPU server.

Over dcgm-exporter's ``DCGM_FI_DEV_GPU_UTIL`` (percent) and ``DCGM_FI_PROF_GR_ENGINE_ACTIVE``
(0..1, the only utilisation MIG instances have), and HAMi's per-container vGPU utilisation
where the catalog has HAMi profiles. Prometheus aggregates each idle window itself (peak,
sample count, widest hole, newest sample's age) and answers a few numbers per GPU, whatever
the window and scrape interval. The widest hole comes from the culler's recording rules;
where they do not cover the window, a second query measures it for the GPUs that look idle.
The interface and the joining of series to servers are :mod:`idle_culler.sources`.
"""

from __future__ import annotations

import asyncio
import json
import math
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from urllib.parse import urlencode

from tornado.httpclient import AsyncHTTPClient, HTTPClientError, HTTPRequest
from traitlets import Float, Integer, Unicode

from spawner.core.idle import DeviceSummary

from .prometheus_holes import HoleMeasures, uuid_matcher
from .promql import (
    KEEP_BY_METRIC,
    KEEP_LABELS,
    TAG,
    duration,
    number,
    prometheus_error,
    union,
    via_kai_group,
)
from .sources import (
    HAMI_CONTAINER_UTIL,
    METRICS,
    SourceUnavailable,
    UtilisationSource,
    index_series,
    metrics_for,
    series_for_targets,
)
from .targets import ServerTarget

#: Per series and window, what Prometheus computes (the ``stat`` part of each answer element's tag).
STATS = ("peak", "samples", "start", "tail", "hole", "evaluations", "max_age", "covered")
#: The recording rules the culler reads when they exist (rules file in helm/gpulab/rules/, loaded
#: by the tests' Prometheus too): per GPU series, the age of its newest sample; per metric, how
#: many series that rule recorded (one series: its samples are the rule group's evaluations).
SAMPLE_AGE_RULE = "gpulab:{metric}:sample_age_seconds"
SAMPLE_AGE_COUNT_RULE = "gpulab:{metric}:sample_age_series"


class PrometheusSource(HoleMeasures, UtilisationSource):
    """dcgm-exporter metrics through Prometheus: one query per cycle, aggregated in Prometheus.

    For each idle window in use (one per distinct timeout) and each metric,
    Prometheus answers a few numbers per GPU:

    - ``peak``: ``max_over_time`` of the raw samples in the window, plus
      ``0 * sum_over_time``, so a single NaN sample makes it NaN (unusable);
    - ``samples``: ``count_over_time``;
    - ``start``: how many samples the series has in the widest tolerated hole
      (``hole_tolerance``) before the window's start (absent when none: a
      series that began inside the window, or a hole across its start wider
      than tolerated). A range, not ``timestamp(x offset w)``: after a failed
      scrape Prometheus marks the target's series stale, and an instant
      selector then answers nothing although the previous sample is seconds old;
    - ``tail``: the age of the newest sample now;
    - ``hole``: from the recording rule :data:`SAMPLE_AGE_RULE` (the newest
      raw sample's age, recorded at every rule evaluation): the largest
      recorded age over the window minus the newest one modulo the rule
      interval. With regular scrapes the age at every evaluation repeats the
      scrapes' phase against the rule's evaluations and grows by one
      interval per missed scrape, so the widest hole is ``hole +
      rule_interval``. A hole longer than Prometheus' lookback still shows:
      the age grows to the lookback before the rule stops recording it.
    - ``evaluations`` (one per metric, not per series): how many times the
      rule group ran over the window (:data:`SAMPLE_AGE_COUNT_RULE`). The
      ``hole`` numbers count only when it ran at every ``rule_interval`` of
      the window: a newly installed rule or a Prometheus that was down leaves
      fewer, and then the subquery measures holes instead.

    Series that look idle (peak at or below the threshold, with a sample
    before the window) but have no usable ``hole`` (no rule, or the rule does
    not cover the window) get their holes measured by a second query, for
    them only: ``max_age``, the largest age of the newest sample over the
    steps of a ``[window:scrape_interval]`` subquery (its cost grows with
    window / interval, which is why the rule exists). With regular scrapes
    the age at every step repeats the scrapes' phase against the step grid
    (``tail`` modulo the interval) and grows by one interval per missed
    scrape, so the widest hole is ``max_age - phase + scrape_interval``.
    With ``sample_age_rule`` empty, the one query asks ``max_age`` for every
    series instead of ``hole``.

    Neither age sees a hole made of failed scrapes: Prometheus marks a target's
    series stale when a scrape of it fails, and an instant selector (the rule's,
    the subquery's steps) answers nothing after a staleness marker, so no large
    age is ever recorded. Range selectors skip the markers, and ``samples``
    counts only real ones: an idle-looking series missing more samples than a
    tolerated hole can hide gets a third number, ``covered``, from one more query
    for those series only: how many steps of a ``[window:scrape_interval]``
    subquery have a sample within ``hole_tolerance`` before them. Fewer than
    the subquery's steps means a hole wider than tolerated (``stale``).

    The queries are evaluated at a multiple of ``scrape_interval`` so the
    subquery's last step is the evaluation time. ``max_answer_bytes`` caps
    the answer: larger, or refused by Prometheus, the cycle reclaims nothing
    and the log line and ``gpulab_culler_source_failures`` say what to change.
    """

    #: The read ahead of this cycle (:meth:`prefetch`), until :meth:`collect` takes it.
    _prefetched: _Prefetch | None = None

    prometheus_url = Unicode(
        "http://prometheus-server",
        config=True,
        help="Base URL of the Prometheus HTTP API (without /api/v1).",
    )
    series_selector = Unicode(
        "",
        config=True,
        help="""Extra PromQL label matchers added to the query, e.g.
        `namespace=~"jhub|team-.*"`, to limit it to the hub's pods.""",
    )
    bearer_token_file = Unicode(
        "",
        config=True,
        help="File with a bearer token for Prometheus (empty: no Authorization header).",
    )
    request_timeout = Float(30.0, config=True, help="Seconds to wait for Prometheus.")
    scrape_interval = Float(
        30.0,
        min=0.001,
        config=True,
        help="""How often Prometheus scrapes dcgm-exporter, in seconds (the subquery step that
        measures holes). Match your scrape config.""",
    )
    sample_age_rule = Unicode(
        SAMPLE_AGE_RULE,
        config=True,
        help="""Name of the recording rule that records the age of each series' newest sample,
        with `{metric}` for the metric name (helm/gpulab/rules/idle-culler.rules.yaml; see
        docs/idle-culler.md). With the rule, holes cost Prometheus one `max_over_time` instead of
        a subquery over every scrape of the window. Where the rule is missing or does not cover
        the window yet, the subquery measures the holes of the servers that look idle.
        Empty: never read the rule.""",
    )
    rule_interval = Float(
        0.0,
        min=0.0,
        config=True,
        help="""Evaluation interval of the rule group with `sample_age_rule`, in seconds
        (0: the scrape interval, as the shipped rules file sets it). Match your rule group.""",
    )
    max_answer_bytes = Integer(
        64 * 1024 * 1024,
        min=1024,
        config=True,
        help="""Largest Prometheus answer accepted, in bytes. The answer holds about 1 KiB per GPU
        series and distinct idle timeout; above the cap the cycle reclaims nothing.""",
    )

    kai_reservation_namespace = Unicode(
        "",
        config=True,
        help="""KAI scheduler's reservation namespace (`kai-resource-reservation`), to find the GPU
        of a KAI GPU fraction: KAI holds it with a `gpu-reservation-*` pod there, which dcgm-exporter
        names on the GPU's series, and gives that pod and the fraction's pods one GPU group label
        (`runai-gpu-group`). The culler joins the reservation pod's series to the fraction's pods
        through kube-state-metrics' `kube_pod_labels` (export the label: metricLabelsAllowlist
        `pods=[runai-gpu-group]`). Like a time-slice, a fraction is then idle only when its whole
        GPU is. Needs the recording rules. Empty: KAI fractions have no evidence (reported).""",
    )
    kai_gpu_group_label = Unicode(
        "label_runai_gpu_group",
        config=True,
        help="kube-state-metrics' name for KAI's `runai-gpu-group` pod label.",
    )
    pod_labels_metric = Unicode(
        "kube_pod_labels", config=True, help="kube-state-metrics' metric carrying pod labels (one series per pod)."
    )

    last_answer_bytes = 0
    #: Series whose holes the last fetch measured with the subquery (the rule did not cover them).
    last_subquery_series = 0
    _warned_no_rule = False

    #: Idle-looking series whose stale holes the last fetch measured (they missed samples).
    last_stale_checked_series = 0

    def _selector(self, metric: str, extra: str = "") -> str:
        matchers = ",".join(m for m in (self.series_selector.strip(), extra) if m)
        return f"{metric}{{{matchers}}}" if matchers else metric

    def _element(self, expr: str, stat: str, metric: str, window: str) -> str:
        by = ",".join(KEEP_BY_METRIC.get(metric, KEEP_LABELS))
        return f'label_replace(max by ({by}) ({expr}), "{TAG}", "{stat}/{metric}/{window}", "", "")'

    def via_kai_group(self, expr: str) -> str:
        """``expr`` moved from KAI's reservation pods to the pods in their GPU group (:func:`promql.via_kai_group`)."""
        return via_kai_group(expr, self.kai_reservation_namespace, self.kai_gpu_group_label, self.pod_labels_metric)

    def query(
        self,
        windows: Iterable[float],
        *,
        rule: bool | None = None,
        metrics: tuple[str, ...] = METRICS,
        kai: bool = False,
    ) -> str:
        """One PromQL expression: every stat, for every metric and window, joined with ``or``.

        With the rule (``sample_age_rule`` set, unless ``rule=False``) holes come from it;
        without, from the subquery (``max_age``), as :meth:`hole_query` asks for. ``kai``:
        dcgm-exporter's stats also through KAI's GPU groups (:meth:`via_kai_group`).
        """
        use_rule = bool(self.sample_age_rule) if rule is None else rule
        parts: list[str] = []
        for window in sorted(set(windows)):
            w = duration(window)
            for metric in metrics:
                sel = self._selector(metric)
                exprs = {
                    "peak": f"max_over_time({sel}[{w}]) + 0 * sum_over_time({sel}[{w}])",
                    "samples": f"count_over_time({sel}[{w}])",
                    "start": f"count_over_time({sel}[{duration(self.hole_tolerance)}] offset {w})",
                    "tail": f"time() - timestamp({sel})",
                }
                if use_rule:
                    age = self._selector(self.sample_age_rule.format(metric=metric))
                    runs = SAMPLE_AGE_COUNT_RULE.format(metric=metric)
                    exprs["hole"] = f"max_over_time({age}[{w}]) - {age} % {number(self.evaluation_step)}"
                    exprs["evaluations"] = f"count_over_time({runs}[{w}])"
                else:
                    exprs["max_age"] = self._max_age(sel, w)
                parts.extend(self._element(e, stat, metric, w) for stat, e in exprs.items())
                if kai and metric != HAMI_CONTAINER_UTIL:
                    parts.extend(
                        self._element(self.via_kai_group(e), stat, metric, w)
                        for stat, e in exprs.items()
                        if stat != "evaluations"
                    )
        return union(parts)

    def kai_for(self, backends: Iterable[str] | None) -> bool:
        """Whether to join through KAI's GPU groups: configured, and a KAI server can exist."""
        return bool(self.kai_reservation_namespace) and (backends is None or bool(set(backends) & {"kai", ""}))

    def _max_age(self, sel: str, w: str) -> str:
        return f"max_over_time((time() - timestamp({sel}))[{w}:{duration(self.scrape_interval)}])"

    def hole_query(self, wanted: Mapping[tuple[str, str], set[str] | None]) -> str:
        """The subquery stat (``max_age``) for ``{(window, metric): UUIDs or None for all}``."""
        parts = []
        for (w, metric), uuids in sorted(wanted.items(), key=lambda kv: kv[0]):
            extra = uuid_matcher(metric, uuids)
            parts.append(self._element(self._max_age(self._selector(metric, extra), w), "max_age", metric, w))
        return union(parts)

    def evaluation_time(self, now: float) -> float:
        """``now`` rounded down to a multiple of the scrape interval (the subquery's step grid)."""
        return math.floor(now / self.scrape_interval) * self.scrape_interval

    async def _fetch(self, body: str) -> bytes:
        headers = {"Content-Type": "application/x-www-form-urlencoded"}
        if self.bearer_token_file:
            with open(self.bearer_token_file) as f:
                headers["Authorization"] = "Bearer " + f.read().strip()
        url = self.prometheus_url.rstrip("/") + "/api/v1/query"
        limit = self.max_answer_bytes
        chunks: list[bytes] = []
        received = [0]

        def on_chunk(chunk: bytes) -> None:
            received[0] += len(chunk)
            if received[0] > limit:
                raise AnswerTooLarge("answer too large")  # aborts the transfer; reported below
            chunks.append(chunk)

        # The cap is ours (in on_chunk), not tornado's, so that it is reported as what it is.
        client = AsyncHTTPClient(force_instance=True, max_body_size=2**62)
        self.queries += 1
        error = None
        try:
            await client.fetch(
                HTTPRequest(
                    url,
                    method="POST",
                    body=body,
                    headers=headers,
                    request_timeout=self.request_timeout,
                    streaming_callback=on_chunk,
                )
            )
        except HTTPClientError as e:
            detail = b"".join(chunks)[:500].decode(errors="replace")
            error = f"Prometheus at {url} answered {e.code}: {prometheus_error(detail) or e}"
            if "too many samples" in detail or "exceeded" in detail:
                error += (
                    " -- narrow c.PrometheusSource.series_selector, shorten the idle timeouts, or raise "
                    "Prometheus' --query.max-samples"
                )
        except (OSError, ValueError, asyncio.TimeoutError, Exception) as e:  # noqa: B014 (tornado raises many kinds)
            error = f"Prometheus at {url}: {e}"
        finally:
            client.close()
        self.last_answer_bytes += received[0]
        if received[0] > limit:
            raise AnswerTooLarge(
                f"Prometheus' answer exceeded {limit} bytes (c.PrometheusSource.max_answer_bytes): "
                "narrow c.PrometheusSource.series_selector to the hub's pods or raise max_answer_bytes"
            )
        if error:
            raise SourceUnavailable(error)
        return b"".join(chunks)

    async def _ask(self, query: str, at: float) -> tuple[dict[tuple, dict[str, float]], dict[tuple, dict]]:
        """Run one query; ``(stats, labels)`` keyed by ``(window, metric, *KEEP_LABELS)``."""
        raw = await self._fetch(urlencode({"query": query, "time": f"{at:.3f}"}))
        try:
            doc = json.loads(raw)
        except ValueError:
            raise SourceUnavailable(f"Prometheus answered something that is not JSON: {raw[:200]!r}") from None
        if doc.get("status") != "success" or (doc.get("data") or {}).get("resultType") != "vector":
            raise SourceUnavailable(f"Prometheus answered {str(doc)[:300]}")
        stats: dict[tuple, dict[str, float]] = defaultdict(dict)
        label_sets: dict[tuple, dict[str, str]] = {}
        for item in doc["data"]["result"]:
            labels = item.get("metric") or {}
            stat, _, rest = labels.pop(TAG, "").partition("/")
            metric, _, window = rest.partition("/")
            key = (window, metric, *(labels.get(k, "") for k in KEEP_LABELS))
            label_sets[key] = labels
            try:
                stats[key][stat] = float(item["value"][1])
            except (KeyError, IndexError, TypeError, ValueError):
                stats[key][stat] = math.nan
        return stats, label_sets

    def prefetch(
        self, now: float, windows: Iterable[float], threshold_percent: float, backends: Iterable[str] | None = None
    ) -> None:
        self.cancel_prefetch()
        asked = frozenset(windows)
        backends = None if backends is None else set(backends)
        metrics, kai = metrics_for(backends), self.kai_for(backends)
        task = asyncio.ensure_future(
            self.fetch(now, asked, threshold_percent=threshold_percent, metrics=metrics, kai=kai)
        )
        task.add_done_callback(_retrieve)
        self._prefetched = _Prefetch(now, asked, threshold_percent, task, metrics, kai)

    def cancel_prefetch(self) -> None:
        if self._prefetched is not None:
            self._prefetched.task.cancel()
            self._prefetched = None

    async def collect(self, targets, now, windows, threshold_percent: float | None = None):
        ahead, self._prefetched = self._prefetched, None
        if not targets:
            if ahead is not None:
                ahead.task.cancel()
            return {}
        wanted = set(windows.values())
        backends = {t.sharing for t in targets}
        metrics, kai = metrics_for(backends), self.kai_for(backends)
        if ahead is not None and ahead.now == now and set(metrics) <= set(ahead.metrics) and kai <= ahead.kai:
            answer = dict(await ahead.task)
            missing = wanted - ahead.windows  # cannot happen with one catalog; asked again if it does
            if missing:
                answer.update(
                    await self.fetch(
                        now, missing, threshold_percent=ahead.threshold_percent, metrics=ahead.metrics, kai=ahead.kai
                    )
                )
        else:
            if ahead is not None:
                ahead.task.cancel()
            answer = await self.fetch(now, wanted, threshold_percent=threshold_percent, metrics=metrics, kai=kai)
        if not any(by_pod or by_device for by_pod, by_device in answer.values()):
            # Not "every server lost its series at once" (which would clear warnings and hold
            # reclaims on no evidence): Prometheus, its scrape of dcgm-exporter or the selector broke.
            raise NoSeries(
                f"Prometheus answered no GPU series at all for the {len(targets)} GPU server(s) "
                f"(metrics {', '.join(metrics)}{', ' + self.series_selector if self.series_selector else ''}): "
                "check that it scrapes dcgm-exporter and that c.PrometheusSource.series_selector matches its series"
            )
        return self.join(answer, targets, windows)

    async def fetch(
        self,
        now: float,
        windows: Iterable[float],
        threshold_percent: float | None = None,
        metrics: tuple[str, ...] = METRICS,
        kai: bool = False,
    ) -> dict[str, tuple]:
        """Ask Prometheus for every window; ``{window: (by_pod, by_device)}``.

        Separate from :meth:`join` so the culler can ask while it is still listing
        the hub's servers (it knows the possible timeouts from the catalog).
        ``threshold_percent``: series peaking above it are busy whatever their holes,
        so the second query (holes the rule does not cover) skips them. ``metrics``: those
        the servers can have evidence in (:func:`metrics_for`).
        """
        windows = sorted(set(windows))
        at = self.evaluation_time(now)
        self.last_answer_bytes = 0
        stats, label_sets = await self._ask(self.query(windows, metrics=metrics, kai=kai), at)
        if self.sample_age_rule:
            self._keep_covered_holes(stats, windows)
            await self._measure_uncovered_holes(stats, windows, at, threshold_percent)
        await self._measure_stale_holes(stats, windows, at, threshold_percent)
        seconds = {duration(w): w for w in windows}
        by_window: dict[str, list] = {w: [] for w in seconds}
        for key, st in stats.items():
            if key[0] in seconds:
                labels = dict(label_sets[key], __name__=key[1])
                by_window[key[0]].append((labels, self._summary(st, seconds[key[0]])))
        self.log.debug(
            "Prometheus: %d series x windows, %d bytes, %d holes by subquery",
            len(stats),
            self.last_answer_bytes,
            self.last_subquery_series,
        )
        return {w: index_series(rows) for w, rows in by_window.items()}

    def join(
        self, answer: Mapping[str, tuple], targets: list[ServerTarget], windows: Mapping[str, float]
    ) -> dict[str, list]:
        """Each server's summaries over its own window (none when its window was not asked for)."""
        out: dict[str, list] = {}
        for w, (by_pod, by_device) in answer.items():
            wanted = [t for t in targets if duration(windows[t.key]) == w]
            out.update(series_for_targets(wanted, by_pod, by_device))
        for t in targets:
            out.setdefault(t.key, [])
        return out

    def _summary(self, st: Mapping[str, float], window: float) -> DeviceSummary:
        n = st.get("samples", 0.0)
        peak = st.get("peak", math.nan)
        tail = st.get("tail", math.inf)
        widest = self._widest(st)
        finite = math.isfinite(peak)
        return DeviceSummary(
            device="",
            samples=int(n) if math.isfinite(n) else 0,
            peak=peak if finite else math.nan,
            mean=math.nan,
            lead=0.0 if "start" in st else math.inf,
            tail=tail,
            max_gap=widest,
            finite=finite,
        )


@dataclass(frozen=True)
class _Prefetch:
    """A read ahead: the time it reads at, the windows asked for, and the running request."""

    now: float
    windows: frozenset[float]
    threshold_percent: float
    task: asyncio.Future
    metrics: tuple[str, ...] = METRICS
    kai: bool = False


def _retrieve(future: asyncio.Future) -> None:
    """Mark a read ahead's exception as seen when the cycle ended before awaiting it."""
    if not future.cancelled():
        future.exception()


class NoSeries(SourceUnavailable):
    """Prometheus answered, with no series for any server: a broken scrape, not idle GPUs."""


class AnswerTooLarge(SourceUnavailable):
    """The metrics answer is larger than the culler accepts."""
