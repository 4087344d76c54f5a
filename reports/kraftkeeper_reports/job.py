"""The report job: event logs in, tables and one HTML report out (``kraftkeeper report``).

    run_report(["events/"], "out/")   ->  out/report.html
                                          out/tables/<name>.parquet and out/tables/<name>.csv
                                          out/tables/recoveries.parquet/ (and .csv/), one part each

Tables: ``phase_stats`` (p50/p90/p99/max per phase, per cluster and "(all)"),
``phase_histogram``, ``outcomes``, ``failures``, ``daily``, ``slowest`` (with timelines),
``bad_input`` (counts by reason with examples), ``summary`` (the headline numbers) and the
per-recovery table ``recoveries``. Definitions are in ``kraftkeeper_reports.transform``.

How it runs: ONE Spark job (``transform.one_pass``) reads every line once, parses and validates
it in the JVM (one projection) and aggregates it into per-recovery rows and per-reason bad-line
groups (a hash aggregation whose buffers hold only numbers, then a small merge); those
(about one row per 7 events) come to the driver as Arrow, and the small tables are computed
there with numpy on the Arrow columns (``tables``). A dozen small Spark jobs, one per table,
cost more in fixed overhead than the whole computation on the driver. ``kraftkeeper report``
runs it incrementally over its state (:func:`compute_state`): the lines are ingested once, each
batch's first aggregation kept (``partials``), and only the recoveries new lines touch merged
again (``merged``); the driver reads the per-recovery rows from Parquet. With KK_REPORT_TIMINGS=1
each step's wall time goes to stderr.

Errors are one ``CODE: message`` line on stderr and a non-zero exit; the report's path is the
last line on stdout.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import itertools
import json
import os
import shutil
import sys
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow as pa  # type: ignore[import-untyped]
import pyarrow.compute as pc  # type: ignore[import-untyped]
import pyarrow.csv as pa_csv  # type: ignore[import-untyped]
import pyarrow.parquet as pq  # type: ignore[import-untyped]
from pyspark.errors import AnalysisException
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from kraftkeeper_reports import ingest as ing
from kraftkeeper_reports import inprocess, landing, merged, partials
from kraftkeeper_reports import transform as tf
from kraftkeeper_reports.render import render_html
from kraftkeeper_reports.session import build_session, jvm_costs, jvm_exit_code, jvm_failure
from kraftkeeper_reports.tables import TS_COL, ReportTables, small_tables
from quorum.cliparse import ArgumentParser

EXIT_INVALID = 2
EXIT_FAILED = 1


class ReportError(Exception):
    """A failure with an error code from the interface (INVALID_REQUEST, ...)."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message


def _is_url(p: str) -> bool:
    return "://" in p or (":" in p.split("/")[0] and len(p.split(":")[0]) > 1)


def _check_inputs(events: list[str]) -> list[str]:
    if not events:
        raise ReportError("INVALID_REQUEST", "no event paths given (--events PATH)")
    out = []
    for p in events:
        if _is_url(p):
            out.append(p)  # Spark (Hadoop FileSystem) resolves and reports URLs
            continue
        path = Path(p)
        if not path.exists():
            raise ReportError("INVALID_REQUEST", f"no events found at {p}: no such file or directory")
        visible = (f for f in path.rglob("*") if not f.name.startswith((".", "_")))
        if path.is_dir() and not any(f.is_file() for f in visible):
            raise ReportError("INVALID_REQUEST", f"no events found at {p}: the directory holds no files")
        out.append(str(path.resolve()))
    return out


class _Timer:
    """Where the job's time goes: with KK_REPORT_TIMINGS=1, each step's wall time on stderr."""

    def __init__(self) -> None:
        self.on = os.environ.get("KK_REPORT_TIMINGS") == "1"
        self.t = time.monotonic()

    def note(self, text: str) -> None:
        if self.on:
            print(f"# report timing: {text}", file=sys.stderr, flush=True)

    def __call__(self, step: str) -> None:
        now = time.monotonic()
        if self.on:
            print(f"# report timing: {step} {now - self.t:.1f} s", file=sys.stderr, flush=True)
        self.t = now


def _no_timing(_step: str) -> None:
    pass


