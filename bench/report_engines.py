"""The peers of the report bench (:mod:`bench.report`), each run in its own process by
``bench/report.py --engine NAME``: the same aggregation in pandas (``events.classify_line`` per
line) and in DuckDB (``read_json`` and SQL), and Spark's two lower bounds, ``spark-read`` (the
job's session reading and counting every line) and ``spark-json`` (DuckDB's query in Spark SQL
over Spark's JSON reader). Each returns the overall p50 of the total recovery time and its
counts as a JSON-ready dict.
"""

from __future__ import annotations

import re
from collections import defaultdict
from pathlib import Path
from typing import Any


def _typed(sql: str) -> str:
    """``sql`` with each ``<<NAME>>`` replaced by the event type of that name (the vocabulary's
    constants: the queries compare ``type`` with them)."""
    from kraftkeeper_reports import vocabulary

    return re.sub(r"<<([A-Z_]+)>>", lambda m: str(getattr(vocabulary, m.group(1))), sql)


PHASES = ("catch_up", "add_voter", "remove_voter", "under_replicated", "exposure", "total")


def run_pandas(root: Path) -> dict[str, Any]:
    import numpy as np
    import pandas as pd
    from kraftkeeper_reports import events as ev

    cols: dict[str, list[Any]] = defaultdict(list)
    bad: dict[str, int] = defaultdict(int)
    lines = 0
    for f in sorted(root.rglob("*.jsonl")):
        with open(f, encoding="utf-8") as fh:
            for raw in fh:
                lines += 1
                c = ev.classify_line(raw.rstrip("\n"))
                if c.problem is not None:
                    bad[c.problem.reason] += 1
                    continue
                e = c.event
                assert e is not None
                cols["cluster"].append(e["cluster"])
                cols["rid"].append(e["recovery_id"])
                cols["type"].append(e["type"])
                cols["ts"].append(c.ts_ms)
                cols["reason"].append(e["detail"].get("reason") if e["type"] == ev.RECOVERY_FAILED else None)
    df = pd.DataFrame(cols)
    df["type"] = df["type"].astype("category")
    first = df.pivot_table(index=["cluster", "rid"], columns="type", values="ts", aggfunc="min",
                           observed=True)
    reasons = df.dropna(subset=["reason"]).groupby("reason").size()
    det = first[ev.DISK_REPLACEMENT_DETECTED]
    done = first[first[ev.RECOVERY_COMPLETED].notna() & det.notna()].copy()
    d = done[ev.DISK_REPLACEMENT_DETECTED]
    phases = pd.DataFrame({
        "catch_up": done[ev.REPLICA_CAUGHT_UP] - d,
        "add_voter": done[ev.ADD_VOTER_COMMITTED] - done[ev.REPLICA_CAUGHT_UP],
        "remove_voter": done[ev.REMOVE_VOTER_COMMITTED] - done[ev.ADD_VOTER_COMMITTED],
        "under_replicated": done[ev.ADD_VOTER_COMMITTED] - d,
        "exposure": done[ev.REMOVE_VOTER_COMMITTED] - d,
        "total": done[ev.RECOVERY_COMPLETED] - d,
    }).reset_index()
    per_cluster = phases.groupby("cluster")[list(PHASES)].quantile(np.array([0.5, 0.9, 0.99]))
    daily = pd.to_datetime(det.dropna(), unit="ms").dt.date.value_counts()
    return {
        "lines": lines,
        "bad_lines": sum(bad.values()),
        "recoveries": len(first),
        "p50_total_ms": float(np.percentile(phases["total"].dropna(), 50)),
        "groups": len(per_cluster) + len(reasons) + len(daily),
    }


DUCK_SQL = """
WITH ev AS (
  SELECT cluster, recovery_id, type, detail.reason AS reason,
         epoch_ms(try_strptime(ts, '%Y-%m-%dT%H:%M:%S.%gZ')) AS ts_ms
  FROM read_json($glob, format = 'newline_delimited', ignore_errors = true, union_by_name = true,
                 columns = {schema_version: 'BIGINT', ts: 'VARCHAR', cluster: 'VARCHAR',
                            recovery_id: 'VARCHAR', type: 'VARCHAR', replica_id: 'BIGINT',
                            detail: 'STRUCT(reason VARCHAR)'})
  WHERE schema_version = 1 AND cluster IS NOT NULL AND recovery_id IS NOT NULL
), rec AS (
  SELECT cluster, recovery_id,
    min(ts_ms) FILTER (type = '<<DISK_REPLACEMENT_DETECTED>>') AS det,
    min(ts_ms) FILTER (type = '<<REPLICA_CAUGHT_UP>>') AS cu,
    min(ts_ms) FILTER (type = '<<ADD_VOTER_COMMITTED>>') AS avc,
    min(ts_ms) FILTER (type = '<<REMOVE_VOTER_COMMITTED>>') AS rvc,
    min(ts_ms) FILTER (type = '<<RECOVERY_COMPLETED>>') AS done,
    max(reason) FILTER (type = '<<RECOVERY_FAILED>>') AS reason
  FROM ev WHERE ts_ms IS NOT NULL GROUP BY ALL
), ph AS (
  SELECT cluster, cu - det AS catch_up, avc - cu AS add_voter, rvc - avc AS remove_voter,
         avc - det AS under_replicated, rvc - det AS exposure, done - det AS total
  FROM rec WHERE done IS NOT NULL AND det IS NOT NULL
)
SELECT cluster,
  quantile_cont(catch_up, [0.5, 0.9, 0.99]), quantile_cont(add_voter, [0.5, 0.9, 0.99]),
  quantile_cont(remove_voter, [0.5, 0.9, 0.99]), quantile_cont(under_replicated, [0.5, 0.9, 0.99]),
  quantile_cont(exposure, [0.5, 0.9, 0.99]), quantile_cont(total, [0.5, 0.9, 0.99])
FROM ph GROUP BY ROLLUP (cluster)
"""


