"""Incremental, exactly-once ingestion of the event log into a columnar table (``--state DIR``).

    DIR/events/date=YYYY-MM-DD/b<N>-part-*.parquet   every usable line (clean, or with only
                                                     tolerated notes), by the event's UTC day
    DIR/quarantine/b<N>-part-*.parquet               every other line: its reason, message, the
                                                     line itself and the file it came from
    DIR/checkpoint/                                  Structured Streaming's checkpoint
    DIR/batches/<N>.json                             what batch N added (files, line counts)
    DIR/landing/                                     the stream's input: the input files, linked
                                                     whole or in segments (below)
    DIR/landed.json                                  how far each input file was landed
    DIR/inputs.json                                  the inputs this state was built from
    DIR/partials/b<N>/, DIR/merged/v<N>/             aggregates derived from the tables
                                                     (``partials``, ``merged``)

How: a Structured Streaming query over Spark's file source (``landing/``) with a checkpoint,
run with ``trigger(availableNow=True)``: each run takes the files no earlier run took, parses
each line once (``parse``, in the JVM) and ends. The file source records the files of batch N
in the checkpoint before running it, and replays exactly those files if the batch did not
commit; the batch's output is made idempotent here (:func:`_commit_batch`): it is written to a
staging directory, the planned moves are recorded (``batches/<N>.pending``), the files are
renamed into the tables (atomic renames, to names that carry N), and ``batches/<N>.json``
records the batch as done. A batch replayed after a kill at any point either finds its record
(and does nothing), finds its plan (and finishes the renames), or starts over from an empty
staging directory: every line lands in exactly one table, once.

Two engines commit batches into one state: Spark (this module) and the in-process engine
(``inprocess``), both through :func:`commit`. Batch numbers come from one sequence
(:func:`next_number`; Spark's stream batch ``n`` is mapped to its state number by
``batches/s<n>.id``), so they grow in commit order whichever engine made a batch, and each engine
reads only its own landing directory (``landing``; docs/reports.md argues exactly-once).

Files still being written. Spark's file source takes a file once, when it first sees it, so
what it sees must be complete. The input files are therefore not its input: ``landing/`` is,
made by :mod:`kraftkeeper_reports.landing` (whole closed files linked, files still being
appended to copied in segments of complete lines). Hadoop URLs (``hdfs://...``) are streamed
from directly: every file there is taken as complete.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq  # type: ignore[import-untyped]
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F

from kraftkeeper_reports import parse
from quorum.storage.atomic import atomic_write, fsync_dir

# A day's partition is closed this long after the day ended (an event stamped just before
# midnight may be written a moment after it).
_TABLE = "kk_table"  # the staging partition column: which table a row belongs to
EVENTS, QUARANTINE = "events", "quarantine"
SPARK, ARROW = "spark", "arrow"  # the engines (``engines``)
ARROW_NEXT = "arrow.next"  # the arrow engine's batch in progress: its number and input files

# The columns of the events table (a usable line) and of the quarantine table (any other line).
EVENT_COLUMNS = ("ts_ms", "cluster", "recovery_id", "type", "replica_id", "old_uuid", "new_uuid",
                 "leader_id", "leader_epoch", "failure_reason", "engine", "order", "info", "notes",
                 "example", "message")
QUARANTINE_COLUMNS = ("reason", "notes", "message", "example", "value", "source")


class StateError(Exception):
    """The state directory cannot be used as asked (e.g. built from other inputs)."""


def read_record(path: Path, shape: type[dict[Any, Any]] | type[list[Any]] | type[str]) -> Any:
    """One of the state's own JSON records, or a :class:`StateError` naming the file when it does
    not parse or is not a JSON ``shape`` (a damaged state is never guessed past)."""
    try:
        value = json.loads(path.read_bytes())
    except (ValueError, UnicodeDecodeError) as e:
        raise StateError(f"{path} is damaged ({e}); --full rebuilds the state from the event logs") from None
    if not isinstance(value, shape):
        raise StateError(f"{path} is damaged (not a JSON {shape.__name__}); --full rebuilds the state "
                         "from the event logs")
    return value


def batch_rows(path: Path) -> dict[str, int]:
    """A committed batch's rows per table (``batches/<N>.json``), checked."""
    rows = read_record(path, dict).get("rows")
    if not isinstance(rows, dict) or not all(isinstance(rows.get(t), int) for t in (EVENTS, QUARANTINE)):
        raise StateError(f"{path} is damaged (no row counts); --full rebuilds the state from the event logs")
    return {EVENTS: rows[EVENTS], QUARANTINE: rows[QUARANTINE]}


