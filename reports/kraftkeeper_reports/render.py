"""The HTML report: one self-contained page drawn from the job's small tables.

Written for the SRE who opens it after an incident: one sentence at the top says what happened
(how many recoveries, how long the slowest took, how long the quorum ran with a dead voter),
with its numbers taken from the same rows as the tables below; every duration is in human units
over an interval named as in ``kraftkeeper_reports.intervals``. The page adapts to its input:
with few recoveries each one is drawn and labelled (no one-bar histograms); a daily trend only
with several days; a cluster comparison only with several clusters; engines and orders side by
side only when the events name more than one. The inline style sheet is the only style; there
is no script and no external resource, so the file opens anywhere, offline. Pure: pandas frames
in, a string out (no Spark here). This module writes the summary, the cards and the page around
them; the sections below the summary are :mod:`kraftkeeper_reports.sections`.
"""

from __future__ import annotations

import html
from datetime import UTC, datetime

import pandas as pd

from kraftkeeper_reports.intervals import (
    NO_VALUE,
    REMOVE_THEN_ADD,
    fmt_ms,
)
from kraftkeeper_reports.plots import ALL, FEW
from kraftkeeper_reports.sections import (
    attention_section,
    bad_section,
    clusters_section,
    compare_section,
    daily_section,
    failures_section,
    intervals_section,
    report_orders,
    timeline_section,
    unclean_section,
    utc_time,
)
from kraftkeeper_reports.tables import ReportTables

__all__ = ["fmt_ms", "render_html", "summary_sentence"]


def _metric(key: str, text: str) -> str:
    return f'<b data-metric="{key}">{html.escape(text)}</b>'


def _all_row(stats: pd.DataFrame, phase: str) -> pd.Series | None:
    row = stats[(stats["cluster"] == ALL) & (stats["phase"] == phase)]
    return None if row.empty else row.iloc[0]


def _loss_sentence(t: ReportTables) -> str:
    """Data loss first: the unclean recoveries, as the summary's opening (HTML), or ""."""
    u = t.unclean
    if u is None or u.empty:
        return ""
    n = len(u)
    last = u.iloc[0]
    where = (f"the latest at {html.escape(utc_time(last['t_unclean']))} "
             f"in {html.escape(str(last['cluster']))}, replica {int(last['survivor'])} surviving")
    if last["log_end_offset"] is not None and not pd.isna(last["log_end_offset"]):
        where += f" with its log up to offset {int(last['log_end_offset']):,}"
    return (f'<span class="loss">Data loss: {_metric("unclean", f"{n:,}")} unclean '
            f"recover{'y' if n == 1 else 'ies'} ({where}) made a surviving replica the sole voter; records "
            "committed only on the lost replicas are gone.</span> ")


def summary_sentence(t: ReportTables) -> str:
    """What happened, in one sentence (HTML), data loss first: its durations come from the
    "(all)" rows of ``phase_stats`` (the table under "Interval durations"), its counts from
    ``summary``."""
    s = t.summary
    recs, done = int(s.get("recoveries") or 0), int(s.get("completed") or 0)
    failed = int(s.get("failed") or 0)
    n_unclean = int(s.get("unclean") or 0)
    clusters = int(s.get("clusters") or 0)
    loss = _loss_sentence(t)
    recs -= n_unclean
    if recs == 0:
        return loss + ("No recovery of a replaced disk in this event log." if loss
                       else "No recovery in this event log.")
    first, last = s.get("first_day"), s.get("last_day")
    when = f"on {first}" if first == last else f"between {first} and {last}"
    parts = [
        loss + f"{_metric('recoveries', f'{recs:,}')} recover{'y' if recs == 1 else 'ies'} "
        "of a replaced disk "
        f"in {clusters:,} cluster{'' if clusters == 1 else 's'} {when}: "
        f"{_metric('completed', f'{done:,}')} completed, {_metric('failed', f'{failed:,}')} failed"
    ]
    running = int(s.get("in_progress") or 0)
    if running:
        parts[0] += f", {_metric('in_progress', f'{running:,}')} still in progress"
    invalid = int(s.get("invalid") or 0)
    if invalid:
        parts[0] += f", {invalid:,} inconsistent (see Bad input)"
    total, exposure = _all_row(t.phase_stats, "total"), _all_row(t.phase_stats, "exposure")
    degraded = _all_row(t.phase_stats, "degraded")
    orders = report_orders(t)
    text = parts[0] + "."
    if total is not None:
        text += (f" The slowest took {_metric('max_total_ms', fmt_ms(total['max_ms']))} "
                 f"(total: detection → recovery completed)")
        if done > 1:
            text += f", the median {_metric('p50_total_ms', fmt_ms(total['p50_ms']))}"
        text += "."
    if exposure is not None:
        worst = _metric("max_exposure_ms", fmt_ms(exposure["max_ms"]))
        if done > 1:
            median = _metric("p50_exposure_ms", fmt_ms(exposure["p50_ms"]))
            text += f" The quorum ran with a dead voter for {median} at the median and at most {worst}"
        else:
            text += f" The quorum ran with a dead voter for {worst}"
        if REMOVE_THEN_ADD not in orders:
            text += " (detection → RemoveVoter committed: one failure less tolerated meanwhile)."
        else:
            text += " (detection → RemoveVoter committed)"
            if degraded is not None:
                which = ("AddVoter committed: removing the old voter first leaves the voter set one short "
                         "until AddVoter commits" if orders == {REMOVE_THEN_ADD} else
                         "the second voter change committed: RemoveVoter in AddThenRemove, AddVoter in "
                         "RemoveThenAdd, whose voter set stays one short until AddVoter commits")
                worst_d = _metric("max_degraded_ms", fmt_ms(degraded["max_ms"]))
                if done > 1:
                    median_d = _metric("p50_degraded_ms", fmt_ms(degraded["p50_ms"]))
                    text += (f", and tolerated one failure less for {median_d} at the median and at most "
                             f"{worst_d}")
                else:
                    text += f", and tolerated one failure less for {worst_d}"
                text += f" (detection → {which})"
            text += "."
    if failed:
        text += f" {failed:,} failed recover{'y' if failed == 1 else 'ies'} left the dead voter in the set"
        text += (", or, failing after RemoveVoter (RemoveThenAdd), the voter set one short."
                 if REMOVE_THEN_ADD in orders else ".")
    return text


