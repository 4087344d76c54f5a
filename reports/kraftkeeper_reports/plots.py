"""The report's plots: matplotlib figures as inline SVG, with axes a person reads at a glance.

Every duration axis is in human units (ms, s, min, h) with round ticks in one unit (linear) or at
1 ms, 10 ms ... 1 s, 10 s, 1 min (log, labelled as such); never scientific notation. Each
figure carries its tick labels (``data-ticks``) and how many data points it draws
(``data-points``), so tests check what a reader sees. Pure: pandas frames in, SVG strings out.
"""

from __future__ import annotations

import html
import io
import json
import math
from typing import Any

import matplotlib

matplotlib.use("Agg")  # no display; must precede pyplot
import matplotlib.pyplot as plt
import pandas as pd
from matplotlib.ticker import FixedLocator, FuncFormatter, NullFormatter, NullLocator

from kraftkeeper_reports import events as ev
from kraftkeeper_reports.intervals import (
    ADD_THEN_REMOVE,
    AUTO_JOIN,
    BY_NAME,
    LABEL_ORDER,
    PHASES,
    REMOVE_THEN_ADD,
    fmt_ms,
    recorded_order,
)
from kraftkeeper_reports.tables import TS_COL

ALL = "(all)"
FEW = 30  # up to this many completed recoveries, each one is drawn and labelled
SEVERAL_DAYS = 3  # a daily trend needs at least this many days
PHASE_TITLES = {name: BY_NAME[name].title for name in PHASES}  # AddThenRemove's (KIP-856)
COLORS = {
    "catch_up": "#4C78A8",
    "add_voter": "#F58518",
    "remove_voter": "#54A24B",
    "finish": "#B279A2",
    "under_replicated": "#E45756",
    "exposure": "#9D755D",
    "degraded": "#B07AA1",
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
        "axes.titlesize": 10.5,
        "axes.titleweight": "bold",
        "axes.formatter.useoffset": False,
    }
)


def _plain(x: float) -> str:
    """A number without scientific notation: 2, 2.5, 0.25."""
    return f"{x:,.2f}".rstrip("0").rstrip(".")


_UNITS = ((1.0, "ms"), (1000.0, "s"), (60_000.0, "min"), (3_600_000.0, "h"))
_STEPS_MS = (1, 2, 5, 10, 20, 25, 50, 100, 200, 250, 500, 1000, 2000, 5000, 10_000, 15_000, 30_000,
             60_000, 120_000, 300_000, 600_000, 900_000, 1_800_000, 3_600_000, 7_200_000, 21_600_000,
             43_200_000, 86_400_000)
_LOG_TICKS_MS = (1, 10, 100, 1000, 10_000, 60_000, 600_000, 3_600_000, 36_000_000)


def _unit(top_ms: float) -> tuple[float, str]:
    """The unit every tick of an axis reaching ``top_ms`` is written in."""
    if top_ms < 2000:
        return _UNITS[0]
    if top_ms < 120_000:
        return _UNITS[1]
    if top_ms < 7_200_000:
        return _UNITS[2]
    return _UNITS[3]


def _ms_tick(v: float) -> str:
    """A log-axis tick: its own unit (1 ms, 100 ms, 1 s, 10 min)."""
    div, name = _UNITS[0]
    for d, n in _UNITS:
        if v >= d:
            div, name = d, n
    return f"{_plain(v / div)} {name}" if v > 0 else "0"


