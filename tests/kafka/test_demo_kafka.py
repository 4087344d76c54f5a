"""End to end: ``kraftkeeper demo --engine kafka`` with two replacements per healer (three real
Kafka controllers over SASL_SSL, ``operator watch``, then Kafka's auto-join, real local Spark):
each healer replaces two different controllers' disks, the leader's first (two, not the demo's
three: each Kafka replacement costs a JVM start, and the turn taking of all three is
test_victims_take_turns_leader_first's); the report's
engines/orders comparison holds both healers, every recovery completed, its intervals are
RemoveThenAdd's, and the console's numbers are the report's under the same titles. Plus the
recorder of auto-join events on hand-made DescribeQuorum answers, and the order of victims."""

from __future__ import annotations

import json
import re
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
from kraftkeeper_demo.demo_kafka import next_victim
from kraftkeeper_demo.kafka_probe import AutoJoinRecorder
from kraftkeeper_reports import events as ev
from kraftkeeper_reports.events import EventLogWriter, validate_event
from kraftkeeper_reports.intervals import fmt_ms

REPO = Path(__file__).resolve().parents[2]


def _base_port() -> int:
    """A base in this suite's range (26000-26999) with BASE+1..BASE+4 free on loopback."""
    for base in range(26200, 26900, 10):
        socks: list[socket.socket] = []
        try:
            for p in range(base + 1, base + 5):
                s = socket.socket()
                socks.append(s)
                s.bind(("127.0.0.1", p))
            return base
        except OSError:
            continue
        finally:
            for s in socks:
                s.close()
    raise AssertionError("no free ports in 26200-26900")


def _read(d: Path) -> list[dict[str, Any]]:
    return [json.loads(x) for f in sorted(d.rglob("*.jsonl")) for x in f.read_text().splitlines() if x]


@pytest.mark.slow
@pytest.mark.spark
@pytest.mark.timeout(1500)
def test_demo_kafka_end_to_end(tmp_path: Path, kafka_jars: Path) -> None:
    d = tmp_path / "demo"
    p = subprocess.run(
        [
            sys.executable,
            "-m",
            "quorum.cli",
            "demo",
            "--engine",
            "kafka",
            "--dir",
            str(d),
            "--recoveries",
            "2",
            "--stabilization-seconds",
            "0",
            "--base-port",
            str(_base_port()),
        ],
        capture_output=True,
        text=True,
        timeout=1200,
        cwd=REPO,
    )
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    last = p.stdout.strip().splitlines()[-1]
    assert last == str(d / "report" / "report.html")
    assert "SASL_SSL" in p.stdout and "auto-join recovery 2/2" in p.stdout, p.stdout
    assert (d / "client.properties").stat().st_mode & 0o077 == 0  # it holds the SASL password
    assert "security.protocol=SASL_SSL" in (d / "client.properties").read_text()

    # Each healer's recovery in its own event log, complete, in its own order.
    watch, auto = _read(d / "events" / "watch"), _read(d / "events" / "auto-join")
    for evs in (watch, auto):
        assert all(validate_event(e) == [] for e in evs)
        assert [e["type"] for e in evs].count(ev.RECOVERY_COMPLETED) == 2
        assert not [e for e in evs if e["type"] == ev.RECOVERY_FAILED]
    assert watch[0]["detail"]["engine"] == "kafka" and watch[0]["detail"]["order"] == "RemoveThenAdd"
    assert auto[0]["detail"]["engine"] == "kafka" and auto[0]["detail"]["order"] == "auto-join"
    assert [e["type"] for e in auto] == 2 * [
        ev.DISK_REPLACEMENT_DETECTED,
        ev.REPLICA_CAUGHT_UP,
        ev.REMOVE_VOTER_COMMITTED,
        ev.ADD_VOTER_COMMITTED,
        ev.RECOVERY_COMPLETED,
    ]
    # Each healer replaced two different controllers' disks (the second one not yet replaced by
    # it), a new directory id each time, and its first replacement was the leader's (the
    # console says whose disk and whether it led).
    for evs in (watch, auto):
        detected = [e["replica_id"] for e in evs if e["type"] == ev.DISK_REPLACEMENT_DETECTED]
        assert len(detected) == 2 and len(set(detected)) == 2 and set(detected) <= {1, 2, 3}, detected
    assert len({e["new_uuid"] for e in watch + auto}) == 4
    for healer in ("operator watch", "auto-join"):
        first = re.search(rf"{healer} recovery 1/2: replacing the disk of controller (\d) \((.*?), epoch",
                          p.stdout)
        assert first is not None and first.group(2) == "the leader", p.stdout

    # The report: both healers compared, every recovery completed.
    tables = d / "report" / "tables"
    summary = json.loads((tables / "summary.json").read_text())
    assert summary["completed"] == 4 and not summary.get("failed"), summary
    compare = pd.read_csv(tables / "compare.csv")
    groups = set(zip(compare["engine"], compare["order"], strict=True))
    assert groups == {("kafka", "RemoveThenAdd"), ("kafka", "auto-join")}, groups
    totals = compare[compare["phase"] == "total"]
    assert sorted(totals["recoveries"].tolist()) == [2, 2]
    html = Path(last).read_text()
    assert "Engines and orders compared" in html
    assert "kafka · RemoveThenAdd" in html and "kafka · auto-join" in html
    assert "recorded from outside" in html
    # Both healers remove first: the report's intervals are RemoveThenAdd's, and so are the
    # console's, under the same titles, with the same numbers.
    assert "RemoveVoter: caught up → RemoveVoter committed" in html
    assert "RemoveVoter: AddVoter committed" not in html
    assert p.stdout.count("healed by operator watch, order RemoveThenAdd;") == 2, p.stdout
    assert p.stdout.count("healed by Kafka's auto-join (steps recorded from outside") == 2, p.stdout
    recs = pd.read_parquet(tables / "recoveries.parquet")
    for title, col in (("Total: detection → recovery completed", "total_ms"),
                       ("One failure less tolerated: detection → AddVoter committed", "degraded_ms"),
                       ("Voter missing: RemoveVoter committed → AddVoter committed", "under_replicated_ms")):
        console = re.findall(rf"{re.escape(title)}: (\S+ \S+)", p.stdout)
        assert sorted(console) == sorted(fmt_ms(v) for v in recs[col]), (title, p.stdout)
        assert title in html
    for value in re.findall(r"Total: detection → recovery completed: (\S+ \S+)", p.stdout):
        assert f">{value}<" in html, value


