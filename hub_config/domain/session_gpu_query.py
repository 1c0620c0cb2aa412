"""What one Kubernetes session used of its GPUs, asked of Prometheus once, at the session's end.

dcgm-exporter labels each GPU's series with the pod holding it (``pod``, ``namespace``,
``container``, from the kubelet's PodResources API; NVIDIA/dcgm-exporter
``internal/pkg/transformation/kubernetes.go``). Scraped without ``honorLabels`` (the GPU
operator's own ServiceMonitor) those become ``exported_pod``/``exported_namespace``: the
selector takes either. For a session of ``span`` seconds ending at ``end``, ONE instant
query at ``end`` answers four numbers, whatever the span:

- ``peak_memory``: the highest frame buffer in use (``DCGM_FI_DEV_FB_USED``, MiB) summed
  over the pod's GPUs, ``max_over_time`` of a subquery at the scrape interval;
- ``device_memory``: one GPU's frame buffer (used + ``DCGM_FI_DEV_FB_FREE``), for "of 80 GiB";
- ``util_p95``: ``quantile_over_time(0.95, ...)`` of ``DCGM_FI_DEV_GPU_UTIL`` averaged over
  the pod's GPUs (the single server's sampler averages them too);
- ``samples``: the raw utilisation samples Prometheus holds for the span (``count_over_time``),
  so a session Prometheus saw only part of is "unknown", never a peak it missed;
- ``device`` (one element per GPU): the GPU's labels as dcgm-exporter set them (``Hostname``
  or ``hostname``, ``gpu``, ``UUID``, ``modelName``, ``GPU_I_ID``), the evidence of which
  GPUs the figures are of (not ``container``: a scrape without ``honorLabels`` replaces it
  with the exporter's own, which would name each GPU twice).

A GPU's series is taken once however many scrape jobs carry it (``max by (UUID, GPU_I_ID)``;
used + free is added series by series first, so it is one scrape's pair).
Each element is one number (every label aggregated away), so the answer is a few hundred
bytes; :func:`fetch_answer` caps it anyway. Pure text in, numbers out, apart from the one request.
"""

from __future__ import annotations

import asyncio
import json
import math
import re
from dataclasses import dataclass
from urllib.parse import urlencode

from tornado.httpclient import AsyncHTTPClient, HTTPClientError, HTTPRequest

FB_USED = "DCGM_FI_DEV_FB_USED"
FB_FREE = "DCGM_FI_DEV_FB_FREE"
GPU_UTIL = "DCGM_FI_DEV_GPU_UTIL"
#: Label carrying which number an answer element is.
TAG = "gpulab_session_stat"
STATS = ("peak_memory", "device_memory", "util_p95", "samples")
DEVICE = "device"
#: The labels naming a GPU in the evidence (dcgm-exporter's).
DEVICE_LABELS = ("Hostname", "hostname", "gpu", "UUID", "modelName", "GPU_I_ID")
#: Most GPUs one pod's answer may name (a node has 8, 16 at most today).
MAX_DEVICES = 64
#: Kubernetes object names (DNS-1123): anything else names no pod and is never put in a query.
_NAME = re.compile(r"[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?")


class PrometheusUnavailable(Exception):
    """Prometheus did not answer usably now; the session stays unmeasured and is asked again."""


@dataclass(frozen=True)
class SessionReading:
    """What Prometheus holds of one session's GPUs (``None``: no series of that metric)."""

    peak_memory_mib: float | None
    device_memory_mib: float | None
    util_p95: float | None
    samples: int
    #: The GPUs the figures are of, as their labels name them (``host/gpu0 model UUID``).
    devices: tuple[str, ...] = ()


def promql_string(value: str) -> str:
    """``value`` as a PromQL double-quoted string (Go's escapes for backslash, quote, newline)."""
    escaped = value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
    return f'"{escaped}"'


def valid_name(value: str) -> bool:
    """A Kubernetes namespace or pod name (DNS-1123 subdomain)."""
    return bool(_NAME.fullmatch(value))


def duration(seconds: float) -> str:
    """Whole seconds as a PromQL duration, at least ``1s``."""
    return f"{max(1, math.ceil(seconds))}s"


def pod_series(metric: str, namespace: str, pod: str, extra: str = "") -> str:
    """``metric``'s series of ``pod``, labelled by dcgm-exporter or renamed ``exported_*`` by the scrape."""
    if not (valid_name(namespace) and valid_name(pod)):
        raise ValueError(f"not a pod: {namespace!r}/{pod!r}")
    more = f",{extra}" if extra else ""
    ns, name = promql_string(namespace), promql_string(pod)
    return (
        f"({metric}{{namespace={ns},pod={name}{more}}} "
        f"or {metric}{{exported_namespace={ns},exported_pod={name}{more}}})"
    )


def _tag(expr: str, stat: str) -> str:
    return f'label_replace({expr}, "{TAG}", "{stat}", "", "")'


