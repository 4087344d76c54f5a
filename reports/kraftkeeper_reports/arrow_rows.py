"""The report's two aggregations in this process, for small batches (no JVM): the same rows as
``transform.partial_rows`` (a batch's partial), ``transform._merge`` (merged aggregates) and
``transform._recovery_rows`` (a recovery's row), computed row by row in Python.

Each function names the Spark expression it mirrors; tests/reports/test_arrow_ingest.py
compares the rows of both on the generator's lines (with its damaged lines and anomalies).
Only aggregates whose result does not depend on the order of the rows are exact whatever the
order (min, max, sum, and picks by them without ties); ``first`` of a bad-input group's message
may differ between runs in Spark too.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable
from datetime import UTC, date, datetime, timedelta
from typing import Any

import pyarrow as pa  # type: ignore[import-untyped]

from kraftkeeper_reports import events as ev
from kraftkeeper_reports.intervals import ADD_THEN_REMOVE, INTERVALS, ORDER_EVIDENCE, REMOVE_THEN_ADD
from kraftkeeper_reports.tables import TS_COL, UNCLEAN

KEY = ("cluster", "recovery_id", "pcode", "pnote")  # transform.KEY_COLUMNS
STRINGS = ("old_uuid", "new_uuid", "failure_reason", "engine", "order", "info", "example", "message")
EXCLUDING = ("missing_detection", "impossible_order", "conflicting_outcome", "incomplete_steps",
             "inconsistent_replica")  # recovery_checks.EXCLUDING (that module imports pyspark)
_EPOCH = date(1970, 1, 1)
_TIX = {t: i for i, t in enumerate(ev.KNOWN_TYPES)}
_M = (1 << 64) - 1
_P1, _P2, _P3, _P4, _P5 = (11400714785074694791, 14029467366897019727, 1609587929392839161,
                           9650029242287828579, 2870177450012600261)


def per_type(t: str) -> tuple[str, str, str, str]:
    """transform._per_type: a type's first, last, sum of timestamps and count."""
    return TS_COL[t], f"last_{t}", f"sum_{t}", f"n_{t}"


_TYPE_COLS = [c for t in ev.KNOWN_TYPES for c in per_type(t)]
_STR, _LONG, _BOOL = pa.string(), pa.int64(), pa.bool_()


def _nn(name: str, t: pa.DataType) -> pa.Field:
    return pa.field(name, t, nullable=False)


# transform.partial_rows' columns as Spark writes them.
PARTIAL_SCHEMA = pa.schema([
    ("cluster", _STR), ("recovery_id", _STR), ("pcode", _STR), ("pnote", _BOOL),
    *[(s, _STR) for s in STRINGS],
    *[_nn(c, _LONG) if c.startswith("n_") else pa.field(c, _LONG) for c in _TYPE_COLS],
    _nn("n_events", _LONG), ("replica_id", _LONG), ("replica_id_max", _LONG), ("min_ts", _LONG),
    ("max_ts", _LONG), _nn("n_problem", _LONG),
])


def _rotl(x: int, r: int) -> int:
    return ((x << r) | (x >> (64 - r))) & _M


def _round(acc: int, lane: int) -> int:
    return (_rotl((acc + lane * _P2) & _M, 31) * _P1) & _M


