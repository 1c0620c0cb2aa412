"""The right-size line on a real hub: the spawn page's card and ``/gpulab/me`` (the JupyterLab
sidebar's source) read the user's own recorded sessions from gpulab's database.

There is no GPU here, so the sessions' samples are written into the usage history the
way the hub's NVML sampler writes them (``UsageRecorder.sample_utilisation``: one row per
workload per reconcile, utilisation and the devices' memory in use) -- the records a real
H100 would have left -- while the hub runs; everything that reads them is the hub's.
"""

from __future__ import annotations

import html

import pytest

from tests.support.hub import RunningHub
from tests.support.usage_history import record_sessions

CATALOG = """
inventory:
  - {model: H100-80GB, count: 2, memory_mib: 81920}
profiles:
  - {slug: h100, display_name: "1 × H100", gpus: 1, gpu_model: H100-80GB}
  - {slug: h100-half, display_name: "0.5 × H100", gpus: 0.5, gpu_model: H100-80GB}
  - {slug: h100-quarter, display_name: "0.25 × H100", gpus: 0.25, gpu_model: H100-80GB}
teams:
  - {name: vision, users: [alice, bob], guarantee: 2, burst: 2}
"""

LINE = (
    "Last 10 sessions of 1 × H100: peak 11 GiB of 80 GiB GPU memory, utilisation p95 18 %: 0.25 × H100 would have done"
)


@pytest.fixture(scope="module")
def hub(tmp_path_factory):
    h = RunningHub(tmp_path_factory.mktemp("right-size-hub"), CATALOG)
    try:
        h.start()
        record_sessions(h, "alice", "h100", 12, peak_mib=11 * 1024, util=(18.0, 9.0, 0.0))
        record_sessions(h, "bob", "h100", 12, peak_mib=None, util=(5.0,))  # no memory reported
        yield h
    finally:
        h.close()


def test_the_spawn_page_names_the_smaller_profile_with_its_evidence(hub):
    page = html.unescape(hub.spawn_page(hub.login("alice")).content.decode())
    assert LINE in page
    assert page.count("would have done") == 1  # on 1 × H100's card only: nothing smaller for the others
    # advice only: the page still preselects nothing it would not have (no choice was changed)
    bob = html.unescape(hub.spawn_page(hub.login("bob")).content.decode())
    assert "would have done" not in bob  # no GPU memory recorded: no hint, never a guessed peak


def test_the_sidebar_source_carries_the_same_line(hub):
    profiles = {p["slug"]: p for t in hub.me("alice")["teams"] for p in t["profiles"]}
    assert profiles["h100"]["right_size"] == LINE
    assert profiles["h100-quarter"]["right_size"] == ""
    assert all(p["right_size"] == "" for t in hub.me("bob")["teams"] for p in t["profiles"])
