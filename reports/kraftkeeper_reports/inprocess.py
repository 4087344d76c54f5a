"""The in-process engine (``--engine arrow``): small increments ingested, aggregated and merged
in this process with pyarrow, no JVM, into the same state as the Spark path (``ingest``).

Its input is ``arrow/landing/`` (``landing`` decides per run which engine's directory new input
goes to; Spark's file source lists only ``landing/``). A batch takes every file there that no
committed arrow batch took: it records its number and files in ``batches/arrow.next`` first, then
commits through ``ingest.commit`` (staging, ``<N>.pending``, atomic renames, ``<N>.json`` with
the files it took), so a run killed anywhere and run again commits the same files under the same
number, once. Its partial (``partials/b<N>``) and the next version of the merged rows are the
same rows the Spark path writes (``arrow_rows``), written aside and renamed into place.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa  # type: ignore[import-untyped]
import pyarrow.compute as pc  # type: ignore[import-untyped]
import pyarrow.dataset as pads  # type: ignore[import-untyped]
import pyarrow.parquet as pq  # type: ignore[import-untyped]

from kraftkeeper_reports import arrow_lines, arrow_rows, merged, partials
from kraftkeeper_reports import ingest as ing
from kraftkeeper_reports.tables import TS_COL
from kraftkeeper_reports.vocabulary import KNOWN_TYPES
from quorum.storage.atomic import atomic_write

_PARSED = ("reason", "notes", "example", "message", "ts_ms", "cluster", "recovery_id", "type", "replica_id",
           "old_uuid", "new_uuid", "leader_id", "leader_epoch", "failure_reason", "engine", "order", "info")
_AGG = [*(c for t in KNOWN_TYPES for c in arrow_rows.per_type(t)), "n_events", "replica_id",
        "replica_id_max", "old_uuid", "new_uuid", "failure_reason", "engine", "order", "info", "min_ts",
        "max_ts", "n_problem", "h_min", "h_max", "ex_min", "ex_max", "h_any", "ex_any", "pmessage"]
_S, _L, _B = pa.string(), pa.int64(), pa.bool_()
_NN_LIST = pa.list_(pa.field("element", _S, nullable=False))
_TYPES = {"pnote": _B, "date": pa.date32(), **dict.fromkeys(
    ("cluster", "recovery_id", "pcode", "unclean_detail", *arrow_rows.STRINGS, "ex_min", "ex_max", "ex_any",
     "pmessage"), _S)}
_NOT_NULL = {"outcome": _S, "after_end_exact": _B, "problems": _NN_LIST, "problem_messages": _NN_LIST}


def merged_schema(names: list[str]) -> pa.Schema:
    """The merged rows' columns as Spark writes them (``transform.merge_into``)."""
    def field(c: str) -> pa.Field:
        if c in _NOT_NULL:
            return pa.field(c, _NOT_NULL[c], nullable=False)
        return pa.field(c, _TYPES.get(c[len(merged_prefix()):] if c.startswith(merged_prefix()) else c, _L))
    return pa.schema([field(c) for c in names])


def merged_prefix() -> str:
    return "m_"  # transform.MERGED_PREFIX


def _claimed(lay: ing.Layout) -> set[str]:
    out: set[str] = set()
    for p in lay.batches.glob("*.json") if lay.batches.exists() else []:
        r = ing.read_record(p, dict)
        if r.get("engine") == ing.ARROW:
            out.update(r.get("inputs", []))
    return out


