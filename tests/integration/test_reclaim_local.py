"""Reclaim executed on one server, with real processes: a team's in-quota job, held back
because borrowers of its department hold the GPUs, takes back the borrowed job of the team
furthest over its weighted share; that job is preempted, goes back to queued without its
share, and runs again once capacity is idle, as a new attempt (GPULAB_ATTEMPT 2).

A real JupyterHub (tests/support/hub.py) on a declared inventory of two GPUs; a department of
two GPUs over audio (guaranteed both), nlp (weight 1) and vision (weight 3), who borrow.
"""

from __future__ import annotations

import time

import pytest

from tests.support.hub import RunningHub
from tests.support.jobs import get_job, submit, user_token, wait_state

CATALOG = """
inventory:
  - {model: H100-80GB, count: 2, memory_mib: 81559}
profiles:
  - {slug: h100-1, display_name: "1 × H100", gpus: 1, gpu_model: H100-80GB}
departments:
  - {name: research, guarantee: 2, burst: 2}
teams:
  - {name: audio, users: [ada], guarantee: 2, burst: 2, department: research, allowed_profiles: [h100-1]}
  - {name: nlp, users: [nina], guarantee: 0, burst: 2, department: research, fair_share_weight: 1,
     allowed_profiles: [h100-1]}
  - {name: vision, users: [alice], guarantee: 0, burst: 2, department: research, fair_share_weight: 3,
     allowed_profiles: [h100-1]}
"""
EXTRA = """
c.GPULabJobs.poll_interval = 0.3
c.GPULabJobs.stop_grace_seconds = 3
"""
#: Prints its attempt, then works until its time is up (or it is stopped).
WORK = """\
import os, sys, time
print(f"attempt {os.environ['GPULAB_ATTEMPT']}", flush=True)
time.sleep(float(sys.argv[1]))
print("done", flush=True)
"""
USERS = ("ada", "nina", "alice")


@pytest.fixture(scope="module")
def hub(start_hub):
    h = start_hub(CATALOG, extra_config=EXTRA)
    for user in USERS:
        path = h.home(user) / "exp" / "work.py"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(WORK)
        h.give(user, path)
    return h


@pytest.fixture(scope="module")
def tokens(hub):
    return {u: user_token(hub, u) for u in USERS}


def log_of(hub: RunningHub, job: dict, token: str) -> str:
    r = hub.api("GET", f"/gpulab/jobs/{job['id']}/logs", token=token)
    assert r.status_code == 200, r.text
    return r.json()["text"]


def work(hub: RunningHub, token: str, seconds: float, name: str) -> dict:
    return submit(hub, token, script="exp/work.py", args=[str(seconds)], job_class="batch", profile="h100-1", name=name)


def test_in_quota_work_takes_back_the_job_of_the_team_furthest_over_its_weighted_share(hub, tokens):
    # nlp and vision each borrow one GPU: nlp's share 1 / 1, vision's 1 / 3
    nlp = work(hub, tokens["nina"], 30, "nlp-borrows")
    vision = work(hub, tokens["alice"], 12, "vision-borrows")
    assert nlp["over_quota"] and vision["over_quota"]
    for job, user in ((nlp, "nina"), (vision, "alice")):
        wait_state(hub, job["id"], "running", token=tokens[user])

    # audio's first GPU is in its guarantee: the department is full of borrowed work, so
    # nlp's job is taken back (furthest over its weighted share) and audio's is admitted
    audio = work(hub, tokens["ada"], 2, "audio-in-quota")
    assert audio["over_quota"] is False and audio["state"] == "queued"
    taken = wait_state(hub, nlp["id"], {"preempted", "queued"}, timeout=20, token=tokens["nina"])
    preempted = next(h for h in taken["history"] if h["state"] == "preempted")
    assert "reclaimed for team audio's batch job 'audio-in-quota'" in preempted["reason"], taken["history"]
    assert "team nlp (weight 1) is furthest over its weighted share" in preempted["reason"]
    assert get_job(hub, vision["id"], tokens["alice"])["state"] == "running"  # below its share: kept

    # audio's job runs on the GPU nlp's gave back; nlp's waits without a share meanwhile
    wait_state(hub, audio["id"], "running", timeout=30, token=tokens["ada"])
    queued = wait_state(hub, nlp["id"], "queued", timeout=20, token=tokens["nina"])
    assert queued["quota_held"] is False
    holdings = {w["key"] for w in hub.holdings()}
    assert f"job:{nlp['id']}" not in holdings and f"job:{audio['id']}" in holdings

    # when capacity is idle again nlp's job is admitted again and runs as attempt 2
    assert wait_state(hub, audio["id"], "succeeded", timeout=60, token=tokens["ada"])["state"] == "succeeded"
    final = wait_state(hub, nlp["id"], {"running", "succeeded"}, timeout=60, token=tokens["nina"])
    assert final["quota_held"] is True and final["over_quota"] is True
    states = [h["state"] for h in final["history"]]
    assert states[:5] == ["queued", "running", "preempted", "queued", "running"], final["history"]
    assert final["attempts"] == 2
    # The state says running as the runner starts; its first line follows a moment later.
    deadline = time.monotonic() + 30
    deadline_log = log_of(hub, final, tokens["nina"])
    while "attempt 2" not in deadline_log and time.monotonic() < deadline:
        time.sleep(0.5)
        deadline_log = log_of(hub, final, tokens["nina"])
    assert "attempt 2" in deadline_log, deadline_log
    vision_done = wait_state(hub, vision["id"], "succeeded", timeout=60, token=tokens["alice"])
    assert "preempted" not in [h["state"] for h in vision_done["history"]]
    r = hub.api("POST", f"/gpulab/jobs/{nlp['id']}/cancel", token=tokens["nina"])
    assert r.status_code == 200, r.text