def test_victims_take_turns_leader_first() -> None:
    ids = [1, 2, 3]
    replaced: list[int] = []
    for leader in (2, 1, 1, 3, 3, 3):  # the leader as DescribeQuorum shows it before each pick
        replaced.append(next_victim(leader, ids, replaced))
    # Each turn of three starts with that moment's leader and replaces every controller once.
    assert replaced == [2, 1, 3, 3, 1, 2]
    assert next_victim(-1, ids, []) == 1  # no leader known: the lowest id


def _desc(voters: list[tuple[int, str, int]], observers: list[tuple[int, str, int]]) -> dict[str, Any]:
    def e(t: tuple[int, str, int]) -> dict[str, Any]:
        return {"id": t[0], "uuid": t[1], "lag": t[2]}

    return {
        "leader_id": 1,
        "leader_epoch": 4,
        "voters": [e(v) for v in voters],
        "observers": [e(o) for o in observers],
    }


OLD, NEW = "00000000-0000-4000-8000-000000000002", "00000000-0000-4000-8000-0000000000a2"
U1, U3 = "00000000-0000-4000-8000-000000000001", "00000000-0000-4000-8000-000000000003"


def test_auto_join_recorder_logs_each_step_once_in_kafka_order(tmp_path: Path) -> None:
    w = EventLogWriter(tmp_path, "c")
    rec = AutoJoinRecorder(w, "r1", 2, OLD, NEW)
    want = {(1, U1), (2, NEW), (3, U3)}
    base = [(1, U1, 0), (3, U3, 0)]
    # Not visible yet: nothing logged, even though the old id is still a voter.
    assert rec.observe(_desc([*base, (2, OLD, 0)], []), want) is False
    assert _read(tmp_path) == []
    # Listed as an observer far behind: detected, not caught up.
    assert rec.observe(_desc([*base, (2, OLD, 0)], [(2, NEW, 5000)]), want) is False
    # Caught up; then the old id leaves; asked twice (no duplicate events).
    assert rec.observe(_desc([*base, (2, OLD, 0)], [(2, NEW, 3)]), want) is False
    assert rec.observe(_desc(base, [(2, NEW, 0)]), want) is False
    assert rec.observe(_desc(base, [(2, NEW, 0)]), want) is False
    # A voter again but still behind: added, not complete.
    assert rec.observe(_desc([*base, (2, NEW, 500)], []), want) is False
    assert rec.observe(_desc([*base, (2, NEW, 0)], []), want) is True
    types = [e["type"] for e in _read(tmp_path)]
    assert types == [
        ev.DISK_REPLACEMENT_DETECTED,
        ev.REPLICA_CAUGHT_UP,
        ev.REMOVE_VOTER_COMMITTED,
        ev.ADD_VOTER_COMMITTED,
        ev.RECOVERY_COMPLETED,
    ]
    first = _read(tmp_path)[0]
    assert first["detail"]["engine"] == "kafka" and first["detail"]["order"] == "auto-join"
    assert first["leader_id"] == 1 and first["leader_epoch"] == 4


def test_auto_join_recorder_fills_in_steps_seen_only_at_completion(tmp_path: Path) -> None:
    w = EventLogWriter(tmp_path, "c")
    rec = AutoJoinRecorder(w, "r2", 2, OLD, NEW)
    want = {(1, U1), (2, NEW), (3, U3)}
    # Everything happened between two polls: all steps at once, in Kafka's order.
    assert rec.observe(_desc([(1, U1, 0), (2, NEW, 0), (3, U3, 0)], []), want) is True
    evs = _read(tmp_path)
    assert [e["type"] for e in evs] == [
        ev.DISK_REPLACEMENT_DETECTED,
        ev.REPLICA_CAUGHT_UP,
        ev.REMOVE_VOTER_COMMITTED,
        ev.ADD_VOTER_COMMITTED,
        ev.RECOVERY_COMPLETED,
    ]
    assert len({e["ts"] for e in evs}) == 1
