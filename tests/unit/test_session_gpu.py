"""Kubernetes sessions' GPU use from Prometheus: the one query per session, the parsing of its
answer, the coverage rule, and the recorder's states (pending while Prometheus is away,
measured or unknown after). Real SQLite files and core objects; Prometheus itself is the
bed test's (tests/kube/test_kube_cluster_right_size.py): here :meth:`SessionGPURecorder.read`
is replaced by the answers a test gives, which the parsing tests show are Prometheus' shape.
"""

from __future__ import annotations

import asyncio
import json
import math
from datetime import timedelta

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from sqlalchemy import select

from hub_config.domain.right_size import hint_for
from hub_config.domain.session_gpu import (
    MEASURED,
    PENDING,
    UNKNOWN,
    GPULabSessionMetrics,
    SessionGPU,
    SessionGPURecorder,
    judge,
)
from hub_config.domain.session_gpu_query import (
    STATS,
    TAG,
    PrometheusUnavailable,
    SessionReading,
    fetch_answer,
    parse_answer,
    pod_series,
    promql_string,
    session_query,
    valid_name,
)
from hub_config.domain.usage_records import GPULabUsage, UsageInterval, UsageRecorder
from hub_config.storage.db import session_factory, utcnow
from spawner.core.catalog.yaml_text import catalog_from_yaml
from spawner.core.rightsize import SessionUse, evidence_p95, percentile
from spawner.runtime import KUBERNETES, GPULabRuntime

# No memory declared for the model: "of 80 GiB" comes from the GPUs' own frame buffer.
CATALOG = catalog_from_yaml("""
profiles:
  - {slug: h100, display_name: "1 × H100", gpus: 1, gpu_model: H100-80GB}
  - {slug: h100-quarter, display_name: "0.25 × H100", gpus: 0.25, gpu_model: H100-80GB}
teams:
  - {name: vision, users: [alice], guarantee: 4, burst: 4}
""")
FB_TOTAL = 81559.0  # an H100 80GB's used + free frame buffer, MiB (NVML)


def answer(**stats: float | str) -> bytes:
    result = [{"metric": {TAG: k}, "value": [1700000000.0, str(v)]} for k, v in stats.items()]
    return json.dumps({"status": "success", "data": {"resultType": "vector", "result": result}}).encode()


# -- the query --------------------------------------------------------------------


def test_the_query_asks_for_four_numbers_of_the_pod_in_either_label_style():
    q = session_query("team-vision", "jupyter-alice", 3600.4, 30, 'job="dcgm"')
    for metric in ("DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_FB_FREE", "DCGM_FI_DEV_GPU_UTIL"):
        assert f'{metric}{{namespace="team-vision",pod="jupyter-alice",job="dcgm"}}' in q
        assert f'{metric}{{exported_namespace="team-vision",exported_pod="jupyter-alice",job="dcgm"}}' in q
    assert q.count("[3601s:30s]") == 3 and q.count("[3601s])") == 4  # the span, rounded up; the scrape step
    assert all(f'"{TAG}", "{stat}"' in q for stat in (*STATS, "device"))
    assert "group by (Hostname, hostname, gpu, UUID, modelName, GPU_I_ID)" in q
    assert "quantile_over_time(0.95," in q and "max by (UUID, GPU_I_ID)" in q


@given(st.text(max_size=40))
def test_a_name_that_is_no_kubernetes_name_never_reaches_a_query(name):
    if valid_name(name):
        assert f'pod="{name}"' in pod_series("DCGM_FI_DEV_GPU_UTIL", "ns", name)
    else:
        with pytest.raises(ValueError):
            pod_series("DCGM_FI_DEV_GPU_UTIL", "ns", name)
        with pytest.raises(ValueError):
            session_query(name, "pod", 60, 30)


@given(st.text(max_size=60))
def test_a_promql_string_reads_back_as_the_value(value):
    # PromQL's double-quoted strings take Go's escapes; for these characters JSON's are the same.
    assert json.loads(promql_string(value), strict=False) == value


# -- the answer -------------------------------------------------------------------


