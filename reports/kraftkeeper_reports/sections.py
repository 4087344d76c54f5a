"""The report page's sections below the summary (unclean recoveries, what needs attention, the
intervals, clusters compared, the timeline, daily counts, failures, bad input), each an HTML
fragment built from :class:`~kraftkeeper_reports.tables.ReportTables`;
:mod:`kraftkeeper_reports.render` assembles them into the page.
"""

from __future__ import annotations

import html
from datetime import UTC, datetime

import pandas as pd

from kraftkeeper_reports import plots
from kraftkeeper_reports.intervals import (
    ADD_THEN_REMOVE,
    AUTO_JOIN,
    BY_NAME,
    NO_VALUE,
    PHASES,
    REMOVE_THEN_ADD,
    fmt_ms,
)
from kraftkeeper_reports.plots import ALL, FEW, SEVERAL_DAYS, order_label, orders_of, row_order
from kraftkeeper_reports.tables import ReportTables


def _note(text: str) -> str:
    return f'<p class="note">{html.escape(text)}</p>'


def _table(df: pd.DataFrame, cls: str = "") -> str:
    head = "".join(f"<th>{html.escape(str(c))}</th>" for c in df.columns)
    rows = []
    for r in df.itertuples(index=False):
        cells = []
        for v in r:
            num = isinstance(v, int | float) and not isinstance(v, bool)
            cls = "num" if num else ("nw" if len(str(v)) <= 24 else "")  # short text: keep "1.5 min" whole
            cells.append(f'<td class="{cls}">{html.escape(str(v))}</td>')
        rows.append("<tr>" + "".join(cells) + "</tr>")
    return f'<table class="{cls}"><thead><tr>{head}</tr></thead><tbody>{"".join(rows)}</tbody></table>'


def report_orders(t: ReportTables) -> frozenset[str]:
    """The voter-change orders the completed recoveries recorded (titles follow them)."""
    return orders_of(t.slowest, t.compare)


def _stats_table(stats: pd.DataFrame, cluster: str, orders: frozenset[str]) -> pd.DataFrame:
    s = stats[stats["cluster"] == cluster].copy()
    s["rank"] = s["phase"].map({p: i for i, p in enumerate(PHASES)})
    s = s.sort_values("rank")
    return pd.DataFrame(
        {
            "interval": s["phase"].map(lambda p: BY_NAME[p].title_for(set(orders))),
            "what it measures": s["phase"].map(lambda p: BY_NAME[p].meaning_for(set(orders))),
            "recoveries": s["recoveries"].astype(int),
            "p50": s["p50_ms"].map(fmt_ms),
            "p90": s["p90_ms"].map(fmt_ms),
            "p99": s["p99_ms"].map(fmt_ms),
            "max": s["max_ms"].map(fmt_ms),
        }
    )


