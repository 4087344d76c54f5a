"""The HTML report: one self-contained page drawn from the job's small tables.

Plots are matplotlib figures embedded as inline SVG (text kept as text, so the page is
searchable); the style sheet is inline; there is no script and no external resource, so the
file opens anywhere, offline. Pure: pandas frames in, a string out (no Spark here).
"""

from __future__ import annotations

import html
import io
import math
from datetime import UTC, datetime
from typing import Any

import matplotlib

matplotlib.use("Agg")  # no display; must precede pyplot
import matplotlib.pyplot as plt
import pandas as pd
from matplotlib.ticker import FuncFormatter

from kraftkeeper_reports.tables import ReportTables

ALL = "(all)"
NO_VALUE = "\u2013"  # an en dash where there is no number
PHASES = ("catch_up", "add_voter", "remove_voter", "under_replicated", "exposure", "total")
PHASE_TITLES = {
    "catch_up": "Catch-up: detection → caught up",
    "add_voter": "AddVoter: caught up → committed",
    "remove_voter": "RemoveVoter: AddVoter → RemoveVoter committed",
    "under_replicated": "Without full voter count: detection → AddVoter committed",
    "exposure": "Dead voter in set: detection → RemoveVoter committed",
    "total": "Total: detection → recovery completed",
}
COLORS = {
    "catch_up": "#4C78A8",
    "add_voter": "#F58518",
    "remove_voter": "#54A24B",
    "finish": "#B279A2",
    "under_replicated": "#E45756",
    "exposure": "#9D755D",
    "total": "#1B2A41",
}
ACTION_COLORS = {"rejected": "#E45756", "excluded": "#F58518", "skipped": "#BAB0AC", "ignored": "#72B7B2"}

plt.rcParams.update(
    {
        "svg.fonttype": "none",
        "font.family": "DejaVu Sans",
        "font.size": 10,
        "axes.spines.top": False,
        "axes.spines.right": False,
        "axes.titlesize": 11,
        "axes.titleweight": "bold",
    }
)


def fmt_ms(ms: float | int | None) -> str:
    """A duration for people: 840 ms, 12.3 s, 4.5 min, 1.2 h."""
    if ms is None or (isinstance(ms, float) and math.isnan(ms)):
        return NO_VALUE
    v = float(ms)
    if v < 1000:
        return f"{v:.0f} ms"
    if v < 60_000:
        return f"{v / 1000:.1f} s"
    if v < 3_600_000:
        return f"{v / 60_000:.1f} min"
    return f"{v / 3_600_000:.1f} h"


_MS_TICKS = FuncFormatter(lambda x, _pos: fmt_ms(x) if x > 0 else "0")


def _svg(fig: Any, label: str) -> str:
    buf = io.StringIO()
    # No RDF metadata block: it only adds namespace URLs and a date (the page stays reproducible).
    fig.savefig(buf, format="svg", bbox_inches="tight",
                metadata={"Creator": None, "Date": None, "Format": None, "Type": None})
    plt.close(fig)
    svg = buf.getvalue()
    svg = svg[svg.index("<svg") :]  # drop the XML prolog and doctype: inline SVG needs neither
    return f'<figure class="plot" data-plot="{html.escape(label)}">{svg}</figure>'


def _empty(label: str, why: str) -> str:
    return f'<figure class="plot empty" data-plot="{html.escape(label)}"><p>{html.escape(why)}</p></figure>'


