"""The driver's small tables (numpy on the Arrow columns, ``tables``) against the pandas code
they replaced, kept here as the reference: the same frames to the last bit and dtype, on
per-recovery rows with the awkward cases (null keys, null totals of completed recoveries, ties,
an engine logged as the "(not logged)" text, durations too spread for the one-sort path). No
Spark: the rows are made here."""

from __future__ import annotations

import datetime as dt
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pytest
from kraftkeeper_reports import columns as cl
from kraftkeeper_reports import tables as tb
from kraftkeeper_reports.intervals import PHASES
from kraftkeeper_reports.job import _rows

# --- the pandas versions (the code before the tables read Arrow columns) ---------------------


def _durations(rec: pd.DataFrame, phase: str) -> pd.DataFrame:
    col = rec[f"{phase}_ms"]
    keep = (rec["outcome"] == "completed") & col.notna()
    return rec.loc[keep, ["cluster", "engine", "order"]].assign(ms=col[keep].astype("int64"))


def _stats(df: pd.DataFrame, keys: list[str], with_min_mean: bool) -> pd.DataFrame:
    g = df.groupby(keys, sort=False)
    sizes = g.size()
    codes = g.ngroup().to_numpy()
    ms = df["ms"].to_numpy()
    kept = codes >= 0  # a null key's rows: NaN, in no group
    codes, ms = codes[kept].astype("int64"), ms[kept]
    v = ms[np.lexsort((ms, codes))]
    counts = sizes.to_numpy()
    starts = np.cumsum(counts) - counts
    out = sizes.rename("recoveries").to_frame()
    if with_min_mean:
        out["min_ms"] = v[starts]
    vf = v.astype("float64")
    for p in cl.PERCENTILES:
        pos = (counts - 1) * p
        lo = np.floor(pos).astype("int64")
        hi = np.minimum(lo + 1, counts - 1)
        out[f"p{round(p * 100)}_ms"] = vf[starts + lo] + (vf[starts + hi] - vf[starts + lo]) * (pos - lo)
    out["max_ms"] = v[starts + counts - 1]
    if with_min_mean:
        out["mean_ms"] = np.bincount(codes, weights=ms.astype("float64"), minlength=len(counts)) / counts
    return out.reset_index()


def ref_phase_stats(rec: pd.DataFrame) -> pd.DataFrame:
    out = []
    for phase in PHASES:
        d = _durations(rec, phase)
        if not d.empty:
            overall = _stats(d.assign(cluster=tb.ALL_CLUSTERS), ["cluster"], True)
            out.append(pd.concat([_stats(d, ["cluster"], True), overall]).assign(phase=phase))
    cols = ["cluster", "phase", "recoveries", "min_ms", "p50_ms", "p90_ms", "p99_ms", "max_ms", "mean_ms"]
    return pd.concat(out)[cols].sort_values(["phase", "cluster"], kind="stable").reset_index(drop=True)


def ref_histogram(rec: pd.DataFrame) -> pd.DataFrame:
    out = []
    for phase in PHASES:
        d = _durations(rec, phase)
        if d.empty:
            continue
        b = np.floor(np.log10(np.maximum(d["ms"].to_numpy(dtype="float64"), 1.0)) * 10)
        counts = pd.Series(b).value_counts().sort_index()
        out.append(pd.DataFrame({"phase": phase, "bin_lo_ms": np.power(10.0, counts.index.to_numpy() / 10),
                                 "bin_hi_ms": np.power(10.0, (counts.index.to_numpy() + 1) / 10),
                                 "count": counts.to_numpy().astype("int64")}))
    return pd.concat(out).sort_values(["phase", "bin_lo_ms"], kind="stable").reset_index(drop=True)


def ref_outcomes(rec: pd.DataFrame) -> pd.DataFrame:
    g = rec.groupby(["cluster", "outcome"]).size().rename("recoveries").reset_index()
    return g.sort_values(["cluster", "outcome"]).reset_index(drop=True)