@dataclass(frozen=True)
class Layout:
    root: Path

    @property
    def events(self) -> Path:
        return self.root / EVENTS

    @property
    def quarantine(self) -> Path:
        return self.root / QUARANTINE

    @property
    def checkpoint(self) -> Path:
        return self.root / "checkpoint"

    @property
    def batches(self) -> Path:
        return self.root / "batches"

    @property
    def landing(self) -> Path:
        return self.root / "landing"

    @property
    def arrow_landing(self) -> Path:
        """The in-process engine's input (``engines``): no Spark file source ever lists it."""
        return self.root / "arrow" / "landing"

    @property
    def spark_due(self) -> Path:
        """Present while files landed for Spark may not all be ingested (``landing``)."""
        return self.root / "spark.due"

    @property
    def staging(self) -> Path:
        return self.root / "staging"

    @property
    def partials(self) -> Path:
        """Per-batch partial aggregates (``partials``): derived from the tables, never counted."""
        return self.root / "partials"

    @property
    def merged(self) -> Path:
        """The merged per-recovery rows (``merged``): derived from the partials, never counted."""
        return self.root / "merged"

    @property
    def inputs(self) -> Path:
        return self.root / "inputs.json"

    @property
    def landed(self) -> Path:
        return self.root / "landed.json"

    @property
    def location(self) -> Path:
        """Where the state was built: its checkpoint names the landed files by absolute path."""
        return self.root / "location.json"


def check_inputs(lay: Layout, inputs: list[str]) -> None:
    """Record the inputs of a new state; refuse other inputs for an existing one (its checkpoint
    and landing names are those inputs')."""
    here = str(lay.root.resolve())
    built = read_record(lay.location, str) if lay.location.exists() else here
    if built != here:  # the checkpoint names the files it took by their paths there
        raise StateError(f"--state {lay.root} was built at {built} and moved or copied here, so every line "
                         "would be ingested again: use it where it was built, or --full to rebuild it here")
    if lay.inputs.exists():
        was = read_record(lay.inputs, list)
        if was != inputs:
            raise StateError(
                f"--state {lay.root} was built from other inputs ({', '.join(was)}); "
                "give the same --events, or --full to rebuild it from these"
            )
    else:
        lay.root.mkdir(parents=True, exist_ok=True)
        atomic_write(lay.inputs, (json.dumps(inputs) + "\n").encode())
    if not lay.location.exists():  # a state from before this record gets it on its next run
        atomic_write(lay.location, (json.dumps(here) + "\n").encode())


def _rows(batch: DataFrame) -> DataFrame:
    """The staged rows of one batch: every line once, in the table it belongs to."""
    parsed = parse.parse_lines(batch.select("value", "value_raw"))
    ok = F.col("reason").isNull()
    source: Column = F.when(~ok, F.input_file_name())
    return parsed.select(
        *[F.col(c) for c in EVENT_COLUMNS if c not in ("notes", "example", "message")],
        "reason", "notes", "example", "message",
        F.when(~ok, F.col("value_raw")).alias("value"), source.alias("source"),
        F.when(ok, F.to_date(F.timestamp_millis("ts_ms"))).alias("date"),
        F.when(ok, F.lit(EVENTS)).otherwise(F.lit(QUARANTINE)).alias(_TABLE),
    )


def _plan(lay: Layout, n: int) -> list[tuple[str, str]]:
    """The renames that put batch ``n``'s staged files into the tables: (from, to) relative to
    the state root; each target name carries the batch number, so a replay makes the same ones."""
    stage = lay.staging / str(n)
    moves = []
    for f in sorted(stage.rglob("*.parquet")):
        parts = f.relative_to(stage).parts
        table = parts[0].split("=", 1)[1]
        if table == EVENTS:
            to = Path(EVENTS, *parts[1:-1], f"b{n}-{parts[-1]}")
        else:  # the quarantine is one small table, not partitioned
            to = Path(QUARANTINE, f"b{n}-{parts[-1]}")
        moves.append((str(f.relative_to(lay.root)), str(to)))
    return moves


