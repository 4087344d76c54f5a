"""What a reader of the report needs, at the demo's size (3 recoveries) and a fleet's (100k):
no tick label in scientific notation, every drawn section has data, sections that would have
nothing to compare are not drawn, and the summary sentence's numbers are the tables' numbers."""

from __future__ import annotations

import json
import re
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
from kraftkeeper_reports.intervals import PHASES, fmt_ms

pytestmark = pytest.mark.spark

# A tick label a person reads: a duration in one unit, a plain count, a date, or a name.
SCIENTIFIC = re.compile(r"\d[eE][+\-]?\d|\u00d7|\$|\^|\u207b|\u00b9|\u00b2|\u00b3")
DURATION = re.compile(r"^(0|\d{1,3}(,\d{3})*(\.\d+)? (ms|s|min|h))$")


class Page(HTMLParser):
    """The report's figures (with their data-* attributes), metrics and section ids."""

    def __init__(self, text: str) -> None:
        super().__init__()
        self.figures: list[dict[str, str]] = []
        self.sections: list[str] = []
        self.metrics: dict[str, str] = {}
        self._metric: str | None = None
        self.feed(text)

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = {k: v or "" for k, v in attrs}
        if tag == "figure":
            self.figures.append(a)
        elif tag == "section":
            self.sections.append(a["id"])
        elif tag == "b" and "data-metric" in a:
            self._metric = a["data-metric"]

    def handle_data(self, data: str) -> None:
        if self._metric is not None:
            self.metrics[self._metric] = data
            self._metric = None


def load(out: Path) -> tuple[str, Page, dict[str, Any], pd.DataFrame]:
    html = (out / "report.html").read_text(encoding="utf-8")
    summary = json.loads((out / "tables" / "summary.json").read_text())
    stats = pd.read_parquet(out / "tables" / "phase_stats.parquet")
    return html, Page(html), summary, stats


def all_row(stats: pd.DataFrame, phase: str) -> pd.Series:
    return stats[(stats["cluster"] == "(all)") & (stats["phase"] == phase)].iloc[0]


def check_common(out: Path) -> Page:
    html, page, summary, stats = load(out)
    assert page.figures, "no figure drawn"
    for f in page.figures:
        ticks = json.loads(f["data-ticks"])
        assert int(f["data-points"]) > 0, f["data-plot"]  # a drawn section has data
        assert ticks, f["data-plot"]
        bad = [t for t in ticks if SCIENTIFIC.search(t)]
        assert bad == [], (f["data-plot"], bad)
    # The sentence at the top says the tables' numbers.
    m = page.metrics
    assert m["recoveries"] == f"{summary['recoveries']:,}"
    assert m["completed"] == f"{summary['completed']:,}" and m["failed"] == f"{summary['failed']:,}"
    assert m["max_total_ms"] == fmt_ms(all_row(stats, "total")["max_ms"])
    assert m["max_exposure_ms"] == fmt_ms(all_row(stats, "exposure")["max_ms"])
    # The same number appears in the interval table under it.
    assert f">{m['max_total_ms']}<" in html
    return page


def test_demo_sized_report_shows_each_recovery(demo_report: Path) -> None:
    page = check_common(demo_report)
    html, _, summary, stats = load(demo_report)
    plots = [f["data-plot"] for f in page.figures]
    # Each recovery drawn (no one-bar histograms), no trend of one day, no comparison of one cluster.
    assert plots == ["each", "gantt"]
    assert {"phases", "slowest", "clusters", "daily"} <= set(page.sections) and "compare" not in page.sections
    each = next(f for f in page.figures if f["data-plot"] == "each")
    assert int(each["data-points"]) == 3 * len(PHASES)
    recs = pd.read_parquet(demo_report / "tables" / "slowest.parquet")
    for rid in recs["recovery_id"]:
        assert html.count(rid) >= 3  # labelled in the strip's legend, the timeline and the table
    # Linear duration axes in human units.
    ticks = json.loads(each["data-ticks"])
    assert ticks and all(DURATION.match(t) for t in ticks), ticks
    assert "3 recoveries" in re.sub(r"<[^>]+>", "", html) and summary["days"] == 1
    assert page.metrics["p50_total_ms"] == fmt_ms(all_row(stats, "total")["p50_ms"])


def test_fleet_report_compares_clusters_days_and_engines(fleet_report: Path) -> None:
    page = check_common(fleet_report)
    html, _, summary, stats = load(fleet_report)
    assert summary["recoveries"] >= 99_000 and summary["days"] == 10 and summary["clusters"] == 8
    plots = [f["data-plot"] for f in page.figures]
    assert plots == ["distributions", "compare", "gantt", "clusters", "daily", "bad-input"]
    assert page.metrics["p50_exposure_ms"] == fmt_ms(all_row(stats, "exposure")["p50_ms"])
    compare = pd.read_parquet(fleet_report / "tables" / "compare.parquet")
    groups = set(zip(compare["engine"], compare["order"], strict=True))
    assert groups == {("kafka", "RemoveThenAdd"), ("kafka", "auto-join"), ("kraftkeeper", "AddThenRemove")}
    for engine, order in groups:
        assert f"{engine} · {order}" in html
    dist = next(f for f in page.figures if f["data-plot"] == "distributions")
    durations = [t for t in json.loads(dist["data-ticks"]) if " " in t]
    assert durations and all(DURATION.match(t) for t in durations), durations
