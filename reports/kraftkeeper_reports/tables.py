"""The report's small tables as one value (:class:`ReportTables`): what the Spark job (``job``)
produces and the HTML renderer (``render``) draws. Its own module so that neither of those
imports the other.

The tables are computed here, on the driver, with pandas from the per-recovery rows the Spark
job collects (about one row per 7 events) and its bad-input groups: one Spark job instead of
one per table. The definitions are those of ``kraftkeeper_reports.transform`` (the Spark
versions of these tables are kept there; tests/reports compares both). No pyspark import: the
renderer uses this module without Spark.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from kraftkeeper_reports import events as ev
from kraftkeeper_reports.intervals import PHASES

ALL_CLUSTERS = "(all)"
PERCENTILES = (0.5, 0.9, 0.99)
UNSPECIFIED = "(not logged)"
EXAMPLES_PER_REASON = 3

# Column names of the first-timestamp-per-type columns of the recovery table.
TS_COL = {
    ev.DISK_REPLACEMENT_DETECTED: "t_detected",
    ev.REPLICA_CAUGHT_UP: "t_caught_up",
    ev.ADD_VOTER_STARTED: "t_add_voter_started",
    ev.ADD_VOTER_COMMITTED: "t_add_voter_committed",
    ev.REMOVE_VOTER_STARTED: "t_remove_voter_started",
    ev.REMOVE_VOTER_COMMITTED: "t_remove_voter_committed",
    ev.RECOVERY_COMPLETED: "t_completed",
    ev.RECOVERY_FAILED: "t_failed",
}

LINE_ACTION = {
    **{r: "rejected" for r in ev.REJECTED},
    ev.UNKNOWN_TYPE: "skipped",
    ev.BLANK_LINE: "skipped",
    ev.EXTRA_FIELDS: "ignored",
}
RECOVERY_ACTION = {
    "missing_detection": "excluded",
    "impossible_order": "excluded",
    "conflicting_outcome": "excluded",
    "incomplete_steps": "excluded",
    "inconsistent_replica": "excluded",
    "event_after_end": "late events ignored",
    "duplicate_event": "first used",
}


@dataclass
class ReportTables:
    """The small tables, as pandas frames (what the HTML is drawn from).

    ``slowest`` holds the slowest completed recoveries with every step's timestamp; when
    ``summary["completed"]`` is no larger than it, it holds every completed recovery.
    ``compare`` holds the total and exposure percentiles per (engine, order) when events carry
    ``detail.engine`` / ``detail.order``."""

    summary: dict[str, float | int | str | None]
    phase_stats: pd.DataFrame
    phase_histogram: pd.DataFrame
    outcomes: pd.DataFrame
    failures: pd.DataFrame
    daily: pd.DataFrame
    slowest: pd.DataFrame
    bad_input: pd.DataFrame
    compare: pd.DataFrame | None = None
    recoveries: pd.DataFrame | None = None  # only with compute(..., collect_recoveries=True)


def _pct(s: Any, name: str, q: float) -> pd.Series:
    """Exact percentile per group (``s`` a SeriesGroupBy), linear interpolation between ranks
    (numpy's default, and Spark's ``percentile``)."""
    out: pd.Series = s.quantile(q).rename(name)
    return out


def _durations(rec: pd.DataFrame, phase: str) -> pd.DataFrame:
    """The completed recoveries that have this phase: cluster, engine, order and the duration
    as ``ms`` (int64). Only those columns are copied (a fleet has millions of recoveries)."""
    col = rec[f"{phase}_ms"]
    keep = (rec["outcome"] == "completed") & col.notna()
    done = rec.loc[keep, ["cluster", "engine", "order"]]
    return done.assign(ms=col[keep].astype("int64"))


def _stats(df: pd.DataFrame, keys: list[str], with_min_mean: bool) -> pd.DataFrame:
    """Count, [min,] the PERCENTILES, max [and mean] of ``ms`` per group of ``keys``, as
    pandas' groupby would give them, from one sort of the durations: pandas' grouped quantile
    sorts the column once per percentile, which took most of the driver's time at 10 M events.
    Percentiles interpolate linearly between the two nearest ranks (numpy's default, and
    Spark's ``percentile``)."""
    g = df.groupby(keys, sort=False)
    sizes = g.size()
    codes = g.ngroup().to_numpy()
    ms = df["ms"].to_numpy()
    kept = codes >= 0  # rows of a null key belong to no group, as in groupby
    codes, ms = codes[kept], ms[kept]
    v = ms[np.lexsort((ms, codes))]
    counts = sizes.to_numpy()
    starts = np.cumsum(counts) - counts
    last = starts + counts - 1
    out = sizes.rename("recoveries").to_frame()
    if with_min_mean:
        out["min_ms"] = v[starts]
    vf = v.astype("float64")
    for p in PERCENTILES:
        pos = (counts - 1) * p
        lo = np.floor(pos).astype("int64")
        hi = np.minimum(lo + 1, counts - 1)
        out[f"p{round(p * 100)}_ms"] = vf[starts + lo] + (vf[starts + hi] - vf[starts + lo]) * (pos - lo)
    out["max_ms"] = v[last]
    if with_min_mean:
        out["mean_ms"] = np.bincount(codes, weights=ms.astype("float64"), minlength=len(counts)) / counts
    return out.reset_index()


def phase_stats(rec: pd.DataFrame) -> pd.DataFrame:
    """p50/p90/p99/max per phase, per cluster and over all clusters (cluster = "(all)")."""
    out = []
    for phase in PHASES:
        d = _durations(rec, phase)
        if d.empty:
            continue
        per = _stats(d, ["cluster"], True)
        overall = _stats(d.assign(cluster=ALL_CLUSTERS), ["cluster"], True)
        out.append(pd.concat([per, overall]).assign(phase=phase))
    cols = ["cluster", "phase", "recoveries", "min_ms", *[f"p{round(p * 100)}_ms" for p in PERCENTILES],
            "max_ms", "mean_ms"]
    if not out:
        return pd.DataFrame(columns=cols)
    return pd.concat(out)[cols].sort_values(["phase", "cluster"], kind="stable").reset_index(drop=True)


def phase_histogram(rec: pd.DataFrame, bins_per_decade: int = 10) -> pd.DataFrame:
    """Counts of each phase's durations in logarithmic bins: (phase, bin_lo_ms, bin_hi_ms, count).
    Durations of 0 ms fall in the first bin."""
    out = []
    for phase in PHASES:
        d = _durations(rec, phase)
        if d.empty:
            continue
        b = np.floor(np.log10(np.maximum(d["ms"].to_numpy(dtype="float64"), 1.0)) * bins_per_decade)
        counts = pd.Series(b).value_counts().sort_index()
        out.append(pd.DataFrame({
            "phase": phase,
            "bin_lo_ms": np.power(10.0, counts.index.to_numpy() / bins_per_decade),
            "bin_hi_ms": np.power(10.0, (counts.index.to_numpy() + 1) / bins_per_decade),
            "count": counts.to_numpy().astype("int64"),
        }))
    if not out:
        return pd.DataFrame(columns=["phase", "bin_lo_ms", "bin_hi_ms", "count"])
    return pd.concat(out).sort_values(["phase", "bin_lo_ms"], kind="stable").reset_index(drop=True)


def outcomes(rec: pd.DataFrame) -> pd.DataFrame:
    """Recoveries by cluster and outcome (completed / failed / in_progress / invalid)."""
    g = rec.groupby(["cluster", "outcome"]).size().rename("recoveries").reset_index()
    return g.sort_values(["cluster", "outcome"]).reset_index(drop=True)


def failures(rec: pd.DataFrame) -> pd.DataFrame:
    """Failed recoveries by reason (and cluster, with "(all)"), with the median time to give up."""
    failed = rec[rec["outcome"] == "failed"]
    cols = ["cluster", "failure_reason", "failures", "p50_give_up_ms"]
    if failed.empty:
        return pd.DataFrame(columns=cols)
    f = failed.assign(ms=failed["give_up_ms"].astype("float64"))

    def agg(df: pd.DataFrame, keys: list[str]) -> pd.DataFrame:
        g = df.groupby(keys)["ms"]
        return pd.concat([g.size().rename("failures"), _pct(g, "p50_give_up_ms", 0.5)], axis=1).reset_index()

    out = pd.concat([agg(f, ["cluster", "failure_reason"]),
                     agg(f, ["failure_reason"]).assign(cluster=ALL_CLUSTERS)])[cols]
    return out.sort_values("failures", ascending=False, kind="stable").reset_index(drop=True)


def daily(rec: pd.DataFrame) -> pd.DataFrame:
    """Per UTC day (of detection): recoveries, completed, failed, failure rate, p50/p90 total."""
    d = rec[rec["outcome"].isin(["completed", "failed"])]
    cols = ["date", "recoveries", "completed", "failed", "failure_rate", "p50_total_ms", "p90_total_ms"]
    if d.empty:
        return pd.DataFrame(columns=cols)
    d = d.assign(ms=d["total_ms"].astype("float64"), ok=d["outcome"] == "completed",
                 bad=d["outcome"] == "failed")
    g = d.groupby("date")
    out = pd.concat([
        g.size().rename("recoveries"), g["ok"].sum().rename("completed"), g["bad"].sum().rename("failed"),
        _pct(g["ms"], "p50_total_ms", 0.5), _pct(g["ms"], "p90_total_ms", 0.9),
    ], axis=1).reset_index()
    out["completed"] = out["completed"].astype("int64")
    out["failed"] = out["failed"].astype("int64")
    out["failure_rate"] = out["failed"] / out["recoveries"]
    return out[cols].sort_values("date").reset_index(drop=True)


def slowest(rec: pd.DataFrame, n: int = 20) -> pd.DataFrame:
    """The n slowest completed recoveries with their timelines (every step's timestamp)."""
    done = rec[rec["outcome"] == "completed"]
    # The n largest totals (with every tie of the n-th) first: sorting all recoveries by their
    # string keys cost seconds at 10 M events.
    if len(done) > n and done["total_ms"].notna().all():
        done = done.nlargest(n, "total_ms", keep="all")
    top = done
    top = top.sort_values(["total_ms", "cluster", "recovery_id"], ascending=[False, True, True],
                          kind="stable").head(n)
    cols = ["cluster", "recovery_id", "replica_id", "date", "engine", "order", *TS_COL.values(),
            *[f"{p}_ms" for p in PHASES]]
    return top[cols].reset_index(drop=True)


def compare(rec: pd.DataFrame) -> pd.DataFrame:
    """Per (engine, order, phase) over completed recoveries: count, p50/p90/p99, max. "(not
    logged)" where the events do not say the engine or order."""
    out = []
    for phase in PHASES:
        d = _durations(rec, phase)
        if d.empty:
            continue
        d = d.assign(engine=d["engine"].fillna(UNSPECIFIED), order=d["order"].fillna(UNSPECIFIED))
        out.append(_stats(d, ["engine", "order"], False).assign(phase=phase))
    cols = ["engine", "order", "phase", "recoveries", *[f"p{round(p * 100)}_ms" for p in PERCENTILES],
            "max_ms"]
    if not out:
        return pd.DataFrame(columns=cols)
    out_df = pd.concat(out)[cols].sort_values(["engine", "order", "phase"], kind="stable")
    return out_df.reset_index(drop=True)


def _action(reason: str) -> str:
    return {**LINE_ACTION, **RECOVERY_ACTION}.get(reason, "counted")


def bad_input(line_groups: pd.DataFrame, flagged: pd.DataFrame) -> pd.DataFrame:
    """Counts by (level, reason, code) with up to three examples each, most frequent first.

    ``line_groups``: the Spark job's bad-input rows (a code may come in two: as a line's reason
    and as a note on another line); the examples of least and greatest xxhash64 over all of a
    code's lines, as the Spark version picks them, and one more. Recovery-level problems come
    from ``flagged``: cluster, recovery_id and problem_messages of the recoveries that have
    any."""
    rows: list[dict[str, Any]] = []
    for code, g in line_groups.groupby("pcode", sort=False):
        lo = g.loc[g["h_min"].idxmin(), "ex_min"]
        hi = g.loc[g["h_max"].idxmax(), "ex_max"]
        examples = list(dict.fromkeys(x for x in (lo, hi, *g["ex_any"]) if isinstance(x, str)))
        rows.append({"level": "line", "code": str(code), "count": int(g["n_problem"].sum()),
                     "examples": examples[:EXAMPLES_PER_REASON], "message": g["pmessage"].dropna().iloc[0]})
    if not flagged.empty:
        pm = flagged[["cluster", "recovery_id", "problem_messages"]].explode("problem_messages")
        pm = pm.assign(code=pm["problem_messages"].str.split(": ", n=1).str[0])
        pm = pm.sort_values(["code", "cluster", "recovery_id"], kind="stable")
        for code, g in pm.groupby("code", sort=False):
            first = g.iloc[[0, len(g) - 1, len(g) // 2]]
            examples = [f"{r.cluster} {r.recovery_id} -> {r.problem_messages}" for r in first.itertuples()]
            rows.append({"level": "recovery", "code": str(code), "count": len(g),
                         "examples": list(dict.fromkeys(examples)), "message": g["problem_messages"].iloc[0]})
    cols = ["level", "reason", "code", "action", "count", "examples", "message"]
    if not rows:
        return pd.DataFrame(columns=cols)
    out = pd.DataFrame(rows)
    out["reason"] = out["code"].str.split(":", n=1).str[0]
    out["action"] = out["reason"].map(_action)
    out["count"] = out["count"].astype("int64")
    out = out.sort_values(["count", "level", "code"], ascending=[False, True, True], kind="stable")
    return out[cols].reset_index(drop=True)


def line_counts(line_groups: pd.DataFrame) -> dict[str, int]:
    """Lines by what happened to them, each line once: by its reason (``rejected`` or
    ``skipped``), never by a note (a rejected line may also carry an ``unknown_type`` note,
    which bad_input counts under that code but which is not a second skipped line)."""
    own = line_groups[~line_groups["pnote"].astype(bool)]
    by_action = own.groupby(own["pcode"].str.split(":", n=1).str[0].map(_action))["n_problem"].sum()
    return {a: int(by_action.get(a, 0)) for a in ("rejected", "skipped")}


def summarise(
    paths: list[str], n_lines: int, n_events: int, stats: pd.DataFrame, outc: pd.DataFrame,
    day: pd.DataFrame, lines_by_action: dict[str, int],
) -> dict[str, float | int | str | None]:
    """The headline numbers (summary.json): events + rejected_lines + skipped_lines = lines."""
    def pick(phase: str, col: str) -> float | None:
        row = stats[(stats["cluster"] == ALL_CLUSTERS) & (stats["phase"] == phase)]
        return None if row.empty else float(row.iloc[0][col])

    by_outcome = outc.groupby("outcome")["recoveries"].sum().to_dict()
    return {
        "inputs": ", ".join(paths),
        "lines": n_lines,
        "events": n_events,
        "rejected_lines": lines_by_action["rejected"],
        "skipped_lines": lines_by_action["skipped"],
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


def small_tables(
    rec: pd.DataFrame, flagged: pd.DataFrame, line_groups: pd.DataFrame, paths: list[str], n_lines: int,
    top: int, keep_recoveries: bool = False,
) -> ReportTables:
    """Every small table from the per-recovery rows (``flagged``: those with recovery-level
    problems, see :func:`bad_input`) and the bad-input groups."""
    stats, outc, day = phase_stats(rec), outcomes(rec), daily(rec)
    bad = bad_input(line_groups, flagged)
    n_events = int(rec["n_events"].sum())
    summary = summarise(paths, n_lines, n_events, stats, outc, day, line_counts(line_groups))
    return ReportTables(summary, stats, phase_histogram(rec), outc, failures(rec), day, slowest(rec, top),
                        bad, compare(rec), rec if keep_recoveries else None)