def ref_failures(rec: pd.DataFrame) -> pd.DataFrame:
    failed = rec[rec["outcome"] == "failed"]
    f = failed.assign(ms=failed["give_up_ms"].astype("float64"))

    def agg(df: pd.DataFrame, keys: list[str]) -> pd.DataFrame:
        g = df.groupby(keys)["ms"]
        return pd.concat([g.size().rename("failures"), g.quantile(0.5).rename("p50_give_up_ms")],
                         axis=1).reset_index()

    cols = ["cluster", "failure_reason", "failures", "p50_give_up_ms"]
    out = pd.concat([agg(f, ["cluster", "failure_reason"]),
                     agg(f, ["failure_reason"]).assign(cluster=tb.ALL_CLUSTERS)])[cols]
    return out.sort_values("failures", ascending=False, kind="stable").reset_index(drop=True)


def ref_daily(rec: pd.DataFrame) -> pd.DataFrame:
    d = rec[rec["outcome"].isin(["completed", "failed"])]
    d = d.assign(ms=d["total_ms"].astype("float64"), ok=d["outcome"] == "completed",
                 bad=d["outcome"] == "failed")
    g = d.groupby("date")
    out = pd.concat([g.size().rename("recoveries"), g["ok"].sum().rename("completed"),
                     g["bad"].sum().rename("failed"), g["ms"].quantile(0.5).rename("p50_total_ms"),
                     g["ms"].quantile(0.9).rename("p90_total_ms")], axis=1).reset_index()
    out["completed"] = out["completed"].astype("int64")
    out["failed"] = out["failed"].astype("int64")
    out["failure_rate"] = out["failed"] / out["recoveries"]
    cols = ["date", "recoveries", "completed", "failed", "failure_rate", "p50_total_ms", "p90_total_ms"]
    return out[cols].sort_values("date").reset_index(drop=True)


def ref_slowest(rec: pd.DataFrame, n: int) -> pd.DataFrame:
    top = rec[rec["outcome"] == "completed"].sort_values(
        ["total_ms", "cluster", "recovery_id"], ascending=[False, True, True], kind="stable").head(n)
    cols = ["cluster", "recovery_id", "replica_id", "date", "engine", "order", *tb.TS_COL.values(),
            *[f"{p}_ms" for p in PHASES]]
    return top[cols].reset_index(drop=True)


def ref_compare(rec: pd.DataFrame) -> pd.DataFrame:
    out = []
    for phase in PHASES:
        d = _durations(rec, phase)
        if not d.empty:
            d = d.assign(engine=d["engine"].fillna(tb.UNSPECIFIED), order=d["order"].fillna(tb.UNSPECIFIED))
            out.append(_stats(d, ["engine", "order"], False).assign(phase=phase))
    cols = ["engine", "order", "phase", "recoveries", "p50_ms", "p90_ms", "p99_ms", "max_ms"]
    out_df = pd.concat(out)[cols].sort_values(["engine", "order", "phase"], kind="stable")
    return out_df.reset_index(drop=True)


# --- per-recovery rows ------------------------------------------------------------------------


