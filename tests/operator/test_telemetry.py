"""The operator's event sinks: each takes one RecoveryEvent (kraftkeeper_reports.events) and the
event-log sinks write the record the report job reads."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from kraftkeeper_operator.telemetry import (
    EventLogSink,
    FanOut,
    MemorySink,
    StdoutEventSink,
    logged_steps,
    step_notice,
)
from kraftkeeper_reports.events import RecoveryEvent, validate_event

EV = RecoveryEvent("add_voter_started", "r-1", 3, "old-uuid", "new-uuid", 2, 7, {"attempt": 1})


def test_event_log_sink_writes_a_valid_record_and_an_unknown_leader_as_null(tmp_path: Path) -> None:
    sink = EventLogSink(tmp_path / "events", "ns/q")
    sink.emit(EV)
    sink.emit(RecoveryEvent("recovery_failed", "r-1", 3, "old-uuid", None, -1, -1, {"reason": "timeout"}))
    (f,) = list((tmp_path / "events").rglob("*.jsonl"))
    first, second = (json.loads(x) for x in f.read_text().splitlines())
    assert validate_event(first) == [] and validate_event(second) == []
    assert first["cluster"] == "ns/q" and first["type"] == "add_voter_started"
    assert (first["leader_id"], first["leader_epoch"], first["detail"]) == (2, 7, {"attempt": 1})
    assert (second["leader_id"], second["leader_epoch"]) == (None, None)


def test_stdout_sink_writes_one_line_and_refuses_an_invalid_event(capsys: pytest.CaptureFixture[str]) -> None:
    sink = StdoutEventSink("ns/q")
    sink.emit(EV)
    (line,) = capsys.readouterr().out.splitlines()
    rec = json.loads(line)
    assert validate_event(rec) == [] and rec["recovery_id"] == "r-1" and rec["new_uuid"] == "new-uuid"
    with pytest.raises(ValueError, match="reason"):
        sink.emit(RecoveryEvent("recovery_failed", "r-1", 3))  # recovery_failed needs detail.reason
    assert capsys.readouterr().out == ""


def test_fan_out_keeps_going_when_one_sink_fails() -> None:
    class Broken:
        def emit(self, event: RecoveryEvent) -> None:
            raise OSError("disk full")

    mem = MemorySink()
    FanOut(Broken(), mem).emit(EV)
    assert mem.events == [EV] and mem.types() == ["add_voter_started"]


def test_a_step_notice_names_the_replica_and_both_uuids_and_warns_of_failures() -> None:
    warning, reason, message = step_notice(EV)
    assert (warning, reason) == (False, "AddVoterStarted")
    assert "replica 3" in message and "old-uuid -> new-uuid" in message and "r-1" in message
    failed = RecoveryEvent("recovery_failed", "r-1", 3, "old-uuid", "new", 2, 7, {"reason": "timeout"})
    warning, reason, message = step_notice(failed)
    assert (warning, reason) == (True, "RecoveryFailed") and message.endswith(": timeout")
    unclean = RecoveryEvent("unclean_recovery", "u-1", 2, None, None, -1, -1, {"reason": "x", "warning": "w"})
    warning, reason, message = step_notice(unclean)
    assert (warning, reason) == (True, "UncleanRecovery") and message.startswith("UNCLEAN RECOVERY")


def test_logged_steps_reads_the_day_partitions_since_detection_through_wrappers(tmp_path: Path) -> None:
    """What a restarted controller reads to log no step twice (controller.py ONCE_PER_RECOVERY):
    the (recovery id, type) pairs of the given recoveries, from the day of the detection on, also
    through a FanOut and a decorating sink; other recoveries and older days are not read."""
    sink = EventLogSink(tmp_path / "events", "ns/q")
    now = datetime.now(UTC)
    two_days_ago = now - timedelta(days=2)
    sink.writer.emit(EV, two_days_ago)  # detected two days ago, still active
    sink.emit(RecoveryEvent("add_voter_committed", "r-1", 3, "old-uuid", "new-uuid", 2, 7))
    sink.emit(RecoveryEvent("add_voter_committed", "r-2", 1, "a", "b", 2, 7))
    with sink.writer.path_for(now.isoformat()).open("a") as f:
        f.write('not json\n{"broken": 1}\n')
    since = int(two_days_ago.timestamp() * 1000)
    want = {("r-1", "add_voter_started"), ("r-1", "add_voter_committed")}
    assert sink.logged({"r-1"}, since) == want
    # Reading from yesterday on misses the older day's line (by design: detection bounds it).
    assert sink.logged({"r-1"}, int((now - timedelta(days=1)).timestamp() * 1000)) == {
        ("r-1", "add_voter_committed")
    }

    class Tagged:
        def __init__(self, inner: Any) -> None:
            self.sink = inner

        def emit(self, event: RecoveryEvent) -> None:
            self.sink.emit(event)

    assert logged_steps(FanOut(MemorySink(), Tagged(sink)), {"r-1"}, since) == want
    assert logged_steps(MemorySink(), {"r-1"}, since) == set()
