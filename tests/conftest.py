"""Shared fixtures: a real Debian Chromium driven by Playwright (no browser download)."""

from __future__ import annotations

import json
import os
from collections import Counter
from pathlib import Path

import pytest

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist reads the groups
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Tiers, parallel groups, and the longest groups first.

    A test on the Kubernetes test bed is an integration test too, so the fast tier
    (``-m "not integration"``, scripts/test --fast) never starts a control plane.

    With pytest-xdist (``--dist loadgroup``, as scripts/test runs the suite) an
    integration module runs whole, in order, on one worker: its tests share a
    module's hub and may build on each other's state. Every test on the one
    Kubernetes test bed shares one worker (two sessions never share a bed).

    The groups are then ordered longest first, by the seconds the last full run
    recorded (:data:`GROUP_SECONDS`), and the fast tests, which need no group, fill
    in at the end (``--no-loadscope-reorder`` keeps this order): the run ends when
    its longest worker does.
    """
    for item in items:
        kube = item.get_closest_marker("kube") is not None
        if kube and not item.get_closest_marker("integration"):
            item.add_marker(pytest.mark.integration)
        if item.get_closest_marker("integration") and not item.get_closest_marker("xdist_group"):
            item.add_marker(pytest.mark.xdist_group("kube" if kube else item.path.stem))
    recorded = _recorded_group_seconds()
    counts = Counter(g for g in map(_group, items) if g)
    # A group never timed counts as 3 s a test; the sort is stable, so each group keeps its order.
    items.sort(key=lambda i: -recorded.get(g, 3.0 * counts[g]) if (g := _group(i)) else 0.0)


#: Seconds each group took in the last full parallel run on this machine (a scheduling
#: hint beside the Go cache; a stale or missing file only costs speed).
GROUP_SECONDS = Path(
    os.environ.get("GPULAB_TEST_GROUP_SECONDS") or Path.home() / ".cache/gpulab/test-group-seconds.json"
)


def _group(item: pytest.Item) -> str | None:
    mark = item.get_closest_marker("xdist_group")
    return str(mark.args[0]) if mark is not None and mark.args else None


def _recorded_group_seconds() -> dict[str, float]:
    try:
        data = json.loads(GROUP_SECONDS.read_text())
        return {str(k): float(v) for k, v in data.items()}
    except (OSError, ValueError, TypeError, AttributeError):
        return {}


_group_seconds: Counter[str] = Counter()


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    # On the controller, pytest-xdist's reports carry the group after the node id's "@".
    if "@" in report.nodeid:
        _group_seconds[report.nodeid.rsplit("@", 1)[1]] += report.duration


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Record each group's seconds after a green run of the whole suite (no selection):
    a failed run's times (a test bed that did not start) would misorder the next one."""
    opt = session.config.option
    whole = session.config.args_source == pytest.Config.ArgsSource.TESTPATHS  # no paths given
    if (
        exitstatus != 0
        or not _group_seconds
        or opt.keyword
        or opt.markexpr
        or not whole
        or hasattr(session.config, "workerinput")
    ):
        return
    try:
        GROUP_SECONDS.parent.mkdir(parents=True, exist_ok=True)
        tmp = GROUP_SECONDS.with_suffix(".tmp")
        tmp.write_text(json.dumps({g: round(s, 1) for g, s in _group_seconds.most_common()}, indent=1) + "\n")
        tmp.replace(GROUP_SECONDS)
    except OSError:
        pass  # only a scheduling hint


def pytest_configure(config: pytest.Config) -> None:
    """Refuse to run the groups on a pytest that ignores them, rather than fail at random.

    pytest-xdist puts a test in its group by appending ``@<group>`` to its node id,
    which pytest 9.2 no longer reads (pytest-dev/pytest-xdist#1386): the integration
    tests would then share hubs and the test bed across workers.
    """
    if getattr(config.option, "dist", "no") == "loadgroup" and pytest.version_tuple[:2] >= (9, 2):
        raise pytest.UsageError(
            f"pytest {pytest.__version__} ignores pytest-xdist's test groups; "
            "install the pytest that pyproject.toml pins (scripts/bootstrap.sh --test)"
        )


@pytest.fixture(scope="module")
def browser():
    """Headless Debian Chromium for the module's tests (fails, never skips, if missing)."""
    if not os.path.exists(CHROMIUM):
        pytest.fail(f"{CHROMIUM} is missing: scripts/bootstrap.sh --test installs Debian's chromium")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield b
        b.close()


# The real Kubernetes test bed (tests/kube): session-wide control plane, a
# per-test Cluster view, and the gpulab chart installed into it.
from tests.kube.chart import gpulab_release, release  # noqa: E402,F401
from tests.kube.cluster import kube, kube_testbed  # noqa: E402,F401
