"""Runs every scenario file in this directory through the interpreter (see interp.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.scenarios.interp import Interpreter

FILES = sorted(Path(__file__).parent.glob("*.txt"))


@pytest.mark.parametrize("path", FILES, ids=[p.stem for p in FILES])
def test_scenario(path: Path) -> None:
    sim = Interpreter(path).run()
    assert sim.committed_end > 0
