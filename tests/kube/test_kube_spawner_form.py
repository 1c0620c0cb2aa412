"""GPUKubeSpawner's spawn form on the real control plane: the choices it offers and why,
tampered options and forms refused before any object exists, the culler's reclaim
notice and "Start again". Same spawners and fixtures as :mod:`tests.test_kube_spawner`.
"""

from __future__ import annotations

import re

import pytest
from jupyterhub.utils import maybe_future
from tornado.web import HTTPError

from spawner.runtime import get_runtime
from tests.support.kube_spawner import spawner_config, spawner_for

TAMPERED = [
    ({"team": "vision", "profile": "h100-9000"}, 400, "unknown profile"),
    ({"team": "vision", "profile": "nlp-only"}, 403, "may not use profile"),
    ({"team": "nlp", "profile": "h100-1"}, 403, "not a member of team 'nlp'"),
    ({"team": "vision", "profile": "h100-half", "gpus": "-1"}, 400, "unknown spawn option"),
    (
        {"team": "vision", "profile": "h100-half", "priority_class_name": "gpulab-production"},
        400,
        "unknown spawn option",
    ),
    ({"team": "vision", "profile": "h100-half", "image": "evil/miner:latest"}, 400, "offers no image"),
    ({"team": "vision", "profile": "h" * 100_000}, 400, "longer than"),
    ({"team": "vision", "profile": 5}, 400, "must be a string"),
    ({"team": "vision", "profile": ["h100-half", "h100-1"]}, 400, "must be a string"),
    ({"team": "vision", "profile": None}, 400, "choose a profile"),
]


@pytest.mark.parametrize("options,status,text", TAMPERED)
async def test_tampered_options_are_refused_before_any_object(api, options, status, text):
    s = spawner_for(spawner_config(api.release), "bob", options)
    with pytest.raises(HTTPError) as e:
        await s.start()
    assert e.value.status_code == status
    assert text in e.value.jupyterhub_message
    await s.stop()
    assert api.count("create") == 0 and api.count("delete") == 0
    assert get_runtime().ledger.workloads() == []


@pytest.mark.parametrize(
    "formdata,status,text",
    [
        ({"profile": ["vision:h100-9000"]}, 400, "unknown profile"),
        ({"profile": ["nlp:h100-1"]}, 403, "not a member"),
        ({"profile": ["vision:h100-half"], "gpus": ["-1"]}, 400, "unknown spawn option"),
        ({"profile": ["vision:h100-half"], "profile-option-vision:h100-half--image": ["evil"]}, 400, "offers no image"),
        (
            {"profile": ["vision:h100-half"], "profile-option-vision:h100-half--gpus": ["8"]},
            400,
            "unknown spawn option",
        ),
        ({"profile": ["vision:h100-half", "vision:h100-1"]}, 400, "must be a string"),
    ],
)
async def test_tampered_form_is_refused(api, formdata, status, text):
    s = spawner_for(spawner_config(api.release), "bob")
    with pytest.raises(HTTPError) as e:
        await maybe_future(s.run_options_from_form({**formdata, "_xsrf": ["x"]}))
    assert e.value.status_code == status and text in e.value.jupyterhub_message
    assert api.count("create") == 0


async def test_form_parses_the_chosen_profile_and_image(api):
    s = spawner_for(spawner_config(api.release), "alice")
    options = await maybe_future(
        s.run_options_from_form(
            {
                "_xsrf": ["x"],
                "profile": ["vision:h100-half"],
                "profile-option-vision:h100-half--image": ["base"],
                "profile-option-nlp:h100-1--image": ["ignored"],
            }
        )
    )
    assert options == {"team": "vision", "profile": "h100-half", "image": "base"}


