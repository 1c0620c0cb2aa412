"""Test fixtures for the GPU idle culler: a fake dcgm-exporter and a real Prometheus.

:class:`FakeDCGMExporter` is a real HTTP server (a thread, 127.0.0.1, free
port) that serves ``/metrics`` in dcgm-exporter's text format for a set of
fake GPUs / MIG instances / pods whose values the test sets. It is clearly a
stand-in for the *hardware*: no GPU exists on the test machines.

:class:`RunningPrometheus` starts the real Debian ``prometheus`` binary on a
loopback port, scraping the exporter every second, with the idle culler's
recording rules (helm/gpulab/rules/idle-culler.rules.yaml, evaluated every
second too) unless told otherwise.
"""

from __future__ import annotations

import math
import os
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Iterable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import requests
import yaml

from idle_culler.prometheus_source import SAMPLE_AGE_COUNT_RULE, SAMPLE_AGE_RULE
from idle_culler.sources import METRICS
from tests.support import REPO
from tests.support.hub import free_port
from tests.support.processes import NotReady, wait_ready

MODEL = "NVIDIA H100 80GB HBM3"
#: The recording rules the chart installs and the culler reads.
RULES_FILE = REPO / "helm" / "gpulab" / "rules" / "idle-culler.rules.yaml"


def _labels(d: dict[str, str]) -> str:
    return ",".join(f'{k}="{v}"' for k, v in d.items())