def test_an_answer_becomes_the_session_reading():
    raw = json.loads(answer(peak_memory=11264, device_memory=FB_TOTAL, util_p95=18, samples=118))
    gpu = {"Hostname": "gpu-h100-whole-1", "gpu": "3", "UUID": "GPU-0003", "modelName": "NVIDIA H100 80GB HBM3"}
    raw["data"]["result"] += [{"metric": {TAG: "device", **gpu}, "value": [0, "1"]}] * 2  # two scrape jobs
    reading = parse_answer(json.dumps(raw).encode())
    assert reading == SessionReading(
        11264.0, FB_TOTAL, 18.0, 118, devices=("gpu-h100-whole-1/gpu3 NVIDIA H100 80GB HBM3 GPU-0003",)
    )
    assert parse_answer(answer()) == SessionReading(None, None, None, 0)  # no series: nothing, never 0 GiB


@pytest.mark.parametrize(
    "raw",
    [
        b"<html>bad gateway</html>",
        b'{"status": "error", "errorType": "bad_data", "error": "parse error"}',
        b'{"status": "success", "data": {"resultType": "matrix", "result": []}}',
        answer(peak_memory="NaN", samples=3),
        answer(peak_memory=-1, samples=3),
        answer(samples="+Inf"),
        json.dumps(
            {"status": "success", "data": {"resultType": "vector", "result": [{"metric": {}, "value": [1, "2"]}]}}
        ).encode(),
        json.dumps(
            {
                "status": "success",
                "data": {"resultType": "vector", "result": [{"metric": {TAG: "samples"}, "value": "x"}]},
            }
        ).encode(),
    ],
)
def test_an_answer_that_is_not_this_querys_is_prometheus_unavailable(raw):
    with pytest.raises(PrometheusUnavailable):
        parse_answer(raw)


JSONISH = st.recursive(
    st.none() | st.booleans() | st.floats(allow_nan=True) | st.text(max_size=8) | st.sampled_from(STATS),
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.dictionaries(
            st.sampled_from(["status", "data", "resultType", "result", "metric", "value", TAG]), inner, max_size=4
        )
    ),
    max_leaves=20,
)


@settings(max_examples=300, deadline=None)
@given(JSONISH)
def test_any_answer_is_a_reading_of_finite_numbers_or_unavailable(doc):
    try:
        reading = parse_answer(json.dumps(doc).encode())
    except PrometheusUnavailable:
        return
    for v in (reading.peak_memory_mib, reading.device_memory_mib, reading.util_p95):
        assert v is None or (math.isfinite(v) and v >= 0)
    assert reading.samples >= 0


# -- the coverage rule --------------------------------------------------------------


def test_a_session_prometheus_saw_too_little_of_is_unknown():
    s = GPULabSessionMetrics(scrape_interval=30, min_coverage=0.5)
    assert judge(SessionReading(11264, FB_TOTAL, 18, 100), 3600, s) == (MEASURED, "")
    state, reason = judge(SessionReading(11264, FB_TOTAL, 18, 40), 3600, s)
    assert state == UNKNOWN and "40 samples of the session's ~120" in reason
    assert judge(SessionReading(None, None, 18, 100), 3600, s)[0] == UNKNOWN  # no memory: no peak guessed
    assert judge(SessionReading(None, None, None, 0), 3600, s)[0] == UNKNOWN


@given(
    st.one_of(st.none(), st.floats(0, 1e6)),
    st.one_of(st.none(), st.floats(0, 100)),
    st.integers(0, 10_000),
    st.floats(1, 1e6),
    st.floats(0, 1),
)
def test_measured_only_with_memory_utilisation_and_enough_samples(peak, util, samples, span, coverage):
    s = GPULabSessionMetrics(scrape_interval=30, min_coverage=coverage)
    state, reason = judge(SessionReading(peak, FB_TOTAL, util, samples), span, s)
    if state == MEASURED:
        assert peak is not None and util is not None and samples > 0 and reason == ""
        assert samples >= coverage * max(1.0, span / 30)
    else:
        assert state == UNKNOWN and reason


@settings(max_examples=200, deadline=None)
@given(st.lists(st.lists(st.floats(0, 100), min_size=1, max_size=30), min_size=1, max_size=10))
def test_sessions_p95s_bound_the_pooled_p95(per_session):
    """Sessions that bring only their own p95 (Prometheus') never make the hint more eager than
    their samples pooled would have."""
    pooled = percentile([u for samples in per_session for u in samples], 95)
    bounds = [SessionUse("h100", 1000, 0.0, 1.0, (), util_p95=percentile(samples, 95)) for samples in per_session]
    assert evidence_p95(bounds) >= pooled


