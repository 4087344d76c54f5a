"""The event log module: validator, JSON Schema agreement, writer durability (no Spark)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from kraftkeeper_reports import eventcheck
from kraftkeeper_reports import events as ev

from quorum.timefmt import rfc3339

SCHEMA = Path(__file__).resolve().parents[2] / "schemas" / "recovery-event.schema.json"


def good(**over: Any) -> dict[str, Any]:
    e = ev.RecoveryEvent(ev.ADD_VOTER_COMMITTED, "r-1", 3, "old-uuid", "new-uuid", 1, 7,
                         {"voters": 4}).to_record("ns/kraft", ts="2026-11-22T00:44:53.123Z")
    e.update(over)
    return e


def codes(obj: object) -> list[str]:
    return [p.code for p in ev.check_event(obj)]


def test_valid_event_has_no_problems() -> None:
    assert ev.validate_event(good()) == []
    assert ev.validate_event(good(leader_id=None, leader_epoch=None, old_uuid=None, new_uuid=None)) == []
    failed = good(type=ev.RECOVERY_FAILED, detail={"reason": "timeout"})
    assert ev.validate_event(failed) == []


@pytest.mark.parametrize(
    ("obj", "code"),
    [
        ([1, 2], "not_an_object"),
        ({k: v for k, v in good().items() if k != "ts"}, "missing_field:ts"),
        ({k: v for k, v in good().items() if k != "detail"}, "missing_field:detail"),
        (good(replica_id="3"), "wrong_type:replica_id"),
        (good(replica_id=True), "wrong_type:replica_id"),
        (good(leader_epoch=1.5), "wrong_type:leader_epoch"),
        (good(cluster=12), "wrong_type:cluster"),
        (good(detail="n/a"), "wrong_type:detail"),
        (good(old_uuid=5), "wrong_type:old_uuid"),
        (good(ts=1795308293123), "wrong_type:ts"),
        (good(schema_version="1"), "wrong_type:schema_version"),
        (good(schema_version=2), "unsupported_schema_version"),
        (good(ts="2026-11-22T00:44:53.123"), "bad_timestamp"),
        (good(ts="2026-11-22T00:44:53Z"), "bad_timestamp"),
        (good(ts="2026-13-22T00:44:53.123Z"), "bad_timestamp"),
        (good(ts="2026-02-30T00:44:53.123Z"), "bad_timestamp"),
        (good(ts="2026-11-22T00:44:53.123+02:00"), "bad_timestamp"),
        (good(replica_id=-1), "invalid_value:replica_id"),
        (good(recovery_id="  "), "invalid_value:recovery_id"),
        (good(leader_id=-2), "invalid_value:leader_id"),
        (good(type=ev.RECOVERY_FAILED, detail={}), "invalid_value:detail.reason"),
    ],
)
def test_each_problem_is_named(obj: object, code: str) -> None:
    got = ev.check_event(obj)
    assert got and got[0].code == code and got[0].fatal
    assert ev.validate_event(obj)  # and the public validator reports it


def test_tolerated_deviations_are_noted_not_fatal() -> None:
    assert codes(good(host="n1")) == ["extra_fields"]
    assert ev.validate_event(good(host="n1")) == []
    assert codes(good(type="leader_changed")) == ["unknown_type"]
    assert ev.validate_event(good(type="leader_changed")) == []


def test_classify_line_outcomes() -> None:
    assert ev.classify_line("").problem == ev.Problem(ev.BLANK_LINE, "blank line (skipped)")
    assert ev.classify_line('{"schema_version":1,"ts"').problem.code == "malformed_json"  # type: ignore[union-attr]
    c = ev.classify_line(json.dumps(good(host="x")))
    assert c.event is not None and c.problem is None and [n.code for n in c.notes] == ["extra_fields"]
    assert c.ts_ms == 1795308293123
    u = ev.classify_line(json.dumps(good(type="leader_changed")))
    assert u.event is None and u.problem is not None and u.problem.code == "unknown_type"


def test_strict_json_rules_shared_with_spark() -> None:
    # What Spark's parser refuses is malformed here too (kraftkeeper_reports.parse).
    for text in ('{"a":1,"a":2}', '{"d":{"x":1,"x":2}}', '{"a":NaN}', '{"a":Infinity}', '{"a":"\\ud800"}',
                 '{"a":1} x', '{"a":1},{"b":2}'):
        c = ev.classify_line(text)
        assert c.problem is not None and c.problem.code == "malformed_json", text
    assert ev.classify_line('{"a":"\\ud83d\\ude00"}').problem.code == "missing_field:schema_version"  # type: ignore[union-attr]
    assert ev.classify_line("\u3000\t").problem == ev.Problem(ev.BLANK_LINE, "blank line (skipped)")
    assert [p.code for p in ev.check_event(good(replica_id=2**63))] == ["wrong_type:replica_id"]


def test_timestamps_round_trip() -> None:
    assert rfc3339(1795308293123, millis=True) == "2026-11-22T00:44:53.123Z"
    assert ev.parse_ts_ms("2026-11-22T00:44:53.123Z") == 1795308293123
    assert ev.parse_ts_ms("2026-11-22T00:44:53.123456+00:00") == 1795308293123


def test_json_schema_agrees_with_validator() -> None:
    jsonschema = pytest.importorskip("jsonschema", reason="needs the jsonschema package")
    schema = json.loads(SCHEMA.read_text())
    jsonschema.Draft202012Validator.check_schema(schema)
    v = jsonschema.Draft202012Validator(schema)
    samples: list[object] = [
        good(), good(host="n1"), good(type="leader_changed"), good(leader_id=None, leader_epoch=None),
        good(type=ev.RECOVERY_FAILED, detail={"reason": "quorum_lost"}),
        [1], good(replica_id="3"), good(schema_version=2), good(ts="2026-11-22T00:44:53Z"),
        good(ts="2026-11-22T00:44:53.1+02:00"), good(replica_id=-1), good(cluster=""), good(detail=[]),
        good(type=ev.RECOVERY_FAILED, detail={}), {k: v for k, v in good().items() if k != "new_uuid"},
        good(leader_epoch=True), good(replica_id=2**63), good(replica_id=2**63 - 1),
    ]
    for s in samples:
        assert v.is_valid(s) == (ev.validate_event(s) == []), s


def test_writer_appends_fsynced_lines_by_day(tmp_path: Path) -> None:
    w = ev.EventLogWriter(tmp_path / "events", "ns/kraft")
    w.emit(ev.RecoveryEvent(ev.DISK_REPLACEMENT_DETECTED, "r-1", 2, "old", "new", 1, 5),
           ts="2026-11-21T23:59:59.999Z")
    w.emit(ev.RecoveryEvent(ev.REPLICA_CAUGHT_UP, "r-1", 2, "old", "new", 1, 5, {"lag": 0}), ts=1795305600000)
    day1 = tmp_path / "events" / "date=2026-11-21" / "events-ns_kraft.jsonl"
    day2 = tmp_path / "events" / "date=2026-11-22" / "events-ns_kraft.jsonl"
    lines = day1.read_text().splitlines() + day2.read_text().splitlines()
    assert [json.loads(x)["type"] for x in lines] == [ev.DISK_REPLACEMENT_DETECTED, ev.REPLICA_CAUGHT_UP]
    for x in lines:
        c = ev.classify_line(x)
        assert c.problem is None and c.event is not None and c.event["cluster"] == "ns/kraft"


def test_writer_to_a_file_and_now_timestamp(tmp_path: Path) -> None:
    f = tmp_path / "sub" / "log.jsonl"
    w = ev.EventLogWriter(f, "local")
    e = w.emit(ev.RecoveryEvent(ev.RECOVERY_FAILED, "r-9", 1, "o", detail={"reason": "quorum_lost"}))
    assert ev.parse_ts_ms(e["ts"]) is not None
    assert json.loads(f.read_text()) == e


def test_writer_rejects_invalid_event_and_keeps_what_was_written(tmp_path: Path) -> None:
    f = tmp_path / "log.jsonl"
    w = ev.EventLogWriter(f, "c")
    w.emit(ev.RecoveryEvent(ev.DISK_REPLACEMENT_DETECTED, "r-1", 1, "o", "n", 2, 3), ts=1000)
    before = f.read_bytes()
    with pytest.raises(ValueError, match=r"detail\.reason"):
        w.emit(ev.RecoveryEvent(ev.RECOVERY_FAILED, "r-1", 1, "o", "n", 2, 3, {}))
    with pytest.raises(ValueError, match="replica_id"):
        w.emit(ev.RecoveryEvent(ev.REPLICA_CAUGHT_UP, "r-1", -4, "o", "n", 2, 3))
    with pytest.raises(TypeError, match="RecoveryEvent"):
        w.emit(ev.REPLICA_CAUGHT_UP, "r-1")  # type: ignore[arg-type,call-arg]
    assert f.read_bytes() == before
    with pytest.raises(ValueError, match="cluster"):
        ev.EventLogWriter(tmp_path, " ")


def test_events_module_does_not_import_pyspark() -> None:
    code = "import sys, kraftkeeper_reports.events, kraftkeeper_reports; print('pyspark' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_fast_path_accepts_nothing_the_full_check_rejects() -> None:
    import random

    from kraftkeeper_reports.generate import _damage

    rng = random.Random(4)
    base = json.dumps(good())
    samples = [json.loads(base)]
    for kind in ev.REJECTED + ev.TOLERATED:
        for _ in range(30):
            for text in _damage(base, kind, rng):
                try:
                    samples.append(json.loads(text))
                except ValueError:
                    pass
    samples += [good(type=ev.RECOVERY_FAILED, detail={"reason": ""}), good(leader_id=False),
                good(cluster=" ")]
    for s in samples:
        fast = eventcheck._fast_valid_ts(s)
        full = ev.check_event(s)
        assert (fast is not None) == (full == []), s
        if fast is not None:
            assert fast == ev.parse_ts_ms(s["ts"])