class FakeDCGMExporter:
    """Serves dcgm-exporter-format metrics; ``set_gpu`` / ``set_mig`` / ``remove`` change them."""

    def __init__(self, hostname: str = "gpu-node-1", hostname_label: str = "Hostname"):
        self.hostname = hostname
        self.hostname_label = hostname_label
        self._series: dict[str, tuple[str, dict[str, str], float]] = {}
        self._lock = threading.Lock()
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}/metrics"
        self.scrapes = 0
        #: Times (epoch seconds) of the scrapes answered 503 (:meth:`fail_scrapes`).
        self.failed_at: list[float] = []
        self._fail_count = 0
        self._fail_until = 0.0
        exporter = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):  # noqa: N802 (http.server API)
                if self.path != "/metrics":
                    self.send_error(404)
                    return
                if exporter._failing():
                    self.send_error(503)  # Prometheus: up 0, and the target's series marked stale
                    return
                body = exporter.render().encode()
                exporter.scrapes += 1
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        self._httpd = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        self._thread = threading.Thread(target=self._httpd.serve_forever, daemon=True)

    def start(self) -> FakeDCGMExporter:
        self._thread.start()
        return self

    def fail_scrapes(self, count: int = 0, seconds: float = 0.0) -> None:
        """Answer the next ``count`` scrapes, or every scrape for ``seconds``, with 503, as an
        exporter that times out or restarts does (a failed scrape to Prometheus)."""
        with self._lock:
            self._fail_count = count
            self._fail_until = time.time() + seconds if seconds else 0.0

    def _failing(self) -> bool:
        with self._lock:
            now = time.time()
            if self._fail_count > 0 or now < self._fail_until:
                self._fail_count = max(0, self._fail_count - 1)
                self.failed_at.append(now)
                return True
            return False

    def stop(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()

    def _base(
        self, gpu: int, host: str | None, host_label: str | None, pod: str | None, namespace: str | None
    ) -> dict[str, str]:
        labels = {
            "gpu": str(gpu),
            "UUID": f"GPU-{gpu:08d}-fake",
            "device": f"nvidia{gpu}",
            "modelName": MODEL,
            (host_label or self.hostname_label): host or self.hostname,
            "DCGM_FI_DRIVER_VERSION": "550.54.15",
        }
        if pod:
            labels.update(container="notebook", namespace=namespace or "default", pod=pod)
        return labels

    def set_gpu(
        self,
        gpu: int,
        util: float,
        *,
        pod: str | None = None,
        namespace: str | None = None,
        host: str | None = None,
        host_label: str | None = None,
    ) -> str:
        """``DCGM_FI_DEV_GPU_UTIL`` (percent) of a whole GPU; returns the series key."""
        key = f"util/{host or self.hostname}/{gpu}"
        with self._lock:
            self._series[key] = ("DCGM_FI_DEV_GPU_UTIL", self._base(gpu, host, host_label, pod, namespace), float(util))
        return key

    def set_mig(
        self,
        gpu: int,
        instance: int,
        active: float,
        *,
        profile: str = "3g.40gb",
        pod: str | None = None,
        namespace: str | None = None,
        host: str | None = None,
        host_label: str | None = None,
    ) -> str:
        """``DCGM_FI_PROF_GR_ENGINE_ACTIVE`` (ratio 0..1) of a MIG instance."""
        key = f"mig/{host or self.hostname}/{gpu}/{instance}"
        labels = self._base(gpu, host, host_label, pod, namespace)
        labels.update(GPU_I_PROFILE=profile, GPU_I_ID=str(instance))
        with self._lock:
            self._series[key] = ("DCGM_FI_PROF_GR_ENGINE_ACTIVE", labels, float(active))
        return key

    def remove(self, key: str) -> None:
        with self._lock:
            self._series.pop(key, None)

    def render(self) -> str:
        with self._lock:
            series = list(self._series.values())
        out = []
        for metric, help_text in (
            ("DCGM_FI_DEV_GPU_UTIL", "GPU utilization (in %)."),
            ("DCGM_FI_PROF_GR_ENGINE_ACTIVE", "Ratio of time the graphics engine is active."),
        ):
            rows = [(labels, v) for m, labels, v in series if m == metric]
            if not rows:
                continue
            out.append(f"# HELP {metric} {help_text}")
            out.append(f"# TYPE {metric} gauge")
            for labels, v in rows:
                value = f"{v:.6f}" if metric.startswith("DCGM_FI_PROF") else f"{int(v)}"
                out.append(f"{metric}{{{_labels(labels)}}} {value}")
        return "\n".join(out) + "\n"


class RunningPrometheus:
    """The real ``prometheus`` binary, scraping ``targets`` (host:port) every second."""

    def __init__(
        self,
        workdir: Path,
        targets: list[str],
        port: int | None = None,
        *,
        rules: bool = True,
        rule_interval: str = "1s",
        scrape_configs: list[dict] | None = None,
    ):
        """``scrape_configs``: Prometheus' scrape jobs as given (instead of one ``honor_labels``
        job over ``targets``), e.g. tests/kube/bed/dcgm_exporter.py's two scrape styles."""
        self.workdir = Path(workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.binary = shutil.which("prometheus") or "/usr/bin/prometheus"
        self.config = self.workdir / "prometheus.yml"
        self.rules = self.workdir / "idle-culler.rules.yaml"
        self.rule_interval = rule_interval
        doc = yaml.safe_load(RULES_FILE.read_text())
        for group in doc["groups"]:
            group["interval"] = rule_interval
        self.rules.write_text(yaml.safe_dump(doc))
        rule_files = [str(self.rules)] if rules else []
        jobs = scrape_configs or [{"job_name": "dcgm", "honor_labels": True, "static_configs": [{"targets": targets}]}]
        self.target_count = sum(len(static["targets"]) for job in jobs for static in job.get("static_configs", []))
        self.config.write_text(
            yaml.safe_dump(
                {
                    "global": {"scrape_interval": "1s", "scrape_timeout": "900ms", "evaluation_interval": "1s"},
                    "rule_files": rule_files,
                    "scrape_configs": jobs,
                }
            )
        )
        self.proc: subprocess.Popen | None = None
        self.log_path = self.workdir / "prometheus.log"

    def start(self, timeout: float = 30) -> RunningPrometheus:
        log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(
            [
                self.binary,
                f"--config.file={self.config}",
                f"--storage.tsdb.path={self.workdir / 'data'}",
                f"--web.listen-address=127.0.0.1:{self.port}",
                "--log.level=warn",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        try:
            wait_ready(self.proc, self.url + "/-/ready", timeout=timeout, interval=0.2, request_timeout=1)
        except NotReady as e:
            if e.returncode is not None:
                raise RuntimeError(f"prometheus exited: {self.log_path.read_text()[-2000:]}") from None
            self.stop()
            raise RuntimeError(f"prometheus did not become ready: {self.log_path.read_text()[-2000:]}") from None
        return self

    def backfill(
        self, series: Iterable[tuple[str, dict[str, str], list[tuple[float, float]]]], timeout: float = 300
    ) -> None:
        """Write history into the TSDB before :meth:`start` with ``promtool tsdb create-blocks-from
        openmetrics``: ``(metric, labels, [(unix_seconds, value), ...])`` per series. Tests then
        query any moment of that history at once instead of waiting for it to happen. The
        OpenMetrics file is written as the series come (a benchmark's is a gigabyte)."""
        families: dict[str, Path] = {}
        handles = {}
        try:
            for metric, labels, samples in series:
                if metric not in handles:
                    families[metric] = self.workdir / f"backfill-{len(families)}.part"
                    handles[metric] = open(families[metric], "w")
                handle, tags = handles[metric], _labels(labels)
                for t, v in sorted(samples):
                    value = "NaN" if v != v else repr(float(v))
                    handle.write(f"{metric}{{{tags}}} {value} {t:.3f}\n")
        finally:
            for handle in handles.values():
                handle.close()
        source = self.workdir / "backfill.om"
        with open(source, "w") as out:
            for metric, part in families.items():
                out.write(f"# TYPE {metric} gauge\n")
                with open(part) as f:
                    shutil.copyfileobj(f, out, 1 << 20)
                part.unlink()
            out.write("# EOF\n")
        promtool = shutil.which("promtool") or "/usr/bin/promtool"
        subprocess.run(
            [promtool, "tsdb", "create-blocks-from", "openmetrics", str(source), str(self.workdir / "data")],
            check=True,
            capture_output=True,
            timeout=timeout,
        )
        source.unlink()

    def backfill_rules(self, start: float, end: float, timeout: float = 300) -> None:
        """Evaluate the recording rules over ``[start, end]`` of the history already in the TSDB, as
        Prometheus would have while it happened (``promtool tsdb create-blocks-from rules``, which
        asks this running Prometheus), then restart so the new blocks are read."""
        promtool = shutil.which("promtool") or "/usr/bin/promtool"
        out = self.workdir / "rule-blocks"
        subprocess.run(
            [
                promtool,
                "tsdb",
                "create-blocks-from",
                "rules",
                f"--url={self.url}",
                f"--start={start:.3f}",
                f"--end={end:.3f}",
                f"--output-dir={out}",
                str(self.rules),
            ],
            check=True,
            capture_output=True,
            timeout=timeout,
        )
        self.stop()
        for block in out.iterdir():
            shutil.move(str(block), str(self.workdir / "data" / block.name))
        self.start(timeout=timeout)
        # The rule blocks overlap the history's, which Prometheus merges in the background
        # after it starts: wait until both rules the culler reads show every evaluation. Each
        # evaluation records one age sample per series it saw and the count of those series,
        # so all age samples are visible when they add up to the counts' sum.
        interval = float(self.rule_interval.removesuffix("s"))
        expected = math.floor((end - start) / interval)
        span = f"{end - start:.0f}s"
        seen: dict[str, tuple[float, float, float]] = {}
        deadline = time.monotonic() + max(60.0, timeout / 5)
        while time.monotonic() < deadline:
            for metric in METRICS:
                age = SAMPLE_AGE_RULE.format(metric=metric)
                count = SAMPLE_AGE_COUNT_RULE.format(metric=metric)
                runs = self._scalar(f"count_over_time({count}[{span}])", end)
                counted = self._scalar(f"sum_over_time({count}[{span}])", end)
                ages = self._scalar(f"sum(count_over_time({age}[{span}]))", end)
                seen[metric] = (runs, counted, ages)
            if any(runs for runs, _, _ in seen.values()) and all(
                runs >= expected and ages == counted for runs, counted, ages in seen.values() if runs
            ):
                return
            time.sleep(0.2)
        self.stop()  # the fixture never reaches its teardown
        raise RuntimeError(
            f"the recording rules did not show all {expected} evaluations "
            f"(evaluations, series counted, age samples): {seen}"
        )

    def _scalar(self, query: str, at: float) -> float:
        """The value of a one-element instant query at ``at`` (0 when it has no result)."""
        r = requests.get(self.url + "/api/v1/query", params={"query": query, "time": at}, timeout=60)
        result = r.json().get("data", {}).get("result", [])
        return float(result[0]["value"][1]) if result else 0.0

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(5)
        self.proc = None

    def wait_for_samples(self, selector: str, count: int = 1, timeout: float = 30) -> None:
        """Poll until ``count_over_time(selector[1h])`` reaches ``count`` for some series."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            r = requests.get(
                self.url + "/api/v1/query", params={"query": f"count_over_time({selector}[1h])"}, timeout=5
            ).json()
            result = r.get("data", {}).get("result", [])
            if result and max(float(x["value"][1]) for x in result) >= count:
                return
            time.sleep(0.3)
        raise TimeoutError(f"Prometheus never had {count} samples of {selector}")

    def scraped_cleanly(self, seconds: float) -> bool:
        """Whether every target was scraped up at each interval of the last ``seconds``.

        A failed scrape (``up`` 0: a timeout of an exporter slow under load) makes Prometheus
        mark that target's series stale, and a late one leaves a hole: the culler rightly
        decides nothing on such a window, so a test that expects decisions needs a clean one.
        ``up`` itself is written at every scrape, failed or not."""
        want = max(1, math.floor(seconds) - 1)
        expr = f"min_over_time(up[{seconds:g}s]) == 1 and count_over_time(up[{seconds:g}s]) >= {want}"
        r = requests.get(self.url + "/api/v1/query", params={"query": expr}, timeout=5).json()
        return len(r.get("data", {}).get("result", [])) == self.target_count

    def wait_for_clean_window(self, seconds: float, timeout: float = 60) -> None:
        """Poll until :meth:`scraped_cleanly` holds for the last ``seconds``."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.scraped_cleanly(seconds):
                return
            time.sleep(0.3)
        raise TimeoutError(f"Prometheus never scraped all {self.target_count} targets cleanly for {seconds:g}s")

    def wait_for_every_target(self, count: int, timeout: float = 60) -> None:
        """Poll until every scrape target has been scraped up at least ``count`` times.

        Prometheus spreads its targets' scrapes over the interval and a loaded machine delays
        some, so one series with enough samples says nothing of the others: ``up`` has one
        series per target, and each target's series appear with its first good scrape."""
        deadline = time.monotonic() + timeout
        seen: list[float] = []
        while time.monotonic() < deadline:
            r = requests.get(self.url + "/api/v1/query", params={"query": "sum_over_time(up[1h])"}, timeout=5).json()
            seen = sorted(float(x["value"][1]) for x in r.get("data", {}).get("result", []))
            if len(seen) == self.target_count and seen[0] >= count:
                return
            time.sleep(0.3)
        raise TimeoutError(f"not all {self.target_count} targets were scraped up {count} times: {seen}")
