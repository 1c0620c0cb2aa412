"""The spawn page's options form, rendered from policy choices (pure HTML).

Both spawners' forms and the benchmarks use this; KubeSpawner keeps its own
template but gets the same choices and texts.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from html import escape

from .idle import IdleFacts, idle_policy_text, idle_rule, idle_timeout_words, lifetime_rule
from .policy import PolicyError, ProfileChoice, quota_split_words, what_to_do
from .queue_form import queue_button_html
from .units import format_gpus

FORM_CSS = """
<style>
/* Compact cards, a team's profiles side by side: 3 teams of 4 profiles fit one 1400×900 screen,
   and at 800 px the grid drops to fewer columns instead of cutting anything. */
.gpulab-team { margin: 0 0 .5em 0; min-width: 0; }
.gpulab-team h3 { font-size: 1.05em; margin: .3em 0 .1em 0; }
.gpulab-team .gpulab-headroom { font-weight: normal; color: #555; font-size: .9em; margin-left: .5em; }
.gpulab-quota-split { color: #555; font-size: .85em; margin: 0 0 .3em 0; }
.gpulab-cards { display: grid; gap: .4em;
  grid-template-columns: repeat(auto-fill, minmax(max(15rem, calc((100% - 1.2em) / 4)), 1fr)); }
.gpulab-profile { display: block; border: 1px solid #ddd; border-radius: 4px; padding: .35em .6em; margin: 0;
  font-size: .85em; line-height: 1.35; min-width: 0; overflow-wrap: anywhere; }
/* An unavailable card stays readable (no opacity): its reason and what to do are what the user needs. */
.gpulab-profile.gpulab-unavailable { background: #f6f6f6; border-style: dashed; }
.gpulab-profile.gpulab-unavailable strong { color: #555; }
.gpulab-profile input[type=radio] { margin-right: .4em; }
.gpulab-profile select { max-width: 100%; }
.gpulab-gives { display: block; font-weight: 600; }
.gpulab-reason { color: #a94442; display: block; }
.gpulab-detail { color: #555; display: block; }
.gpulab-inventory { color: #555; margin-bottom: .2em; }
.gpulab-idle-rule { margin: 0 0 .4em 0; }
.gpulab-inventory.gpulab-declared { color: #8a6d3b; }
.gpulab-todo { display: block; }
.gpulab-profile.gpulab-kept { border-color: #a94442; border-width: 2px; }
.gpulab-start-again { margin: 0 0 .7em 0; }
[data-bs-theme=dark] .gpulab-profile { border-color: #495057; }
[data-bs-theme=dark] .gpulab-profile.gpulab-unavailable { background: #2b3035; }
[data-bs-theme=dark] .gpulab-detail, [data-bs-theme=dark] .gpulab-inventory,
[data-bs-theme=dark] .gpulab-team .gpulab-headroom, [data-bs-theme=dark] .gpulab-quota-split { color: #adb5bd; }
[data-bs-theme=dark] .gpulab-reason { color: #ea868f; }
[data-bs-theme=dark] .gpulab-profile.gpulab-unavailable strong { color: #adb5bd; }
</style>
"""


@dataclass(frozen=True)
class CardExtras:
    """What a card may add below its facts: the right-size line and the "Queue me" button (HTML)."""

    right_size: str = ""
    queue_button: str = ""


def choice_value(choice: ProfileChoice) -> str:
    return f"{choice.team.name}:{choice.profile.slug}"


def notice_html(notice: str) -> str:
    """The spawn page's first line: why the user's last server ended (e.g. a GPU reclaim)."""
    return f'<p class="gpulab-reclaimed" id="gpulab-reclaimed" role="status">{escape(notice)}</p>'


def start_again_label(choice: ProfileChoice) -> str:
    """ "Start again with 0.5 × H100 (team vision)"."""
    return f"Start again with {choice.profile.display_name} (team {choice.team.name})"


def find_choice(choices: Iterable[ProfileChoice], value: str) -> ProfileChoice | None:
    """The choice whose form value (``team:profile``) is ``value``."""
    return next((c for c in choices if choice_value(c) == value), None)


def _no_team_html(admin_page_url: str) -> str:
    if admin_page_url:
        return (
            '<p class="gpulab-reason" id="gpulab-no-team">You are not a member of any GPU team, so there is '
            f'nothing to start yet. As an admin, add yourself to a team on the <a href="{escape(admin_page_url)}">'
            "GPU admin page</a> (a team's <em>Users</em> field).</p>"
        )
    return (
        '<p class="gpulab-reason" id="gpulab-no-team">You are not a member of any GPU team. '
        "Ask an admin to add you.</p>"
    )


def render_options_form(
    choices: Iterable[ProfileChoice],
    inventory_note: str = "",
    inventory_declared: bool = False,
    notice: str = "",
    *,
    selected: str = "",
    refused: str = "",
    start_again_url: str = "",
    idle: IdleFacts | None = None,
    admin_contact: str = "",
    admin_page_url: str = "",
    gives: Callable[[ProfileChoice], Sequence[str]] | None = None,
    queue_url: str = "",
    queue_panel: str = "",
    right_size: Callable[[ProfileChoice], str] | None = None,
) -> str:
    """HTML for JupyterHub's spawn form: one radio per (team, profile).

    ``notice``: a sentence for the user first (why their last server ended).
    ``refused``: the ``team:profile`` a refused spawn posted, kept checked
    and marked even if now unavailable; else ``selected`` (the user's last
    choice) when it fits now; else the first available. ``start_again_url``:
    JupyterHub's spawn URL with ``selected`` in the query, shown as a
    one-click button when that choice is available. ``idle``: what the hub knows of
    its GPU idle culler (idle timeouts are shown as not enforced when it does not run).
    ``admin_contact``: whom to ask for quota; ``admin_page_url``: set for
    admins, linked when they are in no team. ``gives``: what a profile gives
    (:func:`spawner.core.profile_facts.profile_facts`), first on its card.
    The team's heading says what it holds and its per-user cap once, so the cards
    say only what differs between profiles. ``queue_url``: where a full GPU profile's
    "Queue me" posts (:mod:`.queue_form`; empty: no queue); ``queue_panel``: the caller's
    place in line, first on the page; ``right_size``: the line saying a smaller profile
    would have done (:mod:`.rightsize`), '' for none.
    """
    choices = list(choices)
    idle = idle or IdleFacts()
    parts = [FORM_CSS]
    if queue_panel:
        parts.append(queue_panel)
    if notice:
        parts.append(notice_html(notice))
    if inventory_note:
        cls = "gpulab-inventory gpulab-declared" if inventory_declared else "gpulab-inventory"
        parts.append(f'<p class="{cls}" id="gpulab-inventory">{escape(inventory_note)}</p>')
    if not choices:
        parts.append(_no_team_html(admin_page_url))
        return "\n".join(parts)
    kept = find_choice(choices, refused) if refused else None
    last = find_choice(choices, selected) if selected else None
    if last is not None and not last.available:
        last = None
    checked_choice = kept or last or next((c for c in choices if c.available), None)
    if last is not None and start_again_url and kept is None:
        parts.append(
            f'<p class="gpulab-start-again"><a class="btn btn-primary" id="gpulab-start-again" '
            f'href="{escape(start_again_url)}">{escape(start_again_label(last))}</a></p>'
        )
    if any(c.profile.is_gpu for c in choices):
        parts.append(f'<p class="gpulab-detail gpulab-idle-rule" id="gpulab-idle-rule">{escape(idle_rule(idle))}.</p>')
    by_team: dict[str, list[ProfileChoice]] = {}
    for c in choices:
        by_team.setdefault(c.team.name, []).append(c)
    for team_name, team_choices in by_team.items():
        team = team_choices[0].team
        heading_id = "gpulab-team-" + escape(team_name) + "-h"
        parts.append(f'<fieldset class="gpulab-team" data-team="{escape(team_name)}" aria-labelledby="{heading_id}">')
        cap = ""
        if team.per_user_cap_milli is not None:
            cap = (
                f"; at most {format_gpus(team.per_user_cap_milli)} GPUs per user, "
                f"you hold {format_gpus(team_choices[0].user_held_milli)}"
            )
        parts.append(
            f'<h3 id="{heading_id}">Team {escape(team.label)} <span class="gpulab-headroom">'
            f"{escape(team_choices[0].team_summary)} "
            f"(guaranteed {format_gpus(team.guarantee_milli)}{escape(cap)})</span></h3>"
        )
        usage = team_choices[0].team_usage
        if usage is not None:
            parts.append(f'<p class="gpulab-quota-split">{escape(quota_split_words(usage))}</p>')
        parts.append('<div class="gpulab-cards">')
        for c in team_choices:
            facts = list(gives(c)) if gives else []
            extra = CardExtras(
                right_size=right_size(c) if right_size is not None and c.profile.is_gpu else "",
                queue_button=queue_button_html(c, queue_url)
                if queue_url and not c.available and c.profile.is_gpu
                else "",
            )
            parts.extend(
                _profile_html(
                    c, choices, c is checked_choice, kept is c and not c.available, idle, admin_contact, facts, extra
                )
            )
        parts.append("</div></fieldset>")
    return "\n".join(parts)


def _profile_html(
    c: ProfileChoice,
    choices: list[ProfileChoice],
    checked: bool,
    refused: bool,
    idle: IdleFacts,
    admin_contact: str,
    facts: Sequence[str] = (),
    extra: CardExtras | None = None,
) -> list[str]:
    p = c.profile
    extra = extra or CardExtras()
    value = choice_value(c)
    rid = "gpulab-" + value.replace(":", "--")
    cls = "gpulab-profile" + ("" if c.available else " gpulab-unavailable") + (" gpulab-kept" if refused else "")
    # The radio's name is the profile's name; the rest of the card is its description.
    parts: list[tuple[str, str, str]] = []  # (id suffix, class, text)
    if len(p.images) > 1:  # the image select below lists the choices
        facts = [f for f in facts if not f.startswith("Images: ")]
    for n, fact in enumerate(facts):
        parts.append((f"gives{n}", "gpulab-gives" if n == 0 else "gpulab-detail gpulab-gives-more", fact))
    details = []
    if p.description:
        details.append(p.description)
    if c.effective_milli is not None:
        details.append(f"allocated as {format_gpus(c.effective_milli)} GPU")
    if c.available and c.over_quota:
        details.append("above the team guarantee: will run preemptible")
    if details:
        parts.append(("details", "gpulab-detail", " · ".join(details)))
    if p.is_gpu:  # the page says the idle rule once; the per-user cap is the team heading's
        limits = f"Idle timeout {idle_timeout_words(p, c.team)}"
        lifetime = lifetime_rule(p, c.team, idle)
        parts.append(("limits", "gpulab-detail gpulab-limits", f"{limits} · {lifetime}" if lifetime else limits))
    if extra.right_size:
        parts.append(("right-size", "gpulab-right-size", extra.right_size))
    if not c.available:
        parts.append(("reason", "gpulab-reason", f"Unavailable: {c.reason}"))
        parts.append(("todo", "gpulab-todo", what_to_do(c, choices, admin_contact)))
    described = " ".join(f"{rid}-{suffix}" for suffix, _, _ in parts)
    out = [
        f'<label class="{cls}" for="{escape(rid)}" data-choice="{escape(value)}">',
        f'<input type="radio" name="choice" id="{escape(rid)}" value="{escape(value)}"'
        f"{' checked' if checked else ''}{'' if c.available else ' disabled'}"
        f' aria-labelledby="{escape(rid)}-name"' + (f' aria-describedby="{escape(described)}"' if parts else "") + ">"
        f'<strong id="{escape(rid)}-name">{escape(p.display_name)}</strong>',
    ]
    for suffix, klass, text in parts:
        # "Queue me" ends the what-to-do line: no extra line on the card
        button = f" {extra.queue_button}" if suffix == "todo" and extra.queue_button else ""
        out.append(f'<span class="{klass}" id="{escape(rid)}-{suffix}">{escape(text)}{button}</span>')
    if len(p.images) > 1:
        out.append(
            f'<span class="gpulab-detail">Image <select name="image-{escape(value)}"'
            f' aria-label="Image for {escape(p.display_name)}">'
        )
        for img in p.images:
            out.append(f'<option value="{escape(img.slug)}">{escape(img.display_name)}</option>')
        out.append("</select></span>")
    out.append("</label>")
    return out


def limit_notes(c: ProfileChoice, idle: IdleFacts) -> list[str]:
    """The profile's idle timeout and the team's per-user cap, as the spawn forms show them."""
    notes = []
    policy = idle_policy_text(c.profile, c.team, idle)
    if policy:
        notes.append(policy)
    if c.profile.is_gpu and c.team.per_user_cap_milli is not None:
        notes.append(f"per-user cap in team {c.team.name}: {format_gpus(c.team.per_user_cap_milli)} GPUs")
    return notes


def refusal_sentence(what: str, reason: str, advice: str = "") -> str:
    """A refused spawn as the spawn page says it: "0.5 × H100 was not started: <reason>. <advice>"."""
    reason = reason.rstrip(". ")
    return f"{what} was not started: {reason}." + (f" {advice}" if advice else "")


def options_from_formdata(formdata: dict[str, list[str]]) -> dict[str, str]:
    """Turn the posted form into ``user_options`` (validated later by policy)."""
    unknown = sorted(k for k in formdata if k not in ("choice", "_xsrf") and not k.startswith("image-"))
    if unknown:
        raise PolicyError(
            "unknown form field(s): "
            + ", ".join(repr(k[:40]) for k in unknown[:5])
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
