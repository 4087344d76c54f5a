"""The event generator: deterministic, realistic shape, damage counted exactly (no Spark)."""

from __future__ import annotations

import hashlib
from collections import Counter
from pathlib import Path

import pytest
from kraftkeeper_reports import events as ev
from kraftkeeper_reports.generate import generate, main


def digest(root: Path) -> str:
    h = hashlib.sha256()
    for f in sorted(root.rglob("*.jsonl")):
        h.update(str(f.relative_to(root)).encode())
        h.update(f.read_bytes())
    return h.hexdigest()


def test_same_seed_same_bytes_whatever_the_workers(tmp_path: Path) -> None:
    a = generate(tmp_path / "a", events=3000, clusters=3, days=3, seed=5, workers=1)
    b = generate(tmp_path / "b", events=3000, clusters=3, days=3, seed=5, workers=2)
    c = generate(tmp_path / "c", events=3000, clusters=3, days=3, seed=6)
    assert digest(tmp_path / "a") == digest(tmp_path / "b")
    assert a.as_dict() == b.as_dict()
    assert digest(tmp_path / "a") != digest(tmp_path / "c")
    assert sorted(p.name for p in (tmp_path / "a").iterdir()) == [
        "date=2026-10-01", "date=2026-10-02", "date=2026-10-03"
    ]
    assert c.lines > 0


def test_line_damage_is_what_a_reader_counts(tmp_path: Path) -> None:
    stats = generate(tmp_path, events=30_000, clusters=4, days=2, seed=3, malformed_rate=0.02)
    seen: Counter[str] = Counter()
    lines = 0
    for f in tmp_path.rglob("*.jsonl"):
        for line in f.read_text().split("\n")[:-1]:
            lines += 1
            c = ev.classify_line(line)
            if c.problem is not None:
                seen[c.problem.reason] += 1
            seen.update(n.reason for n in c.notes)
    assert lines == stats.lines
    # Every kind of damage was injected, and each shows up exactly as injected.
    assert set(stats.line_damage) == set(ev.REJECTED) | set(ev.TOLERATED)
    assert seen == stats.line_damage
    assert set(stats.recovery_anomalies) == {"impossible_order", "event_after_end", "missing_detection",
                                             "duplicate_event"}


def test_clean_log_is_all_valid_and_plausible(tmp_path: Path) -> None:
    stats = generate(tmp_path, events=5000, clusters=3, days=2, seed=9, malformed_rate=0.0, failure_scale=3)
    catch, commit = [], []
    by_rec: dict[str, dict[str, int]] = {}
    for f in tmp_path.rglob("*.jsonl"):
        for line in f.read_text().splitlines():
            c = ev.classify_line(line)
            assert c.problem is None and not c.notes and c.event is not None and c.ts_ms is not None
            by_rec.setdefault(c.event["recovery_id"], {})[c.event["type"]] = c.ts_ms
    for r in by_rec.values():
        if ev.RECOVERY_COMPLETED in r:
            catch.append(r[ev.REPLICA_CAUGHT_UP] - r[ev.DISK_REPLACEMENT_DETECTED])
            commit.append(r[ev.ADD_VOTER_COMMITTED] - r[ev.ADD_VOTER_STARTED])
    assert len(by_rec) == stats.recoveries
    assert stats.outcomes["failed"] > 0 and set(stats.failure_reasons) <= set(ev.FAILURE_REASONS)
    # Catch-up takes seconds to minutes; a commit milliseconds.
    assert 1000 < sorted(catch)[len(catch) // 2] < 600_000
    assert sorted(commit)[len(commit) // 2] < 100


def test_bad_parameters_are_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(ValueError, match="positive"):
        generate(tmp_path, events=0)
    with pytest.raises(ValueError, match="malformed_rate"):
        generate(tmp_path, malformed_rate=0.5)
    assert main(["--out", str(tmp_path / "x"), "--events", "-1"]) == 2
    assert capsys.readouterr().err.startswith("INVALID_REQUEST: ")


def test_kafka_clusters_record_kafkas_order(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """With engines, Kafka clusters write RemoveThenAdd (operator watch, 7 events) or auto-join
    (5 committed steps, recorded from outside); ours stay AddThenRemove; every line is valid."""
    from kraftkeeper_reports.intervals import AUTO_JOIN, first_timestamps, recorded_order

    stats = generate(tmp_path, events=6000, clusters=4, days=2, seed=9, malformed_rate=0.0,
                     engines=("kraftkeeper", "kafka"))
    by_rec: dict[tuple[str, str], list[dict[str, object]]] = {}
    for f in tmp_path.rglob("*.jsonl"):
        for line in f.read_text().splitlines():
            c = ev.classify_line(line)
            assert c.problem is None and c.event is not None
            by_rec.setdefault((c.event["cluster"], c.event["recovery_id"]), []).append(c.event)
    assert len(by_rec) == stats.recoveries
    seen: Counter[tuple[str, str, str]] = Counter()
    for evs in by_rec.values():
        det = next(e for e in evs if e["type"] == ev.DISK_REPLACEMENT_DETECTED)
        detail = det["detail"]
        assert isinstance(detail, dict)
        if not any(e["type"] == ev.RECOVERY_COMPLETED for e in evs):
            assert detail["order"] != AUTO_JOIN  # Kafka's auto-join never gives up
            continue
        types = [e["type"] for e in evs]
        seen[(detail["engine"], detail["order"], recorded_order(first_timestamps(evs)))] += 1
        if detail["order"] == AUTO_JOIN:
            assert types == [ev.DISK_REPLACEMENT_DETECTED, ev.REPLICA_CAUGHT_UP, ev.REMOVE_VOTER_COMMITTED,
                             ev.ADD_VOTER_COMMITTED, ev.RECOVERY_COMPLETED]
            assert "recorded_by" in detail
    # Each label records its own order, and all three kinds are there.
    assert set(seen) == {("kraftkeeper", "AddThenRemove", "AddThenRemove"),
                         ("kafka", "RemoveThenAdd", "RemoveThenAdd"),
                         ("kafka", AUTO_JOIN, "RemoveThenAdd")}
    with pytest.raises(ValueError, match="unknown engine 'zookeeper'"):
        generate(tmp_path / "z", engines=("zookeeper",))
    assert main(["--out", str(tmp_path / "y"), "--engines", "kafka,etcd"]) == 2
    assert "unknown engine 'etcd'" in capsys.readouterr().err
