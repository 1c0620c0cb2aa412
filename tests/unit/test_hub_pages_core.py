"""The pure parts behind the hub's pages: what to do about an unavailable profile,
idle-timeout words, progress words, the spawn form's selection, GPU model names,
and calendar-day usage buckets in a time zone."""

from __future__ import annotations

from datetime import datetime, timedelta
from itertools import pairwise

import pytest
from traitlets import TraitError

from hub_config.domain.usage import bucket_edges, period_report
from hub_config.domain.usage_records import GPULabUsage, UsageInterval
from spawner.core.catalog import catalog_from_dict
from spawner.core.catalog.sharing import known_gpu_models
from spawner.core.catalog.yaml_text import unknown_gpu_model
from spawner.core.form import refusal_sentence, render_options_form
from spawner.core.idle import IdleFacts, idle_policy_text, idle_timeout_words
from spawner.core.ledger import Ledger
from spawner.core.packer import GPUDevice
from spawner.core.policy import choices_for_user, quota_split_words, what_to_do
from spawner.core.progress import setup_messages
from spawner.runtime import GPULabRuntime

CATALOG = catalog_from_dict(
    {
        "inventory": [{"model": "H100-80GB", "count": 2, "memory_mib": 81559}],
        "profiles": [
            {"slug": "cpu", "display_name": "CPU only", "gpus": 0},
            {"slug": "q", "display_name": "0.25 × H100", "gpus": 0.25, "gpu_model": "H100-80GB", "idle_timeout": "4h"},
            {"slug": "half", "display_name": "0.5 × H100", "gpus": 0.5, "gpu_model": "H100-80GB"},
            {"slug": "one", "display_name": "1 × H100", "gpus": 1, "gpu_model": "H100-80GB", "idle_timeout": "1h"},
        ],
        "teams": [
            {
                "name": "vision",
                "users": ["alice", "bob"],
                "guarantee": 0.5,
                "burst": 1,
                "per_user_cap": 0.75,
                "idle_timeout": "30m",
            }
        ],
    }
)


def choices(held_by_bob: int = 0, held_by_alice: int = 0):
    ledger = Ledger(CATALOG.teams)
    if held_by_bob:
        ledger.reserve("notebook:bob/", "vision", "bob", held_by_bob)
    if held_by_alice:
        ledger.reserve("notebook:alice/", "vision", "alice", held_by_alice)
    return {c.profile.slug: c for c in choices_for_user(CATALOG, ledger, "alice")}, ledger


def test_what_to_do_names_a_smaller_fit_when_quota_frees_and_whom_to_ask():
    by_slug, _ = choices(held_by_bob=500)
    one = by_slug["one"]
    assert not one.available and one.blocked_by == "quota"
    assert what_to_do(one, by_slug.values(), "gpu-admins@example.org") == (
        "Start 0.5 × H100, which fits now, try again when quota frees (when someone in team vision stops a "
        "server), or ask gpu-admins@example.org about team vision's quota."
    )
    # Nothing smaller fits, no contact configured: "an admin".
    by_slug, _ = choices(held_by_bob=1000)
    assert what_to_do(by_slug["q"], by_slug.values()) == (
        "Try again when quota frees (when someone in team vision stops a server) or ask an admin about "
        "team vision's quota."
    )


def test_what_to_do_for_the_per_user_cap_says_stop_one_of_yours():
    by_slug, _ = choices(held_by_alice=500)
    half = by_slug["half"]  # fits the team's burst limit, not alice's cap of 0.75
    assert "GPUs one user may hold" in half.reason and half.user_held_milli == 500
    assert what_to_do(half, by_slug.values()) == (
        "Start 0.25 × H100, which fits now, stop your default server, which holds 0.5 GPU of team vision's "
        "GPUs, or ask an admin about team vision's quota."
    )


def test_what_to_do_names_the_users_own_server_that_fills_the_team():
    by_slug, ledger = choices(held_by_alice=500)
    ledger.reserve("notebook:alice/big", "vision", "alice", 250)
    ledger.reserve("notebook:bob/", "vision", "bob", 250)
    one = {c.profile.slug: c for c in choices_for_user(CATALOG, ledger, "alice")}["one"]
    assert one.own_servers == (("", 500), ("big", 250))  # alice's only, largest first
    assert what_to_do(one, [one]) == (
        "Stop your default server, which holds 0.5 GPU of team vision's GPUs, stop your server “big”, which "
        "holds 0.25 GPU of team vision's GPUs, try again when quota frees (when someone in team vision stops a "
        "server), or ask an admin about team vision's quota."
    )


