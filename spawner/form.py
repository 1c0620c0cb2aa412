"""The spawn page's options form, rendered from policy choices (pure HTML).

Both spawners' forms and the benchmarks use this; KubeSpawner keeps its own
template but gets the same choices and texts.
"""

from __future__ import annotations

from collections.abc import Iterable
from html import escape

from .policy import PolicyError, ProfileChoice
from .units import format_gpus

FORM_CSS = """
<style>
.gpulab-team { margin: 0 0 1.2em 0; }
.gpulab-team h3 { font-size: 1.1em; margin: .4em 0; }
.gpulab-team .gpulab-headroom { font-weight: normal; color: #555; font-size: .9em; margin-left: .5em; }
.gpulab-profile { display: block; border: 1px solid #ddd; border-radius: 4px; padding: .5em .8em; margin: .3em 0; }
.gpulab-profile.gpulab-unavailable { opacity: .6; background: #f6f6f6; }
.gpulab-profile input[type=radio] { margin-right: .6em; }
.gpulab-reason { color: #a94442; display: block; margin-left: 1.8em; font-size: .9em; }
.gpulab-detail { color: #555; display: block; margin-left: 1.8em; font-size: .9em; }
.gpulab-inventory { color: #555; margin-bottom: 1em; }
.gpulab-inventory.gpulab-declared { color: #8a6d3b; }
</style>
"""


def choice_value(choice: ProfileChoice) -> str:
    return f"{choice.team.name}:{choice.profile.slug}"


def notice_html(notice: str) -> str:
    """The spawn page's first line: why the user's last server ended (e.g. a GPU reclaim)."""
    return f'<p class="gpulab-reclaimed" id="gpulab-reclaimed" role="status">{escape(notice)}</p>'


def render_options_form(choices: Iterable[ProfileChoice], inventory_note: str = "",
                        inventory_declared: bool = False, notice: str = "") -> str:
    """HTML for JupyterHub's spawn form: one radio per (team, profile).

    ``notice``: a sentence for the user first (why their last server ended).
    """
    choices = list(choices)
    parts = [FORM_CSS]
    if notice:
        parts.append(notice_html(notice))
    if inventory_note:
        cls = "gpulab-inventory gpulab-declared" if inventory_declared else "gpulab-inventory"
        parts.append(f'<p class="{cls}" id="gpulab-inventory">{escape(inventory_note)}</p>')
    if not choices:
        parts.append('<p class="gpulab-reason">You are not a member of any GPU team. Ask an admin to add you.</p>')
        return "\n".join(parts)
    first_available = next((c for c in choices if c.available), None)
    by_team: dict[str, list[ProfileChoice]] = {}
    for c in choices:
        by_team.setdefault(c.team.name, []).append(c)
    for team_name, team_choices in by_team.items():
        team = team_choices[0].team
        parts.append(f'<fieldset class="gpulab-team" data-team="{escape(team_name)}">')
        parts.append(
            f'<h3>Team {escape(team.label)} <span class="gpulab-headroom">'
            f'{escape(team_choices[0].team_summary)} '
            f'(guaranteed {format_gpus(team.guarantee_milli)})</span></h3>'
        )
        for c in team_choices:
            p = c.profile
            value = choice_value(c)
            rid = "gpulab-" + value.replace(":", "--")
            checked = " checked" if c is first_available else ""
            disabled = "" if c.available else " disabled"
            cls = "gpulab-profile" + ("" if c.available else " gpulab-unavailable")
            parts.append(f'<label class="{cls}" for="{escape(rid)}">')
            parts.append(
                f'<input type="radio" name="choice" id="{escape(rid)}" value="{escape(value)}"{checked}{disabled}>'
                f'<strong>{escape(p.display_name)}</strong>'
            )
            details = []
            if p.description:
                details.append(p.description)
            if c.effective_milli is not None:
                details.append(f"allocated as {format_gpus(c.effective_milli)} GPU")
            if c.capacity_summary:
                details.append(c.capacity_summary)
            if c.available and c.over_quota:
                details.append("above the team guarantee: will run preemptible")
            if details:
                parts.append(f'<span class="gpulab-detail">{escape(" · ".join(details))}</span>')
            if not c.available:
                parts.append(f'<span class="gpulab-reason">Unavailable: {escape(c.reason)}</span>')
            if len(p.images) > 1:
                parts.append(f'<span class="gpulab-detail">Image: <select name="image-{escape(value)}"'
                             f' aria-label="Image for {escape(p.display_name)}">')
                for img in p.images:
                    parts.append(f'<option value="{escape(img.slug)}">{escape(img.display_name)}</option>')
                parts.append("</select></span>")
            parts.append("</label>")
        parts.append("</fieldset>")
    return "\n".join(parts)


def options_from_formdata(formdata: dict[str, list[str]]) -> dict[str, str]:
    """Turn the posted form into ``user_options`` (validated later by policy)."""
    unknown = sorted(k for k in formdata if k not in ("choice", "_xsrf") and not k.startswith("image-"))
    if unknown:
        raise PolicyError(
            "unknown form field(s): " + ", ".join(repr(k[:40]) for k in unknown[:5])
            + "; GPU size, resources and priority come from the profile"
        )
    raw = formdata.get("choice") or []
    if len(raw) != 1 or not isinstance(raw[0], str) or ":" not in raw[0]:
        raise PolicyError("choose exactly one profile")
    team, _, profile = raw[0].partition(":")
    options = {"team": team, "profile": profile}
    image = formdata.get(f"image-{raw[0]}")
    if image:
        options["image"] = image[0]
    return options