def ingest(lay: ing.Layout) -> ing.Ingested:
    """Commit, as one batch, the files in ``arrow/landing/`` that no arrow batch took (first the
    batch a killed run left, ``arrow.next``)."""
    t0 = time.monotonic()
    hook = ing.kill_hook()
    nxt = lay.batches / ing.ARROW_NEXT
    count = {ing.EVENTS: 0, ing.QUARANTINE: 0, "batches": 0}
    for _ in range(2):  # the batch a killed run left, then the new files
        if nxt.exists():
            plan = ing.read_record(nxt, dict)
        else:
            files = sorted(p.name for p in lay.arrow_landing.glob("*") if not p.name.startswith(".")) \
                if lay.arrow_landing.exists() else []
            files = [f for f in files if f not in _claimed(lay)]
            if not files:
                break
            plan = {"batch": ing.next_number(lay), "files": files}
            lay.batches.mkdir(parents=True, exist_ok=True)
            atomic_write(nxt, (json.dumps(plan) + "\n").encode())
        n, files = int(plan["batch"]), list(plan["files"])
        done = lay.batches / f"{n}.json"
        was_done = done.exists()  # committed by a run killed before it removed arrow.next

        parsed: list[dict[str, Any]] = []

        def write(stage: Path, files: list[str] = files, parsed: list[dict[str, Any]] = parsed) -> None:
            parsed.extend(arrow_lines.parse_files([lay.arrow_landing / f for f in files]))
            arrow_lines.stage(parsed, stage)
        ing.commit(lay, n, write, hook, {"engine": ing.ARROW, "inputs": files})
        if parsed:  # its partial from the rows in memory (ensure_partials makes it after a kill)
            _write_partial(lay, n, parsed)
        if not was_done:
            rows = ing.batch_rows(done)
            count[ing.EVENTS] += rows[ing.EVENTS]
            count[ing.QUARANTINE] += rows[ing.QUARANTINE]
            count["batches"] += 1
        nxt.unlink(missing_ok=True)
    return ing.Ingested(count["batches"], count[ing.EVENTS], count[ing.QUARANTINE], time.monotonic() - t0)


def _batch_parsed(lay: ing.Layout, n: int) -> list[dict[str, Any]]:
    files = sorted(lay.events.glob(f"*/b{n}-*.parquet")) + sorted(lay.quarantine.glob(f"b{n}-*.parquet"))
    return [r for f in files for r in pq.read_table(f, columns=list(_PARSED)).to_pylist()]


def ensure_partials(lay: ing.Layout, after: int) -> int:
    """partials.ensure in this process: each committed batch after ``after`` without a partial."""
    lay.partials.mkdir(parents=True, exist_ok=True)
    for stale in lay.partials.glob(".b*.tmp"):
        shutil.rmtree(stale, ignore_errors=True)
    made = 0
    for n in partials.batch_numbers(lay):
        final = lay.partials / f"b{n}"
        if n <= after or final.exists():
            continue
        made += _write_partial(lay, n, _batch_parsed(lay, n))
    return made


def _write_partial(lay: ing.Layout, n: int, parsed: list[dict[str, Any]]) -> int:
    """Batch ``n``'s partial from its parsed rows, written aside and renamed into place."""
    rows = arrow_rows.partial_rows(parsed)
    final, tmp = lay.partials / f"b{n}", lay.partials / f".b{n}.tmp"
    if not rows or final.exists():
        return 0
    lay.partials.mkdir(parents=True, exist_ok=True)
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    pq.write_table(pa.Table.from_pylist(rows, schema=arrow_rows.PARTIAL_SCHEMA), tmp / "part-00000.parquet")
    partials.publish_dir(tmp, final)
    return 1


def _key(r: dict[str, Any]) -> tuple[Any, ...]:
    return tuple(r[c] for c in arrow_rows.KEY)