async def test_form_shows_availability_and_disables_with_reason(api):
    holder = spawner_for(spawner_config(api.release), "alice", {"team": "nlp", "profile": "h100-1"})
    await holder.start()
    s = spawner_for(spawner_config(api.release), "alice")
    html = await s._render_options_form_dynamically(s)
    # alice is in two teams; nlp holds 1 of its 2 GPU burst limit.
    assert "1 of 2 GPUs free for team nlp" in html
    assert "3 of 3 GPUs free for team vision" in html
    assert "2 of 4 time-slices of one H100-80GB (0.5 GPU)" in html
    assert re.search(r'value="nlp:h100-2-whole"\s+disabled', html)
    assert "Unavailable: team nlp holds 1 of its 2 GPU burst limit; this request needs 2" in html
    # ... and what to do about it, as on the single-server form: alice's own server is what
    # holds team nlp's GPU.
    assert (
        "Start 1 × H100, which fits now, stop your default server, which holds 1 GPU of team nlp&#39;s "
        "GPUs, try again when quota frees (when someone in team nlp stops a server), or ask an admin "
        "about team nlp&#39;s quota."
    ) in html
    assert not re.search(r'value="vision:h100-2-whole"\s+disabled', html)
    assert "starts above the team guarantee, so it is preemptible" in html  # nlp's guarantee is used
    assert "0.5 GPU (rounded up" in html  # the 0.3 profile shows what it really gets
    assert not re.search(r'value="vision:h100-half"\s+disabled', html)
    assert 'name="profile-option-vision:h100-half--image"' in html
    # What each profile gives, first on its card (no inventory here: the model's name gives its memory).
    assert "0.5 × H100-80GB · 40 GB GPU memory" in html  # 0.3 asked, 0.5 (2 of 4 time-slices) given
    assert "2 × H100-80GB · 160 GB GPU memory" in html
    assert "1 CPU guaranteed, up to 4 · 7.5 GiB RAM guaranteed, up to 14.9 GiB" in html  # 8G / 16G
    assert "Images: PyTorch, Base" in html
    assert '<p class="gpulab-note gpulab-gives">No GPU</p>' in html
    await holder.stop()


async def test_user_in_no_team_sees_why_and_cannot_spawn(api):
    s = spawner_for(spawner_config(api.release), "mallory", {"profile": "h100-half"})
    html = await s._render_options_form_dynamically(s)
    assert "You are not a member of any GPU team; ask an admin to add you." in html
    assert 'name="profile"' not in html
    with pytest.raises(HTTPError) as e:
        await s.start()
    assert e.value.status_code == 403 and "mallory is not a member of any GPU team" in e.value.jupyterhub_message
    assert api.count("create") == 0


async def test_form_says_when_the_idle_culler_reclaimed_the_last_server(api, tmp_path):
    import json as _json
    import time as _time

    from hub_config.config.runtime import HOOK
    from hub_config.domain.idle_records import IdleEventRow
    from hub_config.storage.db import from_epoch, session_factory

    config = spawner_config(api.release)
    config.GPULabDB.db_url = f"sqlite:///{tmp_path / 'gpulab.sqlite'}"
    config.GPULab.runtime_hooks = [HOOK]  # what configure_gpulab adds: the hub reads the culler's records
    s = spawner_for(config, "carol")
    assert "gpulab-reclaimed" not in await s._render_options_form_dynamically(s)
    now = _time.time()
    with session_factory(config=config)() as session:
        session.add(
            IdleEventRow(
                at=from_epoch(now),
                kind="reclaim",
                user="carol",
                server="",
                team="vision",
                profile="h100-half",
                gpu_milli=500,
                reason="idle",
                action="stop-server",
                evidence=_json.dumps({"idle_since": now - 75 * 60, "devices": {"n/gpu0": [{"max": 0.0}]}}),
            )
        )
        session.commit()
    html = await s._render_options_form_dynamically(s)
    assert 'id="gpulab-reclaimed"' in html
    assert "Your GPU was reclaimed at" in html and "after 75 minutes at 0 %" in html and "start again" in html
    assert 'id="kubespawner-profiles-list"' in html  # KubeSpawner's form follows


async def test_a_started_choice_is_remembered_for_start_again(api, tmp_path):
    """The hub home's "Start again" link (``?opt-choice=team:profile``) works on Kubernetes too:
    the form accepts the choice, and a started server records it in gpulab's database."""
    from hub_config.config.runtime import HOOK

    config = spawner_config(api.release)
    config.GPULabDB.db_url = f"sqlite:///{tmp_path / 'gpulab.sqlite'}"
    config.GPULab.runtime_hooks = [HOOK]
    s = spawner_for(config, "alice")
    runtime = get_runtime(config=config)
    assert runtime.last_choice("alice") is None
    s.user_options = s.options_from_form({"choice": ["vision:h100-half"]})
    assert (s.user_options["team"], s.user_options["profile"]) == ("vision", "h100-half")
    with pytest.raises(HTTPError):  # still one way to choose: an unknown field is refused
        s.options_from_form({"choice": ["vision:h100-half"], "gpus": ["8"]})
    await s.start()
    try:
        # the image that started: the profile's default, as resolved at start
        assert runtime.last_choice("alice") == {"team": "vision", "profile": "h100-half", "image": "torch"}
    finally:
        await s.stop()