def plot_distributions(hist: pd.DataFrame, stats: pd.DataFrame) -> str:
    if hist.empty:
        return _empty("distributions", "No completed recovery: no phase durations to show.")
    fig, axes = plt.subplots(2, 3, figsize=(13, 6.2))
    for ax, phase in zip(axes.flat, PHASES, strict=True):
        h = hist[hist["phase"] == phase]
        ax.set_title(PHASE_TITLES[phase], fontsize=9.5)
        if h.empty:
            ax.text(0.5, 0.5, "no data", transform=ax.transAxes, ha="center")
            continue
        ax.bar(h["bin_lo_ms"], h["count"], width=h["bin_hi_ms"] - h["bin_lo_ms"], align="edge",
               color=COLORS[phase], alpha=0.85)
        ax.set_xscale("log")
        ax.xaxis.set_major_formatter(_MS_TICKS)
        ax.set_ylabel("recoveries")
        row = stats[(stats["cluster"] == ALL) & (stats["phase"] == phase)]
        if not row.empty:
            r = row.iloc[0]
            for col, style in (("p50_ms", "-"), ("p90_ms", "--"), ("p99_ms", ":")):
                v = float(r[col])
                ax.axvline(max(v, 1.0), color="#222", linestyle=style, linewidth=1)
                ax.text(max(v, 1.0), ax.get_ylim()[1] * 0.97, f" {col[:3]} {fmt_ms(v)}", fontsize=7.5,
                        va="top", rotation=90, ha="right")
    fig.suptitle("How long each phase takes (completed recoveries; log scale)", fontweight="bold")
    fig.tight_layout()
    return _svg(fig, "distributions")


def plot_clusters(stats: pd.DataFrame) -> str:
    s = stats[(stats["cluster"] != ALL) & (stats["phase"].isin(["total", "catch_up", "under_replicated"]))]
    if s.empty:
        return _empty("clusters", "No completed recovery per cluster.")
    order = (
        s[s["phase"] == "total"].sort_values("p50_ms")["cluster"].tolist()
        or sorted(s["cluster"].unique().tolist())
    )
    fig, ax = plt.subplots(figsize=(11, 0.42 * len(order) + 1.6))
    y = {c: i for i, c in enumerate(order)}
    offsets = {"total": 0.22, "under_replicated": 0.0, "catch_up": -0.22}
    for phase, off in offsets.items():
        p = s[s["phase"] == phase]
        ys = [y[c] + off for c in p["cluster"]]
        ax.hlines(ys, p["p50_ms"], p["p99_ms"], color=COLORS[phase], linewidth=3, alpha=0.6)
        ax.scatter(p["p50_ms"], ys, color=COLORS[phase], s=28, zorder=3, label=f"{PHASE_TITLES[phase]}")
        ax.scatter(p["p90_ms"], ys, color=COLORS[phase], s=28, marker="|", zorder=3)
        ax.scatter(p["max_ms"], ys, color=COLORS[phase], s=14, marker="x", zorder=3)
    ax.set_yticks(range(len(order)), order)
    ax.set_xscale("log")
    ax.xaxis.set_major_formatter(_MS_TICKS)
    ax.set_xlabel("duration (log scale): dot = p50, bar to p99, | = p90, x = max")
    ax.set_title("Per cluster: recovery time (sorted by median total)")
    ax.legend(loc="lower right", fontsize=8, frameon=False)
    ax.grid(axis="x", alpha=0.3)
    fig.tight_layout()
    return _svg(fig, "clusters")


def plot_gantt(slow: pd.DataFrame) -> str:
    if slow.empty:
        return _empty("gantt", "No completed recovery: no timeline to show.")
    fig, ax = plt.subplots(figsize=(11, 0.36 * len(slow) + 1.6))
    segments = (
        ("catch_up", "t_detected", "t_caught_up", "catch-up"),
        ("add_voter", "t_caught_up", "t_add_voter_committed", "AddVoter"),
        ("remove_voter", "t_add_voter_committed", "t_remove_voter_committed", "RemoveVoter"),
        ("finish", "t_remove_voter_committed", "t_completed", "finish"),
    )
    labels = []
    for i, (_, r) in enumerate(slow.iloc[::-1].iterrows()):
        t0 = float(r["t_detected"])
        for key, a, b, name in segments:
            start, end = (float(r[a]) - t0) / 1000.0, (float(r[b]) - t0) / 1000.0
            ax.barh(i, max(end - start, 0.0), left=start, color=COLORS[key], height=0.6,
                    label=name if i == 0 else None)
        ax.text((float(r["t_completed"]) - t0) / 1000.0, i,
                f"  {fmt_ms(r['total_ms'])} (AddVoter {fmt_ms(r['add_voter_ms'])}, "
                f"RemoveVoter {fmt_ms(r['remove_voter_ms'])})", va="center", fontsize=7.5)
        labels.append(f"{r['cluster']} {r['recovery_id']}")
    ax.set_yticks(range(len(labels)), labels, fontsize=8)
    ax.set_xlabel("seconds since the disk replacement was detected")
    ax.set_title(f"Timelines of the {len(slow)} slowest recoveries")
    ax.legend(loc="lower right", fontsize=8, frameon=False)
    xmax = max((float(r["t_completed"]) - float(r["t_detected"])) / 1000.0 for _, r in slow.iterrows())
    ax.set_xlim(0, xmax * 1.45)
    fig.tight_layout()
    return _svg(fig, "gantt")