def xxhash64(data: bytes, seed: int) -> int:
    """XXH64 of ``data`` (Spark's ``xxhash64`` of one string column chains it, seed 42), signed."""
    n, i, seed = len(data), 0, seed & _M
    if n >= 32:
        v = [(seed + _P1 + _P2) & _M, (seed + _P2) & _M, seed, (seed - _P1) & _M]
        while i + 32 <= n:
            v = [_round(v[k], struct.unpack_from("<Q", data, i + 8 * k)[0]) for k in range(4)]
            i += 32
        h = (_rotl(v[0], 1) + _rotl(v[1], 7) + _rotl(v[2], 12) + _rotl(v[3], 18)) & _M
        for x in v:
            h = ((h ^ _round(0, x)) * _P1 + _P4) & _M
    else:
        h = (seed + _P5) & _M
    h = (h + n) & _M
    while i + 8 <= n:
        h = (_rotl(h ^ _round(0, struct.unpack_from("<Q", data, i)[0]), 27) * _P1 + _P4) & _M
        i += 8
    if i + 4 <= n:
        h = (_rotl(h ^ ((struct.unpack_from("<I", data, i)[0] * _P1) & _M), 23) * _P2 + _P3) & _M
        i += 4
    while i < n:
        h = (_rotl(h ^ ((data[i] * _P5) & _M), 11) * _P1) & _M
        i += 1
    h ^= h >> 33
    h = (h * _P2) & _M
    h ^= h >> 29
    h = (h * _P3) & _M
    h ^= h >> 32
    return h - (1 << 64) if h >= 1 << 63 else h


def spark_hash(*values: str) -> int:
    """Spark's ``xxhash64(v1, v2, ...)`` of strings: seed 42, each value's hash the next seed."""
    h = 42
    for v in values:
        h = xxhash64(v.encode("utf-8"), h)
    return h


def _min(a: Any, b: Any) -> Any:
    return b if a is None else a if b is None else min(a, b)


def _max(a: Any, b: Any) -> Any:
    return b if a is None else a if b is None else max(a, b)


def _sum(a: Any, b: Any) -> Any:
    return b if a is None else a if b is None else a + b


