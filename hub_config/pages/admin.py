"""``/hub/gpulab/admin``: the GPU admin page, a JupyterHub page like its own.

Server-rendered from the same functions as the JSON API (teams, profiles,
usage, audit), charts as inline SVG. Edits on the page call the JSON API with
JupyterHub's XSRF token, as JupyterHub's own admin page does, so there is one
write path and it validates everything.
"""

from __future__ import annotations

import json
from html import escape
from typing import Any

from jupyterhub.handlers.base import BaseHandler
from jupyterhub.scopes import Scope
from tornado import web

from hub_config.api.admin import bucket_for, hub_known_gpu_models, parse_period, profile_view, team_view
from hub_config.config.scopes import ADMIN
from hub_config.domain.idle_records import idle_admin_view
from hub_config.domain.quota_tree_view import quota_tree
from hub_config.domain.usage import current_report, period_report
from hub_config.domain.usage_records import GPULabUsage
from hub_config.pages import budgets as budgets_page
from hub_config.pages import whatif as whatif_page
from hub_config.pages.budgets import admin_budget_banners
from spawner.admission import user_groups
from spawner.core.idle import idle_and_lifetime_words
from spawner.core.priority import BY_SHORT_NAME
from spawner.core.units import format_gpus
from spawner.runtime import GPULabRuntime, get_runtime

PERIODS = [("24h", "24 hours"), ("7d", "7 days"), ("30d", "30 days"), ("90d", "90 days")]
#: Colour per team in charts (Okabe-Ito, colour-blind safe; minus the two quota colours).
PALETTE = ["#009e73", "#cc79a7", "#56b4e9", "#d55e00", "#999999", "#f0e442"]
IN_QUOTA = "#0072b2"
OVER_QUOTA = "#e69f00"


def _num(x: float) -> str:
    return f"{x:.2g}" if x else "0"


def nice_ceiling(x: float) -> float:
    """The next 1, 2 or 5 times a power of ten at or above ``x`` (chart axis tops)."""
    import math

    power = 10 ** math.floor(math.log10(x))
    for step in (1, 2, 5, 10):
        if step * power >= x * (1 - 1e-9):
            return step * power
    return 10 * power


def hours(x: float) -> str:
    """GPU-hours for tables: three decimals, more for the tiny sums of a fresh hub."""
    return f"{x:.3f}" if x >= 0.1 or x == 0 else f"{x:.2g}"


def held_bar_svg(team: dict[str, Any], width: int = 360) -> str:
    """One team's holding now: in-quota and over-quota on a track up to the burst limit."""
    burst = max(team["burst_milli"], team["held_milli"], 1)
    scale = (width - 2) / burst
    h = 18
    inq, over = team["in_quota_milli"], team["over_quota_milli"]
    g = team["guarantee_milli"] * scale
    label = (
        f"{team['team']}: {format_gpus(team['held_milli'])} of {format_gpus(team['burst_milli'])} GPUs held "
        f"({format_gpus(inq)} in quota, {format_gpus(over)} over quota); guarantee "
        f"{format_gpus(team['guarantee_milli'])}"
    )
    return (
        f'<svg fill="currentColor" class="gpulab-held" width="{width}" height="{h + 14}" role="img" aria-label="{escape(label)}">'
        f"<title>{escape(label)}</title>"
        f'<rect x="1" y="1" width="{width - 2}" height="{h}" fill="none" stroke="#adb5bd"/>'
        f'<rect x="1" y="1" width="{inq * scale:.1f}" height="{h}" fill="{IN_QUOTA}"/>'
        f'<rect x="{1 + inq * scale:.1f}" y="1" width="{over * scale:.1f}" height="{h}" fill="{OVER_QUOTA}"/>'
        f'<line x1="{1 + g:.1f}" x2="{1 + g:.1f}" y1="0" y2="{h + 2}" stroke="currentColor" stroke-width="2"/>'
        f'<text x="1" y="{h + 13}" font-size="10">guarantee {format_gpus(team["guarantee_milli"])} (|) · '
        f"burst {format_gpus(team['burst_milli'])} · held {format_gpus(team['held_milli'])}</text></svg>"
    )


