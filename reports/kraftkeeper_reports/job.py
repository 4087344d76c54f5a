"""The report job: event logs in, tables and one HTML report out (``kraftkeeper report``).

    run_report(["events/"], "out/")   ->  out/report.html
                                          out/tables/<name>.parquet and out/tables/<name>.csv
                                          out/tables/recoveries.parquet/ (and .csv/), Spark parts

Tables: ``phase_stats`` (p50/p90/p99/max per phase, per cluster and "(all)"),
``phase_histogram``, ``outcomes``, ``failures``, ``daily``, ``slowest`` (with timelines),
``bad_input`` (counts by reason with examples), ``summary`` (the headline numbers) and the
per-recovery table ``recoveries``. Definitions are in ``kraftkeeper_reports.transform``.

Errors are one ``CODE: message`` line on stderr and a non-zero exit; the report's path is the
last line on stdout.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import NoReturn

import pandas as pd
from pyspark import StorageLevel
from pyspark.errors import AnalysisException
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from kraftkeeper_reports import transform as tf
from kraftkeeper_reports.render import render_html
from kraftkeeper_reports.session import build_session
from kraftkeeper_reports.tables import ReportTables

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

    def __call__(self, step: str) -> None:
        now = time.monotonic()
        if self.on:
            print(f"# report timing: {step} {now - self.t:.1f} s", file=sys.stderr, flush=True)
        self.t = now


def compute(
    spark: SparkSession, paths: list[str], top: int = 20, out: Path | None = None,
    collect_recoveries: bool = False,
) -> ReportTables:
    """Run every transformation; write the big per-recovery table under ``out`` when given."""
    try:
        lines = tf.read_lines(spark, paths)
    except AnalysisException as e:
        first = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise ReportError("INVALID_REQUEST", f"no events found at {', '.join(paths)}: {first}") from e
    parsed = tf.parse_lines(lines).persist(StorageLevel.MEMORY_AND_DISK)
    timer = _Timer()
    try:
        counts = parsed.agg(
            F.count(F.lit(1)).alias("lines"),
            F.sum(F.when(F.col("reason").isNull(), 1).otherwise(0)).alias("events"),
        ).first()
        assert counts is not None
        n_lines = int(counts["lines"] or 0)
        n_events = int(counts["events"] or 0)
        timer("read and parse every line")
        if n_lines == 0:
            where = ", ".join(paths)
            raise ReportError("INVALID_REQUEST", f"no events found at {where}: the files are empty")
        recoveries = tf.sessionise(tf.events_of(parsed)).persist(StorageLevel.MEMORY_AND_DISK)
        try:
            problems = tf.line_problems(parsed).unionByName(tf.recovery_problems(recoveries))
            bad = tf.bad_input(problems).toPandas()
            timer("sessionise, bad input")
            stats = tf.phase_stats(recoveries).toPandas()
            hist = tf.phase_histogram(recoveries).toPandas()
            outc = tf.outcomes(recoveries).toPandas()
            fails = tf.failures(recoveries).toPandas()
            day = tf.daily(recoveries).toPandas()
            slow = tf.slowest(recoveries, top).toPandas()
            comp = tf.compare(recoveries).toPandas()
            timer("small tables")
            rec_pd = recoveries.toPandas() if collect_recoveries else None
            if out is not None:
                tables = out / "tables"
                rec = recoveries.drop("problem_messages")
                rec.write.mode("overwrite").parquet(str(tables / "recoveries.parquet"))
                rec.withColumn("problems", F.concat_ws(";", "problems")).write.mode("overwrite").option(
                    "header", "true"
                ).csv(str(tables / "recoveries.csv"))
                timer("per-recovery table written")
        finally:
            recoveries.unpersist()
    finally:
        parsed.unpersist()

    def pick(phase: str, col: str) -> float | None:
        row = stats[(stats["cluster"] == tf.ALL_CLUSTERS) & (stats["phase"] == phase)]
        return None if row.empty else float(row.iloc[0][col])

    by_outcome = outc.groupby("outcome")["recoveries"].sum().to_dict()
    rejected = int(bad.loc[(bad["level"] == "line") & (bad["action"] == "rejected"), "count"].sum())
    summary: dict[str, float | int | str | None] = {
        "inputs": ", ".join(paths),
        "lines": n_lines,
        "events": n_events,
        "rejected_lines": rejected,
        "skipped_lines": int(bad.loc[(bad["level"] == "line") & (bad["action"] == "skipped"), "count"].sum()),
        "recoveries": int(sum(by_outcome.values())),
        "completed": int(by_outcome.get("completed", 0)),
        "failed": int(by_outcome.get("failed", 0)),
        "in_progress": int(by_outcome.get("in_progress", 0)),
        "invalid": int(by_outcome.get("invalid", 0)),
        "clusters": int(outc["cluster"].nunique()),
        "p50_total_ms": pick("total", "p50_ms"),
        "p90_total_ms": pick("total", "p90_ms"),
        "p99_total_ms": pick("total", "p99_ms"),
        "max_total_ms": pick("total", "max_ms"),
        "p50_under_replicated_ms": pick("under_replicated", "p50_ms"),
        "p99_under_replicated_ms": pick("under_replicated", "p99_ms"),
        "p50_exposure_ms": pick("exposure", "p50_ms"),
        "p99_exposure_ms": pick("exposure", "p99_ms"),
        "max_exposure_ms": pick("exposure", "max_ms"),
        "days": len(day),
        "first_day": None if day.empty else str(day["date"].min()),
        "last_day": None if day.empty else str(day["date"].max()),
    }
    return ReportTables(summary, stats, hist, outc, fails, day, slow, bad, comp, rec_pd)


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
    for name, df in frames.items():
        df.to_parquet(tables / f"{name}.parquet", index=False)
        csv = df.copy()
        if "examples" in csv:
            csv["examples"] = csv["examples"].map(lambda xs: " | ".join(list(xs)))
        csv.to_csv(tables / f"{name}.csv", index=False)
    (tables / "summary.json").write_text(json.dumps(t.summary, indent=2) + "\n")
    pd.DataFrame([t.summary]).to_csv(tables / "summary.csv", index=False)


def run_report(events: list[str], out: str, master: str | None = None, top: int = 20) -> Path:
    """Read the event logs at ``events``, write the tables and the HTML report under ``out``,
    return the path of ``out/report.html``. Raises :class:`ReportError` on bad arguments."""
    paths = _check_inputs(events)
    out_dir = Path(out)
    if out_dir.exists() and not out_dir.is_dir():
        raise ReportError("INVALID_REQUEST", f"--out {out} exists and is not a directory")
    out_dir.mkdir(parents=True, exist_ok=True)
    spark = build_session(master)
    tables = compute(spark, paths, top=top, out=out_dir.resolve())
    write_tables(tables, out_dir)
    html = render_html(tables)
    report = out_dir / "report.html"
    tmp = out_dir / ".report.html.tmp"
    tmp.write_text(html, encoding="utf-8")
    os.replace(tmp, report)  # a reader never sees a half-written report
    return report.resolve()


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        print(f"INVALID_REQUEST: {message}", file=sys.stderr)
        raise SystemExit(EXIT_INVALID)


def main(argv: list[str] | None = None) -> int:
    """``kraftkeeper report --events PATH [PATH...] --out DIR [--master URL] [--top N]``."""
    ap = _Parser(prog="kraftkeeper report", description="Recovery timing report (Spark) from event logs.")
    ap.add_argument("--events", required=True, nargs="+", action="extend", metavar="PATH",
                    help="event log files or directories (date=YYYY-MM-DD/ trees, any Hadoop URL)")
    ap.add_argument("--out", required=True, metavar="DIR", help="output directory (report.html, tables/)")
    ap.add_argument("--master", default=None, metavar="URL",
                    help="Spark master (default local[*] on loopback)")
    ap.add_argument("--top", type=int, default=20, metavar="N",
                    help="slowest recoveries to show (default 20)")
    a = ap.parse_args(argv)
    if a.top < 1:
        ap.error("--top must be at least 1")
    try:
        path = run_report(a.events, a.out, a.master, a.top)
    except ReportError as e:
        print(f"{e.code}: {e.message}", file=sys.stderr)
        return EXIT_INVALID
    except Exception as e:  # Spark/JVM failures: one clear line, not a Java stack trace
        msg = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        print(f"INTERNAL_ERROR: report failed: {type(e).__name__}: {msg}", file=sys.stderr)
        return EXIT_FAILED
    print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