def _counts(lay: Layout, moves: list[tuple[str, str]]) -> dict[str, int]:
    """Rows per table of a batch, from the Parquet footers (no data read)."""
    out = {EVENTS: 0, QUARANTINE: 0}
    for _src, dst in moves:
        out[Path(dst).parts[0]] += pq.ParquetFile(lay.root / dst).metadata.num_rows
    return out


def next_number(lay: Layout) -> int:
    """The state number of a new batch: one past every number committed, planned or assigned
    (``batches/<N>.json``, ``<N>.pending``, ``s<n>.id``, ``arrow.next``), so the numbers grow
    in commit order whichever engine ingests a batch (``merged`` relies on it)."""
    taken = [-1]
    if lay.batches.exists():
        for p in lay.batches.iterdir():
            if p.suffix in (".json", ".pending") and p.stem.isdigit():
                taken.append(int(p.stem))
            elif p.suffix == ".id" or p.name == ARROW_NEXT:
                taken.append(int(read_record(p, dict)["batch"]))
    return max(taken) + 1


def _spark_number(lay: Layout, n: int) -> tuple[int, bool]:
    """The state number of the stream's batch ``n`` and whether it is committed: its record
    (``stream_batch``; a record without an engine is a Spark batch numbered as the stream),
    else the number assigned before a kill (``s<n>.id``), else a new one, recorded first."""
    if lay.batches.exists():
        for p in lay.batches.glob("*.json"):
            r = read_record(p, dict)
            if r.get("engine", SPARK) == SPARK and r.get("stream_batch", r.get("batch")) == n:
                return int(r["batch"]), True
    ids = lay.batches / f"s{n}.id"
    if ids.exists():
        return int(read_record(ids, dict)["batch"]), False
    m = next_number(lay)
    lay.batches.mkdir(parents=True, exist_ok=True)
    atomic_write(ids, (json.dumps({"batch": m}) + "\n").encode())
    return m, False


def _commit_batch(lay: Layout, batch: DataFrame, n: int, hook: Callable[[str], None]) -> None:
    """Write the stream's batch ``n`` into the tables exactly once (see the module docstring)."""
    m, _committed = _spark_number(lay, n)

    def write(stage: Path) -> None:
        (_rows(batch).write.partitionBy(_TABLE, "date").option("compression", "snappy")
         .mode("overwrite").parquet(str(stage)))
    # A batch committed before a kill (its record found) is only cleaned up: its plan and staging.
    commit(lay, m, write, hook, {"engine": SPARK, "stream_batch": n})
    (lay.batches / f"s{n}.id").unlink(missing_ok=True)


def commit(lay: Layout, n: int, write: Callable[[Path], None], hook: Callable[[str], None],
           about: dict[str, Any]) -> None:
    """Commit state batch ``n`` exactly once, whichever engine made it: ``write`` fills the
    staging directory (``kk_table=<table>/date=<day>/*.parquet``), the renames are planned
    (``<n>.pending``), done, and ``batches/<n>.json`` records the batch with ``about``."""
    done, pending = lay.batches / f"{n}.json", lay.batches / f"{n}.pending"
    stage = lay.staging / str(n)
    if done.exists():  # committed before a kill that came before its engine recorded it
        pending.unlink(missing_ok=True)
        shutil.rmtree(stage, ignore_errors=True)
        return
    lay.batches.mkdir(parents=True, exist_ok=True)
    if not pending.exists():
        shutil.rmtree(stage, ignore_errors=True)
        write(stage)
        hook("staged")
        atomic_write(pending, (json.dumps(_plan(lay, n)) + "\n").encode())
        hook("planned")
    moves = [tuple(m) for m in read_record(pending, list)]
    for i, (src, dst) in enumerate(moves):
        s, d = lay.root / src, lay.root / dst
        if s.exists():
            d.parent.mkdir(parents=True, exist_ok=True)
            os.replace(s, d)
        if i == 0:
            hook("moving")
    for d in {(lay.root / dst).parent for _, dst in moves}:
        fsync_dir(d)
    record = {"batch": n, "files": len(moves), "rows": _counts(lay, moves), "at": time.time(), **about}
    atomic_write(done, (json.dumps(record) + "\n").encode())
    hook("committed")
    pending.unlink(missing_ok=True)
    shutil.rmtree(stage, ignore_errors=True)


