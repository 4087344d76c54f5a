"""End to end: a shortened ``kraftkeeper demo`` (real node processes under ``operator local``,
real disk replacements, real local Spark) must finish with a report and an event log that
records every recovery in order."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.spark]

ORDER = [
    "disk_replacement_detected",
    "replica_caught_up",
    "add_voter_started",
    "add_voter_committed",
    "remove_voter_started",
    "remove_voter_committed",
    "recovery_completed",
]


def test_short_demo_end_to_end(tmp_path: Path) -> None:
    d = tmp_path / "demo"
    p = subprocess.run(
        [
            sys.executable,
            "-m",
            "quorum.cli",
            "demo",
            "--dir",
            str(d),
            "--recoveries",
            "2",
            "--keys",
            "200",
            "--stabilization-seconds",
            "1",
        ],
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert p.returncode == 0, p.stderr[-3000:]
    last = p.stdout.strip().splitlines()[-1]
    assert last == str(d / "report" / "report.html")
    html = Path(last).read_text()
    assert "<svg" in html or "data:image/png;base64" in html
    assert (d / ".kraftkeeper-demo").exists()  # a second demo run here may replace this one
    assert "replacing the disk of node" in p.stdout and "every acknowledged key is there" in p.stdout
    # The console names each interval as the report does, and its numbers are the report's.
    totals = re.findall(r"Total: detection → recovery completed: (\S+ \S+)", p.stdout)
    assert len(totals) == 2, p.stdout
    assert "dead voter in set" in p.stdout.lower() and "demo wall clock" in p.stdout
    for value in totals:
        assert f">{value}<" in html, value
    events = [
        json.loads(line)
        for f in sorted((d / "events").rglob("*.jsonl"))
        for line in f.read_text().splitlines()
    ]
    by_recovery: dict[str, list[str]] = {}
    for e in events:
        by_recovery.setdefault(e["recovery_id"], []).append(e["type"])
    assert len(by_recovery) == 2
    for types in by_recovery.values():
        assert [t for t in types if t in ORDER] == ORDER


def test_demo_refuses_a_directory_holding_someone_elses_cluster(tmp_path: Path) -> None:
    (tmp_path / "cluster.json").write_text("{}")
    p = subprocess.run(
        [sys.executable, "-m", "quorum.cli", "demo", "--dir", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert (
        p.returncode == 2
        and p.stderr.startswith("INVALID_REQUEST:")
        and "already holds a cluster" in p.stderr
    )
    assert (tmp_path / "cluster.json").read_text() == "{}"
