"""The report's small tables as one value: what the Spark job (``job``) produces and the HTML
renderer (``render``) draws. Its own module so that neither of those imports the other."""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd


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
