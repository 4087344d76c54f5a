"""The one-pass job (one Spark aggregation, small tables on the driver) against the
per-table Spark transformations it replaced, on a generated log with every kind of damage: the
same tables, the same per-recovery rows, the same bad-input counts and examples."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest

from quorum.timefmt import rfc3339

pytestmark = pytest.mark.spark

TOP = 7


def _norm(df: pd.DataFrame, keys: list[str]) -> pd.DataFrame:
    """Rows in key order, numbers as float (Spark's nullable longs and pandas' ints compare)."""
    out = df.sort_values(keys, kind="stable").reset_index(drop=True).copy()
    for c in out.columns:
        if pd.api.types.is_numeric_dtype(out[c]) and not pd.api.types.is_bool_dtype(out[c]):
            out[c] = out[c].astype("float64")
        elif c in ("examples", "problems", "problem_messages"):
            out[c] = out[c].map(lambda xs: list(xs) if xs is not None else None)
        elif c == "date":
            out[c] = out[c].astype(str)
    return out


@pytest.fixture(scope="module")
def both(spark: Any, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    from kraftkeeper_reports import events as ev
    from kraftkeeper_reports import spark_tables as st
    from kraftkeeper_reports import transform as tf
    from kraftkeeper_reports.generate import generate
    from kraftkeeper_reports.job import compute

    root = tmp_path_factory.mktemp("one-pass")
    generate(root / "gen", events=10_000, clusters=4, days=3, seed=9, malformed_rate=0.02,
             failure_scale=2.0, engines=("kraftkeeper", "kafka"))
    good = json.loads((next((root / "gen").rglob("*.jsonl"))).read_text().splitlines()[0])
    # Lines whose notes come with a fatal reason or alone (a code counted twice, as a reason of
    # some lines and a note of others).
    extra = [
        json.dumps(dict(good, host="n1")),                                   # event + extra_fields
        json.dumps(dict(good, type="leader_changed")),                        # unknown_type (skipped)
        json.dumps({k: v for k, v in dict(good, type="x", more=1).items() if k != "ts"}),  # fatal + notes
        json.dumps(dict(good, type="y", replica_id="3", more=2)),            # fatal + both notes
        "", "not json",
    ]
    # Steps logged on both sides of the end: three times (counted exactly from first, last and
    # sum) and five times (the job counts these again from their events).
    t0 = 1_790_000_000_000

    def at(rid: str, typ: str, ms: int) -> str:
        ts = rfc3339(t0 + ms, millis=True)
        return json.dumps(dict(good, recovery_id=rid, type=typ, ts=ts, detail={}))

    for rid, caught in (("r-three-late", (50, 150, 170)), ("r-three-early", (50, 60, 170)),
                        ("r-five", (50, 60, 150, 160, 170))):
        extra += [at(rid, ev.DISK_REPLACEMENT_DETECTED, 0), at(rid, ev.RECOVERY_COMPLETED, 100)]
        extra += [at(rid, ev.REPLICA_CAUGHT_UP, ms) for ms in caught]
    (root / "loose.jsonl").write_text("\n".join(extra) + "\n")
    paths = [str(root)]

    new = compute(spark, paths, top=TOP, collect_recoveries=True)

    parsed = tf.parse_lines(tf.read_lines(spark, paths)).cache()
    recs = tf.sessionise(tf.events_of(parsed)).cache()
    problems = tf.line_problems(parsed).unionByName(st.recovery_problems(recs))
    old = {
        "recoveries": recs.toPandas(),
        "phase_stats": st.phase_stats(recs).toPandas(),
        "phase_histogram": st.phase_histogram(recs).toPandas(),
        "outcomes": st.outcomes(recs).toPandas(),
        "failures": st.failures(recs).toPandas(),
        "daily": st.daily(recs).toPandas(),
        "slowest": st.slowest(recs, TOP).toPandas(),
        "compare": st.compare(recs).toPandas(),
        "bad_input": st.bad_input(problems).toPandas(),
        "all_examples": problems.groupBy("code").agg({"example": "collect_set"}).toPandas(),
        "lines": parsed.count(),
        "events": parsed.where("reason is null").count(),
    }
    parsed.unpersist()
    recs.unpersist()
    assert ev.UNKNOWN_TYPE in set(old["bad_input"]["code"])
    return {"new": new, "old": old, "paths": paths}


@pytest.mark.parametrize("name,keys", [
    ("phase_stats", ["phase", "cluster"]),
    ("phase_histogram", ["phase", "bin_lo_ms"]),
    ("outcomes", ["cluster", "outcome"]),
    ("failures", ["cluster", "failure_reason"]),
    ("daily", ["date"]),
    ("slowest", ["total_ms", "cluster", "recovery_id"]),
    ("compare", ["engine", "order", "phase"]),
    ("recoveries", ["cluster", "recovery_id"]),
])
def test_each_table_is_the_old_one(both: dict[str, Any], name: str, keys: list[str]) -> None:
    new, old = getattr(both["new"], name), both["old"][name]
    assert list(new.columns) == list(old.columns)
    assert len(old) > 0
    a, b = _norm(new, keys), _norm(old, keys)
    for c in a.columns:
        if pd.api.types.is_float_dtype(b[c]):
            assert np.allclose(a[c].to_numpy(), b[c].to_numpy(), rtol=1e-12, atol=1e-9, equal_nan=True), c
        else:
            assert a[c].tolist() == b[c].tolist(), c
    if name == "slowest":  # the same order, not just the same rows
        assert new["recovery_id"].tolist() == old["recovery_id"].tolist()


def test_bad_input_counts_and_examples_are_the_old_ones(both: dict[str, Any]) -> None:
    new, old = both["new"].bad_input, both["old"]["bad_input"]
    cols = ["level", "reason", "code", "action", "count"]
    key = ["level", "code"]
    assert _norm(new[cols], key).values.tolist() == _norm(old[cols], key).values.tolist()
    assert new["count"].tolist() == sorted(new["count"].tolist(), reverse=True)
    seen = {r.code: set(r.example) for r in both["old"]["all_examples"].rename(
        columns={"collect_set(example)": "example"}).itertuples()}
    old_first = dict(zip(old["code"], old["examples"], strict=True))
    for r in new.itertuples():
        assert 1 <= len(r.examples) <= 3 and len(set(r.examples)) == len(r.examples)
        assert set(r.examples) <= seen[r.code], r.code  # real lines (or recoveries) of that code
        if r.level == "line":  # the same deterministic first pick (least xxhash64)
            assert r.examples[0] == old_first[r.code][0], r.code


def test_line_examples_name_their_file(both: dict[str, Any]) -> None:
    """A bad line's example starts with its directory and file: the parse asks Spark for the file
    being read (input_file_name) only for those lines, which works only while the expression runs
    in the stage that scans the files."""
    lines = [ex for r in both["new"].bad_input.itertuples() if r.level == "line" for ex in r.examples]
    assert len(lines) >= 5
    for ex in lines:
        assert re.match(r"(date=\d{4}-\d{2}-\d{2}/part-\d+|one-pass\d*/loose)\.jsonl: ", ex), ex
    assert any("/loose.jsonl: " in ex for ex in lines)


def test_events_after_the_end_are_counted_exactly(both: dict[str, Any]) -> None:
    rec = both["new"].recoveries.set_index("recovery_id")["n_after_end"]
    assert rec["r-three-late"] == 2 and rec["r-three-early"] == 1 and rec["r-five"] == 3


def test_every_line_is_accounted_for(both: dict[str, Any]) -> None:
    s, old = both["new"].summary, both["old"]
    assert s["lines"] == old["lines"] and s["events"] == old["events"]
    assert s["events"] + s["rejected_lines"] + s["skipped_lines"] == s["lines"]
    assert s["recoveries"] == len(old["recoveries"])


def test_per_recovery_table_on_disk(spark: Any, tmp_path: Path, both: dict[str, Any]) -> None:
    """The per-recovery table the job writes holds every recovery, readable as Parquet and CSV."""
    import pyarrow as pa
    from kraftkeeper_reports.job import write_recoveries

    rec = both["new"].recoveries
    write_recoveries(pa.Table.from_pandas(rec, preserve_index=False), tmp_path)
    back = pd.read_parquet(tmp_path / "recoveries.parquet")
    assert len(back) == len(rec) and "problem_messages" not in back.columns
    csv = pd.read_csv(next((tmp_path / "recoveries.csv").glob("*.csv")))
    assert len(csv) == len(rec)
    flagged = csv["problems"].dropna()
    assert len(flagged) > 0 and all(isinstance(x, str) for x in flagged)


def test_parse_and_aggregation_are_separate_generated_loops(spark: Any, both: dict[str, Any]) -> None:
    """The per-line work (scan, parse, explode) and the first aggregation run in two generated
    loops (transform._outside_codegen): fused into one, the job took about 1.5x the CPU. A
    refactoring that drops the boundary fails here rather than only getting slower."""
    import re

    from kraftkeeper_reports import transform as tf

    key = "spark.sql.adaptive.enabled"  # the plan as first compiled, with its stage ids
    before = spark.conf.get(key)
    spark.conf.set(key, "false")
    try:
        df = tf.one_pass(tf.parse_lines(tf.read_lines(spark, both["paths"])))
        plan = df._jdf.queryExecution().executedPlan().toString()
    finally:
        spark.conf.set(key, before)
    stage = {name: [int(n) for n in re.findall(rf"\*\((\d+)\) {name}\b", plan)]
             for name in ("Generate", "HashAggregate")}
    assert len(stage["Generate"]) == 1 and stage["HashAggregate"], plan[:2000]
    partial = stage["HashAggregate"][-1]  # the deepest one: the first aggregation's partial step
    assert stage["Generate"][0] != partial, "the explode and the first aggregation share a generated loop"
