"""An older revision of this repository, exported so that it runs beside the current code.

``export_tree`` writes revision REV's files (``git archive``: the repository's index, branches and
worktree list are not touched) into a work directory; :class:`BaselineTree` runs that tree's
``kraftkeeper`` with ``PYTHONPATH`` pointing at it, with the same interpreter and venv as the
current code, so only the product's code differs. ``missing_start_flags`` asks the exported
``kraftkeeper start --help`` whether it knows the flags a caller passes (older revisions lack
some). Used by the benchmarks' before/after rows and by the tests of mixed versions.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

__all__ = ["REPO_ROOT", "BaselineTree", "export_tree", "missing_start_flags"]

REPO_ROOT = Path(__file__).resolve().parent.parent


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
