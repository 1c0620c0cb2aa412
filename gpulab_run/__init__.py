"""What a gpulab job's code uses of gpulab: its parameters, and the metrics it reports.

Installed with gpulab, so importable wherever jobs run on a single server (the runner's
environment, the notebooks' kernel); on Kubernetes, in an image that has gpulab
installed -- or write the same JSON file yourself (below): this module needs nothing but
the standard library, and copying it beside a script works too. ::

    from gpulab_run import log_metrics, parameters

    lr = parameters().get("lr", 1e-3)
    ...
    log_metrics(loss=0.123, accuracy=0.97)   # merged into the run's metrics file

The metrics file is ``$GPULAB_METRICS_FILE`` (``<dir>/runs/<name>-<stamp>.metrics.json``,
beside the job's log): one JSON object of metric name -> number, the last value of
each. A sweep's table shows it, and its objective picks the best run from it. Outside
a job (no ``GPULAB_METRICS_FILE``) :func:`log_metrics` only returns the values.
"""

from __future__ import annotations

import json
import math
import os
import tempfile
from collections.abc import Mapping
from typing import Any

__all__ = ["log_metrics", "metrics_file", "parameters"]

#: Where a job's metrics go; set by gpulab for every job.
METRICS_ENV = "GPULAB_METRICS_FILE"
#: The job's parameters as JSON (a sweep run's, or a notebook's papermill parameters).
PARAMETERS_ENV = "GPULAB_JOB_PARAMETERS"


def parameters() -> dict[str, Any]:
    """The job's parameters (``{}`` outside a job): a sweep run's values, e.g. ``{"lr": 0.0001, "seed": 0}``."""
    text = os.environ.get(PARAMETERS_ENV) or "{}"
    value = json.loads(text)
    return value if isinstance(value, dict) else {}


def metrics_file() -> str | None:
    """The path of this job's metrics file, ``None`` outside a gpulab job."""
    return os.environ.get(METRICS_ENV) or None


def _read(path: str) -> dict[str, float]:
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def log_metrics(metrics: Mapping[str, float] | None = None, **named: float) -> dict[str, float]:
    """Record metrics (the latest value of each): ``log_metrics(loss=0.12)`` or ``log_metrics({"val/loss": 0.12})``.

    Merged into the job's metrics file, written whole and atomically (a reader never sees half a
    file); returns every metric recorded so far. Values must be finite numbers.
    """
    new = {**(metrics or {}), **named}
    for name, value in new.items():
        if not isinstance(name, str) or not name:
            raise ValueError(f"a metric's name must be a non-empty string, not {name!r}")
        if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
            raise ValueError(f"metric {name!r} must be a finite number, not {value!r}")
    path = metrics_file()
    if path is None:
        return {k: float(v) for k, v in new.items()}
    merged = {**_read(path), **{k: float(v) for k, v in new.items()}}
    folder = os.path.dirname(path) or "."
    os.makedirs(folder, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".metrics-", suffix=".tmp", dir=folder)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(merged, f)
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise
    return merged