def duration_axis(ax: Any, top_ms: float, axis: str = "x", log: bool = False, low_ms: float = 1.0) -> None:
    """Ticks in human units on a duration axis (data in ms): linear with round steps in one unit,
    or log with ticks at 1 ms, 10 ms, ... 1 s, 10 s, 1 min, 10 min, 1 h. Never scientific."""
    a = ax.xaxis if axis == "x" else ax.yaxis
    top = max(float(top_ms), 1.0)
    if log:
        # Up to the first tick at or above the largest value, so every point lies under a label
        # (a dot at 4.6 s past a last tick of 1 s cannot be read).
        above = next((t for t in _LOG_TICKS_MS if t >= top), _LOG_TICKS_MS[-1])
        ticks = [t for t in _LOG_TICKS_MS if low_ms / 1.5 <= t <= max(top * 1.5, above)]
        if len(ticks) < 3:  # a narrow range: 1-2-5 steps in human units
            above = next((t for t in _STEPS_MS if t >= top), _STEPS_MS[-1])
            ticks = [t for t in _STEPS_MS if low_ms / 1.5 <= t <= max(top * 1.5, above)] or [1]
        lo, hi = (ax.get_xlim if axis == "x" else ax.get_ylim)()
        (ax.set_xlim if axis == "x" else ax.set_ylim)(min(lo, ticks[0]) if lo > 0 else ticks[0],
                                                      max(hi, ticks[-1] * 1.05))
        a.set_major_locator(FixedLocator(ticks))
        a.set_major_formatter(FuncFormatter(lambda v, _p: _ms_tick(v)))
    else:
        step = next((s for s in _STEPS_MS if top / s <= 6), _STEPS_MS[-1])
        div, name = _unit(top)
        n = math.ceil(top / step)
        a.set_major_locator(FixedLocator([i * step for i in range(n + 1)]))
        a.set_major_formatter(FuncFormatter(lambda v, _p: f"{_plain(v / div)} {name}" if v else "0"))
        (ax.set_xlim if axis == "x" else ax.set_ylim)(0, n * step)
    a.set_minor_locator(NullLocator())
    a.set_minor_formatter(NullFormatter())


def count_axis(ax: Any, top: float, axis: str = "x") -> None:
    """A log axis of counts with plain ticks: 1, 10, 100, 1,000."""
    a = ax.xaxis if axis == "x" else ax.yaxis
    ticks = [10**k for k in range(0, int(math.log10(max(top, 1))) + 2)]
    a.set_major_locator(FixedLocator(ticks))
    a.set_major_formatter(FuncFormatter(lambda v, _p: f"{v:,.0f}"))
    a.set_minor_locator(NullLocator())
    a.set_minor_formatter(NullFormatter())


def _svg(fig: Any, label: str, points: int) -> str:
    buf = io.StringIO()
    # No RDF metadata block: it only adds namespace URLs and a date (the page stays reproducible).
    fig.savefig(buf, format="svg", bbox_inches="tight",
                metadata={"Creator": None, "Date": None, "Format": None, "Type": None})
    # The tick labels as drawn: savefig's draw set their text (no draw of its own for them).
    ticks = sorted({t.get_text() for ax in fig.axes for t in (*ax.get_xticklabels(), *ax.get_yticklabels())
                    if t.get_text()})
    plt.close(fig)
    svg = buf.getvalue()
    svg = svg[svg.index("<svg") :]  # drop the XML prolog and doctype: inline SVG needs neither
    return (f'<figure class="plot" data-plot="{html.escape(label)}" data-points="{points}" '
            f'data-ticks="{html.escape(json.dumps(ticks))}">{svg}</figure>')


def _label(r: Any) -> str:
    return f"{r['cluster']} {r['recovery_id']} (replica {r['replica_id']})"


_T_COL = {t: TS_COL[t] for t in ev.STEP_TYPES}


def row_order(r: Any) -> str:
    """The voter-change order one row of ``slowest`` recorded (``intervals.recorded_order``)."""
    return recorded_order({typ: (r[col] if col in r and pd.notna(r[col]) else None)
                           for typ, col in _T_COL.items()})


def orders_of(slow: pd.DataFrame, compare: pd.DataFrame | None = None) -> frozenset[str]:
    """The voter-change orders recorded by the completed recoveries: from the comparison's order
    labels (over every completed recovery) where it has them, else from the rows of ``slow``."""
    if compare is not None and not compare.empty and "order" in compare:
        found = {LABEL_ORDER[o] for o in compare["order"].dropna().unique() if o in LABEL_ORDER}
        if found:
            return frozenset(found)
    return frozenset(row_order(r) for _, r in slow.iterrows()) or frozenset({ADD_THEN_REMOVE})


def order_label(label: Any, recorded: str) -> str:
    """How a recovery's order is named to a reader: Kafka's auto-join is said to be Kafka's and
    recorded from outside (its steps as DescribeQuorum showed them)."""
    if label == AUTO_JOIN:
        return "Kafka auto-join (recorded from outside)"
    return recorded


