"""Data loss first: a log with an unclean recovery, a failed one, one still running and a few
that completed, written by the operator's own writer; the report's first section is the unclean
recovery (which replica survived, the log it kept, when, when it served again), its summary
sentence opens with it, and the failed and running ones are listed by name. The page is opened
in Chromium and its screenshot kept (``unclean_failed_running.png`` in the artefacts)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
from kraftkeeper_reports import events as ev
from kraftkeeper_reports.events import EventLogWriter, RecoveryEvent

from tests.reports.test_browser import check_in_browser, screenshot
from tests.reports.util import artefacts_dir, run_job

pytestmark = [pytest.mark.spark, pytest.mark.browser]

T0 = 1_790_000_000_000  # 2026-09-21, a closed day
OLD, NEW = "9f1c7a52-0000-4000-8000-00000000000{}", "3b2e8d10-0000-4000-8000-00000000000{}"


def _disk_recovery(w: EventLogWriter, rid: str, replica: int, start: int, steps: int,
                   failed: str | None = None) -> None:
    """The first ``steps`` steps of a disk-failure recovery (all of them: completed), then
    ``recovery_failed`` with ``failed`` as its reason if given."""
    types = [*ev.STEP_TYPES, ev.RECOVERY_COMPLETED][:steps]
    old, new = OLD.format(replica), NEW.format(replica)
    for i, t in enumerate(types):
        w.emit(RecoveryEvent(t, rid, replica, old, new, 1, 7), start + 900 * i)
    if failed is not None:
        w.emit(RecoveryEvent(ev.RECOVERY_FAILED, rid, replica, old, new, 1, 7, {"reason": failed}),
               start + 900 * steps + 60_000)


def write_log(root: Path) -> Path:
    w = EventLogWriter(root, "prod/orders")
    for k in range(3):
        _disk_recovery(w, f"done-{k}", k + 1, T0 + k * 3_600_000, 7)
    _disk_recovery(w, "failed-1", 2, T0 + 4 * 3_600_000, 2, failed="timeout: replica 2 fell behind")
    _disk_recovery(w, "running-1", 3, T0 + 5 * 3_600_000, 4)
    detail = {"reason": "no live majority for 130s", "log_end_offset": 48_213, "last_epoch": 12,
              "candidates": {"1": [12, 48_213], "3": [11, 47_990]}, "uuids": [NEW.format(1)],
              "warning": "records committed only on the lost replicas are lost"}
    w.emit(RecoveryEvent(ev.UNCLEAN_RECOVERY, "unclean-7f3a", 1, None, NEW.format(1), None, None, detail),
           T0 + 6 * 3_600_000)
    w.emit(RecoveryEvent(ev.UNCLEAN_RECOVERY_COMPLETED, "unclean-7f3a", 1, None, NEW.format(1), 1, 13,
                         {"voters": [1], "seconds": 41.5}), T0 + 6 * 3_600_000 + 41_500)
    return root


@pytest.fixture(scope="module")
def attention_report(spark: Any, tmp_path_factory: pytest.TempPathFactory) -> Path:
    src = write_log(tmp_path_factory.mktemp("attention-events"))
    return run_job(src, tmp_path_factory.mktemp("attention-report"))


def test_unclean_recovery_is_a_table_of_its_own(attention_report: Path) -> None:
    tables = attention_report / "tables"
    summary = json.loads((tables / "summary.json").read_text())
    counts = [summary[k] for k in ("unclean", "completed", "failed", "in_progress")]
    assert counts == [1, 3, 1, 1]
    assert summary["invalid"] == 0 and summary["rejected_lines"] == summary["skipped_lines"] == 0
    u = pd.read_csv(tables / "unclean.csv")
    assert len(u) == 1
    row = u.iloc[0]
    assert (row["cluster"], row["survivor"]) == ("prod/orders", 1)
    assert (row["log_end_offset"], row["last_epoch"]) == (48213, 12)
    assert row["t_unclean"] == T0 + 6 * 3_600_000 and row["t_serving_again"] == T0 + 6 * 3_600_000 + 41_500
    assert row["other_replicas"] == "3 (epoch 11, end offset 47,990)"
    f = pd.read_csv(tables / "failed_recoveries.csv")
    assert f["recovery_id"].tolist() == ["failed-1"] and f["last_step"].tolist() == [ev.REPLICA_CAUGHT_UP]
    p = pd.read_csv(tables / "in_progress.csv")
    assert p["recovery_id"].tolist() == ["running-1"] and p["last_step"].tolist() == [ev.ADD_VOTER_COMMITTED]


def test_page_shows_data_loss_first(attention_report: Path) -> None:
    page = (attention_report / "report.html").read_text()
    sections = [page.index(f'<section id="{s}"') for s in ("data-loss", "attention", "phases")]
    assert sections == sorted(sections)
    summary = page[page.index('id="summary"'):page.index("</p>", page.index('id="summary"'))]
    assert summary.index("Data loss") < summary.index("recoveries of a replaced disk"), summary
    assert "replica 1 surviving with its log up to offset 48,213" in summary
    assert "1</b> still in progress" in summary


async def test_unclean_failed_running_in_chromium(
    attention_report: Path, tmp_path: Path, tmp_path_factory: pytest.TempPathFactory,
) -> None:
    pytest.importorskip("aiohttp")
    page, png, events = await screenshot((attention_report / "report.html").resolve(), tmp_path / "profile")
    keep = artefacts_dir(tmp_path_factory) / "unclean_failed_running.png"
    keep.write_bytes(png)
    print(f"screenshot: {keep}")
    check_in_browser(page, png, events, ["each", "gantt"])
    assert page["summary"].startswith("Data loss: 1 unclean recovery"), page["summary"]
    assert "unclean recoveries (data lost)" in page["headline"]