def session_query(namespace: str, pod: str, span: float, step: float, extra: str = "") -> str:
    """The one query for a session of ``span`` seconds (evaluated at its end), subqueries at ``step``."""
    per_gpu = "max by (UUID, GPU_I_ID)"
    used = f"{per_gpu} ({pod_series(FB_USED, namespace, pod, extra)})"
    # used + free series by series (one scrape's pair), then one per GPU: two scrape jobs'
    # series taken apart could pair one job's new "used" with the other's old "free".
    total = f"{per_gpu} ({pod_series(FB_USED, namespace, pod, extra)} + {pod_series(FB_FREE, namespace, pod, extra)})"
    util = f"{per_gpu} ({pod_series(GPU_UTIL, namespace, pod, extra)})"
    window = f"[{duration(span)}:{duration(step)}]"
    more = f",{extra}" if extra else ""
    ns, name = promql_string(namespace), promql_string(pod)
    raw = (
        f"count_over_time({GPU_UTIL}{{namespace={ns},pod={name}{more}}}[{duration(span)}]) or "
        f"count_over_time({GPU_UTIL}{{exported_namespace={ns},exported_pod={name}{more}}}[{duration(span)}])"
    )
    parts = [
        _tag(f"max_over_time((sum({used})){window})", "peak_memory"),
        _tag(f"max_over_time((max({total})){window})", "device_memory"),
        _tag(f"quantile_over_time(0.95, (avg({util})){window})", "util_p95"),
        _tag(f"max({raw})", "samples"),
        _tag(f"group by ({', '.join(DEVICE_LABELS)}) ({raw})", DEVICE),
    ]
    return " or ".join(parts)


def parse_answer(raw: bytes) -> SessionReading:
    """The numbers of :func:`session_query`'s answer; :class:`PrometheusUnavailable` when it is not one."""
    try:
        doc = json.loads(raw)
    except (ValueError, UnicodeDecodeError):
        raise PrometheusUnavailable(f"Prometheus answered something that is not JSON: {raw[:200]!r}") from None
    data = doc.get("data") if isinstance(doc, dict) else None
    if not isinstance(data, dict) or doc.get("status") != "success" or data.get("resultType") != "vector":
        raise PrometheusUnavailable(f"Prometheus answered {str(doc)[:300]}")
    result = data.get("result")
    if not isinstance(result, list):
        raise PrometheusUnavailable(f"Prometheus answered {str(doc)[:300]}")
    values: dict[str, float] = {}
    devices: list[str] = []
    for item in result:
        labels = item.get("metric") if isinstance(item, dict) else None
        value = item.get("value") if isinstance(item, dict) else None
        stat = labels.get(TAG) if isinstance(labels, dict) else None
        if stat == DEVICE and isinstance(labels, dict) and len(devices) < MAX_DEVICES:
            devices.append(device_words(labels))
            continue
        if stat not in STATS or stat in values:
            raise PrometheusUnavailable(f"Prometheus answered an element this query does not make: {str(item)[:200]}")
        try:
            number = float(value[1])  # type: ignore[index]
        except (TypeError, ValueError, IndexError, KeyError):
            raise PrometheusUnavailable(
                f"Prometheus answered a value that is not a number: {str(item)[:200]}"
            ) from None
        if not math.isfinite(number) or number < 0:
            # A NaN or negative frame buffer is a broken exporter, not a small session.
            raise PrometheusUnavailable(f"Prometheus answered {stat} = {value[1]!r}")  # type: ignore[index]
        values[stat] = number
    return SessionReading(
        peak_memory_mib=values.get("peak_memory"),
        device_memory_mib=values.get("device_memory"),
        util_p95=values.get("util_p95"),
        samples=int(values.get("samples", 0)),
        devices=tuple(sorted(set(devices))),
    )


def device_words(labels: dict) -> str:
    """One GPU as the evidence names it: ``node/gpu0 NVIDIA H100 80GB HBM3 GPU-…`` (MIG: ``/mig3``)."""

    def text(name: str) -> str:
        value = labels.get(name)
        return value if isinstance(value, str) else ""

    where = f"{text('Hostname') or text('hostname')}/gpu{text('gpu')}"
    if text("GPU_I_ID"):
        where += f"/mig{text('GPU_I_ID')}"
    return " ".join(w for w in (where, text("modelName"), text("UUID")) if w)[:200]


async def fetch_answer(
    base_url: str, query: str, at: float, *, timeout: float, max_bytes: int, token: str = ""
) -> bytes:
    """POST one instant query at ``at``; the answer, at most ``max_bytes``; :class:`PrometheusUnavailable`."""
    url = base_url.rstrip("/") + "/api/v1/query"
    headers = {"Content-Type": "application/x-www-form-urlencoded"}
    if token:
        headers["Authorization"] = "Bearer " + token
    chunks: list[bytes] = []
    received = [0]

    def on_chunk(chunk: bytes) -> None:
        received[0] += len(chunk)
        if received[0] <= max_bytes:
            chunks.append(chunk)

    client = AsyncHTTPClient(force_instance=True, max_body_size=2**62)
    try:
        await client.fetch(
            HTTPRequest(
                url,
                method="POST",
                body=urlencode({"query": query, "time": f"{at:.3f}"}),
                headers=headers,
                request_timeout=timeout,
                streaming_callback=on_chunk,
            )
        )
    except HTTPClientError as e:
        detail = b"".join(chunks)[:300].decode(errors="replace")
        raise PrometheusUnavailable(f"Prometheus at {url} answered {e.code}: {detail or e}") from None
    except (OSError, asyncio.TimeoutError, Exception) as e:  # noqa: B014 (tornado raises many kinds)
        raise PrometheusUnavailable(f"Prometheus at {url}: {e}") from None
    finally:
        client.close()
    if received[0] > max_bytes:
        raise PrometheusUnavailable(
            f"Prometheus' answer exceeded {max_bytes} bytes (c.GPULabSessionMetrics.max_answer_bytes): "
            "one session's answer is four numbers, so check c.GPULabSessionMetrics.prometheus_url"
        )
    return b"".join(chunks)