def phase_title(phase: str, orders: frozenset[str]) -> str:
    return BY_NAME[phase].title_for(set(orders))


def _label_levels(vals: list[float], span: float) -> list[int]:
    """A height (0, 1, 2, ...) for each value's label, left to right, so that labels of values
    closer than about a label's width on the axis go one above the other instead of overlapping."""
    width = 0.08 * span if span > 0 and not math.isnan(span) else 0.0
    levels = [0] * len(vals)
    last: list[float] = []  # per level, the value whose label ends furthest right so far
    for i in sorted((i for i, v in enumerate(vals) if not math.isnan(v)), key=lambda i: vals[i]):
        lv = next((k for k, x in enumerate(last) if vals[i] - x >= width), len(last))
        if lv == len(last):
            last.append(vals[i])
        else:
            last[lv] = vals[i]
        levels[i] = lv
    return levels


def plot_each(slow: pd.DataFrame, orders: frozenset[str] = frozenset({ADD_THEN_REMOVE})) -> str:
    """Few recoveries: one strip per interval, one labelled dot per recovery, linear axes; each
    strip titled with the spans of the orders present (``intervals``)."""
    fig, axes = plt.subplots(len(PHASES), 1, figsize=(11, 1.05 * len(PHASES) + 0.9))
    labels = [_label(r) for _, r in slow.iterrows()]
    markers = "osD^v<>ph*"
    points = 0
    for ax, phase in zip(axes, PHASES, strict=True):
        vals = slow[f"{phase}_ms"].astype(float)
        ax.set_title(phase_title(phase, orders), loc="left", fontsize=9.5)
        ax.set_yticks([])
        ax.spines["left"].set_visible(False)
        level = _label_levels([float(v) for v in vals], float(vals.max()) * 1.1)
        for i, v in enumerate(vals):
            if math.isnan(v):  # an end missing or before its start in this recovery
                continue
            ax.scatter([v], [0], s=46, color=COLORS[phase], marker=markers[i % len(markers)], zorder=3,
                       label=labels[i] if phase == PHASES[0] else None)
            if len(vals) <= 8:
                ax.annotate(f"{fmt_ms(v)}", (v, 0), xytext=(0, 7 + 9 * (level[i] % 3)),
                            textcoords="offset points", ha="center", fontsize=7.5)
            points += 1
        top = float(vals.max())
        if math.isnan(top):
            ax.text(0.5, 0.3, "none: no recovery here has both ends of this interval",
                    transform=ax.transAxes, ha="center", fontsize=8.5, color="#666")
            top = 1000.0
        duration_axis(ax, top * 1.1)
        ax.set_ylim(-0.5, 1.6)  # room above the markers for up to three rows of labels
    fig.legend(loc="lower center", ncol=min(3, len(labels)), fontsize=8, frameon=False,
               bbox_to_anchor=(0.5, -0.02 - 0.025 * ((len(labels) - 1) // 3)))
    fig.suptitle("Each completed recovery, per interval (one marker per recovery; linear axes)",
                 fontweight="bold")
    fig.tight_layout()
    return _svg(fig, "each", points)


def plot_distributions(hist: pd.DataFrame, stats: pd.DataFrame,
                       orders: frozenset[str] = frozenset({ADD_THEN_REMOVE})) -> str:
    """Many recoveries: a histogram per interval on a log axis with human tick labels."""
    cols = 3
    rows = math.ceil(len(PHASES) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(13, 3.2 * rows))
    for ax in list(axes.flat)[len(PHASES):]:
        ax.set_visible(False)
    points = 0
    for ax, phase in zip(axes.flat, PHASES, strict=False):
        h = hist[hist["phase"] == phase]
        ax.set_title(_wrap(phase_title(phase, orders), 48), fontsize=9)
        ax.bar(h["bin_lo_ms"], h["count"], width=h["bin_hi_ms"] - h["bin_lo_ms"], align="edge",
               color=COLORS[phase], alpha=0.85)
        points += int((h["count"] > 0).sum())
        ax.set_xscale("log")
        duration_axis(ax, float(h["bin_hi_ms"].max()), log=True, low_ms=float(h["bin_lo_ms"].min()))
        ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _p: f"{v:,.0f}"))
        ax.set_ylabel("recoveries")
        row = stats[(stats["cluster"] == ALL) & (stats["phase"] == phase)]
        if not row.empty:
            r = row.iloc[0]
            for col, style in (("p50_ms", "-"), ("p99_ms", ":")):
                v = max(float(r[col]), 1.0)
                ax.axvline(v, color="#222", linestyle=style, linewidth=1)
                ax.text(v, ax.get_ylim()[1] * 0.97, f" {col[:3]} {fmt_ms(v)}", fontsize=7.5, va="top",
                        rotation=90, ha="right")
    fig.suptitle("How long each interval takes (completed recoveries; log axis, lines at p50 and p99)",
                 fontweight="bold")
    fig.tight_layout()
    return _svg(fig, "distributions", points)


def _wrap(text: str, width: int) -> str:
    """Break a long title at spaces so it stays above its own panel."""
    lines: list[str] = []
    for word in text.split(" "):
        if lines and len(lines[-1]) + 1 + len(word) <= width:
            lines[-1] += " " + word
        else:
            lines.append(word)
    return "\n".join(lines)


def plot_groups(stats: pd.DataFrame, key: str, title: str, label: str) -> str:
    """Per group (cluster, or engine / order): p50 dot, bar to p99, x at max, log axis."""
    order = stats[stats["phase"] == "total"].sort_values("p50_ms")[key].tolist()
    fig, ax = plt.subplots(figsize=(11, 0.5 * len(order) + 1.8))
    y = {c: i for i, c in enumerate(order)}
    points = 0
    # The spans of these four are the same in both voter-change orders (intervals); "degraded"
    # is named by what it means in both: until the second change commits.
    shown = {"total": 0.27, "degraded": 0.09, "exposure": -0.09, "catch_up": -0.27}
    names = {**PHASE_TITLES,
             "degraded": "One failure less tolerated: detection → second voter change committed"}
    for phase, off in shown.items():
        p = stats[(stats["phase"] == phase) & stats[key].isin(order)]
        ys = [y[c] + off for c in p[key]]
        ax.hlines(ys, p["p50_ms"], p["p99_ms"], color=COLORS[phase], linewidth=3, alpha=0.6)
        ax.scatter(p["p50_ms"], ys, color=COLORS[phase], s=28, zorder=3, label=names[phase])
        ax.scatter(p["max_ms"], ys, color=COLORS[phase], s=14, marker="x", zorder=3)
        points += len(p)
    ax.set_yticks(range(len(order)), order)
    ax.set_ylim(-0.5, len(order) - 0.5)  # the outer rows' markers stay inside the frame
    ax.set_xscale("log")
    lo = float(stats["p50_ms"].min()) if len(stats) else 1.0
    duration_axis(ax, float(stats["max_ms"].max()), log=True, low_ms=max(lo, 1.0))
    ax.set_xlabel("duration (log axis): dot = p50, bar to p99, x = max")
    ax.set_title(title)
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.5 / (len(order) + 1) - 0.12), ncol=2, fontsize=8,
              frameon=False)
    ax.grid(axis="x", alpha=0.3)
    fig.tight_layout()
    return _svg(fig, label, points)