# -- the recorder -----------------------------------------------------------------


class Answers:
    """What :meth:`SessionGPURecorder.read` returns, in turn (an exception is raised)."""

    def __init__(self, *items):
        self.items = list(items)
        self.asked: list[tuple[str, str, float]] = []

    async def __call__(self, namespace, pod, span, end):
        self.asked.append((namespace, pod, span))
        item = self.items.pop(0) if len(self.items) > 1 else self.items[0]
        if isinstance(item, Exception):
            raise item
        return item


@pytest.fixture
def hub(tmp_path):
    runtime = GPULabRuntime(CATALOG)
    runtime.platform = KUBERNETES
    pods = {}
    runtime.workload_pod = pods.get
    sessions = session_factory(url=f"sqlite:///{tmp_path / 'gpulab.sqlite'}")
    usage = UsageRecorder(runtime, sessions, GPULabUsage())
    usage.start()
    recorder = SessionGPURecorder(runtime, sessions, GPULabSessionMetrics(settle_seconds=0, scrape_interval=1))
    runtime.ledger.subscribe(recorder.observe)
    return runtime, sessions, recorder, pods


def run_session(runtime, pods, key: str = "notebook:alice/", pod: str = "jupyter-alice", seconds: float = 0.0):
    assert runtime.ledger.reserve(key, "vision", "alice", 1000, profile="h100").allowed
    pods[key] = ("vision", pod)  # the pod shows up in the informer
    runtime.ledger.confirm(key)
    del pods[key]
    runtime.ledger.release(key)


def backdate(sessions, seconds: float = 120.0) -> None:
    """The sessions ran ``seconds`` each, ending a while ago (the tests do not wait)."""
    with sessions.begin() as s:
        for iv in s.scalars(select(UsageInterval)):
            iv.ended_at = utcnow() - timedelta(seconds=5)
            iv.started_at = iv.ended_at - timedelta(seconds=seconds)


def states(sessions) -> list[str]:
    with sessions() as s:
        return [r.state for r in s.scalars(select(SessionGPU).order_by(SessionGPU.usage_id))]


def test_a_session_prometheus_could_not_answer_for_waits_and_is_measured_later(hub):
    runtime, sessions, recorder, pods = hub
    for _ in range(3):
        run_session(runtime, pods)
    backdate(sessions)
    small = SessionReading(11 * 1024, FB_TOTAL, 18.0, 118)
    recorder.read = Answers(PrometheusUnavailable("connection refused"))
    assert asyncio.run(recorder.measure_pass()) == 0
    assert states(sessions) == [PENDING] * 3  # unknown for now: no line, never "0 GiB"
    assert len(recorder.read.asked) == 1  # one request while it is away, not one per session
    assert hint_for(runtime, sessions, "alice", CATALOG.profiles["h100"]) is None

    recorder.read = Answers(small)
    assert asyncio.run(recorder.measure_pass()) == 3
    assert states(sessions) == [MEASURED] * 3
    assert [(ns, pod) for ns, pod, _ in recorder.read.asked] == [("vision", "jupyter-alice")] * 3
    assert all(abs(span - 120) < 1 for *_, span in recorder.read.asked)
    hint = hint_for(runtime, sessions, "alice", CATALOG.profiles["h100"])
    assert hint is not None and hint.line == (
        "Last 3 sessions of 1 × H100: peak 11 GiB of 79.6 GiB GPU memory, utilisation p95 18 %: "
        "0.25 × H100 would have done"
    )
    assert asyncio.run(recorder.measure_pass()) == 0  # measured once


def test_sessions_without_series_or_samples_are_unknown_and_no_evidence(hub):
    runtime, sessions, recorder, pods = hub
    for _ in range(3):
        run_session(runtime, pods)
    backdate(sessions)
    recorder.read = Answers(
        SessionReading(None, None, None, 0),
        SessionReading(1024, FB_TOTAL, 5.0, 10),
        SessionReading(1024, FB_TOTAL, 5.0, 118),
    )
    assert asyncio.run(recorder.measure_pass()) == 3
    assert states(sessions) == [UNKNOWN, UNKNOWN, MEASURED]
    assert hint_for(runtime, sessions, "alice", CATALOG.profiles["h100"]) is None  # one measured session of 3 needed


