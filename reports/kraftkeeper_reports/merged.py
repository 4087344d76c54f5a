"""The merged per-recovery rows of the ingested state, kept so that a daily run pays for its
new lines only: ``state/merged/v<N>/part-*.parquet`` holds ``transform.merge_partials``' rows
over the partials of batches 0..N (``partials``), one per recovery and per bad-input code, each
with its merged aggregates beside it (columns ``transform.MERGED_PREFIX``*).

A run with new batches (after N) reads the current version on the driver with pyarrow, takes
the keys the new batches' partials touch, and has Spark merge only those: the new partials with
those keys' merged aggregates (``transform.merge_into``). The driver then writes the next
version: the untouched rows as they were, the touched ones replaced. Spark brings no row to the
driver; the driver reads and writes Parquet.

Exactly once: a version is written to a hidden temporary directory, fsynced and renamed into
place (``partials.publish_dir``), so it is whole or absent; the highest version is the current
one, and a run removes what a killed run left (a temporary directory, its Spark output, an
older version). A run killed anywhere and run again merges the same batches into the same
version it would have written. The version is a cache: removed (or ``--full``), it is made
again from every batch's partial. Invariant: the rows of version N equal ``merge_partials``
over the partials of batches 0..N, whatever runs merged them.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable, Iterator
from pathlib import Path

import pyarrow as pa  # type: ignore[import-untyped]
import pyarrow.compute as pc  # type: ignore[import-untyped]
import pyarrow.parquet as pq  # type: ignore[import-untyped]
from pyspark.sql import SparkSession

from kraftkeeper_reports import ingest as ing
from kraftkeeper_reports import partials
from kraftkeeper_reports import transform as tf

_PART = "part-00000.parquet"  # the driver's single file of a version it writes


def versions(lay: ing.Layout) -> list[tuple[int, Path]]:
    """The published versions (``v<N>``), oldest first: more than one only after a run was
    killed between publishing one and removing the one before."""
    if not lay.merged.exists():
        return []
    out = [(int(p.name[1:]), p) for p in lay.merged.iterdir() if p.name[:1] == "v" and p.name[1:].isdigit()]
    return sorted(out)


def upto(lay: ing.Layout) -> int:
    """The last batch merged into the current version; -1 when there is none."""
    vs = versions(lay)
    return vs[-1][0] if vs else -1


def _files(d: Path) -> list[Path]:
    return sorted(d.glob("*.parquet"))


def _keys(t: pa.Table) -> pa.ChunkedArray:
    """Each row's key (``transform.KEY_COLUMNS``) as one string, a null unlike any value."""
    cols = [t.column(c) if t.schema.field(c).type == pa.string() else pc.cast(t.column(c), pa.string())
            for c in tf.KEY_COLUMNS]
    return pc.binary_join_element_wise(*cols, "\x1f", null_handling="replace", null_replacement="\x00")


def _batches(files: list[Path]) -> Iterator[pa.Table]:
    """The rows of ``files`` in order, 64 k at a time (all columns: the merged aggregates too)."""
    for f in files:
        for b in pq.ParquetFile(f).iter_batches(batch_size=65_536):
            yield pa.Table.from_batches([b])


def _read(files: list[Path]) -> pa.Table:
    """The rows of a version in ``transform.merge_partials``' columns (no merged aggregates)."""
    cols = [c for c in pq.read_schema(files[0]).names if not c.startswith(tf.MERGED_PREFIX)]
    return pq.read_table([str(f) for f in files], columns=cols)


def _clean(lay: ing.Layout) -> None:
    """Remove what a killed run left: temporary versions, Spark's work, older versions."""
    for p in lay.merged.iterdir():
        if p.name.startswith("."):
            shutil.rmtree(p, ignore_errors=True)
    for _n, p in versions(lay)[:-1]:
        shutil.rmtree(p, ignore_errors=True)


def _no_step(_step: str) -> None:
    pass


def update(spark: SparkSession, lay: ing.Layout, step: Callable[[str], None] = _no_step,
           ) -> pa.Table | None:
    """Merge the batches after the current version into a new version (partials of those
    batches written first, ``partials.ensure``); the current rows (``merge_partials``' columns),
    None while no batch has any. ``step`` is told when each part is done (timings)."""
    hook = ing.kill_hook()
    lay.merged.mkdir(parents=True, exist_ok=True)
    _clean(lay)
    listed = versions(lay)
    cur = listed[-1] if listed else None
    last = cur[0] if cur else -1
    made = partials.ensure(spark, lay, after=last)
    step(f"partial aggregates of {made} batch(es) written (Spark)")
    new = partials.written(lay, after=last)
    if not new:
        return _read(_files(cur[1])) if cur else None
    n = max(partials.batch_numbers(lay))
    work, tmp = lay.merged / ".work", lay.merged / f".v{n}.tmp"
    work.mkdir()
    tmp.mkdir()
    keys = [_keys(pq.read_table(p, columns=list(tf.KEY_COLUMNS))) for p in new]
    touched = pc.unique(pa.chunked_array([c for k in keys for c in k.chunks], type=pa.string()))

    def merge(kept: pa.Table | None) -> list[Path]:
        """Spark's part: the touched keys merged (the new partials with ``kept``, those keys'
        current rows, handed over as a Parquet file so the types are Spark's own as it wrote
        them); its files."""
        old = None
        if kept is not None and kept.num_rows:
            pq.write_table(kept, work / "kept.parquet")
            old = tf.merged_aggregates(spark.read.parquet(str(work / "kept.parquet")))
        tf.merge_into(spark.read.parquet(*map(str, new)), old).write.parquet(str(work / "fresh"))
        step(f"{len(touched):,} touched keys merged (Spark, with {len(new)} partial(s))")
        return _files(work / "fresh")

    if cur is None:  # every row is fresh: Spark's files are the version as they are
        for f in merge(None):
            f.rename(tmp / f.name)
        rows = _read(_files(tmp))
    else:
        rows = _rewrite(_files(cur[1]), touched, merge, tmp / _PART)
    shutil.rmtree(work)
    hook("merging")
    partials.publish_dir(tmp, lay.merged / f"v{n}")
    hook("merged")
    _clean(lay)
    step(f"version {n} of the merged rows written ({rows.num_rows:,} rows)")
    return rows


def _rewrite(old: list[Path], touched: pa.Array, merge: Callable[[pa.Table | None], list[Path]],
             to: Path) -> pa.Table:
    """The next version into ``to`` in one pass over ``old`` (the current version), a row group
    at a time: its rows but the ``touched`` keys' copied, then the rows ``merge`` makes of the
    touched keys' current rows. The merged aggregates are never all in memory; the rows, in
    ``merge_partials``' columns, are returned."""
    schema = pq.read_schema(old[0])
    cols = [c for c in schema.names if not c.startswith(tf.MERGED_PREFIX)]
    kept, rows = [], []
    with pq.ParquetWriter(to, schema) as w:
        for b in _batches(old):
            hit = pc.is_in(_keys(b), value_set=touched)
            kept.append(b.filter(hit))
            stay = b.filter(pc.invert(hit))
            w.write_table(stay)
            rows.append(stay.select(cols))
        for f in merge(pa.concat_tables(kept) if kept else None):
            b = pq.read_table(f).select(schema.names).cast(schema)
            w.write_table(b)
            rows.append(b.select(cols))
    return pa.concat_tables(rows)