@dataclass(frozen=True)
class Run:
    """What one report run is asked for: the event paths (as the report names them), how many
    slowest recoveries to list, where the per-recovery table goes (``out``/tables; None: not
    written), whether the small tables also carry every recovery (tests), what to do with the
    small tables while that table is written (``then``), and where step timings go."""

    paths: list[str]
    top: int = 20
    out: Path | None = None
    collect_recoveries: bool = False
    then: Callable[[ReportTables], None] | None = None
    timer: Callable[[str], None] = _no_timing


@dataclass(frozen=True)
class Input:
    """The Spark session and the job's parsed lines, for a second job over some recoveries'
    events (:func:`_exact_after_end`)."""

    spark: SparkSession
    parsed: DataFrame


def compute(
    spark: SparkSession, paths: list[str], top: int = 20, out: Path | None = None,
    collect_recoveries: bool = False, then: Callable[[ReportTables], None] | None = None,
) -> ReportTables:
    """Run the report: ONE Spark job reads, parses and validates every line and aggregates it
    into per-recovery rows and bad-input groups (``transform.one_pass``); those come to the
    driver as Arrow and the small tables are computed there (``tables``, :func:`finish`). The
    per-recovery table is written under ``out`` when given; ``then`` runs on the small tables
    meanwhile."""
    run = Run(paths, top, out, collect_recoveries, then, _Timer())
    try:
        lines = tf.read_lines(spark, paths)
    except AnalysisException as e:
        first = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise ReportError("INVALID_REQUEST", f"no events found at {', '.join(paths)}: {first}") from e
    parsed = tf.parse_lines(lines)
    # No name holds the Arrow result here: finish() lets go of it as soon as it is split.
    return finish(tf.one_pass(parsed).toArrow(), run, Input(spark, parsed))


def finish(result: pa.Table, run: Run, source: Input | None = None,
           job: str = "read, parse, validate and aggregate every line (one Spark job)") -> ReportTables:
    """The driver's part of :func:`compute`, from the Spark job's Arrow rows: the small tables,
    and the per-recovery table under ``run.out`` when given, written by a second thread while
    the small tables are computed and ``run.then`` (given them) runs. ``source`` is used only
    when some row's count of events after the end is not exact (see :func:`_exact_after_end`)."""
    step = run.timer
    step(job)
    is_rec = pc.is_null(result.column("pcode"))
    groups = result.filter(pc.invert(is_rec)).select(list(tf.PROBLEM_COLUMNS)).to_pandas()
    rec_tbl = _exact_after_end(source, _rows(result, is_rec).drop_columns(list(tf.PROBLEM_COLUMNS)))
    del result, is_rec
    # The problem lists stay in Arrow but for the few recoveries that have any (Python lists
    # of a million recoveries cost seconds and hundreds of MiB on the driver).
    has = pc.greater(pc.list_value_length(rec_tbl.column("problem_messages")), 0)
    flagged = rec_tbl.select(["cluster", "recovery_id", "problem_messages"]).filter(has).to_pandas()
    n_events = int(pc.sum(rec_tbl.column("n_events")).as_py() or 0)
    n_lines = n_events + int(groups.loc[~groups["pnote"].astype(bool), "n_problem"].sum())
    if n_lines == 0:
        where = ", ".join(run.paths)
        raise ReportError("INVALID_REQUEST", f"no events found at {where}: the files are empty")
    # The per-recovery table is written by a second thread while this one computes the small
    # tables: both mostly run in Arrow's and numpy's C code, which let go of the GIL, and the
    # JVM is idle by now, so the two cores are the driver's (measured at 10 M events: 1.3 s of
    # writing and 1.2 s of tables took 2.5 s one after the other, about 1.4 s together). The
    # writing takes longer than the tables, so ``then`` (the HTML report) overlaps it too.
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="kk-write") as pool:
        written = pool.submit(write_recoveries, rec_tbl, run.out / "tables") if run.out is not None else None
        tables = small_tables(rec_tbl, flagged, groups, run.paths, n_lines, run.top, run.collect_recoveries)
        step("small tables (numpy on the Arrow columns, on the driver)")
        if run.then is not None:
            run.then(tables)
            step("small tables written, HTML report rendered")
        if written is not None:
            written.result()
            step("per-recovery table written (the rest of it)")
    return tables