def run_duckdb(root: Path) -> dict[str, Any]:
    import duckdb

    con = duckdb.connect()
    con.execute("SET threads = 2")
    glob = str(root / "**" / "*.jsonl")
    rows = con.execute(_typed(DUCK_SQL), {"glob": glob}).fetchall()
    overall = next(r for r in rows if r[0] is None)
    fails = con.execute(_typed(
        "SELECT detail.reason, count(*) FROM read_json($glob, format='newline_delimited', ignore_errors=true,"
        " columns={type: 'VARCHAR', detail: 'STRUCT(reason VARCHAR)'}) WHERE type = '<<RECOVERY_FAILED>>'"
        " GROUP BY ALL"), {"glob": glob}).fetchall()
    lines = 0
    for f in root.rglob("*.jsonl"):
        with open(f, "rb") as fh:
            while buf := fh.read(1 << 20):
                lines += buf.count(b"\n")
    return {"lines": lines, "p50_total_ms": float(overall[6][0]), "groups": len(rows) + len(fails)}


# DUCK_SQL's per-recovery part in Spark SQL: the same seven fields, filter and per-recovery
# minima; the rows come to the driver as Arrow and the percentiles are taken there (numpy,
# exact, linear, as DuckDB's ``quantile_cont``), which is how the job does it too (Spark's exact
# ``percentile`` with a rollup took 9 s at 1 M events). Spark's JSON reader in its default
# PERMISSIVE mode gives a line it cannot read null fields, which the filter drops: DuckDB's
# ``ignore_errors``.
SPARK_JSON_SCHEMA = ("schema_version BIGINT, ts STRING, cluster STRING, recovery_id STRING, type STRING, "
                     "replica_id BIGINT, detail STRUCT<reason: STRING>")


SPARK_JSON_SQL = """
WITH ev AS (
  SELECT cluster, recovery_id, type, detail.reason AS reason, unix_millis(try_cast(ts AS TIMESTAMP)) AS ts_ms
  FROM lines WHERE schema_version = 1 AND cluster IS NOT NULL AND recovery_id IS NOT NULL
), rec AS (
  SELECT cluster, recovery_id,
    min(ts_ms) FILTER (WHERE type = '<<DISK_REPLACEMENT_DETECTED>>') AS det,
    min(ts_ms) FILTER (WHERE type = '<<REPLICA_CAUGHT_UP>>') AS cu,
    min(ts_ms) FILTER (WHERE type = '<<ADD_VOTER_COMMITTED>>') AS avc,
    min(ts_ms) FILTER (WHERE type = '<<REMOVE_VOTER_COMMITTED>>') AS rvc,
    min(ts_ms) FILTER (WHERE type = '<<RECOVERY_COMPLETED>>') AS done,
    max(reason) FILTER (WHERE type = '<<RECOVERY_FAILED>>') AS reason,
    count(*) FILTER (WHERE type = '<<RECOVERY_FAILED>>') AS failed_lines
  FROM ev WHERE ts_ms IS NOT NULL GROUP BY cluster, recovery_id
)
SELECT cluster, cu - det AS catch_up, avc - cu AS add_voter, rvc - avc AS remove_voter,
       avc - det AS under_replicated, rvc - det AS exposure,
       CASE WHEN done IS NOT NULL AND det IS NOT NULL THEN done - det END AS total, reason, failed_lines
FROM rec WHERE (done IS NOT NULL AND det IS NOT NULL) OR failed_lines > 0
"""


def run_spark_json(root: Path, master: str) -> dict[str, Any]:
    """DuckDB's query (``DUCK_SQL``: no validation, no report) done in Spark as the job would,
    over Spark's own JSON file reader with the event schema, in the job's session (JVM start
    included): the part of the job's work that DuckDB does."""
    import numpy as np
    from kraftkeeper_reports.session import build_session

    spark = build_session(master)
    spark.read.schema(SPARK_JSON_SCHEMA).option("recursiveFileLookup", "true").json(
        str(root)).createOrReplaceTempView("lines")
    # One scan, as the job: the failed lines per reason are summed from the per-recovery rows
    # (DuckDB's second read_json counts them from the lines).
    rec = spark.sql(_typed(SPARK_JSON_SQL)).toPandas()
    spark.stop()
    phases = rec[rec["total"].notna()]
    per_cluster = phases.groupby("cluster")[list(PHASES)].quantile(np.array([0.5, 0.9, 0.99]))
    fails = rec[rec["failed_lines"] > 0].groupby("reason", dropna=False)["failed_lines"].sum()
    return {"lines": None, "p50_total_ms": float(np.percentile(phases["total"], 50)),
            "groups": len(per_cluster) + 1 + len(fails)}


def run_spark_read(root: Path, master: str) -> dict[str, Any]:
    """Spark's floor for this job on this machine: the same session (JVM start included) reading
    every line of the same files, as the job reads them, and counting them; no parse, no
    aggregation, no report."""
    from kraftkeeper_reports import transform as tf
    from kraftkeeper_reports.session import build_session

    spark = build_session(master)
    lines = tf.read_lines(spark, [str(root)]).count()
    spark.stop()
    return {"lines": lines, "p50_total_ms": None, "groups": 0}  # no aggregation: no p50
