"""Recorded sessions in a running hub's usage history, as its NVML sampler writes them.

There is no GPU on these machines: a test that needs a user's past sessions writes the rows
``UsageRecorder.observe`` (one interval per session) and ``UsageRecorder.sample_utilisation``
(one sample per reconcile: the devices' utilisation and GPU memory in use) would have left,
into the hub's own gpulab database; everything that reads them is the hub's.
"""

from __future__ import annotations

from datetime import timedelta

from hub_config.domain.usage_records import UsageInterval, UtilisationSample
from hub_config.storage.db import session_factory, utcnow
from tests.support.hub import RunningHub


def record_sessions(
    hub: RunningHub, user: str, profile: str, n: int, peak_mib: float | None, util: tuple, team: str = "vision"
) -> None:
    """``n`` finished one-hour sessions of ``user`` on ``profile`` (1 GPU each), the newest ending an
    hour ago; each with one sample per value of ``util``, the first at ``peak_mib`` of GPU memory
    and the rest at half (``None``: the source reported no memory)."""
    sessions = session_factory(url=f"sqlite:///{hub.state_dir / 'gpulab.sqlite'}")
    now = utcnow()
    with sessions.begin() as s:
        for i in range(n):
            start = now - timedelta(hours=2 * (n - i))
            end = start + timedelta(hours=1)
            key = f"notebook:{user}/"
            s.add(
                UsageInterval(
                    key=key,
                    team=team,
                    user=user,
                    profile=profile,
                    kind="notebook",
                    gpu_milli=1000,
                    gpu_model="H100-80GB",
                    over_quota=False,
                    started_at=start,
                    ended_at=end,
                )
            )
            for j, u in enumerate(util):
                memory = None if peak_mib is None else peak_mib * (1 if j == 0 else 0.5)
                s.add(
                    UtilisationSample(
                        at=start + timedelta(minutes=10 * (j + 1)),
                        key=key,
                        team=team,
                        user=user,
                        util_pct=u,
                        memory_mib=memory,
                    )
                )
