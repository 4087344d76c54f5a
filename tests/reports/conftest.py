"""Fixtures of the report tests: one SparkSession for the whole test session (Spark starts in
~10 s on two cores, so every Spark test shares it) and small generated event logs."""

from __future__ import annotations

import contextlib
import hashlib
import io
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.reports.util import run_job


def java_major() -> int:
    java = shutil.which("java")
    if java is None:
        return 0
    out = subprocess.run([java, "-version"], capture_output=True, text=True, check=False).stderr
    for tok in out.split('"')[1:2]:
        head = tok.split(".")[0]
        if head == "1":
            return int(tok.split(".")[1])
        return int(head.split("-")[0])
    return 0


def tree_digest(root: Path) -> str:
    h = hashlib.sha256()
    for f in sorted(root.rglob("*")):
        if f.is_file():
            h.update(str(f.relative_to(root)).encode())
            h.update(f.read_bytes())
    return h.hexdigest()


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    pytest.importorskip("pyspark", reason="needs PySpark (pip install -e '.[spark]')")
    if java_major() < 17:
        pytest.skip("needs Java 17+ for Spark (scripts/install-system.sh install)")
    os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"
    from kraftkeeper_reports.session import build_session

    session = build_session("local[2]", app_name="kraftkeeper-report-tests")
    yield session
    session.stop()


@pytest.fixture(scope="session")
def clean_events(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Any, str]:
    """~8 k generated events without damage (numbers are checked against plain Python), some
    failures, plus torn.jsonl: 4 lines that are not events (2 malformed, 1 not an object, 1 blank)."""
    from kraftkeeper_reports.generate import generate

    out = tmp_path_factory.mktemp("clean-events")
    stats = generate(out, events=8_000, clusters=4, days=5, seed=7, malformed_rate=0.0,
                     failure_scale=2.0)
    # A few lines no JSON reader accepts, so the report has a bad-input section to draw.
    (out / "torn.jsonl").write_text('{"schema_version":1,"ts":"2026-10\n[1,2]\n\n{"schema_version":1\n')
    return out, stats, tree_digest(out)


@pytest.fixture(scope="session")
def report_run(
    spark: Any, clean_events: tuple[Path, Any, str], tmp_path_factory: pytest.TempPathFactory
) -> tuple[Path, str]:
    """The full job run once on the clean log through ``main``, as the CLI runs it: the output
    directory and what it printed on stdout."""
    from kraftkeeper_reports.job import main

    out = tmp_path_factory.mktemp("report")
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        rc = main(["--events", str(clean_events[0]), "--out", str(out), "--top", "12"])
    assert rc == 0
    return out, buf.getvalue()


@pytest.fixture(scope="session")
def demo_report(spark: Any, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The demo's size: 3 recoveries of one cluster on one day, clean."""
    from kraftkeeper_reports.generate import generate

    src = tmp_path_factory.mktemp("demo-events")
    stats = generate(src, events=21, clusters=1, days=1, seed=3, malformed_rate=0.0)
    assert stats.recoveries == 3 and stats.outcomes["completed"] == 3
    return run_job(src, tmp_path_factory.mktemp("demo-report"))


@pytest.fixture(scope="session")
def fleet_report(spark: Any, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fleet: 100k recoveries over 8 clusters and 10 days, two engines (Kafka and ours, each
    with its voter-change order), some bad input."""
    from kraftkeeper_reports.generate import generate

    src = tmp_path_factory.mktemp("fleet-events")
    stats = generate(src, events=700_000, clusters=8, days=10, seed=5, malformed_rate=0.0005,
                     files_per_day=1, workers=2, engines=("kraftkeeper", "kafka"))
    assert stats.recoveries >= 99_000
    return run_job(src, tmp_path_factory.mktemp("fleet-report"))
