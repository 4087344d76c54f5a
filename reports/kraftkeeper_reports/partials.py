"""The report's reads of the ingested state: its totals (``ledger``), both tables as parsed rows
(``read_parsed``), and per-batch partial aggregates of them, so a daily run aggregates the lines
it ingested and not every line again.

The report's Spark job is two aggregations (``transform.one_pass``): the first over every line
(``transform.partial_rows``, numbers only in its buffers), the second merging its few rows per
recovery (``transform.merge_partials``). The first reads every line and its rows merge
associatively, so this module keeps them per committed batch, under ``state/partials/b<N>``,
and the report merges the partials of the new batches: a run that ingested one new day computes one
small partial, instead of aggregating all the lines, and merges it with the merged rows of the
recoveries it touches (``merged``).

A committed batch never changes (its files carry its number, ``ingest``), so its partial is a
cache keyed by that number. It is written to a hidden temporary directory and renamed into
place: it is whole or absent, and a run killed while writing one leaves only the temporary
directory, which the next run removes. ``--full`` drops the partials with the tables
(``ingest.reset``). Invariant: ``merge_partials`` over the partials of batches 0..N gives the
rows ``one_pass`` gives over the same batches' rows read together.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from pyspark.sql import DataFrame, SparkSession

from kraftkeeper_reports import ingest as ing
from kraftkeeper_reports import parse
from kraftkeeper_reports import transform as tf
from quorum.storage.atomic import fsync_dir, fsync_existing


def _parsed(spark: SparkSession, lay: ing.Layout, events: list[Path], quarantined: list[Path],
            ) -> DataFrame | None:
    """These files (or directories) of the two tables as parsed rows (``parse.PARSED_COLUMNS``),
    None if none."""
    parts = []
    if events:  # basePath: the date=... directories stay a column however the files are named
        parts.append(spark.read.option("basePath", str(lay.events)).parquet(*map(str, events))
                     .select(*parse.PARSED_COLUMNS))
    if quarantined:
        parts.append(spark.read.parquet(*map(str, quarantined)).select(*parse.PARSED_COLUMNS))
    if not parts:
        return None
    out = parts[0]
    for p in parts[1:]:
        out = out.unionByName(p)
    return out


def read_parsed(spark: SparkSession, lay: ing.Layout) -> DataFrame | None:
    """Both tables as parsed rows, or None while both are empty."""
    events = [lay.events] if any(lay.events.rglob("*.parquet")) else []
    return _parsed(spark, lay, events, [lay.quarantine] if any(lay.quarantine.glob("*.parquet")) else [])


def ledger(lay: ing.Layout) -> dict[str, int]:
    """Rows per table over every committed batch (the state's own count of its lines)."""
    out = {"batches": 0, ing.EVENTS: 0, ing.QUARANTINE: 0}
    if lay.batches.exists():
        for p in lay.batches.glob("*.json"):
            rows = ing.batch_rows(p)
            out["batches"] += 1
            out[ing.EVENTS] += rows[ing.EVENTS]
            out[ing.QUARANTINE] += rows[ing.QUARANTINE]
    return out


def batch_numbers(lay: ing.Layout) -> list[int]:
    """The committed batches (``batches/<N>.json``), in order."""
    if not lay.batches.exists():
        return []
    return sorted(int(p.stem) for p in lay.batches.glob("*.json") if p.stem.isdigit())


def _batch_rows(spark: SparkSession, lay: ing.Layout, n: int) -> DataFrame | None:
    """Batch ``n``'s parsed rows from both tables, None if it has none."""
    return _parsed(spark, lay, sorted(lay.events.glob(f"*/b{n}-*.parquet")),
                   sorted(lay.quarantine.glob(f"b{n}-*.parquet")))


def publish_dir(tmp: Path, final: Path) -> None:
    """Make the directory ``tmp`` (its Parquet files written) appear whole as ``final``: its
    files and itself fsynced, then renamed, then the rename made durable. A kill before the
    rename leaves ``tmp``, which its writer removes on its next run."""
    for f in tmp.glob("*.parquet"):
        fsync_existing(f)
    fsync_dir(tmp)
    os.replace(tmp, final)
    fsync_dir(final.parent)


def ensure(spark: SparkSession, lay: ing.Layout, after: int = -1) -> int:
    """Write the partial of every committed batch after batch ``after`` that has none yet (the
    merged table, ``merged``, holds the batches up to ``after``); how many were written."""
    root = lay.partials
    root.mkdir(parents=True, exist_ok=True)
    for stale in root.glob(".b*.tmp"):  # left by a run killed while writing a partial
        shutil.rmtree(stale, ignore_errors=True)
    written = 0
    for n in batch_numbers(lay):
        final = root / f"b{n}"
        if n <= after or final.exists():
            continue
        rows = _batch_rows(spark, lay, n)
        if rows is None:
            continue
        tmp = root / f".b{n}.tmp"
        tf.partial_rows(rows).write.mode("overwrite").parquet(str(tmp))
        publish_dir(tmp, final)
        written += 1
    return written


def written(lay: ing.Layout, after: int = -1) -> list[Path]:
    """The partials of the committed batches after batch ``after`` (after :func:`ensure`; a
    batch without rows has none)."""
    done = [lay.partials / f"b{n}" for n in batch_numbers(lay) if n > after]
    return [p for p in done if p.exists()]
