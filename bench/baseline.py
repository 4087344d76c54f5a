"""Before/after rows for ``python -m bench.engine --baseline REV`` ("same invocation,
before and after").

The revision's tree is exported and run by :mod:`testkit.revision` (``export_tree``,
``BaselineTree``, ``missing_start_flags``). ``round_order`` interleaves the two
rows (A, B, then B, A, ...) so drift in machine load hits both alike, and ``ratio_lines``
prints current/REV per client count from the per-round ratios.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field

from bench.load import LoadResult

__all__ = ["Pair", "median_run", "ratio_lines", "round_order"]


def round_order(round_index: int) -> tuple[int, int]:
    """Which row runs first in a round: (current, baseline) in even rounds, swapped in odd."""
    return (0, 1) if round_index % 2 == 0 else (1, 0)


@dataclass
class Pair:
    """The current row and its baseline twin, with every round's result per client count."""

    label: str  # the current row's label, e.g. "kraftkeeper fsync"
    rev: str
    size: int
    current: dict[int, list[LoadResult]] = field(default_factory=dict)
    baseline: dict[int, list[LoadResult]] = field(default_factory=dict)

    def ratios(self, clients: int) -> list[float]:
        """current/baseline writes/s of each round where both ran and the baseline wrote."""
        return [
            a.writes_per_s / b.writes_per_s
            for a, b in zip(self.current.get(clients, []), self.baseline.get(clients, []), strict=False)
            if b.writes_per_s > 0
        ]


def median_run(runs: list[LoadResult]) -> LoadResult:
    """The round with the median writes/s (the lower middle one for an even count)."""
    ordered = sorted(runs, key=lambda r: r.writes_per_s)
    return ordered[(len(ordered) - 1) // 2]


def ratio_lines(pairs: Sequence[Pair], clients: Sequence[int]) -> list[str]:
    """One line per pair: the median of the per-round ratios current/REV for each client
    count, then each round's ratio (in run order), then the median writes/s of each side."""
    out: list[str] = []
    for p in pairs:
        cells = []
        for c in clients:
            rs = p.ratios(c)
            if not rs:
                cells.append(f"{c} clients n/a")
                continue
            cur = statistics.median(r.writes_per_s for r in p.current[c])
            base = statistics.median(r.writes_per_s for r in p.baseline[c])
            rounds = " ".join(f"{r:.2f}" for r in rs)
            cells.append(f"{c} clients {statistics.median(rs):.2f}x [{rounds}] ({cur:.0f} vs {base:.0f} w/s)")
        out.append(f"{p.label} now / @{p.rev}, {p.size} B: " + "; ".join(cells))
    return out
