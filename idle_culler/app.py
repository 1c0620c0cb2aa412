"""``gpulab-idle-culler``: reclaim GPUs that sat idle, warn first, never guess.

A JupyterHub service (hub-managed or external). Each cycle it:

1. lists the hub's ready servers (paginated, with their spawner state) and
   gpulab's idle state (warnings, keep-alives, per-profile/team timeouts);
2. asks the utilisation source ONCE for every GPU server's samples;
3. judges each server with :func:`spawner.core.idle.judge_gpu_idle` and steps the
   warn -> grace -> reclaim machine (:func:`spawner.core.idle.next_step`);
4. records warnings / clears / reclaims through the hub API, stops idle
   servers (or, with per-process NVML data, shuts down just the idle kernels).

Servers without a GPU are left to jupyterhub-idle-culler. Flags follow
jupyterhub-idle-culler where they mean the same (--url, --cull-every,
--concurrency, --api-page-size, --ssl-enabled, --internal-certs-location).
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import time

from tornado.log import LogFormatter
from traitlets import Any as AnyTrait
from traitlets import Bool, CaselessStrEnum, Float, Integer, Unicode, default
from traitlets.config import Application

from spawner.core.idle import (
    BUSY,
    LIFETIME,
    SHORT,
    STATUSES,
    IdleVerdict,
    IdleWarning,
    Step,
    idle_gpu_hours_observed,
    idle_timeout_of,
    max_gap_for,
)
from spawner.core.idle_cycle import ReclaimClaim, WarningRecord

from .dcgm_exporter_source import DCGMExporterSource
from .hub import CycleBatch, HubAPIError, HubClient, make_ssl_context
from .metrics import CullerMetrics, serve_metrics
from .nvml_source import NVMLSource
from .plan import CyclePlan, CycleSummary, HubRead, decision_record, lifetimes_of, plan_cycle
from .prometheus_source import AnswerTooLarge, NoSeries, PrometheusSource
from .reclaim import record_and_reclaim
from .sources import SourceUnavailable, UtilisationSource
from .targets import ServerTarget, targets_from_users
from .unattributed_report import UnattributedReport

SOURCES: dict[str, type[UtilisationSource]] = {
    "prometheus": PrometheusSource,
    "dcgm-exporter": DCGMExporterSource,
    "nvml": NVMLSource,
}


class GPUIdleCuller(Application):
    name = "gpulab-idle-culler"
    description = "Reclaim GPUs from JupyterHub servers whose GPUs sat idle (DCGM / NVML), after a warning."

    url = Unicode(
        os.environ.get("JUPYTERHUB_API_URL", "http://127.0.0.1:8081/hub/api"),
        config=True,
        help="The JupyterHub API URL (default: $JUPYTERHUB_API_URL).",
    )
    api_token = Unicode(
        config=True,
        help="The service's API token (default: $JUPYTERHUB_API_TOKEN).",
    )

    @default("api_token")
    def _default_token(self) -> str:
        return os.environ.get("JUPYTERHUB_API_TOKEN", "")

    public_url = Unicode(
        "",
        config=True,
        help="""Public URL of the hub's proxy (e.g. http://127.0.0.1:8000), used to reach
        single-user servers when shutting down one kernel. Not needed when the hub sets
        `c.JupyterHub.public_url` (server models then carry full URLs).""",
    )
    config_file = Unicode("gpulab_idle_culler_config.py", config=True, help="Config file to load (if it exists).")
    cull_every = Integer(60, min=1, config=True, help="Seconds between cull cycles.")
    concurrency = Integer(10, min=0, config=True, help="Most hub API requests in flight at once (0 = no limit).")
    api_page_size = Integer(
        0, min=0, config=True, help="Users per page from the hub's paginated user list (0: hub default)."
    )
    ssl_enabled = Bool(False, config=True, help="Whether the hub API uses internal SSL.")
    internal_certs_location = Unicode(
        "internal-ssl",
        config=True,
        help="Where the internal-ssl certificates are (only with --ssl-enabled).",
    )
    cull_default_servers = Bool(True, config=True, help="Whether default (unnamed) GPU servers are culled.")
    cull_named_servers = Bool(True, config=True, help="Whether named GPU servers are culled.")

    source = CaselessStrEnum(
        list(SOURCES),
        default_value="prometheus",
        config=True,
        help="""Where GPU utilisation comes from: `prometheus` (dcgm-exporter through Prometheus,
        one query per cycle), `dcgm-exporter` (scrape exporters directly) or `nvml`
        (per-process, on the hub's own machine; single server only).""",
    )
    threshold_percent = Float(
        1.0,
        min=0.0,
        max=100.0,
        config=True,
        help="A GPU is idle when every sample is at or below this utilisation (percent).",
    )
    default_timeout = Integer(
        3600,
        min=1,
        config=True,
        help="""Idle timeout in seconds when neither the server's profile nor its team sets
        `idle_timeout` (if both do, the shorter wins; see docs/idle-culler.md).""",
    )
    grace_seconds = Integer(
        900,
        min=0,
        config=True,
        help="Seconds between the warning the user sees and the reclaim.",
    )
    max_missed_samples = Integer(
        2,
        min=0,
        config=True,
        help="""How many samples in a row may be missing inside an idle run and still count as
        *unknown* rather than as a break: one or two lost scrapes do not restart the idle clock.
        Longer holes, stale series and partial data still mean "not idle".""",
    )
    max_sample_gap = Float(
        min=0.1,
        config=True,
        help="""Largest allowed hole between samples (and age of the newest one), in seconds.
        Default: (max_missed_samples + 1.5) x the sample interval -- Prometheus' scrape interval
        (c.PrometheusSource.scrape_interval) with `prometheus`, --cull-every with `dcgm-exporter`
        and `nvml` (they sample once per cycle). Keep it below Prometheus' lookback delta (5m).""",
    )

    @default("max_sample_gap")
    def _default_max_sample_gap(self) -> float:
        interval: float = self.cull_every
        if self.source == "prometheus":
            interval = PrometheusSource(parent=self).scrape_interval
        return max_gap_for(interval, self.max_missed_samples)

    clock = AnyTrait(
        time.time,
        help="The culler's clock (seconds since the epoch); tests replace it to step through idle windows.",
    )
    node_name = Unicode(
        config=True,
        help="""The dcgm-exporter `Hostname`/`hostname` of this machine, for servers mapped by
        device index (the single-server spawners). Default: this host's name.""",
    )

    @default("node_name")
    def _default_node_name(self) -> str:
        return socket.gethostname()

    kernel_shutdown = Bool(
        True,
        config=True,
        help="""With per-process data (nvml), shut down just the idle kernels holding GPU memory
        instead of stopping the server. The server is stopped later if it stays idle.""",
    )
    unattributed_after = Float(
        300.0,
        min=0.0,
        config=True,
        help="""Seconds a running GPU server on Kubernetes may have no utilisation series naming its pod
        before the culler reports it as unattributed: a warning in its log (once per server session),
        `gpulab_culler_unattributed_servers{reason}`, and "idle GPU reclaim is off for this server:
        <reason>" on the admin page and in the user's GPU sidebar. Such a server is never reclaimed.""",
    )
    dry_run = Bool(False, config=True, help="Decide and log, but record, warn and stop nothing.")
    once = Bool(False, config=True, help="Run one cycle and exit.")
    metrics_url = Unicode(
        config=True,
        help="""Where to serve /metrics (e.g. http://127.0.0.1:9464). Default: $JUPYTERHUB_SERVICE_URL
        when the hub gives the service one, else none.""",
    )

    @default("metrics_url")
    def _default_metrics_url(self) -> str:
        return os.environ.get("JUPYTERHUB_SERVICE_URL", "")

    aliases = {
        "url": "GPUIdleCuller.url",
        "public-url": "GPUIdleCuller.public_url",
        "config": "GPUIdleCuller.config_file",
        "cull-every": "GPUIdleCuller.cull_every",
        "concurrency": "GPUIdleCuller.concurrency",
        "api-page-size": "GPUIdleCuller.api_page_size",
        "ssl-enabled": "GPUIdleCuller.ssl_enabled",
        "internal-certs-location": "GPUIdleCuller.internal_certs_location",
        "cull-default-servers": "GPUIdleCuller.cull_default_servers",
        "cull-named-servers": "GPUIdleCuller.cull_named_servers",
        "source": "GPUIdleCuller.source",
        "threshold": "GPUIdleCuller.threshold_percent",
        "timeout": "GPUIdleCuller.default_timeout",
        "grace": "GPUIdleCuller.grace_seconds",
        "max-sample-gap": "GPUIdleCuller.max_sample_gap",
        "max-missed-samples": "GPUIdleCuller.max_missed_samples",
        "scrape-interval": "PrometheusSource.scrape_interval",
        "rule-interval": "PrometheusSource.rule_interval",
        "sample-age-rule": "PrometheusSource.sample_age_rule",
        "node-name": "GPUIdleCuller.node_name",
        "metrics-url": "GPUIdleCuller.metrics_url",
        "prometheus-url": "PrometheusSource.prometheus_url",
        "series-selector": "PrometheusSource.series_selector",
        "kai-reservation-namespace": "PrometheusSource.kai_reservation_namespace",
        "exporter-url": "DCGMExporterSource.exporter_urls",
        "log-level": "Application.log_level",
    }
    flags = {
        "dry-run": ({"GPUIdleCuller": {"dry_run": True}}, "Decide and log, change nothing."),
        "once": ({"GPUIdleCuller": {"once": True}}, "Run one cycle and exit."),
        "no-kernel-shutdown": ({"GPUIdleCuller": {"kernel_shutdown": False}}, "Always stop whole servers."),
    }
    classes = [PrometheusSource, DCGMExporterSource, NVMLSource]

    # tornado's coloured formatter, as JupyterHub's own log uses (traitlets declares a narrower type).
    _log_formatter_cls = LogFormatter  # type: ignore[assignment]
    _cycle_now = 0.0

    @default("log_level")
    def _log_level_default(self):
        return logging.INFO

    @default("log_format")
    def _log_format_default(self):
        return "%(color)s[%(levelname)1.1s %(asctime)s.%(msecs).03d %(name)s]%(end_color)s %(message)s"

    # -- set-up -------------------------------------------------------------

    def initialize(self, argv: list[str] | None = None) -> None:
        super().initialize(argv)
        if self.config_file and os.path.exists(self.config_file):
            self.load_config_file(self.config_file)
        self.metrics = CullerMetrics()
        self.unattributed = UnattributedReport(self.log, self.metrics)
        self.utilisation: UtilisationSource = SOURCES[self.source](parent=self, log=self.log)
        self.utilisation.max_gap_seconds = self.max_sample_gap
        self.hub: HubClient | None = None

    def make_hub_client(self) -> HubClient:
        ctx = None
        if self.ssl_enabled:
            loc = self.internal_certs_location
            ctx = make_ssl_context(
                f"{loc}/hub-internal/hub-internal.key",
                f"{loc}/hub-internal/hub-internal.crt",
                f"{loc}/hub-ca/hub-ca.crt",
            )
        return HubClient(
            self.url,
            self.api_token,
            concurrency=self.concurrency,
            page_size=self.api_page_size,
            ssl_context=ctx,
            public_url=self.public_url,
        )

    # -- one cycle ----------------------------------------------------------

    def timeout_for(self, target: ServerTarget, profiles: dict, teams: dict) -> tuple[int, str]:
        """The server's idle timeout from the hub's catalog (shorter of profile and team)."""
        return self._timeout(target.profile, target.team, profiles, teams)

    def _timeout(self, slug: str, team_name: str, profiles: dict, teams: dict) -> tuple[int, str]:
        return idle_timeout_of(
            (slug, (profiles.get(slug) or {}).get("idle_timeout_seconds")) if slug else None,
            (team_name, (teams.get(team_name) or {}).get("idle_timeout_seconds")) if team_name else None,
            self.default_timeout,
        )

    def candidate_windows(self, profiles: dict, teams: dict) -> set[int]:
        """Every idle timeout a GPU server can have under the hub's catalog (usually a handful)."""
        slugs = [""] + [s for s, p in profiles.items() if (p.get("gpu_milli") or 0) > 0]
        names = [""] + list(teams)
        return {self._timeout(s, n, profiles, teams)[0] for s in slugs for n in names}

    @property
    def hub_client(self) -> HubClient:
        """The hub API client, made on first use."""
        if self.hub is None:
            self.hub = self.make_hub_client()
        return self.hub

    async def cycle(self) -> CycleSummary:
        """One pass over every GPU server: read, plan, apply; returns what it did."""
        started = time.monotonic()
        queries_before = self.utilisation.queries
        summary = CycleSummary()
        self.metrics.cycles.inc()
        try:
            read = await self.read_hub()
        except (HubAPIError, OSError) as e:
            self.utilisation.cancel_prefetch()
            self.metrics.errors.labels("hub").inc()
            self.log.error("Cannot read the hub's servers; culling nothing this cycle: %s", e)
            summary.source_error = f"hub: {e}"
            self._finish(summary, started, queries_before)
            return summary
        targets = self.gpu_targets(read, summary)
        timeouts = {t.key: self.timeout_for(t, read.profiles, read.teams) for t in targets}
        try:
            data = await self.read_utilisation(targets, timeouts, read.now, summary)
        except SourceUnavailable as e:
            # Fail safe: no data means no decision at all -- no warning, no clear, no reclaim.
            reason = (
                "too-large"
                if isinstance(e, AnswerTooLarge)
                else "no-series"
                if isinstance(e, NoSeries)
                else "unavailable"
            )
            self.metrics.errors.labels("source").inc()
            self.metrics.source_failures.labels(reason).inc()
            self.metrics.skipped.inc(len(targets))
            summary.skipped.extend(t.key for t in targets)
            summary.source_error = str(e)
            self.log.error("Utilisation source unavailable; culling nothing this cycle: %s", e)
            self._finish(summary, started, queries_before)
            return summary
        plan = plan_cycle(
            targets,
            data,
            read.warnings,
            read.keepalives,
            timeouts,
            read.running,
            now=read.now,
            threshold_percent=self.threshold_percent,
            max_gap_seconds=self.max_sample_gap,
            lifetimes=lifetimes_of(targets, read.profiles, read.teams),
        )
        batch = self.apply(plan, read.now, summary)
        self.unattributed.report(targets, data, read, batch, summary, self.unattributed_after)
        if not batch.empty and not self.dry_run:
            await record_and_reclaim(self.hub_client, batch, summary, self.metrics, self.log)
        self._finish(summary, started, queries_before)
        return summary

    async def read_hub(self) -> HubRead:
        """The hub's servers and idle state. The server list is the slow part (pages of
        users): the utilisation source may read ahead meanwhile, for every idle timeout the
        catalog allows, so the cycle waits for the slower of the two."""
        hub = self.hub_client
        users_task = asyncio.ensure_future(hub.ready_users())
        try:
            idle_state = await hub.idle_state()
            profiles, teams = idle_state.get("profiles", {}), idle_state.get("teams", {})
            now = self._cycle_now = self.clock()
            backends = {str(p.get("sharing") or "") for p in profiles.values() if (p.get("gpu_milli") or 0) > 0}
            self.utilisation.prefetch(
                now, self.candidate_windows(profiles, teams), self.threshold_percent, backends=backends
            )
            users = await users_task
        except BaseException:
            users_task.cancel()
            raise
        running = {
            (u["name"], name)
            for u in users
            for name, srv in (u.get("servers") or {}).items()
            if srv.get("ready") or srv.get("pending")
        }
        warnings = {
            (w["user"], w["server"]): IdleWarning(
                w["warned_at"], w["reclaim_at"], w.get("session", ""), bool(w.get("held"))
            )
            for w in idle_state.get("warnings", [])
        }
        keepalives = {(k["user"], k["server"]): k["until"] for k in idle_state.get("keepalives", [])}
        return HubRead(users, profiles, teams, warnings, keepalives, running, now, idle_state.get("unattributed"))

    def gpu_targets(self, read: HubRead, summary: CycleSummary) -> list[ServerTarget]:
        """The GPU servers this culler judges (named and default servers as configured)."""
        targets, non_gpu, unmapped = targets_from_users(read.users, read.profiles, self.node_name)
        summary.servers = sum(len(u.get("servers") or {}) for u in read.users)
        summary.non_gpu = len(non_gpu)
        targets = [t for t in targets if (self.cull_named_servers if t.server else self.cull_default_servers)]
        summary.gpu_servers = len(targets)
        for key in unmapped:
            self.log.warning("Not culling %s: its state names neither a pod nor GPU devices", key)
        summary.skipped.extend(unmapped)
        self.metrics.skipped.inc(len(unmapped))
        return targets

    async def read_utilisation(
        self, targets: list[ServerTarget], timeouts: dict[str, tuple[int, str]], now: float, summary: CycleSummary
    ) -> dict[str, list]:
        """One read of the source for every server, each over its own idle window."""
        if not targets:
            self.utilisation.cancel_prefetch()
            return {}
        source_started = time.monotonic()
        windows = {k: sec for k, (sec, _) in timeouts.items()}
        data = await self.utilisation.collect(targets, now, windows)
        summary.source_wait_seconds = time.monotonic() - source_started
        self.metrics.answer_bytes.set(getattr(self.utilisation, "last_answer_bytes", 0))
        return data

    def apply(self, plan: CyclePlan, now: float, summary: CycleSummary) -> CycleBatch:
        """Count, log and batch the plan's steps: what the hub is asked to record."""
        batch = CycleBatch()
        for user, server in plan.gone:
            batch.clear(user, server, "server not running")
            summary.cleared.append(f"{user}/{server}")
        counts: dict[str, int] = {}
        for s in plan.steps:
            t, verdict, step, seconds, origin = s.target, s.verdict, s.step, s.timeout_seconds, s.timeout_from
            counts[verdict.status] = counts.get(verdict.status, 0) + 1
            summary.verdicts[t.key] = verdict.status
            if verdict.missing_data and not (verdict.status == SHORT and "session_started_at" in verdict.evidence):
                self.metrics.skipped.inc()
                summary.skipped.append(t.key)
                self.log.debug("Not culling %s: %s", t.key, verdict.reason)
            if step is Step.NOTHING or step is Step.WAIT:
                continue
            if step is Step.WARN or step is Step.REWARN:
                self.log.warning(
                    "%s %s: %s; reclaim in %ss",
                    "Warning" if step is Step.WARN else "Re-announcing the warning of",
                    t.key,
                    verdict.reason if verdict.status == LIFETIME else f"GPU idle for {seconds}s ({origin})",
                    self.grace_seconds,
                )
                batch.warn(
                    WarningRecord(
                        **decision_record(t, verdict, seconds, origin, self._cycle_now, self.source),
                        grace_seconds=self.grace_seconds,
                        renew=step is Step.REWARN,
                    )
                )
                self.metrics.warnings.labels(t.team).inc()
                summary.warned.append(t.key)
            elif step is Step.HOLD:
                self.log.info("Holding the warning of %s until its data returns: %s", t.key, verdict.reason)
                batch.hold(t.user, t.server, t.started, verdict.reason)
                summary.held.append(t.key)
            elif step is Step.CLEAR or step is Step.VOID:
                reason = (
                    "server restarted: the new session gets its full timeout and grace"
                    if step is Step.VOID
                    else "kept alive by the user"
                    if verdict.status != BUSY
                    else verdict.reason
                )
                self.log.info("Clearing the warning of %s: %s", t.key, reason)
                batch.clear(t.user, t.server, reason)
                summary.cleared.append(t.key)
            elif step is Step.RECLAIM:
                self._plan_reclaim(batch, t, verdict, s.warning, seconds, origin, now)
        for status in STATUSES:
            self.metrics.gpu_servers.labels(status).set(counts.get(status, 0))
        return batch

    def _finish(self, summary: CycleSummary, started: float, queries_before: int) -> None:
        summary.queries = self.utilisation.queries - queries_before
        summary.seconds = time.monotonic() - started
        self.metrics.cycle_seconds.set(summary.seconds)
        self.metrics.queries.set(summary.queries)
        self.log.info(
            "Cycle: %d servers, %d on GPUs, %d warned, %d held, %d cleared, %d reclaimed, %d kernels, "
            "%d skipped, %d metric queries, %.3fs",
            summary.servers,
            summary.gpu_servers,
            len(summary.warned),
            len(summary.held),
            len(summary.cleared),
            len(summary.reclaimed),
            len(summary.kernels),
            len(summary.skipped),
            summary.queries,
            summary.seconds,
        )

    def _plan_reclaim(
        self,
        batch: CycleBatch,
        t: ServerTarget,
        verdict: IdleVerdict,
        warning: IdleWarning | None,
        seconds: int,
        origin: str,
        now: float,
    ) -> None:
        if verdict.status == LIFETIME:  # the session is over, not its kernels: stop the server
            self.log.warning("Reclaiming GPU of %s: stopping the server: %s", t.key, verdict.reason)
            claim = ReclaimClaim(
                **decision_record(t, verdict, seconds, origin, self._cycle_now, self.source),
                action="stop-server",
                idle_since=verdict.evidence["lifetime_ends_at"],
            )
            batch.reclaim(claim, t, self.hub_client.server_base(t.url, t.full_url))
            return
        holders = self.utilisation.kernel_holders(t)
        base = self.hub_client.server_base(t.url, t.full_url)
        idle_since = (warning.warned_at if warning else now) - seconds
        # Per kernel, only its own samples count: a process younger than the window is not proven idle.
        young = [h for h in holders if (h.get("started_at") or 0) > now - seconds]
        if young:
            self.log.info(
                "Not reclaiming %s yet: GPU process %s started %ds ago, the idle timeout is %ss",
                t.key,
                young[0]["pid"],
                now - young[0]["started_at"],
                seconds,
            )
            return
        if self.kernel_shutdown and holders and base and all(h["kernel_id"] for h in holders):
            kernel_ids = sorted({h["kernel_id"] for h in holders})
            self.log.warning("Reclaiming GPU of %s: shutting down idle kernel(s) %s", t.key, ", ".join(kernel_ids))
            # The server keeps its GPU allocation; only the kernels' GPU memory is freed.
            claim = ReclaimClaim(
                **decision_record(t, verdict, seconds, origin, self._cycle_now, self.source),
                action="shutdown-kernel",
                kernel_ids=tuple(kernel_ids),
                idle_since=idle_since,
                idle_gpu_hours=0.0,
            )
            batch.reclaim(claim, t, base)
            return
        hours = idle_gpu_hours_observed(t.gpu_milli, idle_since, now)
        self.log.warning(
            "Reclaiming GPU of %s: stopping the server (%.4f idle GPU-hours observed): %s", t.key, hours, verdict.reason
        )
        claim = ReclaimClaim(
            **decision_record(t, verdict, seconds, origin, self._cycle_now, self.source),
            action="stop-server",
            idle_since=idle_since,
            idle_gpu_hours=hours,
        )
        batch.reclaim(claim, t, base)

    # -- service loop -------------------------------------------------------

    async def run(self) -> None:
        if not self.api_token:
            raise SystemExit(
                "gpulab-idle-culler: no API token (set $JUPYTERHUB_API_TOKEN or --GPUIdleCuller.api_token)"
            )
        if self.metrics_url:
            serve_metrics(self.metrics, self.metrics_url, self.log)
        self.log.info(
            "GPU idle culler: source %s, every %ss, threshold %g%%, default timeout %ss, grace %ss",
            self.source,
            self.cull_every,
            self.threshold_percent,
            self.default_timeout,
            self.grace_seconds,
        )
        try:
            while True:
                try:
                    await self.cycle()
                except Exception:  # a bug in one cycle must not end the service
                    self.metrics.errors.labels("cycle").inc()
                    self.log.exception("Cull cycle failed")
                if self.once:
                    return
                await asyncio.sleep(self.cull_every)
        finally:
            if self.hub is not None:
                await self.hub.close()

    def start(self) -> None:
        asyncio.run(self.run())


def main(argv: list[str] | None = None) -> None:
    GPUIdleCuller.launch_instance(argv)