def history_svg(report: dict[str, Any], width: int = 760, height: int = 220) -> str:
    """GPU-hours per bucket, stacked by team."""
    teams = [t for t in report["teams"] if any(t["series"])]
    n = len(report["buckets"])
    totals = [sum(t["series"][i] for t in teams) for i in range(n)]
    top = nice_ceiling(max(totals + [0.001]))
    left, bottom, right = 64, 28, 8
    plot_w, plot_h = width - left - right, height - bottom - 10
    bar_w = plot_w / max(n, 1)
    hourly = report["bucket_seconds"] < 86400
    parts = [
        f'<svg fill="currentColor" class="gpulab-history" width="{width}" height="{height}" role="img" '
        f'aria-label="GPU-hours per {"hour" if hourly else "calendar day"} ({escape(report.get("time_zone", "UTC"))}), '
        'by team">'
    ]
    for frac in (0, 0.5, 1):
        y = 10 + plot_h * (1 - frac)
        parts.append(
            f'<line x1="{left}" x2="{width - right}" y1="{y:.1f}" y2="{y:.1f}" stroke="#dee2e6"/>'
            f'<text x="{left - 4}" y="{y + 3:.1f}" font-size="10" text-anchor="end">{_num(top * frac)}</text>'
        )
    parts.append(
        f'<text x="12" y="{10 + plot_h / 2:.0f}" font-size="10" transform="rotate(-90 12 '
        f'{10 + plot_h / 2:.0f})" text-anchor="middle">GPU-hours</text>'
    )
    for i in range(n):
        y = 10 + plot_h
        for ti, t in enumerate(report["teams"]):
            v = t["series"][i]
            if v <= 0:
                continue
            hgt = plot_h * v / top
            y -= hgt
            colour = PALETTE[ti % len(PALETTE)]
            parts.append(
                f'<rect x="{left + i * bar_w + 1:.1f}" y="{y:.1f}" width="{max(bar_w - 2, 1):.1f}" '
                f'height="{hgt:.1f}" fill="{colour}"><title>{escape(t["team"])} '
                f"{escape(report['buckets'][i])}: {_num(v)} GPU-hours</title></rect>"
            )
    step = max(1, n // 8)
    for i in range(0, n, step):
        label = report["buckets"][i][11:16] if hourly else report["buckets"][i][5:10]
        parts.append(
            f'<text x="{left + (i + 0.5) * bar_w:.1f}" y="{height - 12}" font-size="10" '
            f'text-anchor="middle">{escape(label)}</text>'
        )
    x = left
    for ti, t in enumerate(report["teams"]):
        colour = PALETTE[ti % len(PALETTE)]
        parts.append(
            f'<rect x="{x}" y="{height - 9}" width="9" height="9" fill="{colour}"/>'
            f'<text x="{x + 12}" y="{height - 1}" font-size="10">{escape(t["team"])}</text>'
        )
        x += 24 + 7 * len(t["team"])
    parts.append("</svg>")
    return "".join(parts)


def money(x: float, currency: str = "") -> str:
    """Cents, or four decimals for the small sums of a short period; with the currency when configured."""
    amount = f"{x:.2f}" if x >= 1 or x == 0 else f"{x:.4f}"
    return f"{amount} {currency}" if currency else amount


def cost_svg(report: dict[str, Any], width: int = 360) -> str:
    """Cost per team over the period, horizontal bars."""
    rows = report["teams"]
    top = max([t["cost"] for t in rows] + [0.0001])
    h = 22 * len(rows) + 4
    parts = [
        f'<svg fill="currentColor" class="gpulab-cost" width="{width}" height="{h}" role="img" aria-label="Cost per team">'
    ]
    for i, t in enumerate(rows):
        y = 2 + 22 * i
        w = (width - 170) * t["cost"] / top
        parts.append(
            f'<text x="0" y="{y + 14}" font-size="12">{escape(t["team"])}</text>'
            f'<rect x="90" y="{y + 2}" width="{w:.1f}" height="16" fill="{PALETTE[i % len(PALETTE)]}"/>'
            f'<text x="{94 + w:.1f}" y="{y + 14}" font-size="12">'
            f"{escape(money(t['cost'], report.get('currency', '')))}</text>"
        )
    parts.append("</svg>")
    return "".join(parts)


def _j(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False)


def describe_change(entry: dict[str, Any]) -> list[str]:
    """Readable ``key: old → new`` lines for an audit entry."""
    old, new = entry.get("old"), entry.get("new")
    if entry["action"].startswith("catalog.") and isinstance(new, dict):
        what = f"{len(new.get('teams', []))} team(s), {len(new.get('profiles', []))} profile(s)"
        return [("re-seeded" if old is not None else "seeded") + f" from the config file: {what}"]
    if isinstance(old, dict) and isinstance(new, dict):
        keys = [k for k in {**old, **new} if old.get(k) != new.get(k)]
        return [f"{k}: {_j(old.get(k))} → {_j(new.get(k))}" for k in keys]
    if new is not None:
        return ["created: " + _j(new)[:300]]
    if old is not None:
        return ["deleted (was " + _j(old)[:300] + ")"]
    return []


def profile_idle_words(runtime, slug: str) -> str:
    """A profile's idle timeout (and maximum lifetime) in each team that may use it ("vision: 2h; nlp: 30m"), as the users'
    own pages say it (:func:`spawner.core.idle.idle_timeout_words`); "not enforced" when the culler is off."""
    catalog = runtime.catalog
    profile = catalog.profile(slug)
    if profile is None or not profile.is_gpu:
        return ""
    words = "; ".join(
        f"{t.name}: {idle_and_lifetime_words(profile, t)}"
        for t in catalog.teams.values()
        if catalog.team_may_use(t, profile)
    )
    if runtime.idle_facts.culler_on is False:
        words += " (not enforced: the GPU idle culler is off on this hub)"
    return words


class GPULabAdminPageHandler(BaseHandler):
    """The admin page; needs the ``custom:gpulab:admin`` scope."""

    @web.authenticated
    async def get(self) -> None:
        # Not jupyterhub.scopes.needs_scope: it validates scope names at import,
        # before the hub has registered gpulab's custom scopes.
        if (self.parsed_scopes or {}).get(ADMIN) != Scope.ALL:
            raise web.HTTPError(403, f"the GPU admin page requires the {ADMIN} scope")
        runtime = get_runtime(config=self.settings.get("config"))
        period = self.get_argument("period", "7d")
        if period not in dict(PERIODS):
            raise web.HTTPError(400, f"period must be one of {', '.join(p for p, _ in PERIODS)}")
        start, end = parse_period(period, None, None)
        recorder = runtime.usage
        store = runtime.catalog_store
        report = (
            period_report(runtime, recorder.sessions, recorder.settings, start, end, bucket_for(end - start))
            if recorder is not None
            else None
        )
        now = current_report(runtime)
        audit = store.entries(limit=50)[0] if store is not None else []
        for entry in audit:
            entry["changes"] = describe_change(entry)
        teams = [team_view(runtime, n) for n in runtime.catalog.teams]
        user = self.current_user
        in_a_team = bool(runtime.catalog.teams_for(user.name, user_groups(user)))
        settings = recorder.settings if recorder is not None else GPULabUsage(config=self.settings.get("config"))
        now_by_team = {t["team"]: t for t in now}
        for t in teams:
            t["held_svg"] = held_bar_svg(now_by_team[t["name"]])
        html = await self.render_template(
            "gpulab-admin.html",
            teams=teams,
            tree=quota_tree(runtime.catalog, runtime.ledger),
            profiles=[
                {**profile_view(runtime.catalog, s), "idle": profile_idle_words(runtime, s)}
                for s in runtime.catalog.profiles
            ],
            priority_classes=list(BY_SHORT_NAME),
            now_usage=now,
            report=report,
            history_svg=history_svg(report) if report else "",
            cost_svg=cost_svg(report) if report else "",
            periods=PERIODS,
            period=period,
            audit=audit,
            prices=dict(runtime.catalog.prices),
            read_only=bool(store is not None and store.read_only),
            store_attached=store is not None,
            format_gpus=format_gpus,
            money=lambda x: money(x, settings.currency),
            currency=settings.currency,
            time_zone=settings.time_zone,
            gpu_models=gpu_model_choices(runtime),
            admin_in_no_team=not in_a_team,
            admin_name=user.name,
            hours=hours,
            period_label=dict(PERIODS)[period],
            idle=idle_admin_view(self.settings.get("config"), unattributed=self._unattributed()),
            budget_banners=admin_budget_banners(runtime),
        )
        self.finish(html)

    def _unattributed(self) -> list[dict]:
        """The servers the idle culler last said it cannot judge (the idle API keeps the list)."""
        servers = self.settings.get("gpulab_idle_unattributed")
        return (servers.to_json() or []) if servers is not None else []


handlers = [(r"/gpulab/admin/?", GPULabAdminPageHandler), *whatif_page.handlers, *budgets_page.handlers]


def gpu_model_choices(runtime: GPULabRuntime) -> list[dict[str, str]]:
    """The profile editor's GPU model choices: this hub's known models, labelled by where they come from."""
    inventory = {s.model for s in runtime.catalog.inventory}
    packer = runtime.packer
    detected = {d.model for d in packer.devices.values() if d.source == "nvml"} if packer is not None else set()
    out = []
    for model in sorted(hub_known_gpu_models(runtime)):
        where = "detected" if model in detected else "declared" if model in inventory else "known product"
        out.append({"model": model, "where": where})
    return out
