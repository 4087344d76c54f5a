"""Benchmark of the recovery report: the full Spark job against the same aggregation in pandas
and in DuckDB, on generated event logs (``kraftkeeper_reports.generate``).

    .venv/bin/python bench/report.py                      # 1 M and 10 M events
    .venv/bin/python bench/report.py --sizes 100000,1000000
    .venv/bin/python bench/report.py --engines spark,duckdb --repeat 3   # ratio of medians
    .venv/bin/python bench/report.py --sizes 10000000 --engines spark,duckdb,spark-read,spark-json
    .venv/bin/python bench/report.py --incremental --sizes 2000000 --daily-only --repeat 2

For each size, each engine runs in its own process (so memory is its own), while this script
samples the process tree with psutil every 0.1 s:

* spark:  ``python -m kraftkeeper_reports.job`` on ``local[2]``: ONE Spark job parses and
  validates every line in the JVM (the writer's form by cutting it at its quotes and writing it
  again byte for byte, any other line by Spark's JSON parser into VARIANT and SQL checks) and
  aggregates it into per-recovery rows and per-reason bad-line counts with examples; those
  come to the driver as Arrow, and the phase percentiles per cluster and overall, failures,
  daily trend, slowest recoveries and engine comparison are computed there with pandas;
  Parquet/CSV tables and the HTML report.
  Wall time includes JVM start. "driver peak" = the driver's Python + its JVM (in local mode
  the executors are threads of that JVM); any Python worker would count in "all". The job's
  own step timings (KK_REPORT_TIMINGS) are printed on stderr.
* pandas: the same per-line classification (``events.classify_line``), then groupby per
  recovery, exact percentiles per phase (numpy, linear), failures and daily counts; no report.
* spark-read: Spark's floor here, not a report: the job's own session (JVM start included)
  reading every line as the job does and counting them. What is left between it and "spark" is
  the parse, validation, aggregation and report; what separates it from duckdb is Spark itself.
* spark-json: Spark doing only what DuckDB does, not a report: DuckDB's query below (the same
  fields, filter, aggregation and exact percentiles; no validation, no report) written in Spark
  SQL over Spark's own JSON file reader with the event schema, in the job's session (JVM start
  included). The job does that work and more, and reads text lines that it parses with Spark's
  JSON functions rather than the file reader.
* duckdb: ``read_json`` with ``ignore_errors`` (a line DuckDB cannot read is skipped without a
  reason: less validation than the two others), the same aggregation in SQL (``quantile_cont``,
  exact), 2 threads.

Events per second = input lines / wall time. Each engine prints the overall p50 of the total
recovery time, so the table also shows that they answer the same question. They agree to a few
ms, not exactly: each lets through a different set of damaged lines (the job's validation and
anomaly rules, pandas's ``classify_line`` without those rules, DuckDB's ``ignore_errors`` and
timestamp format, Spark's JSON reader), and one recovery more or less moves the median (10 M
events: 19,863 ms for the job, 19,861 ms for DuckDB and spark-json). For Spark the script also
checks that every input line is accounted for (events + rejected + skipped lines = lines) and
prints Spark's wall time, and spark-read's and spark-json's, as a multiple of DuckDB's.

``--incremental``: the daily run, ``kraftkeeper report`` over a state already holding the size's
events (prepared once by a ``--full`` run, which ``--engine auto`` gives to Spark) after one new
closed day of ``--new`` events arrived, against DuckDB's full scan of all the lines, the two
interleaved in each repeat. The daily run takes the job's default ``--engine auto``: its new
day (about 25 MB at 100 k events) is ingested in process, no JVM (docs/reports.md).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import defaultdict
from datetime import date
from pathlib import Path
from typing import Any

import psutil

if __package__ in (None, ""):
    # Run as a file (`python bench/report.py`): import `bench` from the repository root, and keep
    # this directory off the path, where operator.py would shadow the standard library's module.
    sys.path[0] = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

from bench.report_engines import run_duckdb, run_pandas, run_spark_json, run_spark_read

# --- measurement ------------------------------------------------------------------------------


class Sampler(threading.Thread):
    """Peak RSS of a process tree: the root, the JVM children, everything."""

    def __init__(self, pid: int) -> None:
        super().__init__(daemon=True)
        self.root = psutil.Process(pid)
        self.stop = threading.Event()
        self.peak_driver = 0
        self.peak_total = 0

    def run(self) -> None:
        while not self.stop.is_set():
            try:
                procs = [self.root, *self.root.children(recursive=True)]
                driver = total = 0
                for p in procs:
                    try:
                        rss = p.memory_info().rss
                        name = p.name()
                    except psutil.Error:
                        continue
                    total += rss
                    if p.pid == self.root.pid or name == "java":
                        driver += rss
                self.peak_driver = max(self.peak_driver, driver)
                self.peak_total = max(self.peak_total, total)
            except psutil.Error:
                pass
            self.stop.wait(0.1)


def measure(cmd: list[str], env: dict[str, str]) -> tuple[float, int, int, str, str]:
    t0 = time.monotonic()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    s = Sampler(proc.pid)
    s.start()
    out, err = proc.communicate()
    wall = time.monotonic() - t0
    s.stop.set()
    s.join()
    if proc.returncode != 0:
        raise SystemExit(f"bench: {' '.join(cmd)} failed ({proc.returncode}):\n{err[-3000:]}")
    return wall, s.peak_driver, s.peak_total, out, err


def ensure_data(base: Path, n: int, seed: int) -> tuple[Path, dict[str, Any]]:
    from kraftkeeper_reports.generate import generate

    d = base / f"events-{n}-seed{seed}"
    stamp = d / "_generated.json"  # "_" prefix: Spark and our readers skip it
    if stamp.exists():
        return d, json.loads(stamp.read_text())
    t0 = time.monotonic()
    stats = generate(d, events=n, clusters=24, days=30, seed=seed, malformed_rate=0.001,
                     files_per_day=2, workers=2)
    info = stats.as_dict() | {"generate_s": round(time.monotonic() - t0, 1)}
    stamp.write_text(json.dumps(info))
    return d, info


def _link_tree(src: Path, dst: Path) -> None:
    """``dst`` as a tree of hard links to ``src``'s files (no bytes copied; nothing here is ever
    modified in place: the job writes new files and renames them)."""
    for f in src.rglob("*"):
        if f.is_file() and not f.name.startswith(("_", ".")):
            to = dst / f.relative_to(src)
            to.parent.mkdir(parents=True, exist_ok=True)
            if not to.exists():
                os.link(f, to)


def _state_copy(src: Path, dst: Path) -> None:
    if dst.exists():
        subprocess.run(["rm", "-rf", str(dst)], check=True)
    subprocess.run(["cp", "-al", str(src), str(dst)], check=True)


def incremental(a: argparse.Namespace, n: int, env: dict[str, str]) -> list[dict[str, Any]]:
    """The daily run: ``n`` events already ingested, ``--new`` new lines in a new closed day,
    the report run again (ingesting only those), against DuckDB's full scan of all the lines;
    and a full rebuild (``--full``) against spark-json. Returns the rows of the table."""
    from kraftkeeper_reports.generate import generate

    base, info = ensure_data(Path(a.data), n, a.seed)
    work = Path(a.data) / f"incremental-{n}-seed{a.seed}"
    # The state is restored to its own path before each daily run (its checkpoint names the
    # files it took by absolute path: a state is not moved), from a copy of hard links.
    root, prepared, pristine = work / "events", work / "state-daily", work / "state-pristine"
    _link_tree(base, root)
    new = Path(a.data) / f"new-{a.new}-seed{a.seed}"
    if not (new / "_generated.json").exists():
        stats = generate(new, events=a.new, clusters=24, days=1, seed=a.seed + 1000, malformed_rate=0.001,
                         files_per_day=1, start=date(2026, 11, 15))
        (new / "_generated.json").write_text(json.dumps(stats.as_dict()))
    new_lines = int(json.loads((new / "_generated.json").read_text())["lines"])
    lines = int(info["lines"])
    rows: list[dict[str, Any]] = []

    def row(engine: str, wall: float, drv: int, tot: int, p50: float, n_lines: int) -> None:
        rows.append({"events": n, "lines": n_lines, "engine": engine, "wall_s": wall, "eps": n_lines / wall,
                     "driver_peak": drv, "total_peak": tot, "p50_total_ms": p50})
        print(f"# {engine:12s} {wall:8.1f} s  {n_lines / wall:12,.0f} lines/s  driver {mib(drv)}  "
              f"all {mib(tot)}  p50 {p50:,.0f} ms", file=sys.stderr)

    def report(state: Path, out: Path, *extra: str) -> tuple[float, int, int, dict[str, Any], str]:
        cmd = [sys.executable, "-m", "kraftkeeper_reports.job", "--events", str(root), "--out", str(out),
               "--state", str(state), "--master", a.master, *extra]
        wall, drv, tot, _, err = measure(cmd, dict(env, KK_REPORT_TIMINGS="1"))
        timings = [x for x in err.splitlines() if x.startswith("# report timing")]
        for t in timings:
            print(t, file=sys.stderr)
        return wall, drv, tot, json.loads((out / "tables" / "summary.json").read_text()), "\n".join(timings)

    def accounted(summary: dict[str, Any], want: int, what: str) -> None:
        counted = sum(int(summary[k]) for k in ("events", "rejected_lines", "skipped_lines"))
        print(f"# {what}: accounted for {counted:,} of {want:,} lines", file=sys.stderr)
        if counted != want or int(summary["lines"]) != want:
            raise SystemExit(f"bench: {what} accounted for {counted:,} lines of {want:,}")

    # The new day is not in the tree while the state is prepared (the n events "already ingested").
    subprocess.run(["rm", "-rf", str(root / "date=2026-11-15")], check=True)
    if not (pristine / "batches").exists():
        print(f"# preparing the state: ingesting {lines:,} lines", file=sys.stderr)
        report(prepared, work / "out-prepared", "--full")
        _state_copy(prepared, pristine)
    for _ in range(a.repeat):
        subprocess.run(["rm", "-rf", str(root / "date=2026-11-15")], check=True)
        # A full rebuild of the whole n + new lines, and spark-json on the same tree.
        _link_tree(new, root)
        if not a.daily_only:
            wall, drv, tot, s, timings = report(work / "state-full", work / "out-full", "--full")
            accounted(s, lines + new_lines, "full rebuild")
            ingest_s = next((float(t.split()[-2]) for t in timings.splitlines() if "ingested" in t),
                            float("nan"))
            print(f"# full rebuild: ingestion {lines + new_lines:,} lines in {ingest_s:.1f} s = "
                  f"{(lines + new_lines) / ingest_s:,.0f} lines/s", file=sys.stderr)
            row("full", wall, drv, tot, float(s["p50_total_ms"] or 0), lines + new_lines)
        for eng in ("duckdb",) if a.daily_only else ("spark-json", "duckdb"):
            cmd = [sys.executable, __file__, "--engine", eng, "--events", str(root), "--master", a.master]
            wall, drv, tot, out_s, _ = measure(cmd, env)
            got = json.loads(out_s.strip().splitlines()[-1])["p50_total_ms"]
            row(eng, wall, drv, tot, float(got), lines + new_lines)
        # The daily run: the prepared state (n lines ingested), then the new day arrives.
        _state_copy(pristine, prepared)
        wall, drv, tot, s, _ = report(prepared, work / "out-daily")
        accounted(s, lines + new_lines, "incremental")
        row("incremental", wall, drv, tot, float(s["p50_total_ms"] or 0), lines + new_lines)
    return rows


def mib(b: int) -> str:
    return f"{b / 1048576:,.0f} MiB"


ENGINES = ("spark", "pandas", "duckdb", "spark-read", "spark-json")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="Spark report job vs pandas vs DuckDB")
    ap.add_argument("--sizes", default="1000000,10000000", help="comma-separated event counts")
    ap.add_argument("--data", default=os.path.join(tempfile.gettempdir(), "kk-report-bench"),
                    help="where generated logs are kept (reused between runs)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--master", default="local[2]")
    ap.add_argument("--engines", default="spark,pandas,duckdb")
    ap.add_argument("--repeat", type=int, default=1, help="run the engines this many times, interleaved")
    ap.add_argument("--incremental", action="store_true",
                    help="the daily run (each size ingested, then --new lines more) vs DuckDB's full scan, "
                         "and a full rebuild (--full) vs spark-json")
    ap.add_argument("--new", type=int, default=100_000, help="new events of the daily run (default 100k)")
    ap.add_argument("--daily-only", action="store_true",
                    help="with --incremental: only the daily run and DuckDB (no full rebuild, no spark-json)")
    ap.add_argument("--engine", help=argparse.SUPPRESS)  # internal: run one engine in this process
    ap.add_argument("--events", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.engine:
        if a.engine in ("spark-read", "spark-json"):
            run = run_spark_read if a.engine == "spark-read" else run_spark_json
            print(json.dumps(run(Path(a.events), a.master)))
            return 0
        fn = {"pandas": run_pandas, "duckdb": run_duckdb}[a.engine]
        print(json.dumps(fn(Path(a.events))))
        return 0

    env = dict(os.environ, SPARK_LOCAL_IP="127.0.0.1", PYTHONUNBUFFERED="1")
    engines = a.engines.split(",")
    for e in engines:
        if e not in ENGINES:
            ap.error(f"unknown engine {e!r} in --engines (known: {', '.join(ENGINES)})")
    try:
        sizes = [int(x) for x in a.sizes.split(",")]
    except ValueError:
        ap.error(f"--sizes must be comma-separated event counts, got {a.sizes!r}")
    if any(n <= 0 for n in sizes) or a.repeat < 1:
        ap.error("--sizes and --repeat must be positive")
    rows = []
    if a.incremental:
        for n in sizes:
            rows += incremental(a, n, env)
        _ratios(rows)
        return 0
    for n in sizes:
        data, info = ensure_data(Path(a.data), n, a.seed)
        lines = int(info["lines"])
        print(f"# {n:,} events requested: {lines:,} lines, generated in {info['generate_s']} s",
              file=sys.stderr)
        # Engines interleaved (A, B, A, B, ...) with --repeat: on a shared machine the load
        # drifts, and the ratio is taken between medians of runs made side by side.
        for eng in [e for _ in range(a.repeat) for e in engines]:
            if eng == "spark":
                out = Path(a.data) / f"report-{n}"
                cmd = [sys.executable, "-m", "kraftkeeper_reports.job", "--events", str(data),
                       "--out", str(out), "--master", a.master]
                wall, drv, tot, _, err = measure(cmd, dict(env, KK_REPORT_TIMINGS="1"))
                for t in (x for x in err.splitlines() if x.startswith("# report timing")):
                    print(t, file=sys.stderr)
                summary = json.loads((out / "tables" / "summary.json").read_text())
                p50 = float(summary["p50_total_ms"] or 0.0)
                counted = sum(int(summary[k]) for k in ("events", "rejected_lines", "skipped_lines"))
                print(f"# spark accounted for {counted:,} of {lines:,} lines "
                      f"({summary['events']:,} events, {summary['rejected_lines']:,} rejected, "
                      f"{summary['skipped_lines']:,} skipped)", file=sys.stderr)
                if counted != lines or int(summary["lines"]) != lines:
                    raise SystemExit(f"bench: spark accounted for {counted:,} lines of {lines:,}")
            else:
                cmd = [sys.executable, __file__, "--engine", eng, "--events", str(data), "--master", a.master]
                wall, drv, tot, out_s, _ = measure(cmd, env)
                got = json.loads(out_s.strip().splitlines()[-1])["p50_total_ms"]
                p50 = float("nan") if got is None else float(got)
            rows.append({"events": n, "lines": lines, "engine": eng, "wall_s": wall, "eps": lines / wall,
                         "driver_peak": drv, "total_peak": tot, "p50_total_ms": p50})
            print(f"# {eng:10s} {wall:8.1f} s  {lines / wall:12,.0f} lines/s  driver {mib(drv)}  "
                  f"all {mib(tot)}  p50 {p50:,.0f} ms", file=sys.stderr)

    print(f"\nmachine: {os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f} at the end; "
          f"spark master {a.master}")
    hdr = (f"| {'events':>11} | {'engine':10} | {'wall s':>8} | {'lines/s':>11} | {'vs spark':>8} | "
           f"{'peak RSS driver':>15} | {'peak RSS all':>12} | {'p50 total':>10} |")
    print(hdr)
    print("|" + "|".join("-" * (len(c)) for c in hdr.split("|")[1:-1]) + "|")
    for r in rows:
        base = next((x for x in rows if x["events"] == r["events"] and x["engine"] == "spark"), r)
        ratio = r["eps"] / base["eps"]
        print(f"| {r['events']:>11,} | {r['engine']:10} | {r['wall_s']:>8.1f} | {r['eps']:>11,.0f} | "
              f"{ratio:>7.2f}x | {mib(r['driver_peak']):>15} | {mib(r['total_peak']):>12} | "
              f"{r['p50_total_ms'] / 1000:>8.1f} s |")
    for n in sorted({r["events"] for r in rows}):
        walls: dict[str, list[float]] = defaultdict(list)
        peaks: dict[str, list[int]] = defaultdict(list)
        for r in rows:
            if r["events"] == n:
                walls[r["engine"]].append(r["wall_s"])
                peaks[r["engine"]].append(r["driver_peak"])
        if "spark" in walls and "duckdb" in walls:
            spark_s, duck_s = statistics.median(walls["spark"]), statistics.median(walls["duckdb"])
            print(f"\n{n:,} events: spark wall time = {spark_s / duck_s:.2f}x duckdb's (medians of "
                  f"{len(walls['spark'])} and {len(walls['duckdb'])} interleaved runs: {spark_s:.1f} s vs "
                  f"{duck_s:.1f} s); spark driver peak {mib(max(peaks['spark']))} (JVM + Python driver)")
        if "spark-read" in walls and "duckdb" in walls:
            read_s, duck_s = statistics.median(walls["spark-read"]), statistics.median(walls["duckdb"])
            print(f"{n:,} events: spark-read (JVM start + reading and counting every line, nothing else) = "
                  f"{read_s / duck_s:.2f}x duckdb's ({read_s:.1f} s vs {duck_s:.1f} s)")
        if "spark-json" in walls and "duckdb" in walls:
            json_s, duck_s = statistics.median(walls["spark-json"]), statistics.median(walls["duckdb"])
            print(f"{n:,} events: spark-json (duckdb's query in Spark on Spark's JSON reader: no validation, "
                  f"no report) = {json_s / duck_s:.2f}x duckdb's ({json_s:.1f} s vs {duck_s:.1f} s)")
    return 0


def _ratios(rows: list[dict[str, Any]]) -> None:
    """The incremental bench's table and its two aims: the daily run against DuckDB's full scan,
    the full rebuild against spark-json (medians of the interleaved runs)."""
    print(f"\nmachine: {os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f} at the end")
    print("| events | lines | engine | wall s | lines/s | peak RSS driver (+JVM) | peak RSS all |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['events']:,} | {r['lines']:,} | {r['engine']} | {r['wall_s']:.1f} | {r['eps']:,.0f} | "
              f"{mib(r['driver_peak'])} | {mib(r['total_peak'])} |")
    for n in sorted({r["events"] for r in rows}):
        w: dict[str, list[float]] = defaultdict(list)
        for r in rows:
            if r["events"] == n:
                w[r["engine"]].append(r["wall_s"])
        med = {k: statistics.median(v) for k, v in w.items()}
        print(f"\n{n:,} events: incremental daily run = {med['incremental'] / med['duckdb']:.2f}x DuckDB's "
              f"full scan ({med['incremental']:.1f} s vs {med['duckdb']:.1f} s; aim 1.0x)")
        if "full" in med:
            print(f"{n:,} events: full rebuild = {med['full'] / med['spark-json']:.2f}x spark-json "
                  f"({med['full']:.1f} s vs {med['spark-json']:.1f} s; aim 1.5x)")


if __name__ == "__main__":
    sys.exit(main())