def _card(value: str, label: str, tone: str = "") -> str:
    return (
        f'<div class="card {tone}"><div class="v">{html.escape(value)}</div>'
        f'<div class="l">{html.escape(label)}</div></div>'
    )


def _cards(t: ReportTables) -> str:
    s = t.summary
    failed, done = int(s.get("failed") or 0), int(s.get("completed") or 0)
    fail_rate = f"{100.0 * failed / (failed + done):.1f} %" if failed + done else NO_VALUE
    total, exposure = _all_row(t.phase_stats, "total"), _all_row(t.phase_stats, "exposure")
    degraded = _all_row(t.phase_stats, "degraded")
    stat, word = ("max_ms", "longest") if done <= FEW else ("p99_ms", "p99")

    def v(row: pd.Series | None, col: str) -> str:
        return NO_VALUE if row is None else fmt_ms(row[col])

    tolerance = ""
    if REMOVE_THEN_ADD in report_orders(t):  # only then does it differ from the dead voter in set
        tolerance = _card(v(degraded, stat),
                          f"{word} one failure less tolerated (detection → second voter change committed)")

    n_unclean = int(s.get("unclean") or 0)
    return "".join([
        _card(f"{n_unclean:,}", "unclean recoveries (data lost)", "bad") if n_unclean else "",
        _card(f"{done:,}", "completed", "good"),
        _card(f"{failed:,} ({fail_rate})", "failed", "bad" if failed else ""),
        _card(v(total, "p50_ms"), "median total (detection → completed)"),
        _card(v(total, "max_ms"), "slowest total"),
        _card(v(exposure, stat), f"{word} dead voter in set (detection → RemoveVoter committed)"),
        tolerance,
        _card(f"{int(s.get('rejected_lines') or 0):,}", f"bad lines of {int(s.get('lines') or 0):,}",
              "bad" if s.get("rejected_lines") else ""),
    ])


CSS = """
body{font-family:"DejaVu Sans",system-ui,sans-serif;margin:0;color:#1b2a41;background:#f6f7f9}
header{background:#1b2a41;color:#fff;padding:22px 32px}
header h1{margin:0 0 4px;font-size:24px} header p{margin:0;opacity:.8;font-size:13px}
main{padding:20px 32px;max-width:1280px}
p.summary{font-size:17px;line-height:1.5;background:#fff;border-left:5px solid #4C78A8;padding:12px 18px;
  margin:4px 0 16px;box-shadow:0 1px 3px #0002}
.cards{display:flex;flex-wrap:wrap;gap:12px;margin:8px 0 20px}
.card{background:#fff;border-radius:8px;padding:12px 18px;min-width:150px;max-width:260px;
  box-shadow:0 1px 3px #0002}
.card .v{font-size:24px;font-weight:bold} .card .l{font-size:12px;color:#555}
.card.bad .v{color:#c0392b} .card.good .v{color:#2e7d32}
section{background:#fff;border-radius:8px;padding:16px 20px;margin:0 0 20px;box-shadow:0 1px 3px #0002}
section h2{margin:0 0 8px;font-size:18px} p.note{color:#555;font-size:13px;margin:4px 0 10px}
figure.plot{margin:0} figure.plot svg{max-width:100%;height:auto}
table{border-collapse:collapse;font-size:12.5px;margin:8px 0}
th,td{padding:4px 9px;border-bottom:1px solid #e3e6ea;text-align:left}
th{background:#eef1f5} td.nw{white-space:nowrap}
td.num{text-align:right;font-variant-numeric:tabular-nums;white-space:nowrap}
.ex{font-family:monospace;font-size:11px;word-break:break-all;color:#444}
section.loss{border-left:6px solid #c0392b} section.loss h2{color:#c0392b}
section.warn{border-left:6px solid #e67e22} section.ok{border-left:6px solid #2e7d32}
section h3{font-size:15px;margin:12px 0 4px}
span.loss{color:#c0392b;font-weight:bold} p.summary.loss{border-left-color:#c0392b}
"""


def render_html(t: ReportTables) -> str:
    """The whole page."""
    s = t.summary
    gen = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    days = f"{s.get('first_day')} → {s.get('last_day')}" if s.get("first_day") else "no finished recovery"
    e = html.escape
    body = "\n".join([
        unclean_section(t), attention_section(t),
        intervals_section(t), compare_section(t), timeline_section(t), clusters_section(t),
        daily_section(t), failures_section(t), bad_section(t),
    ])
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>KRaftKeeper recovery report</title>
<style>{CSS}</style></head>
<body>
<header><h1>KRaftKeeper disk-failure recovery report</h1>
<p>{e(days)} · {int(s.get('events') or 0):,} events in {int(s.get('lines') or 0):,} lines from
{e(str(s.get('inputs')))} · generated {gen}</p></header>
<main>
<p class="summary{' loss' if s.get('unclean') else ''}" id="summary">{summary_sentence(t)}</p>
<div class="cards" id="headline">{_cards(t)}</div>
{body}
</main></body></html>
"""
