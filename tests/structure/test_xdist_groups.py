"""The whole suite's split over two pytest-xdist workers (tests/conftest.py): everything that
needs the Docker engine or the single-node cluster is one unit of work on one worker. When the
units were silently not made, two workers started the cluster at once and one stopped it under
the other."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from tests.conftest import _NODE_UNIT, REPO, _loadgroup, _unit_of, pytest_xdist_make_scheduler


def _config(**option: object) -> Any:
    opts = SimpleNamespace(**option)
    return SimpleNamespace(option=opts, getoption=lambda name, default=None: getattr(opts, name, default),
                           getvalue=lambda name: getattr(opts, name))


def test_a_worker_orders_the_units() -> None:
    # What xdist leaves a worker: dist "no", the choice kept in `loadgroup`.
    assert _loadgroup(_config(dist="no", loadgroup=True))
    assert _loadgroup(_config(dist="loadgroup"))
    assert not _loadgroup(_config(dist="no"))
    assert not _loadgroup(_config(dist="load", loadgroup=False))


def test_the_scheduler_puts_the_cluster_and_the_engine_in_one_unit() -> None:
    # The scheduler the controller uses, given test ids as xdist hands them to it.
    sched = pytest_xdist_make_scheduler(_config(dist="loadgroup", tx=["2*popen"]), None)
    if sched is None:
        pytest.fail("no scheduler for --dist loadgroup")
    kubelet_files = sorted((REPO / "tests" / "kubelet").glob("test_*.py"))
    assert kubelet_files
    ids = [f"tests/kubelet/{p.name}::test_x" for p in kubelet_files]
    ids += ["tests/k8s/test_image.py::test_image_runs_non_root_on_read_only_root",
            "tests/kubelet/test_tls.py::test_a[param::with::colons]"]
    assert {sched._split_scope(i) for i in ids} == {_NODE_UNIT}
    assert sched._split_scope("tests/k8s/test_handlers.py::test_x") == "tests/k8s/test_handlers.py"
    assert sched._split_scope("tests/k8s/test_handlers.py::Cls::test_y") == "tests/k8s/test_handlers.py"
    assert pytest_xdist_make_scheduler(_config(dist="load"), None) is None


def test_units_of_paths() -> None:
    assert _unit_of("tests/kubelet/test_e2e.py") == _NODE_UNIT
    assert _unit_of("tests/k8s/test_image.py") == _NODE_UNIT
    assert _unit_of("tests/k8s/test_images_other.py") == "tests/k8s/test_images_other.py"


def test_files_sharing_the_fleet_report_are_one_unit() -> None:
    # Both read the fleet_report session fixture; on two workers it would be built twice.
    assert _unit_of("tests/reports/test_browser.py") == _unit_of("tests/reports/test_reader.py")
    assert _unit_of("tests/reports/test_report.py") == "tests/reports/test_report.py"
    for rel in ("tests/reports/test_browser.py", "tests/reports/test_reader.py"):
        assert "fleet_report" in (REPO / rel).read_text()