def _rows(t: pa.Table, mask: pa.ChunkedArray) -> pa.Table:
    """``t.filter(mask)`` without copying the table when the rows to drop are few: the kept
    runs as zero-copy slices (the bad-input groups are a few dozen rows among a million
    recoveries; a filter copies every column, about 0.5 GiB at 10 M events)."""
    drop = pc.indices_nonzero(pc.invert(mask)).to_numpy()
    if len(drop) > 1000:
        return t.filter(mask)
    bounds = [-1, *drop.tolist(), t.num_rows]
    parts = [t.slice(a + 1, b - a - 1) for a, b in itertools.pairwise(bounds) if b - a > 1]
    return pa.concat_tables(parts) if parts else t.slice(0, 0)


def _exact_after_end(source: Input | None, rec: pa.Table) -> pa.Table:
    """The per-recovery rows with every count of events after the end exact: the few whose
    one-pass count is not (a step logged four times or more on both sides of the end, see
    ``transform._after_end_from_stats``) are computed again from their events by the per-table
    path (a second Spark job, only when there are any; real logs have none)."""
    exact = rec.column(tf.RECHECK_COLUMN)
    rec = rec.drop_columns([tf.RECHECK_COLUMN])
    if pc.all(exact).as_py() is not False:
        return rec
    if source is None:
        raise ValueError("some events after the end need recounting, which needs the Spark session and lines")
    keys = rec.filter(pc.invert(exact)).select(["cluster", "recovery_id"])
    again = source.spark.createDataFrame(keys.to_pandas())
    events = tf.events_of(source.parsed).join(F.broadcast(again), ["cluster", "recovery_id"])
    fixed = tf.sessionise(events).drop("all_ts").toArrow()
    return pa.concat_tables([rec.filter(exact), fixed.select(rec.column_names).cast(rec.schema)])


def write_recoveries(rec: pa.Table, tables: Path) -> None:
    """The per-recovery table as recoveries.parquet/ and recoveries.csv/ (directories of parts,
    as Spark lays them out, so a reader of either layout finds them)."""
    for name in ("recoveries.parquet", "recoveries.csv"):
        d = tables / name
        if d.is_dir():
            shutil.rmtree(d)
        elif d.exists():
            d.unlink()
        d.mkdir(parents=True)
    t = rec.drop_columns(["problem_messages"])
    # No dictionary for the columns unique to each recovery: Parquet would build one per column
    # chunk and then drop it for plain encoding (0.8 s -> 0.6 s of CPU at 10 M events, and a
    # smaller file; the same values, see the Parquet format's "Dictionary Encoding").
    unique = {"recovery_id", "old_uuid", "new_uuid", *TS_COL.values()}
    pq.write_table(t, tables / "recoveries.parquet" / "part-00000.parquet",
                   use_dictionary=[c for c in t.column_names if c not in unique])
    problems = pc.binary_join(t.column("problems").cast(pa.list_(pa.string())), ";")
    flat = t.set_column(t.schema.get_field_index("problems"), "problems", problems)
    # Larger batches than the default 1,024 rows: the same bytes, 15 % less CPU.
    pa_csv.write_csv(flat, tables / "recoveries.csv" / "part-00000.csv",
                     pa_csv.WriteOptions(batch_size=65_536))


def write_tables(t: ReportTables, out: Path) -> None:
    """Each small table as one Parquet file and one CSV file under out/tables/."""
    tables = out / "tables"
    tables.mkdir(parents=True, exist_ok=True)
    frames = {
        "phase_stats": t.phase_stats,
        "phase_histogram": t.phase_histogram,
        "outcomes": t.outcomes,
        "failures": t.failures,
        "daily": t.daily,
        "slowest": t.slowest,
        "bad_input": t.bad_input,
    }
    if t.compare is not None:
        frames["compare"] = t.compare
    for name, df in (("unclean", t.unclean), ("failed_recoveries", t.failed_list),
                     ("in_progress", t.in_progress)):
        if df is not None:
            frames[name] = df
    for name, df in frames.items():
        df.to_parquet(tables / f"{name}.parquet", index=False)
        csv = df.copy()
        if "examples" in csv:
            csv["examples"] = csv["examples"].map(lambda xs: " | ".join(list(xs)))
        csv.to_csv(tables / f"{name}.csv", index=False)
    (tables / "summary.json").write_text(json.dumps(t.summary, indent=2) + "\n")
    pd.DataFrame([t.summary]).to_csv(tables / "summary.csv", index=False)


