"""The report follows the voter-change order each recovery recorded (``intervals``): a
RemoveThenAdd log (Kafka: ``operator watch``) and a mixed log (ours AddThenRemove, Kafka's
watcher, Kafka's auto-join recorded from outside) through the real Spark job, checking the
per-recovery intervals, the "(all)" rows, the interval titles a reader sees and the summary
sentence's numbers. The pure parts (titles, ``recorded_order``, ``durations``) without Spark."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
from kraftkeeper_reports import events as ev
from kraftkeeper_reports.events import EventLogWriter, RecoveryEvent
from kraftkeeper_reports.intervals import (
    ADD_THEN_REMOVE,
    BY_NAME,
    REMOVE_THEN_ADD,
    durations,
    fmt_ms,
    recorded_order,
)

from tests.reports.test_reader import Page
from tests.reports.util import run_job

T0 = 1_795_000_000_000  # 2026-11-18, ms
OLD = "00000000-0000-4000-8000-00000000000{}"
NEW = "00000000-0000-4000-8000-0000000000a{}"
KAFKA_RTA = {"engine": "kafka", "order": REMOVE_THEN_ADD}
OURS = {"engine": "kraftkeeper", "order": ADD_THEN_REMOVE}
AUTO = {"engine": "kafka", "order": "auto-join",
        "recorded_by": "kraftkeeper demo: DescribeQuorum every 50 ms"}

# (recovery id, detection detail, [(type, ms after detection)]): known intervals by hand.
RTA_STEPS = [ev.DISK_REPLACEMENT_DETECTED, ev.REPLICA_CAUGHT_UP, ev.REMOVE_VOTER_STARTED,
             ev.REMOVE_VOTER_COMMITTED, ev.ADD_VOTER_STARTED, ev.ADD_VOTER_COMMITTED,
             ev.RECOVERY_COMPLETED]
ATR_STEPS = [ev.DISK_REPLACEMENT_DETECTED, ev.REPLICA_CAUGHT_UP, ev.ADD_VOTER_STARTED,
             ev.ADD_VOTER_COMMITTED, ev.REMOVE_VOTER_STARTED, ev.REMOVE_VOTER_COMMITTED,
             ev.RECOVERY_COMPLETED]
AUTO_STEPS = [ev.DISK_REPLACEMENT_DETECTED, ev.REPLICA_CAUGHT_UP, ev.REMOVE_VOTER_COMMITTED,
              ev.ADD_VOTER_COMMITTED, ev.RECOVERY_COMPLETED]
RTA = [
    ("w1", KAFKA_RTA, RTA_STEPS, [0, 1000, 1010, 1030, 1040, 1100, 1105]),
    ("w2", KAFKA_RTA, RTA_STEPS, [0, 2000, 2005, 2050, 2060, 2300, 2310]),
    ("w3", {}, RTA_STEPS, [0, 500, 520, 540, 550, 600, 601]),  # no detail: the order is read from the steps
]
# What each RemoveThenAdd recovery measures: remove_voter from caught up, add_voter and the missing
# voter from RemoveVoter committed, one failure less tolerated until AddVoter committed.
RTA_EXPECTED = {
    "w1": {"catch_up": 1000, "remove_voter": 30, "add_voter": 70, "under_replicated": 70, "exposure": 1030,
           "degraded": 1100, "total": 1105},
    "w2": {"catch_up": 2000, "remove_voter": 50, "add_voter": 250, "under_replicated": 250, "exposure": 2050,
           "degraded": 2300, "total": 2310},
    "w3": {"catch_up": 500, "remove_voter": 40, "add_voter": 60, "under_replicated": 60, "exposure": 540,
           "degraded": 600, "total": 601},
}
MIXED_MORE = [
    ("o1", OURS, ATR_STEPS, [0, 3000, 3010, 3020, 3025, 3040, 3041]),
    ("o2", OURS, ATR_STEPS, [0, 4000, 4100, 4120, 4130, 4150, 4152]),
    ("a1", AUTO, AUTO_STEPS, [0, 6000, 7000, 7400, 7450]),
]
MIXED_EXPECTED = {
    **RTA_EXPECTED,
    "o1": {"catch_up": 3000, "add_voter": 20, "remove_voter": 20, "under_replicated": 3020, "exposure": 3040,
           "degraded": 3040, "total": 3041},
    "o2": {"catch_up": 4000, "add_voter": 120, "remove_voter": 30, "under_replicated": 4120, "exposure": 4150,
           "degraded": 4150, "total": 4152},
    "a1": {"catch_up": 6000, "remove_voter": 1000, "add_voter": 400, "under_replicated": 400,
           "exposure": 7000, "degraded": 7400, "total": 7450},
}


def write_events(root: Path, recs: list[tuple[str, dict[str, Any], list[str], list[int]]]) -> Path:
    for n, (rid, detail, steps, offsets) in enumerate(recs):
        w = EventLogWriter(root / rid, "kafka-a")
        for typ, off in zip(steps, offsets, strict=True):
            d = detail if typ == ev.DISK_REPLACEMENT_DETECTED else {}
            e = RecoveryEvent(typ, rid, 2, OLD.format(n), NEW.format(n), 1, 7, dict(d))
            w.emit(e, T0 + n * 60_000 + off)
    return root


def _check(out: Path, expected: dict[str, dict[str, int]]) -> tuple[str, Page, pd.DataFrame]:
    recs = pd.read_parquet(out / "tables" / "recoveries.parquet").set_index("recovery_id")
    assert set(recs.index) == set(expected) and (recs["outcome"] == "completed").all()
    for rid, want in expected.items():
        got = {p: int(recs.loc[rid][f"{p}_ms"]) for p in want}
        assert got == want, rid
    stats = pd.read_parquet(out / "tables" / "phase_stats.parquet")
    allr = stats[stats["cluster"] == "(all)"].set_index("phase")
    for p in BY_NAME:
        vals = sorted(e[p] for e in expected.values())
        assert allr.loc[p]["max_ms"] == vals[-1], p
        assert allr.loc[p]["min_ms"] == vals[0], p
    html = (out / "report.html").read_text(encoding="utf-8")
    page = Page(html)
    m = page.metrics
    # The summary sentence's numbers are the "(all)" rows of the tables.
    assert m["completed"] == str(len(expected))
    assert m["max_exposure_ms"] == fmt_ms(allr.loc["exposure"]["max_ms"])
    assert m["p50_exposure_ms"] == fmt_ms(allr.loc["exposure"]["p50_ms"])
    assert m["max_degraded_ms"] == fmt_ms(max(e["degraded"] for e in expected.values()))
    assert m["p50_degraded_ms"] == fmt_ms(allr.loc["degraded"]["p50_ms"])
    return html, page, recs


@pytest.mark.spark
def test_remove_then_add_report_follows_that_order(spark: Any, tmp_path: Path) -> None:
    out = run_job(write_events(tmp_path / "events", RTA), tmp_path / "report")
    html, page, recs = _check(out, RTA_EXPECTED)
    # The order nobody logged is read from the steps.
    assert recs.loc["w3"]["order"] == REMOVE_THEN_ADD
    text = re.sub(r"<[^>]+>", "", html)
    # Titles are RemoveThenAdd's, none of AddThenRemove's.
    for name in ("add_voter", "remove_voter", "under_replicated", "degraded"):
        assert BY_NAME[name].span(REMOVE_THEN_ADD).title in text, name
        assert BY_NAME[name].span(ADD_THEN_REMOVE).title not in text, name
    assert "caught up → AddVoter committed" not in text
    summary = page.metrics
    assert summary["max_degraded_ms"] == "2.3 s" and summary["max_exposure_ms"] == fmt_ms(2050)
    assert "voter set one short until AddVoter commits" in text
    assert "one failure less tolerated meanwhile" not in text  # that is AddThenRemove's wording


@pytest.mark.spark
def test_mixed_orders_report_names_both_and_labels_auto_join(spark: Any, tmp_path: Path) -> None:
    out = run_job(write_events(tmp_path / "events", RTA + MIXED_MORE), tmp_path / "report")
    html, page, recs = _check(out, MIXED_EXPECTED)
    assert recs.loc["a1"]["order"] == "auto-join" and recs.loc["o1"]["order"] == ADD_THEN_REMOVE
    text = re.sub(r"<[^>]+>", "", html)
    # An interval whose span differs by order names both spans; one that does not keeps its title.
    assert BY_NAME["add_voter"].title_for({ADD_THEN_REMOVE, REMOVE_THEN_ADD}) in text
    assert ("AddThenRemove: caught up → AddVoter committed; RemoveThenAdd: RemoveVoter committed → "
            "AddVoter committed") in text
    assert BY_NAME["exposure"].title in text and BY_NAME["catch_up"].title in text
    # Engines and orders side by side, auto-join said to be Kafka's own and recorded from outside.
    compare = pd.read_parquet(out / "tables" / "compare.parquet")
    groups = set(zip(compare["engine"], compare["order"], strict=True))
    assert groups == {("kafka", REMOVE_THEN_ADD), ("kafka", "auto-join"), ("kraftkeeper", ADD_THEN_REMOVE),
                      ("(not logged)", REMOVE_THEN_ADD)}  # w3: no detail, its order read from its steps
    assert "compare" in page.sections
    assert "kafka · auto-join (Kafka's own, recorded from outside)" in text
    deg = compare[(compare["phase"] == "degraded")].set_index("order")
    assert deg.loc["auto-join"]["max_ms"] == 7400 and deg.loc[ADD_THEN_REMOVE]["max_ms"] == 4150
    # Each timeline row names its order; auto-join's as recorded from outside.
    assert "Kafka auto-join (recorded from outside)" in text
    assert page.metrics["max_degraded_ms"] == "7.4 s"
    assert "RemoveVoter in AddThenRemove, AddVoter in RemoveThenAdd" in text
    assert "Replacement not yet a voter / Voter missing (AddThenRemove: detection" in text


def test_recorded_order_and_durations_without_spark() -> None:
    def first(steps: list[str], offs: list[int]) -> dict[str, int]:
        return {s: T0 + o for s, o in zip(steps, offs, strict=True)}

    for rid, _, steps, offs in RTA + MIXED_MORE:
        f = first(steps, offs)
        assert durations(f) == MIXED_EXPECTED[rid], rid
    assert recorded_order(first(AUTO_STEPS, [0, 1, 2, 3, 4])) == REMOVE_THEN_ADD
    assert recorded_order(first(ATR_STEPS, [0, 1, 2, 3, 4, 5, 6])) == ADD_THEN_REMOVE
    # Only the started events so far (a recovery in progress): they decide.
    assert recorded_order({ev.REMOVE_VOTER_STARTED: 5, ev.ADD_VOTER_STARTED: 9}) == REMOVE_THEN_ADD
    assert recorded_order({}) == ADD_THEN_REMOVE
    # An end before its start is no interval (None), never a negative duration.
    assert durations({ev.DISK_REPLACEMENT_DETECTED: 10, ev.REPLICA_CAUGHT_UP: 5})["catch_up"] is None


def test_titles_follow_the_orders_present() -> None:
    one = BY_NAME["remove_voter"]
    assert one.title_for({REMOVE_THEN_ADD}) == "RemoveVoter: caught up → RemoveVoter committed"
    assert one.title_for({ADD_THEN_REMOVE}) == "RemoveVoter: AddVoter committed → RemoveVoter committed"
    assert one.title_for(set()) == one.title  # nothing known: KIP-856's
    both = one.title_for({ADD_THEN_REMOVE, REMOVE_THEN_ADD})
    assert both.startswith("RemoveVoter (AddThenRemove: ") and "RemoveThenAdd: caught up" in both
    assert BY_NAME["total"].title_for({ADD_THEN_REMOVE, REMOVE_THEN_ADD}) == BY_NAME["total"].title
    meaning = BY_NAME["degraded"].meaning_for({ADD_THEN_REMOVE, REMOVE_THEN_ADD})
    assert json.dumps(meaning).count("commits") == 2
