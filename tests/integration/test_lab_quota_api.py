"""What the lab sidebar and the job dialog read from the hub (``GET /hub/api/gpulab/me``),
against a real hub running real papermill jobs on a declared one-GPU inventory:

- the team quota counts a running batch job beside the notebook servers;
- each profile says, per job class, whether a job of that class would be
  admitted now (a training job is never offered what only a burst would fit);
- the job record carries the submit and start times and its state history.
"""

from __future__ import annotations

import time

import pytest

from tests.support.jobs import submit, user_token, wait_state, write_notebook

CATALOG = """
inventory:
  - {model: H100-80GB, count: 1, memory_mib: 81559}
profiles:
  - {slug: h100-quarter, display_name: "0.25 × H100", gpus: 0.25, gpu_model: H100-80GB, idle_timeout: 30m}
  - {slug: h100-half, display_name: "0.5 × H100", gpus: 0.5, gpu_model: H100-80GB}
teams:
  - {name: vision, users: [alice], guarantee: 0.5, burst: 1, allowed_profiles: [h100-quarter, h100-half]}
"""

EXTRA = """
c.GPULabJobs.poll_interval = 0.3
c.GPULabJobs.stop_grace_seconds = 2
"""


@pytest.fixture(scope="module")
def hub(start_hub):
    h = start_hub(CATALOG, extra_config=EXTRA)
    h.give("alice", write_notebook(h.home("alice") / "calc.ipynb"))
    return h


def vision(me: dict) -> dict:
    return {t["name"]: t for t in me["teams"]}["vision"]


def profile(team: dict, slug: str) -> dict:
    return {p["slug"]: p for p in team["profiles"]}[slug]


def test_running_batch_job_counts_in_the_quota_and_limits_training(hub):
    token = user_token(hub, "alice")
    before = vision(hub.me("alice"))
    assert (before["held_milli"], before["in_quota_milli"]) == (0, 0)
    half = profile(before, "h100-half")
    assert half["job_classes"]["training"] == {"available": True, "over_quota": False, "reason": ""}

    job = submit(
        hub,
        token,
        notebook="calc.ipynb",
        job_class="batch",
        profile="h100-quarter",
        parameters={"sleep_seconds": 60},
        time_limit_seconds=300,
    )
    running = wait_state(hub, job["id"], "running", token=token)

    # The sidebar's quota bar: the 0.25-GPU batch job is held, in quota.
    team = vision(hub.me("alice"))
    assert team["held_milli"] == 250 and team["in_quota_milli"] == 250, team
    assert team["free_milli"] == 750 and team["user_held_milli"] == 250
    assert team["summary"] == "0.75 of 1 GPUs free for team vision"
    holdings = hub.me("alice")["holdings"]
    assert [(h["kind"], h["gpu_milli"], h["state"]) for h in holdings] == [("job", 250, "running")]

    # 0.25 held + 0.5 asked > the 0.5 guarantee: a batch job would burst, a training job is refused.
    half = profile(team, "h100-half")
    assert half["job_classes"]["batch"] == {"available": True, "over_quota": True, "reason": ""}
    training = half["job_classes"]["training"]
    assert training["available"] is False and "guarantee" in training["reason"], training
    quarter = profile(team, "h100-quarter")
    assert quarter["job_classes"]["training"]["available"] is True
    # The idle policy the sidebar shows for the session's profile.
    assert quarter["idle_timeout_seconds"] == 1800 and half["idle_timeout_seconds"] is None

    # The job's record, as the jobs list shows it.
    assert running["created_at"] and running["started_at"]
    assert [h["state"] for h in running["history"]] == ["queued", "running"]

    r = hub.api("POST", f"/gpulab/jobs/{job['id']}/cancel", token=token, json={})
    assert r.status_code == 200, r.text
    wait_state(hub, job["id"], "cancelled", token=token)
    deadline = time.monotonic() + 20
    while vision(hub.me("alice"))["held_milli"] and time.monotonic() < deadline:
        time.sleep(0.2)
    assert vision(hub.me("alice"))["held_milli"] == 0
