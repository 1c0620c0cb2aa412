"""Which hub servers the culler judges, and how it finds their GPUs (idle_culler/targets.py)."""

from __future__ import annotations

from idle_culler.targets import DEVICE, POD, targets_from_users

PROFILES = {"cpu": {"gpu_milli": 0}, "h100-half": {"gpu_milli": 500}, "h100-2": {"gpu_milli": 2000}}


def server(state=None, options=None, ready=True, pending=None):
    return {
        "ready": ready,
        "pending": pending,
        "url": "/user/x/",
        "last_activity": None,
        "state": state or {},
        "user_options": options or {},
    }


def test_targets_from_kubespawner_local_spawner_and_form_choices():
    users = [
        {
            "name": "alice",
            "servers": {
                "": server({"pod_name": "jupyter-alice", "namespace": "jhub"}, {"team": "vision", "profile": "h100-2"}),
                "form": server(
                    {"pod_name": "jupyter-alice--form", "namespace": "team-nlp"}, {"profile": "nlp:h100-half"}
                ),
                "cpu": server({"pod_name": "jupyter-alice--cpu", "namespace": "jhub"}, {"profile": "vision:cpu"}),
                "starting": server({"pod_name": "p"}, {"profile": "vision:h100-2"}, ready=False, pending="spawn"),
            },
        },
        {
            "name": "bob",
            "servers": {
                "": server(
                    {
                        "pid": 4242,
                        "gpulab": {
                            "team": "vision",
                            "profile": "h100-2",
                            "milli": 2000,
                            "shares": [[3, 1000], [5, 1000]],
                        },
                    }
                ),
                "odd": server({}, {"team": "vision", "profile": "h100-half"}),  # GPU, but no pod and no devices
                "unknown": server({}, {"team": "vision", "profile": "retired-profile"}),
            },
        },
    ]
    targets, non_gpu, unmapped = targets_from_users(users, PROFILES, "box-1")
    by_key = {t.key: t for t in targets}
    assert sorted(by_key) == ["alice/", "alice/form", "bob/"]
    a = by_key["alice/"]
    assert (a.mapping, a.namespace, a.pod, a.gpu_milli, a.expected_devices) == (POD, "jhub", "jupyter-alice", 2000, 2)
    f = by_key["alice/form"]
    assert (f.team, f.profile, f.gpu_milli, f.expected_devices) == ("nlp", "h100-half", 500, 1)
    b = by_key["bob/"]
    assert (b.mapping, b.devices, b.pid, b.hostname) == (DEVICE, (3, 5), 4242, "box-1")
    assert b.expected_devices == {"box-1/gpu3", "box-1/gpu5"}
    assert non_gpu == ["alice/cpu"]
    assert sorted(unmapped) == ["bob/odd", "bob/unknown"]


def test_a_kernel_younger_than_the_idle_timeout_is_not_reclaimed():
    """Per kernel, only its own samples count: a GPU process started inside the window waits."""
    import time as _time

    from idle_culler.app import CycleBatch, GPUIdleCuller
    from idle_culler.nvml_source import process_started_at
    from idle_culler.targets import DEVICE, ServerTarget
    from spawner.core.idle import IdleVerdict, IdleWarning

    culler = GPUIdleCuller(config_file="", source="nvml", api_token="x")
    culler.initialize([])
    culler.hub = culler.make_hub_client()
    now = _time.time()
    target = ServerTarget(
        user="u",
        server="",
        team="t",
        profile="p",
        gpu_milli=1000,
        mapping=DEVICE,
        hostname="h",
        devices=(0,),
        url="/user/u/",
        full_url="http://127.0.0.1:1/user/u/",
    )
    verdict = IdleVerdict(True, "idle", "idle", {})
    warning = IdleWarning(now - 900, now - 1)
    for age, claims in ((60, 0), (7200, 1)):
        culler.utilisation._holders = {
            target.key: [{"pid": 123, "device": 0, "used_memory_bytes": 1, "kernel_id": "k1", "started_at": now - age}]
        }
        batch = CycleBatch()
        culler._plan_reclaim(batch, target, verdict, warning, 3600, "default", now)
        assert len(batch.claims) == claims, age
    assert batch.claims[0][0].action == "shutdown-kernel"
    # The start time of a real process: this one, which started before now.
    import os

    assert process_started_at(os.getpid()) <= _time.time()
