"""Each Kubernetes session's GPU memory peak and utilisation p95, from Prometheus, at its end.

The single server samples NVML itself (``UsageRecorder.sample_utilisation``); on Kubernetes
the GPUs are dcgm-exporter's to measure and Prometheus' to keep, so the hub records only
where to look and asks once, when the session is over:

1. When a notebook's usage interval is open and its pod is known (the ledger's ``add`` on
   confirm or rebuild; :attr:`spawner.runtime.GPULabRuntime.workload_pod`), a
   :class:`SessionGPU` row ties the interval to the pod's namespace and name, ``pending``.
2. When the interval is closed (the server stopped, was culled, or its pod ended, seen by
   the ledger or by the usage reconcile after a hub restart), and ``settle_seconds`` later
   (the last scrape is in), ONE query asks Prometheus for the whole span
   (:mod:`.session_gpu_query`): the row becomes ``measured``, or ``unknown`` with its reason
   (no series of the pod, too few samples for the span).
3. Prometheus away: the row stays ``pending`` and is asked again at every pass, until
   ``give_up_after`` (then ``unknown``). Pending and unknown rows are no evidence: the
   right-size line (:mod:`.right_size`) counts measured sessions only, never a 0.

Everything lives in gpulab's database and Prometheus, so a hub restart mid-session loses
nothing: the interval stays open across it (``UsageRecorder``) and the span is measured whole.
"""

from __future__ import annotations

import asyncio
import logging
from datetime import datetime, timedelta

from sqlalchemy import DateTime, Float, Integer, String, select
from sqlalchemy.orm import Mapped, Session, mapped_column, sessionmaker
from tornado.ioloop import PeriodicCallback
from traitlets import Float as TFloat
from traitlets import Integer as TInteger
from traitlets import Unicode
from traitlets.config import Configurable

from hub_config.domain.session_gpu_query import (
    PrometheusUnavailable,
    SessionReading,
    fetch_answer,
    parse_answer,
    session_query,
    valid_name,
)
from hub_config.domain.usage_records import UsageInterval
from hub_config.storage.db import Base, to_epoch, utcnow
from spawner.core.ledger import Workload
from spawner.runtime import KUBERNETES, GPULabRuntime

log = logging.getLogger("gpulab.session_gpu")

PENDING, MEASURED, UNKNOWN = "pending", "measured", "unknown"


class GPULabSessionMetrics(Configurable):
    """Where a Kubernetes hub reads each session's GPU memory and utilisation (Prometheus)."""

    prometheus_url = Unicode(
        "",
        config=True,
        help="""Base URL of the Prometheus HTTP API (without /api/v1) that scrapes dcgm-exporter
        with its pod labels, e.g. `http://kube-prometheus-stack-prometheus.monitoring.svc:9090`
        (the culler's `--prometheus-url`). Empty: no session's GPU use is recorded on
        Kubernetes, and the spawn page and sidebar show no right-size line.""",
    )
    series_selector = Unicode(
        "",
        config=True,
        help="""Extra PromQL label matchers for the dcgm-exporter series, e.g. `job="dcgm"`
        (as c.PrometheusSource.series_selector for the culler).""",
    )
    bearer_token_file = Unicode(
        "", config=True, help="File with a bearer token for Prometheus (empty: no Authorization header)."
    )
    request_timeout = TFloat(20.0, config=True, help="Seconds to wait for Prometheus' answer to one session.")
    scrape_interval = TFloat(
        30.0,
        min=0.001,
        config=True,
        help="""How often Prometheus scrapes dcgm-exporter, in seconds: the step of the
        per-session subqueries, and the expected spacing of samples for `min_coverage`.""",
    )
    min_coverage = TFloat(
        0.5,
        min=0.0,
        max=1.0,
        config=True,
        help="""Least share of a session's span that Prometheus' samples must cover (samples x
        scrape interval / span) for its peak to count; below it (Prometheus or its scrape of
        dcgm-exporter was away) the session is `unknown`, never a peak it did not see. The span
        includes the pod's start, before dcgm-exporter sees its GPU.""",
    )
    settle_seconds = TFloat(
        60.0,
        min=0.0,
        config=True,
        help="Seconds after a session's end before it is measured, so the last scrape is in (twice the scrape interval or more).",
    )
    check_interval = TFloat(
        60.0,
        min=0.1,
        config=True,
        help="""Seconds between passes over sessions not measured yet (ended while Prometheus
        was away or the hub was down) and running sessions whose pod is not recorded yet.""",
    )
    sessions_per_pass = TInteger(50, min=1, config=True, help="Most sessions measured in one pass (one query each).")
    longest_span = TFloat(
        7 * 86400.0,
        min=1.0,
        config=True,
        help="""Most seconds of a session that are measured (its last part); keeps each query's
        cost within Prometheus' limits. Keep it within Prometheus' retention.""",
    )
    give_up_after = TFloat(
        7 * 86400.0,
        min=1.0,
        config=True,
        help="""Seconds after its end a session Prometheus never answered for is given up
        (`unknown`): by then its samples are likely past Prometheus' retention.""",
    )
    max_answer_bytes = TInteger(
        65536, min=1024, config=True, help="Largest answer accepted from Prometheus for one session (four numbers)."
    )