def recoveries(n: int, seed: int, spread: int = 600_000) -> pa.Table:
    """``n`` per-recovery rows with the Spark job's column names and types, and nulls where the
    job may give them."""
    rng = np.random.default_rng(seed)

    def maybe(values: list[Any], null_rate: float) -> list[Any]:
        return [None if rng.random() < null_rate else v for v in values]

    def ints(lo: int, hi: int, null_rate: float) -> pa.Array:
        return pa.array(maybe([int(x) for x in rng.integers(lo, hi, n)], null_rate), pa.int64())

    def pick(choices: list[Any], null_rate: float = 0.0) -> list[Any]:
        return maybe([choices[i] for i in rng.integers(0, len(choices), n)], null_rate)

    days = [dt.date(2026, 10, d) for d in (3, 1, 2, 30)]
    outcomes = pick(["completed"] * 6 + ["failed", "in_progress", "invalid"])
    cols: dict[str, pa.Array] = {
        "cluster": pa.array([None, *pick(["b/meta", "a/kraft", "c", "a/kraft-2"], 0.01)[1:]], pa.string()),
        "recovery_id": pa.array([f"r-{i % (n // 2 + 1):06d}" for i in range(n)], pa.string()),
        "replica_id": ints(0, 5, 0.0),
        "engine": pa.array(pick(["kraftkeeper", "kafka", tb.UNSPECIFIED], 0.3), pa.string()),
        "order": pa.array(pick(["AddThenRemove", "RemoveThenAdd"], 0.1), pa.string()),
        "outcome": pa.array(["completed", "completed", *outcomes[2:]], pa.string()),
        "failure_reason": pa.array(pick(["timeout", "quorum_lost"], 0.05), pa.string()),
        "date": pa.array(pick(days, 0.01), pa.date32()),
        **{c: ints(1_790_000_000_000, 1_790_000_900_000, 0.05) for c in tb.TS_COL.values()},
        "n_events": ints(1, 12, 0.0),
        **{f"{p}_ms": ints(0, spread, 0.05) for p in PHASES},
        "give_up_ms": ints(0, 1000, 0.1),
    }
    t = pa.table(cols)
    # Ties of the slowest totals (the n-th largest shared by several recoveries).
    total = t.column("total_ms").to_numpy(zero_copy_only=False)
    top = set(np.argsort(np.nan_to_num(total, nan=-1.0))[-(n // 4):].tolist())
    old = t.column("total_ms").to_pylist()
    total = pa.array([None if i == 1 else spread if i in top else v for i, v in enumerate(old)], pa.int64())
    return t.set_column(t.schema.get_field_index("total_ms"), "total_ms", total)


CASES = [(5_000, 1, 600_000), (300, 2, 600_000), (2_000, 3, 2**50), (40, 4, 1_000)]


@pytest.mark.parametrize("n,seed,spread", CASES)
def test_each_table_is_the_pandas_one(n: int, seed: int, spread: int) -> None:
    rec_tbl = recoveries(n, seed, spread)
    rec, cols = rec_tbl.to_pandas(), cl.Columns(rec_tbl)
    assert rec["total_ms"].isna().any() and rec["cluster"].isna().any()
    pd.testing.assert_frame_equal(tb.phase_stats(cols), ref_phase_stats(rec), check_exact=True)
    pd.testing.assert_frame_equal(tb.phase_histogram(cols), ref_histogram(rec), check_exact=True)
    pd.testing.assert_frame_equal(tb.outcomes(cols), ref_outcomes(rec), check_exact=True)
    pd.testing.assert_frame_equal(tb.daily(cols), ref_daily(rec), check_exact=True)
    pd.testing.assert_frame_equal(tb.failures(cols), ref_failures(rec), check_exact=True)
    pd.testing.assert_frame_equal(tb.compare(cols), ref_compare(rec), check_exact=True)
    for top in (1, 20, n):
        pd.testing.assert_frame_equal(tb.slowest(cols, top), ref_slowest(rec, top), check_exact=True)


def test_tables_without_completed_recoveries() -> None:
    t = recoveries(200, 5)
    t = t.set_column(t.schema.get_field_index("outcome"), "outcome", pa.array(["invalid"] * 200))
    cols = cl.Columns(t)
    assert tb.phase_stats(cols).empty and tb.compare(cols).empty and tb.phase_histogram(cols).empty
    assert tb.daily(cols).empty and tb.slowest(cols, 5).empty and tb.failures(cols).empty
    assert tb.outcomes(cols)["recoveries"].sum() == 200 - t.column("cluster").null_count


@pytest.mark.parametrize("spread", [10, 2**40, 2**61, 2**63 - 1])
def test_group_sort_is_the_lexsort(spread: int) -> None:
    """Values sorted by group and within it, by one sort of code * span + value when that fits
    in int64 and by lexsort when not (the groups' sizes alike)."""
    rng = np.random.default_rng(7)
    codes = rng.integers(0, 5, 10_000)
    ms = rng.integers(0, spread, 10_000, dtype=np.int64)
    v, counts = cl.group_sort(codes, ms, 6)
    assert v.tolist() == ms[np.lexsort((ms, codes))].tolist()
    assert counts.tolist() == [*np.bincount(codes).tolist(), 0]


@pytest.mark.parametrize("drop", [[], [0], [5, 6, 99], list(range(0, 100, 3)), list(range(100))])
def test_rows_without_the_problem_rows_is_the_filter(drop: list[int]) -> None:
    t = pa.Table.from_batches(recoveries(100, 6).to_batches(max_chunksize=7))
    mask = pa.chunked_array([pa.array([i not in drop for i in range(100)])])
    assert _rows(t, mask).equals(t.filter(mask))
    many = pa.chunked_array([pc.greater(pa.array(np.arange(3000)), 1200)])
    big = pa.concat_tables([t] * 30)
    assert _rows(big, many).equals(big.filter(many))


def one_pass_result(n: int, seed: int) -> pa.Table:
    """What ``transform.one_pass`` gives the driver: ``n`` recovery rows and, among them, two
    bad-input groups (a rejected reason and a tolerated note)."""
    rec = recoveries(n, seed)
    msgs = [["duplicate_event: a step was logged twice"] if i % 7 == 0 else [] for i in range(n)]
    rec = rec.append_column("problems", pa.array([[m.split(":")[0] for m in x] for x in msgs],
                                                 pa.list_(pa.string())))
    rec = rec.append_column("problem_messages", pa.array(msgs, pa.list_(pa.string())))
    rec = rec.append_column("old_uuid", pa.array([f"u{i}" for i in range(n)]))
    groups = pa.table({
        "pcode": ["malformed_json", "extra_fields"], "pnote": [False, True], "n_problem": [5, 3],
        "h_min": [1, 2], "h_max": [9, 8], "ex_min": ["a.jsonl: {", "b.jsonl: x"],
        "ex_max": ["a.jsonl: [", None],
        "ex_any": [None, None], "pmessage": ["not valid JSON", "fields the schema does not name"],
    })
    blank = pa.table({c: pa.nulls(2, rec.schema.field(c).type) for c in rec.column_names})
    blank = blank.set_column(blank.schema.get_field_index("n_events"), "n_events", pa.array([0, 0]))
    rows = pa.concat_tables([rec.slice(0, n // 2), blank, rec.slice(n // 2)])
    # The problem columns: null on recovery rows, the groups' values on theirs.
    for c in groups.column_names:
        vals = [None] * (n // 2) + groups.column(c).to_pylist() + [None] * (n - n // 2)
        if c == "n_problem":
            vals = [0 if v is None else v for v in vals]
        rows = rows.append_column(c, pa.array(vals, groups.schema.field(c).type))
    return rows.append_column("after_end_exact", pa.array([True] * (n + 2)))


def test_finish_from_the_arrow_rows(tmp_path: Any) -> None:
    """The driver's part alone: the problem rows leave the recovery table, every line is
    counted, the per-recovery table is written (by the second thread) with every recovery."""
    from kraftkeeper_reports.job import Run, finish

    result = one_pass_result(500, 8)
    seen: list[tb.ReportTables] = []
    t = finish(result, Run(["in"], top=5, out=tmp_path, collect_recoveries=True, then=seen.append))
    assert seen == [t]
    events = sum(result.column("n_events").to_pylist())
    assert t.summary["lines"] == events + 5 and t.summary["rejected_lines"] == 5
    assert t.recoveries is not None
    assert t.recoveries["old_uuid"].tolist() == [f"u{i}" for i in range(500)]  # the recovery rows, in order
    assert set(t.bad_input["code"]) == {"malformed_json", "extra_fields", "duplicate_event"}
    back = pd.read_parquet(tmp_path / "tables" / "recoveries.parquet")
    assert back["recovery_id"].tolist() == t.recoveries["recovery_id"].tolist()
    csv = pd.read_csv(tmp_path / "tables" / "recoveries.csv" / "part-00000.csv")
    assert len(csv) == 500 and (csv["problems"] == "duplicate_event").sum() == len(range(0, 500, 7))


def test_finish_fails_when_the_table_cannot_be_written(tmp_path: Any) -> None:
    """An error of the writing thread is the job's error, not lost with the thread."""
    from kraftkeeper_reports.job import Run, finish

    (tmp_path / "tables").write_text("a file where the tables directory goes")
    seen: list[tb.ReportTables] = []
    with pytest.raises(OSError):
        finish(one_pass_result(50, 9), Run(["in"], out=tmp_path, then=seen.append))
    assert len(seen) == 1 and seen[0].summary["rejected_lines"] == 5  # ran, and the error still came


def test_inexact_counts_need_spark() -> None:
    from kraftkeeper_reports.job import Run, finish

    result = one_pass_result(50, 10)
    inexact = pa.array([i != 3 for i in range(result.num_rows)])
    result = result.set_column(result.schema.get_field_index("after_end_exact"), "after_end_exact", inexact)
    with pytest.raises(ValueError, match="needs the Spark session"):
        finish(result, Run(["in"]))