def _out_rows(aggs: dict[tuple[Any, ...], dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for a in aggs.values():
        row = arrow_rows.recovery_row(a)
        row.update({merged_prefix() + c: a[c] for c in _AGG})
        out.append(row)
    return out


def update(lay: ing.Layout, step: Callable[[str], None]) -> pa.Table | None:
    """merged.update in this process: the batches after the current version merged into the
    next one; the current rows (``merge_partials``' columns), None while no batch has any."""
    hook = ing.kill_hook()
    lay.merged.mkdir(parents=True, exist_ok=True)
    merged._clean(lay)
    listed = merged.versions(lay)
    cur = listed[-1] if listed else None
    last = cur[0] if cur else -1
    made = ensure_partials(lay, after=last)
    step(f"partial aggregates of {made} batch(es) written (in process)")
    new = partials.written(lay, after=last)
    if not new:
        return _exact(lay, merged._read(merged._files(cur[1]))) if cur else None
    n = max(partials.batch_numbers(lay))
    work, tmp = lay.merged / ".work", lay.merged / f".v{n}.tmp"
    work.mkdir()
    tmp.mkdir()
    fresh = [arrow_rows.as_merged(r) for p in new for f in merged._files(p)
             for r in pq.read_table(f).to_pylist()]
    touched_keys = {_key(r) for r in fresh}

    def merge(kept: pa.Table | None) -> list[Path]:
        old = [] if kept is None else [
            {c[len(merged_prefix()):]: v for c, v in r.items() if c.startswith(merged_prefix())} | {
                k: r[k] for k in arrow_rows.KEY} for r in kept.to_pylist()]
        rows = _out_rows(arrow_rows.merge([*fresh, *old]))
        schema = pq.read_schema(merged._files(cur[1])[0]) if cur else merged_schema(list(rows[0]))
        pq.write_table(pa.Table.from_pylist(rows, schema=schema), work / "fresh.parquet")
        step(f"{len(touched_keys):,} touched keys merged (in process, with {len(new)} partial(s))")
        return [work / "fresh.parquet"]

    if cur is None:
        merge(None)[0].rename(tmp / "part-00000.parquet")
        rows = merged._read(merged._files(tmp))
    else:
        rows = _rewrite(merged._files(cur[1]), fresh, merge, tmp, n)
    shutil.rmtree(work)
    hook("merging")
    partials.publish_dir(tmp, lay.merged / f"v{n}")
    hook("merged")
    merged._clean(lay)
    step(f"version {n} of the merged rows written ({rows.num_rows:,} rows)")
    return _exact(lay, rows)


def _rewrite(old: list[Path], fresh: list[dict[str, Any]], merge: Callable[[pa.Table | None], list[Path]],
             tmp: Path, n: int) -> pa.Table:
    """The next version into ``tmp``: each file of ``old`` that holds none of the keys of
    ``fresh`` is linked as it is (a version's files never change), the others written again
    without those keys' rows, and the rows ``merge`` makes of the touched keys (with their current
    rows) in a file of their own. A daily run's keys are mostly new recoveries, so it rewrites a
    few rows, not the state; the rows (``merge_partials``' columns) are returned."""
    touched = {_key(r) for r in fresh}
    rids = pa.array(sorted({k[1] for k in touched if k[1] is not None}), type=pa.string())
    problem_keys = any(k[1] is None for k in touched)
    kept = []
    for f in old:
        keys = pq.read_table(f, columns=list(arrow_rows.KEY))
        rid = keys.column("recovery_id")
        maybe = pc.is_in(rid, value_set=rids)
        if problem_keys:  # a bad-input group's row has no recovery
            maybe = pc.or_(maybe, pc.is_null(rid))
        idx = pc.indices_nonzero(maybe).to_pylist()
        cand = keys.take(idx).to_pylist() if idx else []
        hit = [i for i, r in zip(idx, cand, strict=True) if _key(r) in touched]
        if not hit:
            os.link(f, tmp / f.name)
            continue
        t = pq.read_table(f)
        mask = np.ones(t.num_rows, dtype=bool)
        mask[hit] = False
        kept.append(t.take(hit))
        pq.write_table(t.filter(pa.array(mask)), tmp / f.name)
    for f in merge(pa.concat_tables(kept) if kept else None):
        f.rename(tmp / f"part-b{n}.parquet")
    return merged._read(merged._files(tmp))


def _exact(lay: ing.Layout, rows: pa.Table) -> pa.Table:
    """The rows with every count of events after the end exact (``job._exact_after_end``): the
    few rows whose count is not are made again with the count taken from their events."""
    exact = rows.column("after_end_exact")
    if pc.all(exact).as_py() is not False:
        return rows
    bad = rows.filter(pc.invert(exact))
    keys = {(r["cluster"], r["recovery_id"]): r for r in bad.select(["cluster", "recovery_id"]).to_pylist()}
    stored = pq.read_table([str(f) for f in merged._files(merged.versions(lay)[-1][1])])
    aggs = {}
    for r in stored.filter(pc.invert(stored.column("after_end_exact"))).to_pylist():
        k = (r["cluster"], r["recovery_id"])
        if k in keys and r["pcode"] is None:
            aggs[k] = {c[len(merged_prefix()):]: v for c, v in r.items() if c.startswith(merged_prefix())} | {
                c: r[c] for c in arrow_rows.KEY}
    ev_rows = pads.dataset(str(lay.events), partitioning="hive").to_table(
        columns=["cluster", "recovery_id", "type", "ts_ms"],
        filter=pc.field("recovery_id").isin(sorted({k[1] for k in keys}))).to_pylist()
    fixed = []
    for k, a in aggs.items():
        end = min((t for t in (a["t_completed"], a["t_failed"]) if t is not None), default=None)
        n_after = sum(1 for e in ev_rows if (e["cluster"], e["recovery_id"]) == k and e["type"] in TS_COL
                      and end is not None and e["ts_ms"] > end)
        fixed.append(arrow_rows.recovery_row(a, n_after))
    good = rows.filter(exact)
    return pa.concat_tables([good, pa.Table.from_pylist(fixed, schema=rows.schema)]) if fixed else good