def plot_daily(day: pd.DataFrame) -> str:
    if day.empty:
        return _empty("daily", "No finished recovery: no daily trend.")
    d = day.copy()
    d["date"] = pd.to_datetime(d["date"])
    fig, ax = plt.subplots(figsize=(11, 3.8))
    ax.bar(d["date"], d["completed"], color="#9ecae1", label="completed")
    ax.bar(d["date"], d["failed"], bottom=d["completed"], color="#E45756", label="failed")
    ax.set_ylabel("recoveries per day")
    ax2 = ax.twinx()
    ax2.plot(d["date"], d["p50_total_ms"] / 60_000, color="#1B2A41", marker="o", ms=3, label="p50 total")
    ax2.plot(d["date"], d["p90_total_ms"] / 60_000, color="#1B2A41", linestyle="--", label="p90 total")
    ax2.set_ylabel("total recovery time (minutes)")
    ax2.set_ylim(bottom=0)
    ax2.spines["right"].set_visible(True)
    h1, l1 = ax.get_legend_handles_labels()
    h2, l2 = ax2.get_legend_handles_labels()
    ax.legend(h1 + h2, l1 + l2, loc="upper left", fontsize=8, ncol=4, frameon=False)
    ax.set_title("Daily trend (UTC day of detection)")
    fig.autofmt_xdate()
    fig.tight_layout()
    return _svg(fig, "daily")


def plot_bad_input(bad: pd.DataFrame) -> str:
    if bad.empty:
        return _empty("bad-input", "No bad input: every line is a valid event, every recovery consistent.")
    g = bad.groupby(["level", "reason", "action"], as_index=False).agg(count=("count", "sum"))
    g = g.sort_values(by="count")
    fig, ax = plt.subplots(figsize=(11, 0.34 * len(g) + 1.4))
    labels = [f"{r.reason} ({r.level})" for r in g.itertuples()]
    ax.barh(labels, g["count"], color=[ACTION_COLORS.get(a, "#888") for a in g["action"]])
    for i, (c, a) in enumerate(zip(g["count"], g["action"], strict=True)):
        ax.text(c, i, f"  {c:,} {a}", va="center", fontsize=8)
    ax.set_xscale("log")
    ax.set_xlabel("lines (line level) or recoveries (recovery level), log scale")
    ax.set_title("Bad input by reason")
    ax.set_xlim(right=max(g["count"]) * 8)
    fig.tight_layout()
    return _svg(fig, "bad-input")


def _table(df: pd.DataFrame, cls: str = "") -> str:
    head = "".join(f"<th>{html.escape(str(c))}</th>" for c in df.columns)
    rows = []
    for r in df.itertuples(index=False):
        cells = []
        for v in r:
            num = isinstance(v, int | float) and not isinstance(v, bool)
            cells.append(f'<td class="{"num" if num else ""}">{html.escape(str(v))}</td>')
        rows.append("<tr>" + "".join(cells) + "</tr>")
    return f'<table class="{cls}"><thead><tr>{head}</tr></thead><tbody>{"".join(rows)}</tbody></table>'