def plot_gantt(slow: pd.DataFrame, every: bool) -> str:
    fig, ax = plt.subplots(figsize=(11, 0.4 * len(slow) + 1.7))
    # Each row's bars follow the order it recorded (intervals): AddThenRemove adds then removes.
    segments = {
        ADD_THEN_REMOVE: (
            ("catch_up", "t_detected", "t_caught_up", "catch-up"),
            ("add_voter", "t_caught_up", "t_add_voter_committed", "→ AddVoter committed"),
            ("remove_voter", "t_add_voter_committed", "t_remove_voter_committed", "→ RemoveVoter committed"),
            ("finish", "t_remove_voter_committed", "t_completed", "→ completed"),
        ),
        REMOVE_THEN_ADD: (
            ("catch_up", "t_detected", "t_caught_up", "catch-up"),
            ("remove_voter", "t_caught_up", "t_remove_voter_committed", "→ RemoveVoter committed"),
            ("add_voter", "t_remove_voter_committed", "t_add_voter_committed", "→ AddVoter committed"),
            ("finish", "t_add_voter_committed", "t_completed", "→ completed"),
        ),
    }
    labels = []
    seen: set[str] = set()
    for i, (_, r) in enumerate(slow.iloc[::-1].iterrows()):
        t0 = float(r["t_detected"])
        order = row_order(r)
        for key, a, b, name in segments[order]:
            start, end = float(r[a]) - t0, float(r[b]) - t0
            ax.barh(i, max(end - start, 0.0), left=start, color=COLORS[key], height=0.6,
                    label=name if key not in seen else None)
            seen.add(key)
        ax.text(float(r["t_completed"]) - t0, i,
                f"  total {fmt_ms(r['total_ms'])}, one failure less tolerated {fmt_ms(r['degraded_ms'])}"
                f" ({order_label(r.get('order'), order)})", va="center", fontsize=7.5)
        labels.append(_label(r))
    ax.set_yticks(range(len(labels)), labels, fontsize=8)
    xmax = max(float(r["t_completed"]) - float(r["t_detected"]) for _, r in slow.iterrows())
    duration_axis(ax, xmax * 1.5)
    ax.set_xlabel("time since the disk replacement was detected")
    what = "every completed recovery" if every else f"the {len(slow)} slowest recoveries"
    ax.set_title(f"Timelines of {what}")
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.09 - 0.6 / (len(slow) + 2)), ncol=4, fontsize=8,
              frameon=False)
    fig.tight_layout()
    return _svg(fig, "gantt", len(slow))


