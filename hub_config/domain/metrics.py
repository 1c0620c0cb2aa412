"""Prometheus gauges for Grafana, served on the hub's own ``/hub/metrics``.

A collector on prometheus_client's default ``REGISTRY`` (which JupyterHub's
metrics handler serves) that reads the ledger and catalog at scrape time, so
the numbers are never stale and nothing runs between scrapes:

- ``gpulab_team_gpu_milli{team,state}``: milli-GPUs held, ``state`` is
  ``in-quota`` or ``over-quota`` (together: everything held) or ``reserved``
  (the part still starting; counted in the other two as well)
- ``gpulab_team_guarantee_milli{team}``, ``gpulab_team_burst_milli{team}``,
  ``gpulab_team_per_user_cap_milli{team}`` (teams with a cap)
- ``gpulab_team_workloads{team}``: notebook servers and jobs holding quota
- ``gpulab_user_gpu_milli{team,user}``: milli-GPUs held per user
- ``gpulab_profile_retired{profile}``: 1 for retired profiles, 0 otherwise
- ``gpulab_team_gpu_hours{team,quota}``: GPU-hours used in the last 24 hours
  (``quota`` = ``in-quota`` / ``over-quota``), from the usage history
- ``gpulab_team_idle_gpu_hours_before_reclaim{team}`` and
  ``gpulab_team_gpu_hours_freed{team}``: for the idle culler's reclaims of the
  last 24 hours, the idle GPU-hours it observed before reclaiming, and the
  GPU-hours the reclaims freed (until each user next held a GPU, or now)
"""

from __future__ import annotations

import logging
from datetime import timedelta

from prometheus_client import REGISTRY
from prometheus_client.core import GaugeMetricFamily

from hub_config.domain.usage import period_report, reclaim_figures
from hub_config.storage.db import utcnow
from spawner.runtime import get_runtime

log = logging.getLogger("gpulab.metrics")


class GPULabCollector:
    """Reads the hub process's runtime at scrape time."""

    def __init__(self, config=None):
        self.config = config

    def describe(self):
        # Nothing at registration time: the runtime may not exist yet.
        return []

    def collect(self):
        try:
            runtime = get_runtime(config=self.config)
        except Exception as e:  # a broken catalog must not break the hub's own metrics
            log.warning("gpulab metrics unavailable: %s", e)
            return
        held = GaugeMetricFamily(
            "gpulab_team_gpu_milli", "Milli-GPUs held by a team, by quota state", labels=["team", "state"]
        )
        guarantee = GaugeMetricFamily("gpulab_team_guarantee_milli", "Team guaranteed milli-GPUs", labels=["team"])
        burst = GaugeMetricFamily("gpulab_team_burst_milli", "Team burst limit in milli-GPUs", labels=["team"])
        cap = GaugeMetricFamily(
            "gpulab_team_per_user_cap_milli", "Most milli-GPUs one user may hold in the team", labels=["team"]
        )
        count = GaugeMetricFamily("gpulab_team_workloads", "Workloads holding team quota", labels=["team"])
        per_user = GaugeMetricFamily("gpulab_user_gpu_milli", "Milli-GPUs held per user", labels=["team", "user"])
        retired = GaugeMetricFamily("gpulab_profile_retired", "1 if the profile is retired", labels=["profile"])
        hours = GaugeMetricFamily(
            "gpulab_team_gpu_hours", "GPU-hours used by a team in the last 24 hours", labels=["team", "quota"]
        )
        ledger = runtime.ledger
        catalog = runtime.catalog
        users: dict[tuple[str, str], int] = {}
        for w in ledger.workloads():
            users[(w.team, w.user)] = users.get((w.team, w.user), 0) + w.milli
        for name in sorted(set(catalog.teams) | {t for t, _ in users}):
            u = ledger.usage(name)
            held.add_metric([name, "in-quota"], u.in_quota_milli)
            held.add_metric([name, "over-quota"], u.over_quota_milli)
            held.add_metric([name, "reserved"], u.reserved_milli)
            count.add_metric([name], u.workloads)
            team = catalog.team(name)
            if team is not None:
                guarantee.add_metric([name], team.guarantee_milli)
                burst.add_metric([name], team.burst_milli)
                if team.per_user_cap_milli is not None:
                    cap.add_metric([name], team.per_user_cap_milli)
        for (team_name, user), milli in sorted(users.items()):
            per_user.add_metric([team_name, user], milli)
        for slug, p in catalog.profiles.items():
            retired.add_metric([slug], 1 if p.retired else 0)
        yield from (held, guarantee, burst, cap, count, per_user, retired)
        recorder = runtime.usage
        if recorder is not None:
            now = utcnow()
            try:
                report = period_report(
                    runtime,
                    recorder.sessions,
                    recorder.settings,
                    now - timedelta(hours=24),
                    now,
                    bucket=timedelta(hours=24),
                    others=False,
                )
            except Exception as e:
                log.warning("gpulab usage metrics unavailable: %s", e)
            else:
                for t in report["teams"]:
                    hours.add_metric([t["team"], "in-quota"], t["in_quota_gpu_hours"])
                    hours.add_metric([t["team"], "over-quota"], t["burst_gpu_hours"])
                yield hours
            yield from reclaim_metrics(recorder, now)


def reclaim_metrics(recorder, now):
    """The two reclaim figures of the last 24 hours, per team (nothing without the culler's table)."""
    figures = reclaim_figures(recorder.sessions, now - timedelta(hours=24), now, now)
    if figures is None:
        return
    idle = GaugeMetricFamily(
        "gpulab_team_idle_gpu_hours_before_reclaim",
        "Idle GPU-hours the culler observed before its reclaims of the last 24 hours",
        labels=["team"],
    )
    freed = GaugeMetricFamily(
        "gpulab_team_gpu_hours_freed",
        "GPU-hours freed by the culler's reclaims of the last 24 hours (until each user next held a GPU, or now)",
        labels=["team"],
    )
    by_team: dict[str, tuple[float, float]] = {}
    for (team, _), (i, f) in figures.items():
        a, b = by_team.get(team, (0.0, 0.0))
        by_team[team] = (a + i, b + f)
    for team, (i, f) in sorted(by_team.items()):
        idle.add_metric([team], round(i, 6))
        freed.add_metric([team], round(f, 6))
    yield idle
    yield freed


_collector: GPULabCollector | None = None


def register(config=None) -> GPULabCollector:
    """Register (once per process; again replaces) gpulab's collector on the default registry."""
    global _collector
    if _collector is not None:
        try:
            REGISTRY.unregister(_collector)
        except KeyError:
            pass
    _collector = GPULabCollector(config)
    REGISTRY.register(_collector)
    return _collector