def partial_rows(parsed: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """transform.partial_rows over parsed rows (``parse.PARSED_COLUMNS``): ``_line_rows`` (a
    line as its event row and a row per reason and note), grouped by key and strings."""
    groups: dict[tuple[Any, ...], dict[str, Any]] = {}
    for r in parsed:
        codes = [r["reason"], *r["notes"]] if r["reason"] is not None else [None, *r["notes"]]
        for pos, pcode in enumerate(codes):
            prob = pcode is not None
            tix = _TIX.get(r["type"]) if r["type"] is not None else None
            event = not prob and tix is not None
            vals = {s: (r[s] if event else None) for s in STRINGS[:5]}
            vals["info"] = r["info"] if event and r["type"] == ev.UNCLEAN_RECOVERY else None
            vals["example"], vals["message"] = (r["example"], r["message"]) if prob else (None, None)
            key = (None if prob else r["cluster"], None if prob else r["recovery_id"], pcode,
                   pos > 0 if prob else None, *[vals[s] for s in STRINGS])
            g = groups.get(key)
            if g is None:
                g = groups[key] = dict(zip((*KEY, *STRINGS), key, strict=True))
                g.update({c: (0 if c.startswith("n_") else None) for c in _TYPE_COLS})
                g.update(n_events=0, n_problem=0, replica_id=None, replica_id_max=None, min_ts=None,
                         max_ts=None)
            if prob:
                g["n_problem"] += 1
            if not event:
                continue
            ts = r["ts_ms"]
            first, last, sm, n = per_type(ev.KNOWN_TYPES[tix])  # type: ignore[index]
            g[first], g[last], g[sm] = _min(g[first], ts), _max(g[last], ts), _sum(g[sm], ts)
            g[n] += ts is not None
            g["n_events"] += 1
            g["replica_id"], g["replica_id_max"] = _min(g["replica_id"], r["replica_id"]), _max(
                g["replica_id_max"], r["replica_id"])
            g["min_ts"], g["max_ts"] = _min(g["min_ts"], ts), _max(g["max_ts"], ts)
    return list(groups.values())


def as_merged(p: dict[str, Any]) -> dict[str, Any]:
    """transform._as_merged: a partial row in the merged aggregates' shape."""
    out = {k: v for k, v in p.items() if k not in ("example", "message")}
    prob = p["pcode"] is not None
    ex = p["example"]
    h = spark_hash(ex) if prob and ex is not None else (42 if prob else None)
    out.update(h_min=h, h_max=h, h_any=(spark_hash("any", ex) if prob and ex is not None else
                                        (spark_hash("any") if prob else None)),
               ex_min=ex, ex_max=ex, ex_any=ex, pmessage=p["message"])
    return out


def merge(rows: Iterable[dict[str, Any]]) -> dict[tuple[Any, ...], dict[str, Any]]:
    """transform._merge: one row of merged aggregates per key. min_by / max_by take the later
    row on a tie of their ordering, as Spark's do in row order."""
    out: dict[tuple[Any, ...], dict[str, Any]] = {}
    for r in rows:
        k = tuple(r[c] for c in KEY)
        a = out.get(k)
        if a is None:
            out[k] = dict(r)
            continue
        for t in ev.KNOWN_TYPES:
            first, last, sm, n = per_type(t)
            a[first], a[last], a[sm], a[n] = _min(a[first], r[first]), _max(a[last], r[last]), _sum(
                a[sm], r[sm]), a[n] + r[n]
        a["n_events"] += r["n_events"]
        a["n_problem"] += r["n_problem"]
        a["replica_id"], a["replica_id_max"] = _min(a["replica_id"], r["replica_id"]), _max(
            a["replica_id_max"], r["replica_id_max"])
        for by, col, better in (("min_ts", "old_uuid", -1), ("max_ts", "new_uuid", 1),
                                ("h_min", "ex_min", -1),
                                ("h_max", "ex_max", 1), ("h_any", "ex_any", -1)):
            if r[by] is not None and (a[by] is None or (r[by] - a[by]) * better >= 0):
                a[col] = r[col]
        for c in ("failure_reason", "info", "max_ts", "h_max"):
            a[c] = _max(a[c], r[c])
        for c in ("engine", "order", "min_ts", "h_min", "h_any"):
            a[c] = _min(a[c], r[c])
        if a["pmessage"] is None:
            a["pmessage"] = r["pmessage"]
    return out


def _fmt_ts(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, UTC).strftime("%Y-%m-%dT%H:%M:%S.") + f"{ms % 1000:03d}Z"


def _order_violation(a: dict[str, Any], steps: list[str]) -> str | None:
    """recovery_checks.order_violation: the first step stamped before the latest of those
    before it."""
    tsa = [a[TS_COL[s]] for s in steps]
    for j in range(1, len(steps)):
        before = [t for t in tsa[:j] if t is not None]
        if tsa[j] is not None and before and tsa[j] < max(before):
            prev = max(before)
            i = tsa.index(prev)
            return (f"{steps[j]} at {_fmt_ts(tsa[j])} is {prev - tsa[j]} ms before {steps[i]} "
                    f"at {_fmt_ts(prev)}")
    return None


def _violation(a: dict[str, Any], t_end: int | None) -> str | None:
    """recovery_checks.violation."""
    det = a["t_detected"]
    if t_end is not None and det is not None and t_end < det:
        return f"recovery ended {det - t_end} ms before it was detected"
    add_first = list(ev.STEP_TYPES)
    remove_first = [*add_first[:2], *add_first[4:], *add_first[2:4]]
    return _order_violation(a, add_first) if _order_violation(a, remove_first) is not None else None


def _after_end(a: dict[str, Any], end: int | None) -> tuple[int, bool]:
    """transform._after_end_from_stats (with the end known)."""
    total, exact = 0, True
    for t in ev.KNOWN_TYPES:
        first, last, sm, n = (a[c] for c in per_type(t))
        if n == 0 or end is None or last <= end:
            continue
        if first > end:
            total += n
        else:
            total += 1 + (1 if n == 3 and sm - first - last > end else 0)
            exact = exact and n <= 3
    return total, exact


def recovery_row(a: dict[str, Any], n_after: int | None = None) -> dict[str, Any]:
    """transform._recovery_rows over one key's merged aggregates (``n_after``: the exact count
    of events after the end, when recounted from the events)."""
    tc, tf_ = a["t_completed"], a["t_failed"]
    t_end = _min(tc, tf_)
    counted, exact = _after_end(a, t_end)
    after = a["max_ts"] is not None and t_end is not None and a["max_ts"] > t_end
    if n_after is not None:
        counted, exact = n_after, True
    n_after_end = counted if after else 0
    viol = _violation(a, t_end)
    dup = max(a[f"n_{t}"] for t in (*ev.STEP_TYPES, *ev.TERMINAL_TYPES, *ev.UNCLEAN_TYPES)) > 1
    rid, rmax = a["replica_id"], a["replica_id_max"]
    found = [
        ("missing_detection", a["t_detected"] is None and a[TS_COL[ev.UNCLEAN_RECOVERY]] is None,
         f"no {ev.DISK_REPLACEMENT_DETECTED} event"),
        ("impossible_order", viol is not None, viol),
        ("conflicting_outcome", tc is not None and tf_ is not None,
         f"both {ev.RECOVERY_COMPLETED} and {ev.RECOVERY_FAILED}"),
        ("incomplete_steps", tc is not None and (a["t_add_voter_committed"] is None
                                                 or a["t_remove_voter_committed"] is None),
         f"{ev.RECOVERY_COMPLETED} without {ev.ADD_VOTER_COMMITTED} and {ev.REMOVE_VOTER_COMMITTED}"),
        ("inconsistent_replica", rid is not None and rmax is not None and rid != rmax,
         f"replica_id varies from {rid} to {rmax}"),
        ("event_after_end", n_after_end > 0, f"{n_after_end} event(s) after the recovery ended"),
        ("duplicate_event", dup, "a step was logged more than once (first one used)"),
    ]
    flagged = [(c, m) for c, cond, m in found if cond]
    codes = {c for c, _ in flagged}
    outcome = ("invalid" if codes & set(EXCLUDING) else UNCLEAN if a[TS_COL[ev.UNCLEAN_RECOVERY]] is not None
               else "completed" if tc is not None else "failed" if tf_ is not None else "in_progress")
    recorded = None
    for x, y in ORDER_EVIDENCE:
        tx, ty = a[TS_COL[x]], a[TS_COL[y]]
        if tx is not None and ty is not None:
            recorded = REMOVE_THEN_ADD if tx < ty else ADD_THEN_REMOVE
            break
    first_ts = a["t_detected"] if a["t_detected"] is not None else a["min_ts"]
    row: dict[str, Any] = {k: a[k] for k in ("cluster", "recovery_id", "replica_id", "old_uuid", "new_uuid",
                                              "engine")}
    row.update(
        order=a["order"] if a["order"] is not None else recorded, outcome=outcome,
        failure_reason=(a["failure_reason"] if a["failure_reason"] is not None else "unspecified")
        if outcome == "failed" else None,
        date=None if first_ts is None else _EPOCH + timedelta(days=first_ts // 86_400_000),
    )
    row.update({c: a[c] for c in TS_COL.values()})
    row.update(n_events=a["n_events"], n_after_end=n_after_end, unclean_detail=a["info"])
    for i in INTERVALS:
        s = i.span(REMOVE_THEN_ADD if recorded == REMOVE_THEN_ADD else ADD_THEN_REMOVE)
        x, y = a[TS_COL[s.start]], a[TS_COL[s.end]]
        ok = outcome == "completed" and x is not None and y is not None and y >= x
        row[f"{i.name}_ms"] = y - x if ok else None
    det = a["t_detected"]
    row["give_up_ms"] = tf_ - det if outcome == "failed" and tf_ is not None and det is not None else None
    row["problems"] = [c for c, _ in flagged]
    row["problem_messages"] = [f"{c}: {m}" for c, m in flagged]
    for c in ("pcode", "pnote", "n_problem", "h_min", "h_max", "ex_min", "ex_max", "ex_any", "pmessage"):
        row[c] = a[c]
    row["after_end_exact"] = exact
    return row
