"""The Spark transformations on small hand-written logs: every bad-input reason is counted,
durations are exact, nothing is dropped silently."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from kraftkeeper_reports import events as ev

pytestmark = pytest.mark.spark

T0 = 1_795_305_600_000  # 2026-11-22T00:00:00Z
STEPS = [  # offsets (ms) of a clean recovery
    (ev.DISK_REPLACEMENT_DETECTED, 0),
    (ev.REPLICA_CAUGHT_UP, 10_000),
    (ev.ADD_VOTER_STARTED, 10_100),
    (ev.ADD_VOTER_COMMITTED, 10_110),
    (ev.REMOVE_VOTER_STARTED, 10_150),
    (ev.REMOVE_VOTER_COMMITTED, 10_160),
    (ev.RECOVERY_COMPLETED, 10_170),
]


def line(typ: str, rid: str, at: int, cluster: str = "ns/a", replica: int = 2, **over: Any) -> str:
    detail = {"reason": "quorum_lost"} if typ == ev.RECOVERY_FAILED else {}
    e = ev.RecoveryEvent(typ, rid, replica, "old", "new", 1, 4, detail).to_record(cluster, ts=T0 + at)
    e.update(over)
    return json.dumps(e)


def recovery(rid: str, start: int, steps: list[tuple[str, int]] | None = None, **kw: Any) -> list[str]:
    return [line(t, rid, start + off, **kw) for t, off in (steps or STEPS)]


def write_logs(root: Path) -> dict[str, int]:
    """The log, spread over a date= tree and a loose file; returns the expected count per code."""
    part = root / "date=2026-11-22"
    part.mkdir(parents=True)
    a: list[str] = []
    a += recovery("r-ok", 0)
    a[1] = line(ev.REPLICA_CAUGHT_UP, "r-ok", 10_000, host="n1")  # extra field: kept
    a += recovery("r-ok2", 50_000, cluster="ns/b")
    a += recovery("r-fail", 100_000, [*STEPS[:3], (ev.RECOVERY_FAILED, 25000)])
    order = [(t, o) for t, o in STEPS]
    order[3] = (ev.ADD_VOTER_COMMITTED, 10_050)  # committed before started (10_100)
    a += recovery("r-order", 200_000, order)
    a += [*recovery("r-after", 300000), line(ev.REPLICA_CAUGHT_UP, "r-after", 300000 + 20000)]
    a += recovery("r-nodet", 400_000, STEPS[1:])
    a += recovery("r-dup", 500_000, [*STEPS[:3], (ev.ADD_VOTER_STARTED, 10105), *STEPS[3:]])
    a += recovery("r-conflict", 600_000, [*STEPS, (ev.RECOVERY_FAILED, 10180)])
    a += recovery("r-incomplete", 700_000, [*STEPS[:2], (ev.RECOVERY_COMPLETED, 10500)])
    mixed = recovery("r-replica", 800_000)
    mixed[4] = line(ev.REMOVE_VOTER_STARTED, "r-replica", 800_000 + 10_150, replica=3)
    a += mixed
    a += recovery("r-open", 900_000, STEPS[:2])
    a += recovery("r-negative", 1_000_000, [(ev.DISK_REPLACEMENT_DETECTED, 5_000), (ev.RECOVERY_FAILED, 0)])
    (part / "part-0.jsonl").write_text("\n".join(a) + "\n")

    bad = [
        "",
        '{"schema_version":1,"ts":"2026-11-22T00:0',
        "[1, 2]",
        json.dumps({k: v for k, v in json.loads(line(ev.REPLICA_CAUGHT_UP, "x", 0)).items() if k != "ts"}),
        line(ev.REPLICA_CAUGHT_UP, "x", 0, replica_id="3"),
        line(ev.REPLICA_CAUGHT_UP, "x", 0, leader_epoch="7"),
        line(ev.REPLICA_CAUGHT_UP, "x", 0, replica_id=-1),
        line(ev.RECOVERY_FAILED, "x", 0, detail={}),
        line(ev.REPLICA_CAUGHT_UP, "x", 0, ts="2026-11-22T00:00:00.000"),
        line(ev.REPLICA_CAUGHT_UP, "x", 0, ts="2026-13-22T00:00:00.000Z"),
        line(ev.REPLICA_CAUGHT_UP, "x", 0, ts="2026-11-22T02:00:00.000+02:00"),
        line(ev.REPLICA_CAUGHT_UP, "x", 0, schema_version=2),
        line("leader_changed", "r-ok", 5),
        "\ufeffnot json at all",
    ]
    (root / "loose.jsonl").write_text("\r\n".join(bad) + "\r\n")  # CRLF on purpose
    return {
        "blank_line": 1, "malformed_json": 2, "not_an_object": 1, "missing_field:ts": 1,
        "wrong_type:replica_id": 1, "wrong_type:leader_epoch": 1, "invalid_value:replica_id": 1,
        "invalid_value:detail.reason": 1, "bad_timestamp": 3, "unsupported_schema_version": 1,
        "unknown_type": 1, "extra_fields": 1,
        "impossible_order": 2, "missing_detection": 1,
        # r-after, r-negative (detected after it failed), r-conflict (failed after completed)
        "event_after_end": 3,
        "duplicate_event": 2,  # r-dup, r-after (its late replica_caught_up is a second one)
        "conflicting_outcome": 1, "incomplete_steps": 1, "inconsistent_replica": 1,
    }


@pytest.fixture(scope="module")
def handmade(spark: Any, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    from kraftkeeper_reports.job import compute

    root = tmp_path_factory.mktemp("handmade")
    expected = write_logs(root)
    # Read through a URL, as for any Hadoop-compatible file system.
    tables = compute(spark, [root.as_uri()], top=5, collect_recoveries=True)
    assert tables.recoveries is not None
    recs = tables.recoveries.set_index("recovery_id")
    n_lines = sum(len(f.read_text().splitlines()) for f in root.rglob("*.jsonl"))
    return {"tables": tables, "recs": recs, "expected": expected, "n_lines": n_lines}


def test_every_bad_input_reason_is_counted(handmade: dict[str, Any]) -> None:
    bad = handmade["tables"].bad_input
    got = dict(zip(bad["code"], bad["count"], strict=True))
    assert got == handmade["expected"]
    # Each reason comes with an example that shows the offending input.
    for r in bad.itertuples():
        assert len(r.examples) >= 1 and all(isinstance(x, str) and x for x in r.examples)
    ex = dict(zip(bad["code"], bad["examples"], strict=True))
    assert any("schema_version\": 2" in x for x in ex["unsupported_schema_version"])
    assert any("r-order" in x and "add_voter_committed" in x and "before add_voter_started" in x
               for x in ex["impossible_order"])
    assert any("loose.jsonl" in x for x in ex["malformed_json"])


def test_no_line_is_lost(handmade: dict[str, Any]) -> None:
    t = handmade["tables"]
    s = t.summary
    line_bad = t.bad_input[(t.bad_input["level"] == "line") & (t.bad_input["action"] != "ignored")]
    assert s["lines"] == handmade["n_lines"]
    assert s["events"] + int(line_bad["count"].sum()) == s["lines"]
    assert s["rejected_lines"] == 12 and s["skipped_lines"] == 2


def test_outcomes_and_exact_durations(handmade: dict[str, Any]) -> None:
    recs = handmade["recs"]
    outcome = recs["outcome"].to_dict()
    # Every line of recovery "x" is rejected, so "x" is not a recovery at all.
    assert outcome == {
        "r-ok": "completed", "r-ok2": "completed", "r-fail": "failed", "r-order": "invalid",
        "r-after": "completed", "r-nodet": "invalid", "r-dup": "completed", "r-conflict": "invalid",
        "r-incomplete": "invalid", "r-replica": "invalid", "r-open": "in_progress", "r-negative": "invalid",
    }
    ok = recs.loc["r-ok"]
    assert (ok["catch_up_ms"], ok["add_voter_ms"], ok["remove_voter_ms"]) == (10_000, 110, 50)
    assert (ok["under_replicated_ms"], ok["exposure_ms"], ok["total_ms"]) == (10_110, 10_160, 10_170)
    assert str(ok["date"]) == "2026-11-22"
    fail = recs.loc["r-fail"]
    assert fail["failure_reason"] == "quorum_lost" and fail["give_up_ms"] == 25_000
    assert fail["total_ms"] is None or fail["total_ms"] != fail["total_ms"]  # null: not completed
    # A duplicate step uses the first occurrence; events after the end are ignored.
    assert recs.loc["r-dup"]["add_voter_ms"] == 110
    assert recs.loc["r-after"]["total_ms"] == 10_170 and recs.loc["r-after"]["n_after_end"] == 1


def test_aggregates_over_completed(handmade: dict[str, Any]) -> None:
    t = handmade["tables"]
    st = t.phase_stats
    total = st[(st["cluster"] == "(all)") & (st["phase"] == "total")].iloc[0]
    assert total["recoveries"] == 4  # r-ok, r-ok2, r-after, r-dup
    assert total["p50_ms"] == 10_170 and total["max_ms"] == 10_170
    per = st[(st["phase"] == "total") & (st["cluster"] != "(all)")]
    assert dict(zip(per["cluster"], per["recoveries"], strict=True)) == {"ns/a": 3, "ns/b": 1}
    f = t.failures[t.failures["cluster"] == "(all)"]
    assert dict(zip(f["failure_reason"], f["failures"], strict=True)) == {"quorum_lost": 1}
    assert t.daily["recoveries"].tolist() == [5] and t.daily["failed"].tolist() == [1]
    assert len(t.slowest) == 4 and t.summary["completed"] == 4 and t.summary["in_progress"] == 1


EDGE_LINES = [
    "", "   ", "\t\u00a0", '{"a":1},{"b":2}', '{"a":1} x', "[1, 2]", "null", "42", '"text"', "\ufeff{}",
    '{"a":NaN}', '{"a":{"x":1,"x":2}}', '{"a":"\\ud800"}', '{"a":"\\ud83d\\ude00"}',
]


def test_spark_rules_are_the_python_rules(spark: Any) -> None:
    """Every line, damaged every way the generator knows plus edge cases, gets the same reason
    and notes from the Spark parser (in the JVM) as from events.classify_line."""
    import random

    from kraftkeeper_reports.generate import _damage
    from kraftkeeper_reports.parse import parse_lines
    from pyspark.sql import functions as F

    rng = random.Random(11)
    base = [line(t, f"r-{i}", i * 1000 + off) for i in range(3) for t, off in STEPS]
    base.append(line(ev.RECOVERY_FAILED, "r-f", 5))
    samples = list(base) + EDGE_LINES
    for kind in ev.REJECTED + ev.TOLERATED:
        for _ in range(25):
            samples += _damage(rng.choice(base), kind, rng)
    big = json.loads(base[0])
    samples += [
        json.dumps(dict(big, replica_id=2**63)), json.dumps(dict(big, replica_id=2**63 - 1)),
        json.dumps(dict(big, leader_epoch=1.0)), json.dumps(dict(big, leader_id=True)),
        json.dumps(dict(big, cluster="\u3000")), json.dumps(dict(big, type=" ")),
        json.dumps(dict(big, type="leader_changed", replica_id="x", host=1)),
        json.dumps(dict(big, ts="0000-01-01T00:00:00.1Z")),
        json.dumps(dict(big, ts="2026-02-29T00:00:00.1Z")),
        json.dumps(dict(big, ts="2028-02-29T23:59:59.123456789+00:00")),
        json.dumps(dict(big, ts="2026-11-22T24:00:00.000Z")), json.dumps(dict(big, schema_version=2**70)),
        json.dumps(dict(big, type=ev.RECOVERY_FAILED, detail={"reason": ""})),
        json.dumps(dict(big, type=ev.RECOVERY_FAILED, detail={"reason": 3})),
        json.dumps(dict(big, detail=[], extra=1, other=2)),
    ]
    # The same objects in the writer's compact form, which takes the parser's fast path.
    for text in list(samples):
        try:
            obj = ev.loads_strict(text)
        except ValueError:
            continue
        samples.append(json.dumps(obj, separators=(",", ":"), ensure_ascii=False))
    samples += [
        '{"schema_version":1,"ts":"2026-11-22T00:00:00.000Z","cluster":"c","recovery_id":"r","type":'
        '"replica_caught_up","replica_id":1,"old_uuid":null,"new_uuid":"n","leader_id":1,"leader_epoch":2,'
        + d + "}"
        for d in ('"detail":{"a":1},"x":{}', '"detail":{"a":1,"a":2}', '"detail":{"a":NaN}',
                  '"detail":{\'a\':1}', '"detail":{"a":"\\ud800"}', '"detail":{"a":1}} x {}',
                  '"detail":{"engine":"kafka","order":"RemoveThenAdd"}', '"detail":{}')
    ]
    rows = [(s, "file:/d/date=x/f.jsonl") for s in samples]
    df = spark.createDataFrame(rows, "value string, source string")
    df = df.withColumn("i", F.monotonically_increasing_id())
    got = parse_lines(df).orderBy("i").select("reason", "notes", "ts_ms", "replica_id", "failure_reason",
                                             "engine").collect()
    assert len(got) == len(samples)
    mismatches = []
    for s, row in zip(samples, got, strict=True):
        c = ev.classify_line(s)
        want = (c.problem.code if c.problem else None, [n.reason for n in c.notes if not n.fatal], c.ts_ms)
        if (row["reason"], list(row["notes"]), row["ts_ms"]) != want:
            mismatches.append((s, want, tuple(row)))
        if c.problem is None and c.event is not None:
            assert row["replica_id"] == c.event["replica_id"]
    assert mismatches == []
    assert "kafka" in [r["engine"] for r in got]
    # The writer's own lines take the fast path (no JSON parser), with the same fields.
    from kraftkeeper_reports.parse import _fast_fields

    writer = [json.dumps(json.loads(b), separators=(",", ":")) for b in base[:-1]]
    fast = _fast_fields(spark.createDataFrame([(w, "f") for w in writer], "value string, source string"), [])
    assert [r["ok"] for r in fast.select("ok").collect()] == [True] * len(writer)
    assert len({r["reason"] for r in got}) >= 15  # the samples exercise most reasons
