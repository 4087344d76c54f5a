"""The bench scripts run as files (``python bench/report.py``), which puts ``bench/`` first on
``sys.path``: a script named like a standard-library module (``profile``, ``operator``...) would
shadow it for every import after, as ``bench/profile.py`` once broke PySpark's ``cProfile``."""

from __future__ import annotations

import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "bench"


def test_no_bench_module_shadows_the_standard_library() -> None:
    stems = {p.stem for p in BENCH.glob("*.py")}
    assert stems, BENCH
    # operator.py is run as a file only after it replaces bench/ on sys.path (its own guard)
    clashes = sorted((stems & set(sys.stdlib_module_names)) - {"operator"})
    assert clashes == [], f"bench scripts named like standard-library modules: {clashes}"
