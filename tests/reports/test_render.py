"""The HTML renderer on its own (no Spark): units, escaping, and a page for empty input."""

from __future__ import annotations

import re

import pandas as pd
from kraftkeeper_reports.render import fmt_ms, render_html
from kraftkeeper_reports.tables import ReportTables


def empty_tables(**over: object) -> ReportTables:
    t = ReportTables(
        summary={"recoveries": 0, "completed": 0, "failed": 0, "lines": 2, "rejected_lines": 2,
                 "events": 0, "inputs": "<in>", "clusters": 0},
        phase_stats=pd.DataFrame(columns=["cluster", "phase", "recoveries", "min_ms", "p50_ms", "p90_ms",
                                          "p99_ms", "max_ms", "mean_ms"]),
        phase_histogram=pd.DataFrame(columns=["phase", "bin_lo_ms", "bin_hi_ms", "count"]),
        outcomes=pd.DataFrame(columns=["cluster", "outcome", "recoveries"]),
        failures=pd.DataFrame(columns=["cluster", "failure_reason", "failures", "p50_give_up_ms"]),
        daily=pd.DataFrame(columns=["date", "recoveries", "completed", "failed", "failure_rate",
                                    "p50_total_ms", "p90_total_ms"]),
        slowest=pd.DataFrame(columns=["cluster", "recovery_id", "replica_id", "t_detected", "catch_up_ms",
                                      "add_voter_ms", "remove_voter_ms", "total_ms"]),
        bad_input=pd.DataFrame(
            [{"level": "line", "reason": "malformed_json", "code": "malformed_json", "action": "rejected",
              "count": 2, "examples": ["a.jsonl: <script>alert(1)</script>"], "message": "not valid JSON"}]
        ),
    )
    for k, v in over.items():
        setattr(t, k, v)
    return t


def test_fmt_ms_units() -> None:
    assert [fmt_ms(x) for x in (0, 999, 1500, 61_000, 7_200_000)] == ["0 ms", "999 ms", "1.5 s", "1.0 min",
                                                                      "2.0 h"]
    assert fmt_ms(None) == fmt_ms(float("nan")) == "\u2013"


def test_page_for_input_without_recoveries_is_complete_and_escaped() -> None:
    page = render_html(empty_tables())
    assert page.startswith("<!DOCTYPE html>") and page.rstrip().endswith("</html>")
    assert "No completed recovery" in page and "No recovery in this event log." in page
    assert "<script>" not in page and "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    assert "&lt;in&gt;" in page
    assert 'data-plot="bad-input"' in page and "<svg" in page  # the one plot with data is drawn
    # Self-contained: no script, no style sheet or image fetched from anywhere.
    assert not re.search(r"<script|<link|<img|<iframe|(src|href)=\"?(https?:)?//", page)