def _ingest_and_merge(paths: list[str], lay: ing.Layout, engine: str, master: str | None,
                      step: Callable[[str], None],
                      ) -> tuple[ing.Ingested, SparkSession | None, pa.Table | None]:
    """Land, ingest and merge (:func:`compute_state`); a JVM only if Spark has input."""
    sources, chosen = landing.sources_for(lay, paths, engine=engine)
    done = inprocess.ingest(lay)  # arrow's batch a killed run left, and arrow's new files
    spark = None
    if sources:
        spark = build_session(master)
        step("Spark session (JVM start)")
        s = ing.ingest(spark, lay, sources)
        done = ing.Ingested(done.batches + s.batches, done.events + s.events,
                            done.quarantined + s.quarantined, done.seconds + s.seconds)
    step(f"ingested {done.events + done.quarantined:,} new lines in {done.batches} batch(es) "
         f"(new input: {chosen})")
    return done, spark, merged.update(spark, lay, step=step) if spark else inprocess.update(lay, step)


def compute_state(
    paths: list[str], lay: ing.Layout, run: Run, engine: str = landing.AUTO, master: str | None = None,
) -> tuple[ReportTables, ing.Ingested, SparkSession | None]:
    """The incremental report: land what is new for one engine (``landing``; ``engine``: spark,
    arrow or auto), ingest it into the tables under ``lay`` exactly once (``inprocess`` for
    arrow, ``ingest`` for Spark, which starts only when it has input), aggregate each new batch's
    lines once (``partials``) and merge them into the merged rows of the recoveries they touch
    (``merged``, or ``inprocess`` when no JVM was started); the driver reads those rows."""
    done, spark, rows = _ingest_and_merge(paths, lay, engine, master, run.timer)
    if rows is None:
        raise ReportError("INVALID_REQUEST", f"no events found at {', '.join(paths)}: the files are empty")
    source = None
    if spark is not None:  # only for recounting a rare recovery (finish)
        parsed = partials.read_parsed(spark, lay)
        assert parsed is not None
        source = Input(spark, parsed)
    return finish(rows, run, source, "merged rows written and read (pyarrow)"), done, spark


@contextlib.contextmanager
def _state(lay: ing.Layout, paths: list[str], full: bool) -> Iterator[None]:
    """The state directory, held by this run alone (a second run is refused, not queued),
    emptied first with ``full``, and checked to be built from ``paths``."""
    if lay.root.exists() and not lay.root.is_dir():
        raise ReportError("INVALID_REQUEST", f"--state {lay.root} exists and is not a directory")
    lay.root.mkdir(parents=True, exist_ok=True)
    with open(lay.root / ".lock", "a+") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            busy = f"--state {lay.root} is in use by another report run"
            raise ReportError("INVALID_REQUEST", busy) from None
        if full:
            ing.reset(lay)
        try:  # a state that cannot be used, found at the start or while the run reads it
            ing.check_inputs(lay, paths)
            yield
        except ing.StateError as e:
            raise ReportError("INVALID_REQUEST", str(e)) from e


def ingest_only(
    events: list[str], state: str, master: str | None = None, full: bool = False, engine: str = landing.AUTO,
) -> dict[str, Any]:
    """Bring the state under ``state`` up to date with ``events`` (the tables, the partials and
    the merged rows), no report: what this run ingested and the state's totals."""
    paths = _check_inputs(events)
    lay = ing.Layout(Path(state))
    with _state(lay, paths, full):
        done = _ingest_and_merge(paths, lay, engine, master, _no_timing)[0]
        return {"batches": done.batches, "events": done.events, "quarantined": done.quarantined,
                "seconds": round(done.seconds, 3), "state": partials.ledger(lay)}