def _stats_table(stats: pd.DataFrame, cluster: str) -> pd.DataFrame:
    s = stats[stats["cluster"] == cluster].copy()
    s["order"] = s["phase"].map({p: i for i, p in enumerate(PHASES)})
    s = s.sort_values("order")
    return pd.DataFrame(
        {
            "phase": s["phase"].map(PHASE_TITLES),
            "recoveries": s["recoveries"].astype(int),
            "p50": s["p50_ms"].map(fmt_ms),
            "p90": s["p90_ms"].map(fmt_ms),
            "p99": s["p99_ms"].map(fmt_ms),
            "max": s["max_ms"].map(fmt_ms),
        }
    )


def _card(value: str, label: str, tone: str = "") -> str:
    return (
        f'<div class="card {tone}"><div class="v">{html.escape(value)}</div>'
        f'<div class="l">{html.escape(label)}</div></div>'
    )


CSS = """
body{font-family:"DejaVu Sans",system-ui,sans-serif;margin:0;color:#1b2a41;background:#f6f7f9}
header{background:#1b2a41;color:#fff;padding:22px 32px}
header h1{margin:0 0 4px;font-size:24px} header p{margin:0;opacity:.8;font-size:13px}
main{padding:20px 32px;max-width:1280px}
.cards{display:flex;flex-wrap:wrap;gap:12px;margin:8px 0 20px}
.card{background:#fff;border-radius:8px;padding:12px 18px;min-width:150px;box-shadow:0 1px 3px #0002}
.card .v{font-size:26px;font-weight:bold} .card .l{font-size:12px;color:#555}
.card.bad .v{color:#c0392b} .card.good .v{color:#2e7d32}
section{background:#fff;border-radius:8px;padding:16px 20px;margin:0 0 20px;box-shadow:0 1px 3px #0002}
section h2{margin:0 0 8px;font-size:18px} section p.note{color:#555;font-size:13px;margin:4px 0 10px}
figure.plot{margin:0} figure.plot svg{max-width:100%;height:auto}
table{border-collapse:collapse;font-size:12.5px;margin:8px 0}
th,td{padding:4px 9px;border-bottom:1px solid #e3e6ea;text-align:left}
th{background:#eef1f5} td.num{text-align:right;font-variant-numeric:tabular-nums}
td code{font-size:11px;word-break:break-all}
.ex{font-family:monospace;font-size:11px;word-break:break-all;color:#444}
"""