class SessionGPU(Base):
    """Where one notebook session's GPU series are, and what Prometheus said of them."""

    __tablename__ = "gpulab_session_gpu"

    #: The session's usage interval (``gpulab_usage.id``).
    usage_id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=False)
    key: Mapped[str] = mapped_column(String(255), index=True)
    namespace: Mapped[str] = mapped_column(String(253))
    pod: Mapped[str] = mapped_column(String(253))
    #: ``pending`` (not measured yet), ``measured`` or ``unknown`` (with ``reason``).
    state: Mapped[str] = mapped_column(String(16), index=True)
    #: Highest GPU memory in use, summed over the pod's GPUs, MiB.
    peak_memory_mib: Mapped[float | None] = mapped_column(Float, nullable=True)
    #: Memory of one of its GPUs (used + free frame buffer), MiB.
    device_memory_mib: Mapped[float | None] = mapped_column(Float, nullable=True)
    #: Utilisation p95 over the session, percent of its GPUs (averaged over them).
    util_p95: Mapped[float | None] = mapped_column(Float, nullable=True)
    samples: Mapped[int | None] = mapped_column(Integer, nullable=True)
    #: The GPUs the figures are of, as dcgm-exporter's labels name them ("; " between them).
    devices: Mapped[str] = mapped_column(String(1000), default="")
    reason: Mapped[str] = mapped_column(String(500), default="")
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    measured_at: Mapped[datetime | None] = mapped_column(DateTime, nullable=True)


def judge(reading: SessionReading, span: float, settings: GPULabSessionMetrics) -> tuple[str, str]:
    """``(state, reason)`` for a session's reading: measured only with memory, utilisation and
    samples covering at least ``min_coverage`` of its span."""
    if reading.samples <= 0 or reading.util_p95 is None:
        return UNKNOWN, "Prometheus holds no dcgm-exporter utilisation series labelled with this pod"
    if reading.peak_memory_mib is None:
        return UNKNOWN, "dcgm-exporter reported no frame buffer (DCGM_FI_DEV_FB_USED) for this pod"
    expected = max(1.0, span / settings.scrape_interval)
    coverage = reading.samples / expected
    if coverage < settings.min_coverage:
        return UNKNOWN, (
            f"Prometheus holds {reading.samples} samples of the session's ~{expected:.0f} "
            f"({coverage:.0%} < c.GPULabSessionMetrics.min_coverage {settings.min_coverage:.0%})"
        )
    return MEASURED, ""