def plot_daily(day: pd.DataFrame) -> str:
    d = day.copy()
    d["date"] = pd.to_datetime(d["date"])
    fig, ax = plt.subplots(figsize=(11, 3.8))
    ax.bar(d["date"], d["completed"], color="#9ecae1", label="completed")
    ax.bar(d["date"], d["failed"], bottom=d["completed"], color="#E45756", label="failed")
    ax.set_ylabel("recoveries per day")
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _p: f"{v:,.0f}"))
    ax2 = ax.twinx()
    ax2.plot(d["date"], d["p50_total_ms"], color="#1B2A41", marker="o", ms=3, label="p50 total")
    ax2.plot(d["date"], d["p90_total_ms"], color="#1B2A41", linestyle="--", label="p90 total")
    duration_axis(ax2, float(d["p90_total_ms"].max()) * 1.1, axis="y")
    ax2.set_ylabel("total recovery time")
    ax2.spines["right"].set_visible(True)
    h1, l1 = ax.get_legend_handles_labels()
    h2, l2 = ax2.get_legend_handles_labels()
    ax.legend(h1 + h2, l1 + l2, loc="upper left", fontsize=8, ncol=4, frameon=False)
    ax.set_title("Daily trend (UTC day of detection)")
    fig.autofmt_xdate()
    fig.tight_layout()
    return _svg(fig, "daily", len(d))


def plot_bad_input(bad: pd.DataFrame) -> str:
    g = bad.groupby(["level", "reason", "action"], as_index=False).agg(count=("count", "sum"))
    g = g.sort_values(by="count")
    fig, ax = plt.subplots(figsize=(11, 0.34 * len(g) + 1.4))
    labels = [f"{r.reason} ({r.level})" for r in g.itertuples()]
    ax.barh(labels, g["count"], color=[ACTION_COLORS.get(a, "#888") for a in g["action"]])
    for i, (c, a) in enumerate(zip(g["count"], g["action"], strict=True)):
        ax.text(c, i, f"  {c:,} {a}", va="center", fontsize=8)
    ax.set_xscale("log")
    top = float(max(g["count"]))
    count_axis(ax, top)
    ax.set_xlim(0.8, top * 8)
    ax.set_xlabel("lines (line level) or recoveries (recovery level), log axis")
    ax.set_title("Bad input by reason")
    fig.tight_layout()
    return _svg(fig, "bad-input", len(g))
