"""bench/operator_ab.py's summary of an interleaved A/B (the kubelet part runs only by hand)."""

from __future__ import annotations

from bench.operator_ab import merge, table


def test_the_ab_table_gives_medians_shares_ranges_and_the_ratio() -> None:
    base: dict[str, list[float]] = {}
    new: dict[str, list[float]] = {}
    merge(base, {"container start": [7.0, 8.0], "total": [10.0, 12.0]})
    merge(base, {"container start": [9.0], "total": [14.0]})
    merge(new, {"container start": [2.0, 2.0, 3.0], "total": [4.0, 5.0, 6.0]})
    out = table({"base": base, "new": new}).splitlines()
    assert out[0] == "| phase | base p50 | share | new p50 | share |"
    assert "| container start | 8.00 s | 67% | 2.00 s | 40% |" in out
    assert "base: 3 replacements, median 12.00 s (10.00-14.00)" in out
    assert out[-1] == "ratio new/base: 0.42"