def test_a_session_never_answered_for_is_given_up(hub):
    runtime, sessions, recorder, pods = hub
    run_session(runtime, pods)
    backdate(sessions)
    recorder.settings.give_up_after = 1
    recorder.read = Answers(PrometheusUnavailable("down"))
    assert asyncio.run(recorder.measure_pass()) == 1
    with sessions() as s:
        (row,) = s.scalars(select(SessionGPU)).all()
    assert row.state == UNKNOWN and "give_up_after" in row.reason and row.peak_memory_mib is None


def test_an_open_session_whose_pod_showed_up_later_is_recorded_by_the_pass(hub):
    runtime, sessions, recorder, pods = hub
    assert runtime.ledger.reserve("notebook:alice/", "vision", "alice", 1000, profile="h100").allowed
    runtime.ledger.confirm("notebook:alice/")  # the pod not yet in the informer
    assert states(sessions) == []
    pods["notebook:alice/"] = ("vision", "jupyter-alice")
    recorder.read = Answers(PrometheusUnavailable("not asked: nothing has ended"))
    assert asyncio.run(recorder.measure_pass()) == 0
    assert states(sessions) == [PENDING] and recorder.read.asked == []
    # a hub restart: a new recorder, the ledger rebuilt from the pods; the interval and row go on
    fresh = SessionGPURecorder(runtime, sessions, recorder.settings)
    fresh.observe("add", runtime.ledger.get("notebook:alice/"))
    assert states(sessions) == [PENDING]


def test_jobs_and_pods_with_odd_names_are_not_recorded(hub):
    runtime, sessions, recorder, pods = hub
    run_session(runtime, pods, pod="Not_A_Pod")
    assert runtime.ledger.reserve("job:7", "vision", "alice", 1000, kind="job").allowed
    pods["job:7"] = ("vision", "job-7")
    runtime.ledger.confirm("job:7")
    assert states(sessions) == []


def test_a_session_longer_than_longest_span_is_measured_over_its_last_part(hub):
    runtime, sessions, recorder, pods = hub
    run_session(runtime, pods)
    backdate(sessions, seconds=3 * 86400)
    recorder.settings.longest_span = 86400
    recorder.read = Answers(SessionReading(1024, FB_TOTAL, 5.0, 86400))
    assert asyncio.run(recorder.measure_pass()) == 1
    assert [span for *_, span in recorder.read.asked] == [86400]


# -- the request: what a Prometheus (or something else at its URL) may answer ------------


class Server:
    """A local HTTP server answering every POST with ``status`` and ``body`` (a test fixture
    standing where Prometheus would: what the hub does with what comes back)."""

    def __init__(self, status: int, body: bytes):
        import threading
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        self.requests: list[tuple[str, str]] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802 (http.server API)
                length = int(self.headers.get("Content-Length") or 0)
                outer.requests.append((self.path, self.rfile.read(length).decode()))
                self.send_response(status)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def fetch(url: str, max_bytes: int = 65536) -> bytes:
    return asyncio.run(fetch_answer(url, "up", 1700000000.5, timeout=5, max_bytes=max_bytes, token="t0ken"))


def test_the_request_is_one_instant_query_at_the_sessions_end_with_the_token():
    server = Server(200, answer(samples=3))
    try:
        assert parse_answer(fetch(server.url)).samples == 3
        ((path, body),) = server.requests
        assert path == "/api/v1/query" and body == "query=up&time=1700000000.500"
    finally:
        server.close()


@pytest.mark.parametrize(
    "status, body, words",
    [
        (503, b'{"status":"error","error":"overloaded"}', "answered 503"),
        (
            422,
            b'{"status":"error","errorType":"execution","error":"query processing would load too many samples"}',
            "422",
        ),
        (200, b"x" * 70_000, "exceeded 65536 bytes"),
    ],
)
def test_a_refusal_or_an_oversized_answer_is_prometheus_unavailable(status, body, words):
    server = Server(status, body)
    try:
        with pytest.raises(PrometheusUnavailable, match=words):
            fetch(server.url)
    finally:
        server.close()


def test_nothing_listening_is_prometheus_unavailable():
    from tests.support.ports import free_port

    with pytest.raises(PrometheusUnavailable, match="Prometheus at http://127.0.0.1"):
        fetch(f"http://127.0.0.1:{free_port()}")
