"""Results of ``bench/engine.py``: the :class:`Row` each measured system and value size makes,
and what is made of the rows at the end: the side-by-side table on stdout (writes/s, p50/p99,
ratios to etcd and to the best PySyncObj row, the half-of-peak p99), the cost-of-TLS lines, the
generator-ceiling lines, and the ``--json`` document.

Nothing here starts a process or measures: it only formats what ``bench/measure.py`` returned.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from bench.baseline import Pair
from bench.load import LoadResult


@dataclass
class Row:
    """One system at one value size: a closed-loop run per client count, the run at half of the
    peak, or the error that stopped the system."""

    label: str
    family: str
    size: int
    tls: bool = False
    runs: dict[int, LoadResult] = field(default_factory=dict)
    half: LoadResult | None = None
    error: str | None = None
    notes: list[str] = field(default_factory=list)


def _fmt_ratio(a: float, b: float | None) -> str:
    return f"{a / b:5.2f}x" if b else "    - "


def render(rows: list[Row], clients: list[int], sizes: list[int]) -> str:
    lines: list[str] = []
    w = max([21, *(len(r.label) for r in rows)])  # --baseline labels are longer
    for size in sizes:
        srows = [r for r in rows if r.size == size]
        if not srows:
            continue
        lines.append("")
        lines.append(
            f"== value size {size} B: committed writes/s, p50/p99 commit latency (ms), "
            f"ratio of writes/s vs etcd and vs best PySyncObj =="
        )
        head = f"{'system':{w}} |" + "|".join(f"{f'{c} clients':^40}" for c in clients) + "| p99 @50% peak"
        sub = f"{'':{w}} |" + "|".join(
            f"{'w/s':>8} {'p50':>6} {'p99':>7} {'vsEtcd':>7} {'vsPSO':>7} " for _ in clients
        )
        lines += [head, sub, "-" * len(head)]
        for r in srows:
            cells = []
            for c in clients:
                res = r.runs.get(c)
                if res is None:
                    cells.append(f"{'n/a':>40}")
                    continue
                # TLS rows against etcd with TLS, plaintext rows against plaintext etcd
                etcd = next(
                    (
                        x.runs[c].writes_per_s
                        for x in srows
                        if x.family == "etcd" and x.tls == r.tls and c in x.runs
                    ),
                    None,
                )
                pso = max(
                    (x.runs[c].writes_per_s for x in srows if x.family == "pysyncobj" and c in x.runs),
                    default=None,
                )
                cells.append(
                    f"{res.writes_per_s:8.0f} {res.p50_ms:6.2f} {res.p99_ms:7.2f} "
                    f"{_fmt_ratio(res.writes_per_s, etcd):>7} {_fmt_ratio(res.writes_per_s, pso):>7} "
                )
            half = "n/a"
            if r.half is not None:
                achieved = r.half.ok / r.half.duration_s
                half = f"{r.half.p99_ms:.2f} ms at {achieved:.0f}/s"
                if r.half.send_lag_p99_ms is not None:
                    half += f" (send lag p99 {r.half.send_lag_p99_ms:.1f} ms)"
                if r.half.target_rate and achieved < 0.9 * r.half.target_rate:
                    half += " (below offered)"
            line = f"{r.label:{w}} |" + "|".join(cells) + f"| {half}"
            if r.error:
                line = f"{r.label:{w}} | FAILED: {r.error}"
            lines.append(line)
        errs = [
            f"{r.label} {c} clients: {res.errors}" for r in srows for c, res in r.runs.items() if res.errors
        ]
        errs += [f"{r.label} @50%: {r.half.errors}" for r in srows if r.half is not None and r.half.errors]
        if errs:
            lines.append("non-2xx answers or connection errors (not counted as writes): " + "; ".join(errs))
        lines += [f"note: {r.label}: {n}" for r in srows for n in r.notes]
        lines += _tls_cost(srows, clients)
    return "\n".join(lines)


def _tls_cost(srows: list[Row], clients: list[int]) -> list[str]:
    """What TLS costs each system (writes/s and p99 against its plaintext row), and KRaftKeeper
    with TLS against etcd with TLS at the largest client count."""
    by_label = {r.label: r for r in srows if not r.error}
    pairs = [("kraftkeeper fsync+tls", "kraftkeeper fsync"), ("etcd tls", "etcd")]
    out: list[str] = []
    for tls_label, plain_label in pairs:
        t, p = by_label.get(tls_label), by_label.get(plain_label)
        if t is None or p is None:
            continue
        cells = []
        for c in clients:
            if c in t.runs and c in p.runs and p.runs[c].writes_per_s > 0:
                tr, pr = t.runs[c], p.runs[c]
                cells.append(
                    f"{c} clients {100 * (tr.writes_per_s / pr.writes_per_s - 1):+.0f}% w/s "
                    f"(p99 {pr.p99_ms:.2f} -> {tr.p99_ms:.2f} ms)"
                )
        if cells:
            out.append(f"cost of TLS, {tls_label} vs {plain_label}: " + "; ".join(cells))
    kk, et = by_label.get("kraftkeeper fsync+tls"), by_label.get("etcd tls")
    top = max(clients)
    if kk is not None and et is not None and top in kk.runs and top in et.runs and et.runs[top].writes_per_s:
        ratio = kk.runs[top].writes_per_s / et.runs[top].writes_per_s
        out.append(
            f"kraftkeeper fsync+tls vs etcd tls at {top} clients: {ratio:.2f}x writes/s "
            f"({kk.runs[top].writes_per_s:.0f} vs {et.runs[top].writes_per_s:.0f})"
        )
    return out


def ceiling_lines(ceiling: dict[str, LoadResult], sizes: list[int]) -> list[str]:
    """The generator-ceiling lines printed above the table (one per generator)."""
    return [
        f"generator ceiling: {name} against an aiohttp no-op handler ({res.clients} conns, "
        f"{max(sizes)} B bodies): {res.writes_per_s:.0f} req/s"
        + (f" (offered {res.target_rate:.0f}/s)" if res.target_rate else "")
        + f", p50 {res.p50_ms:.2f} ms, p99 {res.p99_ms:.2f} ms"
        + (f", send lag p99 {res.send_lag_p99_ms:.2f} ms" if res.send_lag_p99_ms is not None else "")
        for name, res in ceiling.items()
    ]


def results_json(
    generator: str,
    duration: float,
    clients: list[int],
    sizes: list[int],
    ceiling: dict[str, LoadResult],
    rows: Sequence[Row],
    pairs: Sequence[Pair],
) -> dict[str, Any]:
    """The document ``--json FILE`` writes: settings, ceiling, every row, every --baseline round."""
    return {
        "generator": generator,
        "duration_s": duration,
        "clients": clients,
        "sizes": sizes,
        "ceiling": {k: v.to_json() for k, v in ceiling.items()},
        "rows": [
            {
                "system": r.label,
                "family": r.family,
                "size": r.size,
                "error": r.error,
                "notes": r.notes,
                "runs": {str(c): res.to_json() for c, res in r.runs.items()},
                "half_load": r.half.to_json() if r.half else None,
            }
            for r in rows
        ],
        "baseline": [
            {
                "system": p.label,
                "rev": p.rev,
                "size": p.size,
                "rounds": {
                    str(c): {
                        "now": [x.to_json() for x in p.current.get(c, [])],
                        "baseline": [x.to_json() for x in p.baseline.get(c, [])],
                        "ratios": p.ratios(c),
                    }
                    for c in clients
                },
            }
            for p in pairs
        ],
    }