def test_a_borrowing_request_takes_nothing_back(hub, tokens):
    """nlp borrowing past a full department is refused; it never preempts vision."""
    vision = [work(hub, tokens["alice"], 20, f"vision-{i}") for i in range(2)]
    for job in vision:
        wait_state(hub, job["id"], "running", token=tokens["alice"])
    r = hub.api(
        "POST",
        "/gpulab/jobs",
        token=tokens["nina"],
        data='{"script": "exp/work.py", "args": ["1"], "job_class": "batch", "profile": "h100-1"}',
    )
    assert r.status_code == 403 and "department research holds 2 of its 2 GPU burst limit" in r.text, r.text
    assert all(get_job(hub, j["id"], tokens["alice"])["state"] == "running" for j in vision)
    for job in vision:
        assert hub.api("POST", f"/gpulab/jobs/{job['id']}/cancel", token=tokens["alice"]).status_code == 200


def test_an_in_quota_notebook_takes_back_the_borrowed_job_and_starts_when_its_gpu_is_free(hub, tokens):
    """A notebook spawn within audio's guarantee: nlp's borrowed job (furthest over its share)
    is taken back, and the server starts on its GPU once the job's grace is over."""
    nlp = work(hub, tokens["nina"], 60, "nlp-again")
    vision = work(hub, tokens["alice"], 60, "vision-again")
    for job, user in ((nlp, "nina"), (vision, "alice")):
        wait_state(hub, job["id"], "running", token=tokens[user])
    r = hub.api("POST", "/users/ada/server", json={"team": "audio", "profile": "h100-1"})
    assert r.status_code in (201, 202), r.text
    hub.wait_server("ada", timeout=60)
    taken = get_job(hub, nlp["id"], tokens["nina"])
    preempted = next(h for h in taken["history"] if h["state"] == "preempted")
    assert "reclaimed for ada's server (1 × H100) in team audio" in preempted["reason"], taken["history"]
    assert get_job(hub, vision["id"], tokens["alice"])["state"] == "running"
    server = next(w for w in hub.holdings() if w["key"] == "notebook:ada/")
    assert server["over_quota"] is False and server["team"] == "audio"
    # the server stops: nlp's job is admitted again and runs its second attempt
    assert hub.api("DELETE", "/users/ada/server").status_code in (202, 204)
    again = wait_state(hub, nlp["id"], "running", timeout=60, token=tokens["nina"])
    assert again["attempts"] == 2 and again["quota_held"] is True
    for job, user in ((nlp, "nina"), (vision, "alice")):
        assert hub.api("POST", f"/gpulab/jobs/{job['id']}/cancel", token=tokens[user]).status_code == 200


def test_a_job_taken_back_stays_without_its_share_across_a_hub_restart(hub, tokens):
    nlp = work(hub, tokens["nina"], 60, "nlp-restart")
    vision = work(hub, tokens["alice"], 60, "vision-restart")
    for job, user in ((nlp, "nina"), (vision, "alice")):
        wait_state(hub, job["id"], "running", token=tokens[user])
    audio = work(hub, tokens["ada"], 60, "audio-restart")
    wait_state(hub, nlp["id"], "queued", timeout=30, token=tokens["nina"])
    wait_state(hub, audio["id"], "running", timeout=30, token=tokens["ada"])
    hub.restart()
    # the ledger rebuilt from the database: the job taken back holds nothing, the others do
    keys = {w["key"] for w in hub.holdings()}
    assert keys == {f"job:{vision['id']}", f"job:{audio['id']}"}, keys
    after = get_job(hub, nlp["id"], tokens["nina"])
    assert after["state"] == "queued" and after["quota_held"] is False
    assert after["reason"].startswith("waiting to be admitted again: department research holds 2 of its 2"), after
    for job, user in ((nlp, "nina"), (vision, "alice"), (audio, "ada")):
        assert hub.api("POST", f"/gpulab/jobs/{job['id']}/cancel", token=tokens[user]).status_code == 200