class SessionGPURecorder:
    """Ledger observer recording each notebook session's pod, and the passes measuring them."""

    def __init__(self, runtime: GPULabRuntime, sessions: sessionmaker[Session], settings: GPULabSessionMetrics):
        self.runtime = runtime
        self.sessions = sessions
        self.settings = settings
        #: Workload key -> usage interval id whose pod is recorded (saves a read per event).
        self._recorded: dict[str, int] = {}
        self._periodic: PeriodicCallback | None = None
        self._pass: asyncio.Task | None = None
        self._away = False
        #: Queries sent since start (the tests read it).
        self.queries = 0

    # -- step 1: where the session's series are -------------------------------------

    def observe(self, event: str, w: Workload) -> None:
        if w.kind != "notebook" or w.milli <= 0:
            return
        if event == "remove":
            self._recorded.pop(w.key, None)
            self._soon(self.settings.settle_seconds + 1)
            return
        if w.key not in self._recorded:
            self.record_pod(w.key)

    def record_pod(self, key: str) -> bool:
        """Tie ``key``'s open interval to its pod, once; False while either is not known."""
        where = self.runtime.workload_pod(key)
        if where is None or not (valid_name(where[0]) and valid_name(where[1])):
            return False
        with self.sessions.begin() as s:
            interval = s.scalars(
                select(UsageInterval.id).where(UsageInterval.key == key, UsageInterval.ended_at.is_(None))
            ).first()
            if interval is None:
                return False
            if s.get(SessionGPU, interval) is None:
                s.add(SessionGPU(usage_id=interval, key=key, namespace=where[0], pod=where[1], state=PENDING))
        self._recorded[key] = interval
        return True

    # -- steps 2 and 3: the measurement --------------------------------------------

    def _soon(self, delay: float) -> None:
        try:
            asyncio.get_running_loop().call_later(delay, self.start_pass)
        except RuntimeError:  # no event loop (a script): the periodic pass is the only one
            pass

    def start_pass(self) -> None:
        """One pass in the background, unless one runs."""
        if self._pass is None or self._pass.done():
            self._pass = asyncio.ensure_future(self._safe_pass())

    async def _safe_pass(self) -> None:
        try:
            await self.measure_pass()
        except Exception:
            log.exception("gpulab: measuring sessions' GPU use failed")

    async def measure_pass(self) -> int:
        """Record the pods of open sessions not recorded yet, then measure the ended sessions
        that are due; returns how many sessions got a final state."""
        with self.sessions() as s:
            open_keys = s.scalars(
                select(UsageInterval.key)
                .outerjoin(SessionGPU, SessionGPU.usage_id == UsageInterval.id)
                .where(
                    UsageInterval.ended_at.is_(None), UsageInterval.kind == "notebook", SessionGPU.usage_id.is_(None)
                )
                .limit(self.settings.sessions_per_pass * 20)
            ).all()
        for key in open_keys:
            self.record_pod(key)
        now = utcnow()
        due = now - timedelta(seconds=self.settings.settle_seconds)
        with self.sessions() as s:
            rows = s.execute(
                select(
                    SessionGPU.usage_id,
                    SessionGPU.namespace,
                    SessionGPU.pod,
                    UsageInterval.started_at,
                    UsageInterval.ended_at,
                )
                .join(UsageInterval, UsageInterval.id == SessionGPU.usage_id)
                .where(SessionGPU.state == PENDING, UsageInterval.ended_at.is_not(None), UsageInterval.ended_at <= due)
                .order_by(UsageInterval.ended_at)
                .limit(self.settings.sessions_per_pass)
            ).all()
        done = 0
        for usage_id, namespace, pod, started, ended in rows:
            if ended is None:
                continue
            if (now - ended).total_seconds() > self.settings.give_up_after:
                self._finish(usage_id, UNKNOWN, "Prometheus did not answer before c.GPULabSessionMetrics.give_up_after")
                done += 1
                continue
            span = min((ended - started).total_seconds(), self.settings.longest_span)
            try:
                reading = await self.read(namespace, pod, span, to_epoch(ended))
            except PrometheusUnavailable as e:
                self._tried(usage_id)
                if not self._away:
                    log.warning(
                        "gpulab: cannot read sessions' GPU use from Prometheus (%s); %d session(s) wait and are "
                        "asked again every %gs (c.GPULabSessionMetrics); they show no right-size evidence meanwhile",
                        e,
                        len(rows) - done,
                        self.settings.check_interval,
                    )
                self._away = True
                return done  # the rest wait for the next pass: no request per session while it is away
            if self._away:
                log.info("gpulab: Prometheus answers again; measuring the sessions that waited")
            self._away = False
            state, reason = judge(reading, span, self.settings)
            self._finish(usage_id, state, reason, reading)
            done += 1
        return done

    async def read(self, namespace: str, pod: str, span: float, end: float) -> SessionReading:
        """What Prometheus holds of ``namespace/pod``'s GPUs over the ``span`` seconds before ``end``."""
        token = ""
        if self.settings.bearer_token_file:
            with open(self.settings.bearer_token_file) as f:
                token = f.read().strip()
        query = session_query(namespace, pod, span, self.settings.scrape_interval, self.settings.series_selector)
        self.queries += 1
        raw = await fetch_answer(
            self.settings.prometheus_url,
            query,
            end,
            timeout=self.settings.request_timeout,
            max_bytes=self.settings.max_answer_bytes,
            token=token,
        )
        return parse_answer(raw)

    def _tried(self, usage_id: int) -> None:
        with self.sessions.begin() as s:
            row = s.get(SessionGPU, usage_id)
            if row is not None:
                row.attempts += 1

    def _finish(self, usage_id: int, state: str, reason: str, reading: SessionReading | None = None) -> None:
        with self.sessions.begin() as s:
            row = s.get(SessionGPU, usage_id)
            if row is None:
                return
            row.state, row.reason, row.measured_at = state, reason[:500], utcnow()
            row.attempts += 1
            if reading is not None:
                row.samples = reading.samples
                row.devices = "; ".join(reading.devices)[:1000]
                if state == MEASURED:
                    row.peak_memory_mib = reading.peak_memory_mib
                    row.device_memory_mib = reading.device_memory_mib
                    row.util_p95 = reading.util_p95
        log.info("gpulab: session %s's GPU use %s%s", usage_id, state, f": {reason}" if reason else "")

    def start(self) -> None:
        self.runtime.ledger.subscribe(self.observe)
        try:
            self._periodic = PeriodicCallback(self.start_pass, self.settings.check_interval * 1000)
            self._periodic.start()
        except RuntimeError:  # no event loop in this process (a script)
            self._periodic = None


def attach(runtime: GPULabRuntime, sessions: sessionmaker[Session], config) -> SessionGPURecorder | None:
    """The recorder on a Kubernetes hub with ``c.GPULabSessionMetrics.prometheus_url``; else ``None``."""
    if runtime.platform != KUBERNETES:
        return None  # the single server samples NVML (usage_records)
    settings = GPULabSessionMetrics(config=config)
    if not settings.prometheus_url:
        log.info(
            "gpulab: c.GPULabSessionMetrics.prometheus_url is not set: sessions' GPU memory and utilisation are "
            "not recorded, so the spawn page and sidebar show no right-size line"
        )
        return None
    recorder = SessionGPURecorder(runtime, sessions, settings)
    recorder.start()
    return recorder