def run_report(
    events: list[str], out: str, master: str | None = None, top: int = 20, state: str | None = None,
    full: bool = False, engine: str = landing.AUTO,
) -> Path:
    """Read the event logs at ``events`` (new lines through the table under ``state``, default
    ``out``/state; ``full``: rebuilt from the raw logs), write the tables and the HTML report
    under ``out``, return the path of ``out/report.html``. Raises :class:`ReportError` on bad
    arguments."""
    paths = _check_inputs(events)
    out_dir = Path(out)
    if out_dir.exists() and not out_dir.is_dir():
        raise ReportError("INVALID_REQUEST", f"--out {out} exists and is not a directory")
    lay = ing.Layout(Path(state) if state else out_dir / "state")
    out_dir.mkdir(parents=True, exist_ok=True)
    timer = _Timer()
    with _state(lay, paths, full):
        report, tmp = out_dir / "report.html", out_dir / ".report.html.tmp"

        def emit(tables: ReportTables) -> None:  # while the per-recovery table is being written
            write_tables(tables, out_dir)
            tmp.write_text(render_html(tables), encoding="utf-8")

        run = Run(paths, top, out_dir.resolve(), False, emit, timer)
        spark = compute_state(paths, lay, run, engine, master)[2]
    costs = jvm_costs(spark) if timer.on and spark is not None else None
    if costs is not None:  # e.g. the JIT's share: a fixed cost of every run (README, bench/report.py)
        timer.note(costs.line())
    # Only once every table is written: a reader never sees a half-written report, nor a
    # report whose per-recovery table failed.
    os.replace(tmp, report)
    return report.resolve()


# Errors of a Python call into a JVM that may have died under it (py4j's Py4JError and
# Py4JNetworkError; the socket's own OSError / EOFError): a Py4JJavaError, a Java exception
# relayed by a live JVM, is not one of them.
_LOST_JVM = ("Py4JError", "Py4JNetworkError", "EOFError")


def failure_line(e: Exception) -> str:
    """One line for a failed run: its first line, unless the JVM itself died (e.g. out of memory:
    session.py makes it exit), which is then what the line says. The JVM may end a moment after
    the call failed on its closed socket, so for those errors its end is awaited briefly."""
    lost = type(e).__name__ in _LOST_JVM or (isinstance(e, OSError) and not isinstance(e, FileNotFoundError))
    code = jvm_exit_code(wait_s=3.0 if lost else 0.0)
    if code is not None:
        return jvm_failure(code)
    msg = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
    return f"{type(e).__name__}: {msg}"


def main(argv: list[str] | None = None) -> int:
    """``kraftkeeper report --events PATH [PATH...] --out DIR [--master URL] [--top N]``."""
    ap = ArgumentParser(prog="kraftkeeper report",
                        description="Recovery timing report from event logs (Spark; small increments "
                        "in process).")
    ap.add_argument("--events", required=True, nargs="+", action="extend", metavar="PATH",
                    help="event log files or directories (date=YYYY-MM-DD/ trees, any Hadoop URL)")
    ap.add_argument("--out", required=True, metavar="DIR", help="output directory (report.html, tables/)")
    ap.add_argument("--master", default=None, metavar="URL",
                    help="Spark master (default local[*] on loopback)")
    ap.add_argument("--top", type=int, default=20, metavar="N",
                    help="slowest recoveries to show (default 20)")
    ap.add_argument("--state", default=None, metavar="DIR",
                    help="the ingested table, its quarantine and checkpoint (default OUT/state)")
    ap.add_argument("--full", action="store_true", help="rebuild the state from the raw logs")
    ap.add_argument("--engine", default=landing.AUTO, choices=landing.ENGINES,
                    help="who ingests the new input: spark (a Structured Streaming run), arrow (in this "
                    "process, no JVM), or auto (default): arrow below KK_REPORT_ARROW_MAX_BYTES of new "
                    "input (64 MiB), else spark; the state and report are the same either way")
    # Tests and the bench: ingest into --state only, print what was ingested as JSON, no report.
    ap.add_argument("--ingest-only", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.top < 1:
        ap.error("--top must be at least 1")
    try:
        if a.ingest_only:
            state = a.state or str(Path(a.out) / "state")
            print(json.dumps(ingest_only(a.events, state, a.master, a.full, a.engine)))
            return 0
        path = run_report(a.events, a.out, a.master, a.top, a.state, a.full, a.engine)
    except ReportError as e:
        print(f"{e.code}: {e.message}", file=sys.stderr)
        return EXIT_INVALID
    except Exception as e:  # Spark/JVM failures: one clear line, not a Java stack trace
        print(f"INTERNAL_ERROR: report failed: {failure_line(e)}", file=sys.stderr)
        return EXIT_FAILED
    print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
