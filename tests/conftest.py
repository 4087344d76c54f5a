"""Fixtures shared by several test packages.

- ``image_build`` (session): the product image built by scripts/build-image.sh once per test run.
  tests/k8s/test_image.py and tests/kubelet both use the image; building it twice cost a second
  wheel build and ``docker build`` (20-40 s on the 2-core CI machine) for the same sources. Each
  user still decides what a failed build means (a skip there, a failure here) and still stops
  a Docker engine it had to start; :meth:`ImageBuild.engine` starts it again for a later user.

The fast lane and the whole suite run on two pytest-xdist workers (``-n 2 --dist loadgroup``;
``KK_TEST_WORKERS=1`` runs the whole suite on one). :func:`pytest_collection_modifyitems`
and :func:`pytest_xdist_make_scheduler` decide what may run side by side: each test file is one
unit of work (its module fixtures are set up once), except that everything needing the Docker
engine or the single-node cluster (tests/kubelet, the image tests) is one unit, since there is one
engine and one kubelet per machine and users stop the engine they started, and files that share a
costly session fixture are one unit (``_SHARED_FIXTURE_UNITS``). Units are handed out
longest first (a fixed estimate per directory, below), so the last ones are short.

The units are made by our own scheduler (xdist's ``loadgroup`` split by :func:`_unit` of each
test's id), not by ``xdist_group`` marks: xdist renames a marked test by assigning a private
attribute that pytest 9 no longer reads, so the marks silently made no groups, every test file
went its own way, and two workers started and stopped the single-node cluster under each other.
"""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[1]
BUILD_IMAGE_SH = REPO / "scripts" / "build-image.sh"
IMAGE = os.environ.get("KK_IMAGE", "kraftkeeper:dev")


@dataclass(frozen=True)
class ImageBuild:
    """The outcome of this run's one ``scripts/build-image.sh build``."""

    image: str
    returncode: int
    stderr: str

    def engine(self) -> subprocess.CompletedProcess[str]:
        """Start the Docker engine if it is not running (a user before this one may have
        stopped the engine it had started): ``scripts/build-image.sh engine``, quick when
        it runs."""
        return subprocess.run(["bash", str(BUILD_IMAGE_SH), "engine"], capture_output=True, text=True,
                              timeout=300)


@pytest.fixture(scope="session")
def image_build() -> ImageBuild:
    proc = subprocess.run(["bash", str(BUILD_IMAGE_SH), "build"], capture_output=True, text=True,
                          timeout=1800, env={**os.environ, "KK_IMAGE": IMAGE})
    return ImageBuild(IMAGE, proc.returncode, proc.stderr)


# Directories by their share of the whole run, heaviest first (an estimate from the slowest
# tests a whole run lists, not a measurement per directory): the worker that takes the
# single-node cluster is busy for a long stretch, so it starts at once, and the small files at
# the end even the two workers out.
_NODE_UNIT = "kubelet-and-docker"
_ORDER = ["kubelet", "reports", "k8s", "kafka", "powerloss", "demo", "operator", "bench", "engine",
          "hostile", "alerts", "security", "sim"]


# Test files that share a costly session fixture are one unit, so that it is built once per run
# and not once per worker: the fleet report (700 k generated events through the whole Spark
# job, the longest fixture of the suite) is read by the browser and the reader tests.
_SHARED_FIXTURE_UNITS = {
    "tests/reports/test_browser.py": "reports-fleet",
    "tests/reports/test_reader.py": "reports-fleet",
}


def _unit_of(rel: str) -> str:
    """The unit of work of a test file, by its path relative to the repository."""
    if rel.startswith("tests/kubelet/") or rel == "tests/k8s/test_image.py":
        return _NODE_UNIT
    return _SHARED_FIXTURE_UNITS.get(rel, rel)


def _unit(item: pytest.Item) -> str:
    return _unit_of(Path(str(item.path)).resolve().relative_to(REPO).as_posix())


def _rank(item: pytest.Item) -> int:
    parts = Path(str(item.path)).resolve().relative_to(REPO / "tests").parts
    if _unit(item) == _NODE_UNIT:
        return -1
    return _ORDER.index(parts[0]) if parts[0] in _ORDER else len(_ORDER)


def _loadgroup(config: pytest.Config) -> bool:
    """Whether this process collects for ``--dist loadgroup``: in the controller ``dist`` says
    so; in a worker xdist has set ``dist`` to "no" and keeps the choice in ``loadgroup``."""
    return bool(getattr(config.option, "loadgroup", False)) or config.getoption("dist", "no") == "loadgroup"


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The order units are handed out in (module docstring); a no-op without xdist."""
    if _loadgroup(config):
        items.sort(key=_rank)  # stable: the file order within a directory stays


@pytest.hookimpl(tryfirst=True, optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """``--dist loadgroup`` with our units (module docstring); xdist's own choice otherwise."""
    if config.getvalue("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadScopeScheduling  # type: ignore[import-untyped]

    class UnitScheduling(LoadScopeScheduling):  # type: ignore[misc]
        def _split_scope(self, nodeid: str) -> str:
            return _unit_of(nodeid.split("::", 1)[0])

    return UnitScheduling(config, log)


# The fast lane (`./dev.sh test --fast` sets KK_FAST_LANE=1) is the pure and in-process tests:
# a test there that starts a process (a node, the CLI, `operator local`) fails naming the
# command, so that it is marked slow and runs with the whole suite instead of slowing the lane
# unseen. Only while a test runs: xdist starts its workers with processes too.
_RUNNING: list[str] = []


def _refuse_processes() -> None:
    original = subprocess.Popen.__init__

    def guarded(self: subprocess.Popen[Any], args: Any, *rest: Any, **kw: Any) -> None:
        if _RUNNING:
            raise AssertionError(
                f"{_RUNNING[-1]} starts a process ({args!r}) in the fast lane, which runs in-process "
                "tests only: mark it slow"
            )
        original(self, args, *rest, **kw)

    subprocess.Popen.__init__ = guarded  # type: ignore[method-assign]


def pytest_configure(config: pytest.Config) -> None:
    if os.environ.get("KK_FAST_LANE") == "1":
        _refuse_processes()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Any:
    _RUNNING.append(item.nodeid)
    try:
        yield
    finally:
        _RUNNING.pop()
