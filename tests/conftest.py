"""The tiers (by folder), the parallel groups, and the one session-wide test bed."""

from __future__ import annotations

import json
import os
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

#: The Kubernetes test bed's fixtures (tests/kube/bed): the session-wide control plane
#: ``kube_testbed`` (also for the benchmarks' smoke run on it), ``kube``, the chart's ``release``
#: and ``kai_scheduler`` (KAI's components, for the tests of one module).
pytest_plugins = ("tests.kube.bed.cluster", "tests.kube.bed.chart", "tests.kube.bed.kai_scheduler")

TESTS = Path(__file__).resolve().parent
#: The tier folders and the markers each gives its tests: the folder is the tier, so a new
#: test file cannot forget its marker. ``smoke/`` keeps its tests' own markers (the
#: benchmarks' smoke runs: most in-process, one with a hub, one on the test bed).
TIERS: dict[str, tuple[str, ...] | None] = {
    "unit": (),
    "integration": ("integration",),
    "browser": ("integration", "browser"),
    "kube": ("integration", "kube"),
    "smoke": None,
}


def _tier(item: pytest.Item) -> str:
    rel = item.path.relative_to(TESTS).parts
    if len(rel) < 2 or rel[0] not in TIERS:
        raise pytest.UsageError(
            f"tests/{'/'.join(rel)}: a test module lives in a tier folder ("
            + ", ".join(f"tests/{t}/" for t in TIERS)
            + "), which gives it its markers"
        )
    return rel[0]


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist reads the groups
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Tiers from the folders, parallel groups, and the longest groups first.

    A test's folder gives its markers (:data:`TIERS`): ``integration/``, ``browser/``
    and ``kube/`` are all integration tests, so the fast tier (``-m "not integration"``,
    scripts/test --fast) never starts a hub, a browser or a control plane. A test in
    ``unit/`` marked as needing one belongs in another folder, and says so.

    With pytest-xdist (``--dist loadgroup``, as scripts/test runs the suite) an
    integration module runs whole, in order, on one worker: its tests share a
    module's hub and may build on each other's state. Every test on the one
    Kubernetes test bed shares one worker (two sessions never share a bed).

    The groups are then ordered longest first, by the seconds the last full run
    recorded (:data:`GROUP_SECONDS`), and the fast tests, which need no group, fill
    in at the end (``--no-loadscope-reorder`` keeps this order): the run ends when
    its longest worker does.
    """
    stems: dict[str, Path] = {}
    for item in items:
        tier = _tier(item)
        for marker in TIERS[tier] or ():
            item.add_marker(marker)
        if tier == "unit" and (item.get_closest_marker("integration") or item.get_closest_marker("kube")):
            raise pytest.UsageError(f"{item.nodeid} needs real processes: move its module out of tests/unit/")
        # The parallel groups (and the recorded seconds) are named by the module's file name.
        if stems.setdefault(item.path.stem, item.path) != item.path:
            raise pytest.UsageError(f"two test modules named {item.path.stem}: {stems[item.path.stem]}, {item.path}")
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
def start_hub(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Callable[..., Any]]:
    """Start a real hub for the module: ``start_hub(catalog_yaml, prepare=fn, **RunningHub kwargs)``.

    ``prepare(hub)`` runs before the hub starts (files in the users' homes). Every hub it
    started is stopped at the module's end, with the job runners it left and its accounts.
    """
    from tests.support.hub import RunningHub
    from tests.support.jobs import kill_job_runners

    hubs: list[RunningHub] = []

    def start(catalog_yaml: str | None = None, *, prepare: Callable[[RunningHub], Any] | None = None, **kwargs: Any):
        hub = RunningHub(tmp_path_factory.mktemp(request.module.__name__.rsplit(".", 1)[-1]), catalog_yaml, **kwargs)
        hubs.append(hub)
        if prepare is not None:
            prepare(hub)
        return hub.start()

    yield start
    for hub in hubs:
        hub.stop()
        kill_job_runners(hub)
        hub.close()