def test_one_idle_sentence_timeout_warning_grace_keepalive_and_whether_the_culler_runs():
    team = CATALOG.team("vision")
    on = IdleFacts(culler_on=True, keepalive_uses=2, keepalive_seconds=3600)
    assert idle_policy_text(CATALOG.profile("one"), team, on) == (  # the team's 30m is shorter than the profile's
        "After 30m with the GPU idle you get a warning; after a grace period the server is stopped and its GPU "
        "released, unless you use the GPU or press “Keep my GPU” (1h more, 2 times per session)"
    )
    assert idle_timeout_words(CATALOG.profile("q"), None) == "4h"
    assert idle_timeout_words(CATALOG.profile("half"), None) == "the culler's default idle time"
    no_keep = IdleFacts(culler_on=True, keepalive_uses=0)
    assert idle_policy_text(CATALOG.profile("q"), None, no_keep).endswith("unless you use the GPU")
    assert idle_policy_text(CATALOG.profile("q"), None, IdleFacts()).endswith("(if this hub runs the GPU idle culler)")
    assert idle_policy_text(CATALOG.profile("q"), None, IdleFacts(culler_on=False)) == (
        "Idle timeout 4h, not enforced: the GPU idle culler is off on this hub, so the server keeps its GPU "
        "until it is stopped"
    )
    assert idle_policy_text(CATALOG.profile("cpu"), team, on) == ""


def test_form_keeps_a_refused_choice_and_offers_the_last_one_in_one_click():
    by_slug, _ = choices(held_by_bob=500)
    all_choices = list(by_slug.values())
    html = render_options_form(
        all_choices,
        refused="vision:one",
        selected="vision:half",
        start_again_url="/hub/spawn/alice?opt-choice=vision%3Ahalf",
    )
    assert 'value="vision:one" checked disabled' in html and "gpulab-kept" in html
    assert 'id="gpulab-start-again"' not in html  # after a refusal the form is about that choice
    html = render_options_form(
        all_choices, selected="vision:half", start_again_url="/hub/spawn/alice?opt-choice=vision%3Ahalf"
    )
    assert 'value="vision:half" checked' in html
    assert (
        '<a class="btn btn-primary" id="gpulab-start-again" href="/hub/spawn/alice?opt-choice=vision%3Ahalf">'
        "Start again with 0.5 × H100 (team vision)</a>"
    ) in html
    # A last choice that does not fit now is neither checked nor offered.
    html = render_options_form(all_choices, selected="vision:one", start_again_url="/x")
    assert 'id="gpulab-start-again"' not in html and 'value="vision:one" checked' not in html
    # Whom to ask is escaped like every other text.
    html = render_options_form(all_choices, admin_contact="<script>x</script>")
    assert "<script>x" not in html and "&lt;script&gt;x&lt;/script&gt;" in html


def test_form_for_an_admin_in_no_team_links_the_admin_page():
    html = render_options_form([], admin_page_url="/hub/gpulab/admin")
    assert 'href="/hub/gpulab/admin"' in html and "add yourself to a team" in html
    assert "Ask an admin to add you" in render_options_form([])


def test_refusal_sentence():
    assert refusal_sentence("1 × H100", "team vision holds 1 of its 1 GPU burst limit.", "Wait.") == (
        "1 × H100 was not started: team vision holds 1 of its 1 GPU burst limit. Wait."
    )


def test_progress_words_say_quota_devices_and_account():
    devices = {
        0: GPUDevice(0, "H100-80GB", 81559, source="declared"),
        1: GPUDevice(1, "H100-80GB", 81559, source="nvml"),
    }
    team = CATALOG.team("vision")
    lines = setup_messages(
        CATALOG.profile("half"), team, 500, False, [(1, 500)], devices, "as system account jupyter-alice"
    )
    assert lines == [
        "Reserved 0.5 GPU for 0.5 × H100 in team vision, within team vision's 0.5-GPU guarantee: in quota, "
        "not preemptible",
        "Devices: GPU 1 (H100-80GB): 0.5 of it, 39.8 GiB of its 79.6 GiB memory",
        "Starting JupyterLab as system account jupyter-alice with CUDA_VISIBLE_DEVICES set to this device",
    ]
    lines = setup_messages(CATALOG.profile("one"), team, 2000, True, [(0, 1000), (1, 1000)], devices, "x")
    assert "preemptible (it may be stopped" in lines[0]
    assert lines[1] == "Devices: GPU 0 (H100-80GB, declared): all of it; GPU 1 (H100-80GB): all of it"
    assert setup_messages(CATALOG.profile("cpu"), team, 0, False, [], devices, "as y")[0].endswith("no GPU (CPU only)")


def test_known_gpu_models_and_the_typo_message():
    assert known_gpu_models(CATALOG, kubernetes=False) == {"H100-80GB"}
    assert known_gpu_models(CATALOG, kubernetes=False, detected=["A100-40GB"]) == {"H100-80GB", "A100-40GB"}
    assert {"A100-80GB", "H100-80GB", "H200-141GB"} <= known_gpu_models(CATALOG, kubernetes=True)
    assert unknown_gpu_model("H100-80G", ["H100-80GB", "A100-40GB"]) == (
        "GPU model 'H100-80G' is not known here (did you mean 'H100-80GB'?); known: A100-40GB, H100-80GB"
    )


