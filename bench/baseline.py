"""Before/after rows for ``python -m bench.engine --baseline REV`` ("same invocation,
before and after").

``export_tree`` writes revision REV's files (``git archive``: the shared repository's index,
branches and worktree list are not touched) into the bench work directory; the baseline rows
run that tree's ``kraftkeeper`` with ``PYTHONPATH`` pointing at it, with the same interpreter
and venv as the current code, so only the engine's code differs between the two rows.
``missing_start_flags`` asks the exported ``kraftkeeper start --help`` whether it knows the
flags a row passes (older revisions have no ``--tls-dir``). ``round_order`` interleaves the two
rows (A, B, then B, A, ...) so drift in machine load hits both alike, and ``ratio_lines``
prints current/REV per client count from the per-round ratios.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from bench.common import REPO_ROOT, LoadResult

__all__ = ["BaselineTree", "Pair", "export_tree", "missing_start_flags", "ratio_lines", "round_order"]


@dataclass(frozen=True)
class BaselineTree:
    """An exported revision: ``rev`` (short commit id) and the directory holding its files."""

    rev: str
    source: Path

    def command(self) -> list[str]:
        """The tree's ``kraftkeeper`` (its ``quorum.cli``) under this interpreter."""
        return [sys.executable, "-m", "quorum.cli"]

    def env(self) -> dict[str, str]:
        # PYTHONPATH precedes the venv's editable-install finder, so ``quorum`` is the tree's.
        return {"PYTHONPATH": str(self.source)}


def export_tree(rev: str, work: Path, repo: Path = REPO_ROOT) -> BaselineTree:
    """Write ``rev``'s files into ``work/baseline-<short id>``; raises ``ValueError`` naming
    ``rev`` if git does not know it as a commit."""
    found = subprocess.run(
        ["git", "-C", str(repo), "rev-parse", "--verify", "--quiet", "--short=7", f"{rev}^{{commit}}"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    short = found.stdout.strip()
    if found.returncode != 0 or not short:
        raise ValueError(f"--baseline {rev!r}: not a commit of {repo}")
    dest = work / f"baseline-{short}"
    dest.mkdir(parents=True, exist_ok=True)
    archive = subprocess.Popen(["git", "-C", str(repo), "archive", short], stdout=subprocess.PIPE)
    try:
        untar = subprocess.run(["tar", "-x", "-C", str(dest)], stdin=archive.stdout, timeout=120)
    finally:
        if archive.stdout is not None:
            archive.stdout.close()
        archive_rc = archive.wait(timeout=120)
    if archive_rc != 0 or untar.returncode != 0:
        raise ValueError(f"--baseline {rev!r}: git archive | tar failed ({archive_rc}, {untar.returncode})")
    if not (dest / "quorum" / "cli.py").exists():
        raise ValueError(f"--baseline {rev!r}: commit {short} has no quorum/cli.py")
    return BaselineTree(short, dest)


def missing_start_flags(tree: BaselineTree, flags: Sequence[str]) -> list[str]:
    """The ``flags`` the tree's ``kraftkeeper start --help`` does not mention."""
    out = subprocess.run(
        [*tree.command(), "start", "--help"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tree.source,
        env={**os.environ, **tree.env()},
    )
    if out.returncode != 0:
        why = out.stderr.strip()[-300:]
        raise ValueError(f"--baseline {tree.rev}: `kraftkeeper start --help` failed: {why}")
    return [f for f in flags if f not in out.stdout]


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