def render_html(t: ReportTables) -> str:
    """The whole page."""
    s = t.summary
    recs = int(s.get("recoveries") or 0)
    failed = int(s.get("failed") or 0)
    finished = failed + int(s.get("completed") or 0)
    fail_rate = f"{100.0 * failed / finished:.1f} %" if finished else NO_VALUE
    gen = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    days = f"{s.get('first_day')} → {s.get('last_day')}" if s.get("first_day") else "no finished recovery"
    cards = "".join(
        [
            _card(f"{recs:,}", f"recoveries in {int(s.get('clusters') or 0)} clusters"),
            _card(f"{int(s.get('completed') or 0):,}", "completed", "good"),
            _card(f"{failed:,} ({fail_rate})", "failed", "bad" if failed else ""),
            _card(fmt_ms(s.get("p50_total_ms")), "median time to recover"),  # type: ignore[arg-type]
            _card(fmt_ms(s.get("p99_total_ms")), "p99 time to recover"),  # type: ignore[arg-type]
            _card(fmt_ms(s.get("p99_under_replicated_ms")),  # type: ignore[arg-type]
                  "p99 time without full voter count"),
            _card(fmt_ms(s.get("max_total_ms")), "slowest recovery"),  # type: ignore[arg-type]
            _card(f"{int(s.get('rejected_lines') or 0):,}", f"bad lines of {int(s.get('lines') or 0):,}",
                  "bad" if s.get("rejected_lines") else ""),
        ]
    )
    fails = t.failures[t.failures["cluster"] == ALL].copy()
    fails_tbl = pd.DataFrame(
        {"reason": fails["failure_reason"], "failures": fails["failures"].astype(int),
         "median time to give up": fails["p50_give_up_ms"].map(fmt_ms)}
    )
    per_cluster = t.phase_stats[(t.phase_stats["phase"] == "total") & (t.phase_stats["cluster"] != ALL)]
    cl_tbl = pd.DataFrame(
        {"cluster": per_cluster["cluster"], "completed": per_cluster["recoveries"].astype(int),
         "p50": per_cluster["p50_ms"].map(fmt_ms), "p90": per_cluster["p90_ms"].map(fmt_ms),
         "p99": per_cluster["p99_ms"].map(fmt_ms), "max": per_cluster["max_ms"].map(fmt_ms)}
    )
    bad_rows = []
    for r in t.bad_input.to_dict("records"):
        exs = "".join(f'<div class="ex">{html.escape(str(x))}</div>' for x in list(r["examples"])[:3])
        bad_rows.append(
            f"<tr><td>{html.escape(str(r['level']))}</td><td><b>{html.escape(str(r['code']))}</b>"
            f"<div class='ex'>{html.escape(str(r['message'] or ''))}</div></td>"
            f"<td>{html.escape(str(r['action']))}</td><td class='num'>{int(r['count']):,}</td>"
            f"<td>{exs}</td></tr>"
        )
    bad_tbl = (
        "<table><thead><tr><th>level</th><th>reason</th><th>action</th><th>count</th><th>examples</th>"
        f"</tr></thead><tbody>{''.join(bad_rows)}</tbody></table>"
        if bad_rows else "<p>None.</p>"
    )
    slow = t.slowest
    slow_tbl = pd.DataFrame(
        {"cluster": slow["cluster"], "recovery": slow["recovery_id"], "replica": slow["replica_id"],
         "detected (UTC)": [datetime.fromtimestamp(float(x) / 1000, UTC).strftime("%Y-%m-%d %H:%M:%S")
                            for x in slow["t_detected"]],
         "catch-up": slow["catch_up_ms"].map(fmt_ms), "AddVoter": slow["add_voter_ms"].map(fmt_ms),
         "RemoveVoter": slow["remove_voter_ms"].map(fmt_ms), "total": slow["total_ms"].map(fmt_ms)}
    )
    e = html.escape
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>KRaftKeeper recovery report</title>
<style>{CSS}</style></head>
<body>
<header><h1>KRaftKeeper disk-failure recovery report</h1>
<p>{e(days)} · {int(s.get('events') or 0):,} events from {e(str(s.get('inputs')))}
· generated {gen}</p></header>
<main>
<div class="cards" id="headline">{cards}</div>
<section id="phases"><h2>Phase durations</h2>
<p class="note">Completed recoveries only. Percentiles are exact (linear interpolation between ranks).
"Without full voter count" runs from detection until the replacement (id, new UUID) is a committed voter
(KIP-856 AddVoter); "dead voter in set" until the old (id, UUID) is removed.</p>
{plot_distributions(t.phase_histogram, t.phase_stats)}
{_table(_stats_table(t.phase_stats, ALL))}
</section>
<section id="clusters"><h2>Clusters compared</h2>
{plot_clusters(t.phase_stats)}
{_table(cl_tbl)}
</section>
<section id="slowest"><h2>Slowest recoveries</h2>
<p class="note">Catch-up (fetching the log as an observer) dominates; AddVoter and RemoveVoter commit in
milliseconds, so their durations are written beside each bar.</p>
{plot_gantt(slow)}
{_table(slow_tbl)}
</section>
<section id="daily"><h2>Daily trend</h2>
{plot_daily(t.daily)}
</section>
<section id="failures"><h2>Failures by reason</h2>
{_table(fails_tbl) if not fails_tbl.empty else "<p>No recovery failed.</p>"}
</section>
<section id="bad-input"><h2>Bad input</h2>
<p class="note">Nothing is dropped silently: rejected lines are left out of the analysis, skipped ones are
unknown event types or blank lines (allowed), ignored ones are extra fields (allowed); excluded
recoveries are inconsistent and left out of the durations.</p>
{plot_bad_input(t.bad_input)}
{bad_tbl}
</section>
</main></body></html>
"""
