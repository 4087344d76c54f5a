"""The floor line of ``bench/engine.py``: measured on this machine's disk and loopback, and each
1-client row's share of it."""

from __future__ import annotations

from pathlib import Path

from bench.engine import floor_lines
from bench.load import LoadResult
from bench.measure import measure_floor
from bench.results import Row


def test_floor_is_measured_and_rows_compared(tmp_path: Path) -> None:
    floor = measure_floor(tmp_path / "floor", n=20)
    assert floor["fdatasync_p50_ms"] > 0 and floor["loopback_rtt_p50_ms"] > 0
    assert (
        abs(floor["writes_per_s"] - 1000 / (floor["fdatasync_p50_ms"] + floor["loopback_rtt_p50_ms"])) < 1e-6
    )
    assert not list((tmp_path / "floor").iterdir())  # its file is removed
    row = Row("etcd tls", "etcd", 100, tls=True)
    # a run of 10 s that committed half the floor's writes
    row.runs[1] = LoadResult("asyncio", 1, 10.0, int(floor["writes_per_s"] * 5), 0, 1.0, 2.0, 3.0)
    lines = floor_lines(floor, [row])
    assert lines[0].startswith("floor (1 client): fdatasync p50")
    assert lines[1].endswith("0.50x the floor") or lines[1].endswith("0.49x the floor")
    assert floor_lines({}, [row]) == []
