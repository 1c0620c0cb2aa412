"""The embedded single-server hub, end to end over HTTP: real JupyterHub,
real configurable-http-proxy, real jupyterhub-singleuser (JupyterLab) processes."""

from __future__ import annotations

import html
import json
from pathlib import Path

import pytest

from spawner.local.accounts import can_switch_users
from tests.support.hub import RunningHub, process_env

CATALOG = """
inventory:
  - {model: H100-80GB, count: 2, memory_mib: 81559}
profiles:
  - {slug: h100-quarter, display_name: "0.25 × H100", gpus: 0.25, gpu_model: H100-80GB}
  - {slug: h100-half, display_name: "0.5 × H100", gpus: 0.5, gpu_model: H100-80GB,
     cpu: {guarantee: 2, limit: 4}, memory: {guarantee: 8G, limit: 16Gi}}
  - {slug: h100-1, display_name: "1 × H100", gpus: 1, gpu_model: H100-80GB}
  - {slug: secret, display_name: "Other team only", gpus: 0.25, teams: [other]}
teams:
  - {name: vision, users: [alice, bob], guarantee: 0.5, burst: 1, allowed_profiles: [h100-quarter, h100-half, h100-1]}
  - {name: other, users: [carol], guarantee: 1, burst: 1, allowed_profiles: [secret]}
"""


@pytest.fixture(scope="module")
def hub(start_hub):
    return start_hub(CATALOG)


def held(hub: RunningHub, team: str = "vision") -> int:
    return sum(w["gpu_milli"] for w in hub.holdings() if w["team"] == team)


def server_pid(hub: RunningHub, user: str, name: str = "") -> int:
    model = hub.api("GET", f"/users/{user}").json()
    return model["servers"][name]["state"]["pid"]


def cgroup_value(pid: int, controller: str, name: str) -> str:
    """A cgroup v1 interface file of the cgroup ``pid`` is in (these machines: v1)."""
    from spawner.local.cgroups import this_machine

    for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines():
        _, names, path = line.split(":", 2)
        if controller in names.split(","):
            root = this_machine().v1[controller]
            return (root / path.lstrip("/") / name).read_text().strip()
    raise AssertionError(f"pid {pid} is in no {controller} cgroup")


def test_login_page_explains_demo_login(hub):
    import requests

    page = requests.get(hub.url + "/hub/login", timeout=10).text
    assert "gpulab-demo-notice" in page
    assert "<code>alice</code>" in page and "gpulab-demo" in page