# -- calendar-day buckets --------------------------------------------------------


def test_day_buckets_start_at_local_midnight_and_follow_daylight_saving():
    # Europe/Berlin leaves summer time on 2026-10-25: that day has 25 hours.
    start, end = datetime(2026, 10, 24, 10, 0), datetime(2026, 10, 26, 10, 0)
    edges = bucket_edges(start, end, timedelta(days=1), "Europe/Berlin")
    assert edges == [
        datetime(2026, 10, 23, 22),
        datetime(2026, 10, 24, 22),
        datetime(2026, 10, 25, 23),
        datetime(2026, 10, 26, 23),
    ]
    assert [(b - a).total_seconds() / 3600 for a, b in pairwise(edges)] == [24, 25, 24]
    # UTC: midnight to midnight; hours: clock hours.
    assert bucket_edges(datetime(2026, 1, 1, 5, 30), datetime(2026, 1, 2), timedelta(days=1)) == [
        datetime(2026, 1, 1),
        datetime(2026, 1, 2),
    ]
    hours = bucket_edges(datetime(2026, 1, 1, 5, 30), datetime(2026, 1, 1, 8, 0), timedelta(hours=1), "Asia/Kolkata")
    assert hours == [
        datetime(2026, 1, 1, 5, 30),
        datetime(2026, 1, 1, 6, 30),
        datetime(2026, 1, 1, 7, 30),
        datetime(2026, 1, 1, 8, 30),
    ]  # +05:30: local clock hours


def test_period_report_buckets_by_calendar_day_in_the_configured_zone(tmp_path):
    from hub_config.storage.db import session_factory

    sessions = session_factory(url=f"sqlite:///{tmp_path / 'g.sqlite'}")
    with sessions.begin() as s:  # 1 GPU from 21:00 to 01:00 UTC = 22:00 to 02:00 in Berlin (winter)
        s.add(
            UsageInterval(
                key="a",
                team="vision",
                user="alice",
                profile="one",
                kind="notebook",
                gpu_milli=1000,
                gpu_model="H100-80GB",
                over_quota=False,
                started_at=datetime(2026, 1, 1, 21),
                ended_at=datetime(2026, 1, 2, 1),
            )
        )
    settings = GPULabUsage(time_zone="Europe/Berlin", currency="EUR")
    r = period_report(
        GPULabRuntime(CATALOG),
        sessions,
        settings,
        datetime(2026, 1, 1, 12),
        datetime(2026, 1, 3, 12),
        timedelta(days=1),
    )
    assert r["time_zone"] == "Europe/Berlin" and r["currency"] == "EUR"
    assert r["buckets"] == ["2026-01-01T00:00:00+01:00", "2026-01-02T00:00:00+01:00", "2026-01-03T00:00:00+01:00"]
    vision = next(t for t in r["teams"] if t["team"] == "vision")
    assert vision["series"] == pytest.approx([2.0, 2.0, 0.0])  # split at Berlin's midnight, not UTC's
    utc = period_report(
        GPULabRuntime(CATALOG),
        sessions,
        GPULabUsage(),
        datetime(2026, 1, 1, 12),
        datetime(2026, 1, 3, 12),
        timedelta(days=1),
    )
    assert next(t for t in utc["teams"] if t["team"] == "vision")["series"] == pytest.approx([3.0, 1.0, 0.0])


def test_unknown_time_zone_is_refused_at_start():
    with pytest.raises(TraitError, match="unknown time zone 'Mars/Olympus'"):
        GPULabUsage(time_zone="Mars/Olympus")


def test_the_team_header_splits_in_quota_borrowable_and_free():
    by_slug, ledger = choices(held_by_bob=250)  # vision: guarantee 0.5, burst 1
    usage = by_slug["q"].team_usage
    assert quota_split_words(usage) == (
        "in quota 0.25 of 0.5 · borrowable 0.5 above the guarantee (preemptible) · 0.75 free in all"
    )
    # Half a GPU more goes above the guarantee as a whole (preemptible): 0.25 of the guarantee
    # is still unused, and it is all that is free, so nothing is left to borrow.
    ledger.reserve("notebook:bob/more", "vision", "bob", 500)
    assert quota_split_words(ledger.usage("vision")) == (
        "in quota 0.25 of 0.5 · borrowable 0 above the guarantee (preemptible) · 0.25 free in all"
    )
    html = render_options_form(list(by_slug.values()))
    assert '<p class="gpulab-quota-split">in quota 0.25 of 0.5 · borrowable 0.5' in html
