"""The report's small tables as one value (:class:`ReportTables`): what the Spark job (``job``)
produces and the HTML renderer (``render``) draws. Its own module so that neither of those
imports the other.

The tables are computed here, on the driver, from the per-recovery rows the Spark job collects
(about one row per 7 events, as Arrow) and its bad-input groups: one Spark job instead of one
per table. The big tables' columns are read as numpy arrays, strings as codes and no Python
object per recovery (:mod:`kraftkeeper_reports.columns`, with the grouped statistics); only small
results and the few rows a table shows (slowest, failures) become pandas frames. The definitions
are those of ``kraftkeeper_reports.transform`` (the Spark versions of these tables are kept there;
tests/reports compares both). No pyspark import: the
renderer uses this module without Spark.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa  # type: ignore[import-untyped]
import pyarrow.compute as pc  # type: ignore[import-untyped]

from kraftkeeper_reports import events as ev
from kraftkeeper_reports.columns import (
    PERCENTILES,
    Columns,
    group_percentile,
    group_sort,
    group_stats,
    is_value,
    labelled,
    merge_labels,
    quantiles,
    rows_frame,
)
from kraftkeeper_reports.intervals import PHASES

ALL_CLUSTERS = "(all)"
UNCLEAN = "unclean"  # the outcome of an unclean recovery (committed records may be lost)
LIST_ROWS = 50  # at most this many failed / in-progress recoveries listed by name
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
    ev.REPLICA_FELL_BEHIND: "t_fell_behind",
    ev.RECOVERY_RESUMED: "t_resumed",
    ev.UNCLEAN_RECOVERY: "t_unclean",
    ev.UNCLEAN_RECOVERY_COMPLETED: "t_unclean_completed",
}
assert set(TS_COL) == set(ev.KNOWN_TYPES), "every known type has its first-timestamp column"

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
    unclean: pd.DataFrame | None = None  # every unclean recovery (:func:`unclean`)
    failed_list: pd.DataFrame | None = None  # the latest failed recoveries, by name
    in_progress: pd.DataFrame | None = None  # the recoveries still running, by name


def phase_stats(cols: Columns) -> pd.DataFrame:
    """p50/p90/p99/max per phase, per cluster and over all clusters (cluster = "(all)")."""
    cluster, names = cols.codes("cluster")
    out = []
    for phase in PHASES:
        keep, ms = cols.durations(phase)
        if len(ms) == 0:
            continue
        per = labelled(group_stats(cluster[keep], ms, len(names), True), {"cluster": names})
        every = np.zeros(len(ms), dtype=np.int64)
        overall = labelled(group_stats(every, ms, 1, True), {"cluster": [ALL_CLUSTERS]})
        out.append(pd.concat([per, overall]).assign(phase=phase))
    cols_ = ["cluster", "phase", "recoveries", "min_ms", *[f"p{round(p * 100)}_ms" for p in PERCENTILES],
             "max_ms", "mean_ms"]
    if not out:
        return pd.DataFrame(columns=cols_)
    return pd.concat(out)[cols_].sort_values(["phase", "cluster"], kind="stable").reset_index(drop=True)


def phase_histogram(cols: Columns, bins_per_decade: int = 10) -> pd.DataFrame:
    """Counts of each phase's durations in logarithmic bins: (phase, bin_lo_ms, bin_hi_ms, count).
    Durations of 0 ms fall in the first bin."""
    out = []
    for phase in PHASES:
        _keep, ms = cols.durations(phase)
        if len(ms) == 0:
            continue
        b = np.floor(np.log10(np.maximum(ms.astype("float64"), 1.0)) * bins_per_decade)
        bins, counts = np.unique(b, return_counts=True)
        out.append(pd.DataFrame({
            "phase": phase,
            "bin_lo_ms": np.power(10.0, bins / bins_per_decade),
            "bin_hi_ms": np.power(10.0, (bins + 1) / bins_per_decade),
            "count": counts.astype("int64"),
        }))
    if not out:
        return pd.DataFrame(columns=["phase", "bin_lo_ms", "bin_hi_ms", "count"])
    return pd.concat(out).sort_values(["phase", "bin_lo_ms"], kind="stable").reset_index(drop=True)


def outcomes(cols: Columns) -> pd.DataFrame:
    """Recoveries by cluster and outcome (completed / failed / in_progress / invalid)."""
    cluster, clusters = cols.codes("cluster")
    outcome, names = cols.codes("outcome")
    kept = (cluster >= 0) & (outcome >= 0)
    n = np.bincount(cluster[kept] * len(names) + outcome[kept], minlength=len(clusters) * len(names))
    has = np.flatnonzero(n)
    g = pd.DataFrame({
        "cluster": np.array([clusters[i // len(names)] for i in has], dtype=object),
        "outcome": np.array([names[i % len(names)] for i in has], dtype=object),
        "recoveries": n[has].astype("int64"),
    })
    return g.sort_values(["cluster", "outcome"]).reset_index(drop=True)


def failures(cols: Columns) -> pd.DataFrame:
    """Failed recoveries by reason (and cluster, with "(all)"), with the median time to give up."""
    failed = rows_frame(cols.rec, cols.failed, ["cluster", "failure_reason", "give_up_ms"])
    out_cols = ["cluster", "failure_reason", "failures", "p50_give_up_ms"]
    if failed.empty:
        return pd.DataFrame(columns=out_cols)
    f = failed.assign(ms=failed["give_up_ms"].astype("float64"))

    def agg(df: pd.DataFrame, keys: list[str]) -> pd.DataFrame:
        g = df.groupby(keys)["ms"]
        p50 = group_percentile(g, "p50_give_up_ms", 0.5)
        return pd.concat([g.size().rename("failures"), p50], axis=1).reset_index()

    out = pd.concat([agg(f, ["cluster", "failure_reason"]),
                     agg(f, ["failure_reason"]).assign(cluster=ALL_CLUSTERS)])[out_cols]
    return out.sort_values("failures", ascending=False, kind="stable").reset_index(drop=True)


def daily(cols: Columns) -> pd.DataFrame:
    """Per UTC day (of detection): recoveries, completed, failed, failure rate, p50/p90 total."""
    out_cols = ["date", "recoveries", "completed", "failed", "failure_rate", "p50_total_ms", "p90_total_ms"]
    date, days = cols.codes("date")
    ended = (cols.completed | cols.failed) & (date >= 0)
    if not ended.any():
        return pd.DataFrame(columns=out_cols)
    ms, valid = cols.ints("total_ms")
    code = date[ended]
    n_days = len(days)
    has = np.bincount(code, minlength=n_days) > 0
    timed = ended & valid
    v, counts = group_sort(date[timed], ms[timed], n_days)
    out = pd.DataFrame({
        "date": np.array(days, dtype=object)[has],
        "recoveries": np.bincount(code, minlength=n_days)[has].astype("int64"),
        "completed": np.bincount(date[ended & cols.completed], minlength=n_days)[has].astype("int64"),
        "failed": np.bincount(date[ended & cols.failed], minlength=n_days)[has].astype("int64"),
        "p50_total_ms": quantiles(v, counts, 0.5)[has],
        "p90_total_ms": quantiles(v, counts, 0.9)[has],
    })
    out["failure_rate"] = out["failed"] / out["recoveries"]
    return out[out_cols].sort_values("date").reset_index(drop=True)


def slowest(cols: Columns, n: int = 20) -> pd.DataFrame:
    """The n slowest completed recoveries with their timelines (every step's timestamp)."""
    ms, valid = cols.ints("total_ms")
    done = cols.completed
    # Only the candidates come to pandas: the completed recoveries whose total is at least the
    # n-th largest (every tie of it); with fewer than n totals, every completed one.
    timed = ms[done & valid]
    if len(timed) >= n:
        nth = np.partition(timed, len(timed) - n)[len(timed) - n]
        done = done & valid & (ms >= nth)
    out_cols = ["cluster", "recovery_id", "replica_id", "date", "engine", "order", *TS_COL.values(),
                *[f"{p}_ms" for p in PHASES]]
    top = rows_frame(cols.rec, done, out_cols)
    top = top.sort_values(["total_ms", "cluster", "recovery_id"], ascending=[False, True, True],
                          kind="stable").head(n)
    return top[out_cols].reset_index(drop=True)


def compare(cols: Columns) -> pd.DataFrame:
    """Per (engine, order, phase) over completed recoveries: count, p50/p90/p99, max. "(not
    logged)" where the events do not say the engine or order."""
    engine, engines = merge_labels(*cols.codes("engine"), UNSPECIFIED)
    order, orders = merge_labels(*cols.codes("order"), UNSPECIFIED)
    pair = engine * len(orders) + order
    labels = {"engine": [e for e in engines for _o in orders], "order": [o for _e in engines for o in orders]}
    out = []
    for phase in PHASES:
        keep, ms = cols.durations(phase)
        if len(ms) == 0:
            continue
        stats = group_stats(pair[keep], ms, len(engines) * len(orders), False)
        out.append(labelled(stats, labels).assign(phase=phase))
    out_cols = ["engine", "order", "phase", "recoveries", *[f"p{round(p * 100)}_ms" for p in PERCENTILES],
                "max_ms"]
    if not out:
        return pd.DataFrame(columns=out_cols)
    out_df = pd.concat(out)[out_cols].sort_values(["engine", "order", "phase"], kind="stable")
    return out_df.reset_index(drop=True)


UNCLEAN_COLUMNS = ["cluster", "recovery_id", "survivor", "survivor_uuid", "t_unclean", "t_serving_again",
                   "log_end_offset", "last_epoch", "other_replicas", "reason", "warning"]


def _int_or_none(v: Any) -> int | None:
    return int(v) if isinstance(v, int | float) and not isinstance(v, bool) else None


def unclean(cols: Columns) -> pd.DataFrame:
    """Every unclean recovery, latest first: which replica survived (made the sole voter, with
    the log it holds: its last epoch and log end offset), when, when the quorum served again
    (null while it does not), the other replicas that answered, and why. What is lost is every
    record committed only on the replicas that did not survive: past the survivor's log end
    offset (KIP-704's trade of durability for availability)."""
    outcome, names = cols.codes("outcome")
    mask = is_value(outcome, names, UNCLEAN)
    if not mask.any():
        return pd.DataFrame(columns=UNCLEAN_COLUMNS)
    t_un, t_done = TS_COL[ev.UNCLEAN_RECOVERY], TS_COL[ev.UNCLEAN_RECOVERY_COMPLETED]
    df = rows_frame(cols.rec, mask, ["cluster", "recovery_id", "replica_id", "new_uuid", t_un, t_done,
                                 "unclean_detail"])
    rows = []
    for r in df.to_dict("records"):
        try:
            d = json.loads(r["unclean_detail"]) if isinstance(r["unclean_detail"], str) else {}
        except ValueError:
            d = {}
        d = d if isinstance(d, dict) else {}
        given = d.get("candidates")
        cands: dict[str, Any] = given if isinstance(given, dict) else {}
        others = []
        for rid, v in sorted(cands.items()):
            if str(rid) == str(int(r["replica_id"])):
                continue
            epoch, end = [*v, None, None][:2] if isinstance(v, list) else (None, None)
            end_s = f"{end:,}" if isinstance(end, int) else str(end)
            others.append(f"{rid} (epoch {epoch}, end offset {end_s})")
        rows.append({
            "cluster": r["cluster"], "recovery_id": r["recovery_id"], "survivor": int(r["replica_id"]),
            "survivor_uuid": r["new_uuid"], "t_unclean": _int_or_none(r[t_un]),
            "t_serving_again": _int_or_none(r[t_done]) if pd.notna(r[t_done]) else None,
            "log_end_offset": _int_or_none(d.get("log_end_offset")),
            "last_epoch": _int_or_none(d.get("last_epoch")),
            "other_replicas": ", ".join(others), "reason": str(d.get("reason") or ""),
            "warning": str(d.get("warning") or ""),
        })
    out = pd.DataFrame(rows, columns=UNCLEAN_COLUMNS)
    out = out.sort_values(["t_unclean", "cluster"], ascending=[False, True], kind="stable")
    return out.reset_index(drop=True)


# The disk-failure steps and the time each was first logged, to name where a recovery stopped.
_STEPS = [(t, TS_COL[t]) for t in (*ev.STEP_TYPES, ev.REPLICA_FELL_BEHIND, ev.RECOVERY_RESUMED)]


def _last_step(df: pd.DataFrame) -> tuple[list[str], list[float]]:
    """For each row, the step logged last (before the end) and its time."""
    ts = df[[c for _, c in _STEPS]].astype("float64").to_numpy()
    has = ~np.isnan(ts).all(axis=1)
    idx = np.where(has, np.nanargmax(np.where(np.isnan(ts), -np.inf, ts), axis=1), 0)
    steps = [_STEPS[i][0] if h else "" for i, h in zip(idx, has, strict=True)]
    when = [float(ts[k, i]) if h else float("nan") for k, (i, h) in enumerate(zip(idx, has, strict=True))]
    return steps, when


FAILED_COLUMNS = ["cluster", "recovery_id", "replica_id", "t_detected", "t_failed", "give_up_ms",
                  "failure_reason", "last_step"]
IN_PROGRESS_COLUMNS = ["cluster", "recovery_id", "replica_id", "t_detected", "last_step", "t_last_step"]


def failed_list(cols: Columns, n: int = LIST_ROWS) -> pd.DataFrame:
    """The n latest failed recoveries by name: which replica, when detected and given up, why,
    and the last step reached (before the failure)."""
    if not cols.failed.any():
        return pd.DataFrame(columns=FAILED_COLUMNS)
    df = rows_frame(cols.rec, cols.failed, ["cluster", "recovery_id", "replica_id", "t_failed", "give_up_ms",
                                        "failure_reason", *[c for _, c in _STEPS]])
    df["last_step"] = _last_step(df)[0]
    df = df.sort_values(["t_failed", "cluster", "recovery_id"], ascending=[False, True, True], kind="stable")
    return df[FAILED_COLUMNS].head(n).reset_index(drop=True)


def in_progress(cols: Columns, n: int = LIST_ROWS) -> pd.DataFrame:
    """The recoveries still running (no end logged), latest detection first (n of them): which
    replica, since when, and the last step logged so far."""
    outcome, names = cols.codes("outcome")
    mask = is_value(outcome, names, "in_progress")
    if not mask.any():
        return pd.DataFrame(columns=IN_PROGRESS_COLUMNS)
    df = rows_frame(cols.rec, mask, ["cluster", "recovery_id", "replica_id", *[c for _, c in _STEPS]])
    df["last_step"], df["t_last_step"] = _last_step(df)
    df = df.sort_values(["t_detected", "cluster", "recovery_id"], ascending=[False, True, True],
                        kind="stable")
    return df[IN_PROGRESS_COLUMNS].head(n).reset_index(drop=True)


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
        "unclean": int(by_outcome.get(UNCLEAN, 0)),
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
    rec: pa.Table, flagged: pd.DataFrame, line_groups: pd.DataFrame, paths: list[str], n_lines: int,
    top: int, keep_recoveries: bool = False,
) -> ReportTables:
    """Every small table from the per-recovery rows (Arrow, as the Spark job gives them;
    ``flagged``: those with recovery-level problems, see :func:`bad_input`) and the bad-input
    groups."""
    cols = Columns(rec)
    stats, outc, day = phase_stats(cols), outcomes(cols), daily(cols)
    bad = bad_input(line_groups, flagged)
    n_events = int(pc.sum(rec.column("n_events")).as_py() or 0)
    summary = summarise(paths, n_lines, n_events, stats, outc, day, line_counts(line_groups))
    return ReportTables(summary, stats, phase_histogram(cols), outc, failures(cols), day, slowest(cols, top),
                        bad, compare(cols), rec.to_pandas() if keep_recoveries else None,
                        unclean(cols), failed_list(cols), in_progress(cols))