def test_spawn_half_gpu_sets_cuda_env(hub):
    alice = hub.login("alice")
    page = hub.spawn_page(alice).text
    assert "1 of 1 GPUs free for team vision" in page
    assert "declared in config" in page and "not detected" in page
    assert 'value="vision:h100-half"' in page
    assert 'value="other:secret"' not in page  # another team's profile is not offered

    r = hub.post_spawn(alice, "alice", {"choice": "vision:h100-half"})
    assert r.status_code in (302, 303), r.text[-2000:]
    hub.wait_server("alice")
    env = process_env(server_pid(hub, "alice"))
    assert env["CUDA_VISIBLE_DEVICES"] == "0"
    assert env["GPULAB_GPU_FRACTION"] == "0.5"
    assert env["GPULAB_GPU_MILLI"] == "500"
    assert env["GPULAB_GPU_MEMORY_MIB"] == str(81559 * 500 // 1000)
    assert env["GPULAB_TEAM"] == "vision"
    assert env["GPULAB_QUOTA"] == "in-quota" and env["GPULAB_PREEMPTIBLE"] == "0"
    assert env["XLA_PYTHON_CLIENT_MEM_FRACTION"] == "0.5"
    # The profile's CPU and memory reach the server the way JupyterHub passes them.
    assert env["CPU_LIMIT"] == "4.0" and env["CPU_GUARANTEE"] == "2.0"
    assert env["MEM_LIMIT"] == str(16 * 2**30) and env["MEM_GUARANTEE"] == str(8 * 10**9)
    # ... and, as root, the server's own cgroup enforces them (joined before it ran).
    if can_switch_users():
        pid = server_pid(hub, "alice")
        assert cgroup_value(pid, "memory", "memory.limit_in_bytes") == str(16 * 2**30)
        assert cgroup_value(pid, "cpu", "cpu.cfs_quota_us") == "400000"
        assert cgroup_value(pid, "pids", "pids.max") == "4096"
    assert held(hub) == 500


def test_over_guarantee_is_preemptible_and_burst_limit_refuses(hub):
    bob = hub.login("bob")
    page = html.unescape(hub.spawn_page(bob).text)
    assert "Unavailable: team vision holds 0.5 of its 1 GPU burst limit; this request needs 1" in page

    # Refused on the server too, with the reason on the page, and nothing starts.
    r = hub.post_spawn(bob, "bob", {"choice": "vision:h100-1"})
    assert r.status_code == 403
    assert "team vision holds 0.5 of its 1 GPU burst limit; this request needs 1" in html.unescape(r.text)
    assert not hub.api("GET", "/users/bob").json()["servers"]
    assert held(hub) == 500

    # Half a GPU more fits the burst limit but not the guarantee: preemptible.
    r = hub.post_spawn(bob, "bob", {"choice": "vision:h100-half"})
    assert r.status_code in (302, 303), r.text[-2000:]
    hub.wait_server("bob")
    env = process_env(server_pid(hub, "bob"))
    assert env["GPULAB_QUOTA"] == "over-quota" and env["GPULAB_PREEMPTIBLE"] == "1"
    # Best fit: bob's half shares device 0 with alice's half.
    assert env["CUDA_VISIBLE_DEVICES"] == "0"
    assert held(hub) == 1000


@pytest.mark.parametrize(
    "data, status",
    [
        ({"choice": "vision:no-such-profile"}, 400),
        ({"choice": "other:secret"}, 403),
        ({"choice": "vision:secret"}, 403),
        ({"choice": "vision:h100-quarter", "gpus": "-1"}, 400),
        ({"choice": "vision:h100-quarter", "gpu_milli": "99999999999"}, 400),
        ({"choice": "vision:h100-quarter", "image": "ubuntu"}, 400),
        ({"choice": "x" * 5000}, 400),
        ({}, 400),
    ],
)
def test_tampered_spawn_form_is_refused_and_reserves_nothing(hub, data, status):
    carol_or_alice = hub.login("alice")
    before = hub.holdings()
    r = hub.post_spawn(carol_or_alice, "alice", data, server_name="tamper")
    assert r.status_code == status, r.text[-1500:]
    assert hub.holdings() == before
    assert "tamper" not in hub.api("GET", "/users/alice").json()["servers"]


@pytest.mark.parametrize(
    "options",
    [
        {"team": "vision", "profile": "nope"},
        {"team": "other", "profile": "secret"},
        {"team": "vision", "profile": "h100-quarter", "gpus": -1},
        {"team": "vision", "profile": "h100-quarter", "gpu_milli": 10**12},
        {"team": ["vision"], "profile": "h100-quarter"},
    ],
)
def test_tampered_rest_spawn_is_refused_and_reserves_nothing(hub, options):
    before = hub.holdings()
    r = hub.api("POST", "/users/alice/servers/api-tamper", data=json.dumps(options))
    assert 400 <= r.status_code < 500, (r.status_code, r.text)
    assert hub.holdings() == before
    assert "api-tamper" not in hub.api("GET", "/users/alice").json()["servers"]


def test_hub_restart_counts_running_servers_again(hub):
    before = sorted((w["key"], w["gpu_milli"], w["over_quota"]) for w in hub.holdings())
    assert before, "previous tests left servers running"
    hub.restart()
    after = sorted((w["key"], w["gpu_milli"], w["over_quota"]) for w in hub.holdings())
    assert after == before
    # ... and the burst limit still holds after the restart.
    bob = hub.login("bob")
    r = hub.post_spawn(bob, "bob", {"choice": "vision:h100-quarter"}, server_name="more")
    assert r.status_code == 403
    assert "burst limit" in html.unescape(r.text)


def test_stopping_a_server_frees_its_share_at_once(hub):
    assert held(hub) == 1000
    r = hub.api("DELETE", "/users/alice/server")
    assert r.status_code in (202, 204), r.text
    hub.wait_server("alice", ready=False)
    assert held(hub) == 500
    bob = hub.login("bob")
    page = html.unescape(hub.spawn_page(bob, "second", "bob").text)
    assert "0.5 of 1 GPUs free for team vision" in page


def test_next_spawn_does_not_inherit_the_previous_profiles_limits(hub):
    alice = hub.login("alice")
    r = hub.post_spawn(alice, "alice", {"choice": "vision:h100-quarter"})
    assert r.status_code in (302, 303), r.text[-2000:]
    hub.wait_server("alice")
    env = process_env(server_pid(hub, "alice"))
    assert env["GPULAB_PROFILE"] == "h100-quarter"
    assert "CPU_LIMIT" not in env and "MEM_LIMIT" not in env


def test_me_endpoint_refuses_other_users_and_bad_input(hub):
    r = hub.api("POST", "/users/alice/tokens", json={"note": "me-test", "expires_in": 600})
    assert r.status_code == 201, r.text
    alice_token = r.json()["token"]
    mine = hub.api("GET", "/gpulab/me", token=alice_token)
    assert mine.status_code == 200
    assert mine.json()["user"] == "alice" and {t["name"] for t in mine.json()["teams"]} == {"vision"}
    assert hub.api("GET", "/gpulab/me", token=alice_token, params={"user": "bob"}).status_code == 403
    assert hub.api("GET", "/gpulab/me", token="not-a-token").status_code == 403
    assert hub.api("GET", "/gpulab/me", params={"user": "x" * 300}).status_code == 400
    assert hub.api("GET", "/gpulab/me", params={"user": "nobody"}).status_code == 404
