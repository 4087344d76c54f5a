"""End to end: ``kraftkeeper demo --engine kafka`` with one replacement per healer (three real
Kafka controllers over SASL_SSL, ``operator watch``, then Kafka's auto-join, real local Spark)
must end with a report whose engines/orders comparison holds both healers, every recovery
completed, and console numbers that are the report's. Plus the recorder of auto-join events on
hand-made DescribeQuorum answers."""

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
from kraftkeeper_reports import events as ev
from kraftkeeper_reports.demo_kafka import AutoJoinRecorder
from kraftkeeper_reports.events import EventLogWriter, validate_event

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
            "1",
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
    assert "SASL_SSL" in p.stdout and "auto-join recovery 1/1" in p.stdout, p.stdout
    assert (d / "client.properties").stat().st_mode & 0o077 == 0  # it holds the SASL password
    assert "security.protocol=SASL_SSL" in (d / "client.properties").read_text()

    # Each healer's recovery in its own event log, complete, in its own order.
    watch, auto = _read(d / "events" / "watch"), _read(d / "events" / "auto-join")
    for evs in (watch, auto):
        assert all(validate_event(e) == [] for e in evs)
        assert [e["type"] for e in evs].count(ev.RECOVERY_COMPLETED) == 1
        assert not [e for e in evs if e["type"] == ev.RECOVERY_FAILED]
    assert watch[0]["detail"]["engine"] == "kafka" and watch[0]["detail"]["order"] == "RemoveThenAdd"
    assert auto[0]["detail"]["engine"] == "kafka" and auto[0]["detail"]["order"] == "auto-join"
    assert [e["type"] for e in auto] == [
        ev.DISK_REPLACEMENT_DETECTED,
        ev.REPLICA_CAUGHT_UP,
        ev.REMOVE_VOTER_COMMITTED,
        ev.ADD_VOTER_COMMITTED,
        ev.RECOVERY_COMPLETED,
    ]
    # The same replacement in both rounds: a follower's disk, so a new directory id each time.
    assert watch[0]["replica_id"] in (1, 2, 3) and auto[0]["new_uuid"] != watch[0]["new_uuid"]

    # The report: both healers compared, every recovery completed.
    tables = d / "report" / "tables"
    summary = json.loads((tables / "summary.json").read_text())
    assert summary["completed"] == 2 and not summary.get("failed"), summary
    compare = pd.read_csv(tables / "compare.csv")
    groups = set(zip(compare["engine"], compare["order"], strict=True))
    assert groups == {("kafka", "RemoveThenAdd"), ("kafka", "auto-join")}, groups
    totals = compare[compare["phase"] == "total"]
    assert sorted(totals["recoveries"].tolist()) == [1, 1]
    html = Path(last).read_text()
    assert "Engines and orders compared" in html
    assert "kafka · RemoveThenAdd" in html and "kafka · auto-join" in html
    # The console's numbers are the report's (same interval definitions).
    console = re.findall(r"Total: detection → recovery completed: (\S+ \S+)", p.stdout)
    assert len(console) == 2, p.stdout
    for value in console:
        assert f">{value}<" in html, value


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