def utc_time(ms: float | int | None) -> str:
    if ms is None or pd.isna(ms):
        return NO_VALUE
    return datetime.fromtimestamp(float(ms) / 1000, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def _section(ident: str, title: str, body: str, cls: str = "") -> str:
    c = f' class="{cls}"' if cls else ""
    return f'<section id="{ident}"{c}><h2>{html.escape(title)}</h2>\n{body}\n</section>'


def unclean_section(t: ReportTables) -> str:
    """Data loss, the first section: every unclean recovery with its survivor and what is lost."""
    u = t.unclean
    if u is None or u.empty:
        return _section("data-loss", "Data loss",
                        _note("No unclean recovery: no committed record was given up."), "ok")
    note = _note("An unclean recovery (KIP-704 style) is the last resort when a majority of voters is gone "
                 "for good: the surviving replica with the most log (highest last epoch, then end offset) "
                 "becomes the sole voter with the log it holds. Every record committed only on the lost "
                 "replicas, past the survivor's log end offset, is lost.")
    tbl = pd.DataFrame({
        "when (UTC)": u["t_unclean"].map(utc_time),
        "cluster": u["cluster"],
        "survivor (sole voter)": [f"replica {int(r)} · {x}" if isinstance(x, str) else f"replica {int(r)}"
                                  for r, x in zip(u["survivor"], u["survivor_uuid"], strict=True)],
        "log kept": [NO_VALUE if o is None or pd.isna(o) else f"up to offset {int(o):,} (epoch {int(e)})"
                     if e is not None and not pd.isna(e) else f"up to offset {int(o):,}"
                     for o, e in zip(u["log_end_offset"], u["last_epoch"], strict=True)],
        "lost": [f"records committed only on the lost replicas, past offset {int(o):,}"
                 if o is not None and not pd.isna(o) else "records committed only on the lost replicas"
                 for o in u["log_end_offset"]],
        "other replicas that answered": [x or "none" for x in u["other_replicas"]],
        "serving again": [utc_time(x) if x is not None and not pd.isna(x) else "NOT YET"
                          for x in u["t_serving_again"]],
        "why": u["reason"],
    })
    return _section("data-loss", f"Data loss: {len(u):,} unclean recover{'y' if len(u) == 1 else 'ies'}",
                    note + _table(tbl), "loss")


def attention_section(t: ReportTables) -> str:
    """Failed recoveries and recoveries still running, by name (the failures-by-reason section
    below counts them)."""
    f, p = t.failed_list, t.in_progress
    n_failed, n_running = int(t.summary.get("failed") or 0), int(t.summary.get("in_progress") or 0)
    if (f is None or f.empty) and (p is None or p.empty):
        return ""
    body = ""
    if f is not None and not f.empty:
        shown = "" if len(f) == n_failed else f" (the latest {len(f):,} of {n_failed:,})"
        body += f"<h3>Failed{shown}</h3>" + _note(
            "The dead voter stays in the voter set until a new recovery succeeds.") + _table(pd.DataFrame({
                "cluster": f["cluster"], "recovery": f["recovery_id"], "replica": f["replica_id"],
                "detected (UTC)": f["t_detected"].map(utc_time), "gave up (UTC)": f["t_failed"].map(utc_time),
                "after": f["give_up_ms"].map(fmt_ms), "reason": f["failure_reason"],
                "last step reached": f["last_step"]}))
    if p is not None and not p.empty:
        shown = "" if len(p) == n_running else f" (the latest {len(p):,} of {n_running:,})"
        body += f"<h3>Still in progress{shown}</h3>" + _note(
            "No end logged yet: the operator is still working on these (or stopped logging).") + _table(
            pd.DataFrame({"cluster": p["cluster"], "recovery": p["recovery_id"], "replica": p["replica_id"],
                          "detected (UTC)": p["t_detected"].map(utc_time), "last step": p["last_step"],
                          "at (UTC)": p["t_last_step"].map(utc_time)}))
    return _section("attention", "Failed and unfinished recoveries", body, "warn")


def intervals_section(t: ReportTables) -> str:
    done = int(t.summary.get("completed") or 0)
    if done == 0:
        return _section("phases", "Interval durations", _note("No completed recovery: no durations to show."))
    each = done <= min(FEW, len(t.slowest))
    orders = report_orders(t)
    plot = (plots.plot_each(t.slowest, orders) if each
            else plots.plot_distributions(t.phase_histogram, t.phase_stats, orders))
    how = {
        frozenset({ADD_THEN_REMOVE}): "Every recovery here added the replacement first, then removed the "
                                      "old voter (AddThenRemove, KIP-856).",
        frozenset({REMOVE_THEN_ADD}): "Every recovery here removed the old voter first, then added the "
                                      "replacement (RemoveThenAdd: Kafka keeps one directory id per voter "
                                      "id, KIP-853); the intervals follow that order.",
    }.get(orders, "Recoveries of both voter-change orders: where an interval's span differs by order, "
                   "its title names both, and each recovery is measured by the order it recorded.")
    note = _note("Completed recoveries only. Percentiles are exact (linear interpolation between ranks). "
                 "Every interval starts and ends at the first event of its type in the recovery's log. "
                 + how)
    return _section("phases", "Interval durations", note + plot + plots_table(t))


def plots_table(t: ReportTables) -> str:
    return _table(_stats_table(t.phase_stats, ALL, report_orders(t)))


def clusters_section(t: ReportTables) -> str:
    per = t.phase_stats[t.phase_stats["cluster"] != ALL]
    names = sorted(per["cluster"].unique().tolist())
    if len(names) < 2:
        which = names[0] if names else NO_VALUE
        return _section("clusters", "Clusters",
                        _note(f"All completed recoveries are from one cluster ({which}): nothing to "
                              "compare."))
    tot = per[per["phase"] == "total"]
    tbl = pd.DataFrame({"cluster": tot["cluster"], "completed": tot["recoveries"].astype(int),
                        "p50 total": tot["p50_ms"].map(fmt_ms), "p99 total": tot["p99_ms"].map(fmt_ms),
                        "max total": tot["max_ms"].map(fmt_ms)})
    return _section("clusters", "Clusters compared",
                    plots.plot_groups(per, "cluster", "Per cluster (sorted by median total)", "clusters")
                    + _table(tbl))


def compare_section(t: ReportTables) -> str:
    c = t.compare
    if c is None or c.empty:
        return ""
    c = c.assign(group=c["engine"] + " · " + c["order"].map(_group_label))
    if c["group"].nunique() < 2:
        return ""
    wide = []
    for g, rows in c.groupby("group", sort=True):
        r = {p: rows[rows["phase"] == p].iloc[0] for p in rows["phase"]}
        if "total" not in r or "exposure" not in r:
            continue
        tot, exp = r["total"], r["exposure"]
        deg = r.get("degraded")
        wide.append({"engine · order": g, "completed": int(tot["recoveries"]),
                     "p50 total": fmt_ms(tot["p50_ms"]), "p99 total": fmt_ms(tot["p99_ms"]),
                     "p50 dead voter in set": fmt_ms(exp["p50_ms"]),
                     "max dead voter in set": fmt_ms(exp["max_ms"]),
                     "max one failure less tolerated": NO_VALUE if deg is None else fmt_ms(deg["max_ms"])})
    body = _note("Side by side by the engine and the voter-change order named in the events' detail "
                 "(detail.engine, detail.order; where the events do not name the order, the one they "
                 "recorded). Kafka's auto-join logs nothing: its recoveries were recorded from outside, "
                 "each step when DescribeQuorum first showed it (no *_started events; committed steps "
                 "seen up to one poll late). \"One failure less tolerated\" runs from detection to the "
                 "second voter change committed: RemoveVoter in AddThenRemove, AddVoter in RemoveThenAdd "
                 "and auto-join.")
    body += plots.plot_groups(c, "group", "Per engine and order (sorted by median total)", "compare")
    return _section("compare", "Engines and orders compared", body + _table(pd.DataFrame(wide)))


def _group_label(order: str) -> str:
    return "auto-join (Kafka's own, recorded from outside)" if order == AUTO_JOIN else order


def timeline_section(t: ReportTables) -> str:
    slow = t.slowest
    if slow.empty:
        return _section("slowest", "Timelines", _note("No completed recovery: no timeline to show."))
    every = int(t.summary.get("completed") or 0) <= len(slow)
    orders = frozenset(row_order(r) for _, r in slow.iterrows())
    labels = [order_label(r.get("order"), row_order(r)) for _, r in slow.iterrows()]
    tbl = pd.DataFrame(
        {"cluster": slow["cluster"], "recovery": slow["recovery_id"], "replica": slow["replica_id"],
         "detected (UTC)": [datetime.fromtimestamp(float(x) / 1000, UTC).strftime("%Y-%m-%d %H:%M:%S")
                            for x in slow["t_detected"]],
         **({"order": labels} if len(set(labels)) > 1 or REMOVE_THEN_ADD in orders else {}),
         **{BY_NAME[p].head_for(set(orders)): slow[f"{p}_ms"].map(fmt_ms) for p in PHASES}}
    )
    title = "Every recovery" if every else "Slowest recoveries"
    note = _note("Columns are the intervals of the table under \"Interval durations\", each measured in "
                 "the voter-change order its recovery recorded.")
    return _section("slowest", title, plots.plot_gantt(slow, every) + note + _table(tbl))


def daily_section(t: ReportTables) -> str:
    if len(t.daily) < SEVERAL_DAYS:
        n = len(t.daily)
        days = f"{n} day{'' if n == 1 else 's'}"
        return _section("daily", "Daily trend",
                        _note(f"{days} of finished recoveries: a trend needs at least {SEVERAL_DAYS}."))
    return _section("daily", "Daily trend", plots.plot_daily(t.daily))


def failures_section(t: ReportTables) -> str:
    fails = t.failures[t.failures["cluster"] == ALL]
    if fails.empty:
        return _section("failures", "Failures by reason", _note("No recovery failed."))
    tbl = pd.DataFrame({"reason": fails["failure_reason"], "failures": fails["failures"].astype(int),
                        "median time to give up (detection → recovery failed)":
                            fails["p50_give_up_ms"].map(fmt_ms)})
    return _section("failures", "Failures by reason", _table(tbl))


def bad_section(t: ReportTables) -> str:
    note = _note("Nothing is dropped silently: rejected lines are left out of the analysis, skipped ones are "
                 "unknown event types or blank lines (allowed), ignored ones are extra fields (allowed); "
                 "excluded recoveries are inconsistent and left out of the durations.")
    if t.bad_input.empty:
        return _section("bad-input", "Bad input",
                        _note("None: every line is a valid event, every recovery consistent."))
    rows = []
    for r in t.bad_input.to_dict("records"):
        exs = "".join(f'<div class="ex">{html.escape(str(x))}</div>' for x in list(r["examples"])[:3])
        rows.append(
            f"<tr><td>{html.escape(str(r['level']))}</td><td><b>{html.escape(str(r['code']))}</b>"
            f"<div class='ex'>{html.escape(str(r['message'] or ''))}</div></td>"
            f"<td>{html.escape(str(r['action']))}</td><td class='num'>{int(r['count']):,}</td>"
            f"<td>{exs}</td></tr>"
        )
    tbl = ("<table><thead><tr><th>level</th><th>reason</th><th>action</th><th>count</th><th>examples</th>"
           f"</tr></thead><tbody>{''.join(rows)}</tbody></table>")
    return _section("bad-input", "Bad input", note + plots.plot_bad_input(t.bad_input) + tbl)
