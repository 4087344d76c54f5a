"""Interleaved A/B of the real replaced-disk bench (``bench/operator_real.py``) between two trees.

    flock /tmp/kk-kubelet.lock python -m bench.operator_ab --base /tmp/kk-base --base-image \
        kraftkeeper:base --image kraftkeeper:new --blocks 2 --recoveries 5 --tls

runs ``run(recoveries, 0, ..., tls=...)`` of each tree in turn (base, this tree, base, this tree,
...: ``--blocks`` rounds), each in its own process from its own tree (its bench, chart and
``scripts/build-image.sh``, its image tag: ``KK_IMAGE``), and prints the medians of every phase
per side with its share of that side's median total, the range of the totals, the ratio of the
medians and the load average before each block. ``--base`` is a clean export of the other
revision (``git archive REV | tar -x -C DIR``); it uses this tree's ``.venv`` (its wheels are built
by its own ``build-image.sh`` with ``PYTHON``). Blocks' rows are kept as JSON in ``--out``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parents[1]
BLOCK = (
    "import json, sys; from bench.operator_real import run; "
    "rows, _ = run(int(sys.argv[1]), 0.0, 0, 0.0, 'recovery', tls=sys.argv[2] == '1'); "
    "json.dump(rows, open(sys.argv[3], 'w'))"
)


def block(tree: Path, image: str, recoveries: int, tls: bool, out: Path) -> dict[str, list[float]]:
    """One block of ``recoveries`` replacements with ``tree``'s bench and image."""
    env = {
        **os.environ,
        "KK_IMAGE": image,
        "PYTHON": str(HERE / ".venv" / "bin" / "python"),
        "PYTHONPATH": os.pathsep.join(str(tree / p) for p in ("", "reports", "operator")),
    }
    cmd = [sys.executable, "-c", BLOCK, str(recoveries), "1" if tls else "0", str(out)]
    subprocess.run(cmd, cwd=tree, env=env, check=True, timeout=3600)
    rows: dict[str, list[float]] = json.loads(out.read_text())
    return rows


def table(sides: dict[str, dict[str, list[float]]]) -> str:
    """Median of every phase per side, with its share of that side's median total."""
    names = list(sides)
    totals = {s: statistics.median(sides[s]["total"]) for s in names}
    head = " | ".join(f"{s} p50 | share" for s in names)
    lines = [f"| phase | {head} |", "| --- |" + " --- | --- |" * len(names)]
    for phase in sides[names[0]]:
        cells = []
        for s in names:
            m = statistics.median(sides[s][phase])
            cells += [f"{m:.2f} s", f"{100 * m / totals[s]:.0f}%"]
        lines.append(f"| {phase} | " + " | ".join(cells) + " |")
    for s in names:
        t = sides[s]["total"]
        lines.append(f"{s}: {len(t)} replacements, median {totals[s]:.2f} s ({min(t):.2f}-{max(t):.2f})")
    if len(names) == 2:
        lines.append(f"ratio {names[1]}/{names[0]}: {totals[names[1]] / totals[names[0]]:.2f}")
    return "\n".join(lines)


def merge(into: dict[str, list[float]], rows: dict[str, list[float]]) -> None:
    for phase, values in rows.items():
        into.setdefault(phase, []).extend(values)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--base", type=Path, required=True, help="the other revision's exported tree")
    p.add_argument("--base-image", default="kraftkeeper:base")
    p.add_argument("--image", default="kraftkeeper:new", help="this tree's image tag")
    p.add_argument("--blocks", type=int, default=2)
    p.add_argument("--recoveries", type=int, default=5, help="replacements per block")
    p.add_argument("--tls", action="store_true")
    p.add_argument("--out", type=Path, default=Path("/tmp/kk-operator-ab"))
    a = p.parse_args(argv)
    a.out.mkdir(parents=True, exist_ok=True)
    sides: dict[str, dict[str, Any]] = {"base": {}, "new": {}}
    for r in range(1, a.blocks + 1):
        for side, tree, image in (("base", a.base, a.base_image), ("new", HERE, a.image)):
            print(
                f"block {r} {side}: load average {' '.join(f'{x:.1f}' for x in os.getloadavg())}", flush=True
            )
            rows = block(tree, image, a.recoveries, a.tls, a.out / f"{side}-{r}.json")
            merge(sides[side], rows)
            print(f"  totals {[round(t, 2) for t in rows['total']]}", flush=True)
    print(table(sides))
    return 0


if __name__ == "__main__":
    sys.exit(main())