def _no_hook(_point: str) -> None:
    pass


def kill_hook() -> Callable[[str], None]:
    """Tests: KK_INGEST_DIE_AT=<point>[:<batch count>] makes the process SIGKILL itself at that
    point of a batch's commit (after that many batches reached it), to prove a restart counts
    every line once. Points: staged, planned, moving, committed; and of the merged table's
    update (``merged``): merging (written aside), merged (renamed into place)."""
    spec = os.environ.get("KK_INGEST_DIE_AT", "")
    if not spec:
        return _no_hook
    point, _, nth = spec.partition(":")
    seen = {"n": 0}

    def hook(at: str) -> None:
        if at == point:
            seen["n"] += 1
            if seen["n"] >= int(nth or "1"):
                # The driver and its JVM together, as a crash or an OOM kill of the pod would,
                # when this process leads its own group (the tests start it so).
                if os.getpgid(0) == os.getpid():
                    os.killpg(0, signal.SIGKILL)
                os.kill(os.getpid(), signal.SIGKILL)

    return hook


@dataclass(frozen=True)
class Ingested:
    """What one ingestion run did: batches committed by it, rows they added per table."""

    batches: int
    events: int
    quarantined: int
    seconds: float


def ingest(spark: SparkSession, lay: Layout, sources: list[str]) -> Ingested:
    """Run the ingestion query until every file present now is in the tables, then stop.
    ``sources``: directories for the file source (``landing/`` and any Hadoop URL)."""
    t0 = time.monotonic()
    before = {p.name for p in lay.batches.glob("*.json")} if lay.batches.exists() else set()
    hook = kill_hook()
    streams = []
    for src in sources:
        streams.append(
            spark.readStream.format("text")
            .option("recursiveFileLookup", "true")
            # Every file is taken however old (the default forgets files a week older than the
            # newest, and an archive may be ingested in any order).
            .option("maxFileAge", "36500d")
            .option("maxFilesPerTrigger", os.environ.get("KK_INGEST_MAX_FILES", "100000"))
            .load(src)
            .select(F.col("value").alias("value_raw"), F.col("value"))
        )
    stream = streams[0]
    for s in streams[1:]:
        stream = stream.unionByName(s)

    def each(batch: DataFrame, n: int) -> None:
        _commit_batch(lay, batch, n, hook)

    q = (stream.writeStream.foreachBatch(each)
         .option("checkpointLocation", str(lay.checkpoint))
         .trigger(availableNow=True)
         .queryName("kraftkeeper-ingest")
         .start())
    q.awaitTermination()
    if q.exception() is not None:
        raise RuntimeError(str(q.exception()))
    lay.spark_due.unlink(missing_ok=True)  # every file landed for Spark is in a committed batch
    new = [lay.batches / p for p in sorted({p.name for p in lay.batches.glob("*.json")} - before)] \
        if lay.batches.exists() else []
    events = quarantined = 0
    for p in new:
        rows = batch_rows(p)
        events += rows[EVENTS]
        quarantined += rows[QUARANTINE]
    return Ingested(len(new), events, quarantined, time.monotonic() - t0)


def reset(lay: Layout) -> None:
    """``--full``: forget everything ingested (the tables, checkpoint, landing links, partials,
    merged rows)."""
    for d in (lay.events, lay.quarantine, lay.checkpoint, lay.batches, lay.landing, lay.staging,
              lay.partials, lay.merged, lay.arrow_landing.parent):
        shutil.rmtree(d, ignore_errors=True)
    lay.inputs.unlink(missing_ok=True)
    lay.landed.unlink(missing_ok=True)
    lay.location.unlink(missing_ok=True)
    lay.spark_due.unlink(missing_ok=True)
