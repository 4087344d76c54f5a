"""Incremental, exactly-once ingestion (``kraftkeeper report --state``): each line of the log is
in exactly one of the two tables (events, quarantine) once, whether the state was built in one
run, in many, or by runs SIGKILLed at each point of a batch's commit and started again; a
report from the state equals one built with ``--full``; a file still being appended to (today's)
has each complete line ingested once, a line still being written waits for the next run."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
from kraftkeeper_reports import ingest as ing
from kraftkeeper_reports import merged, partials
from kraftkeeper_reports.job import ReportError, ingest_only, run_report

pytestmark = [pytest.mark.spark, pytest.mark.timeout(1800)]


@pytest.fixture(scope="module")
def log(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """~1.5 k events over 4 closed days (8 files) with damaged lines, and a torn file."""
    from kraftkeeper_reports.generate import generate

    out = tmp_path_factory.mktemp("ingest-events")
    generate(out, events=1_500, clusters=2, days=4, seed=11, malformed_rate=0.02)
    (out / "torn.jsonl").write_text('{"schema_version":1,"ts":"2026-10\n[1,2]\n\n')
    return out


def n_lines(root: Path) -> int:
    return sum(len(f.read_bytes().splitlines()) for f in root.rglob("*") if f.is_file())


def rows(state: Path) -> tuple[list[tuple[Any, ...]], list[tuple[Any, ...]]]:
    """Both tables' rows, sorted, with the quarantine's source as the landing file's name (the
    same for any state built from the same inputs) less its segment's offset (a file taken in
    several runs has several segments)."""
    def table(d: Path) -> list[tuple[Any, ...]]:
        if not any(d.rglob("*.parquet")):
            return []
        t = pq.read_table(d)  # the events' date=... directories as a column
        out = []
        for r in t.to_pylist():
            if r.get("source"):
                r["source"] = r["source"].rsplit("/", 1)[-1]
            r = {k: re.sub(r"~at[0-9]+", "", v) if isinstance(v, str) else v for k, v in r.items()}
            out.append(tuple(sorted((k, json.dumps(v, default=str)) for k, v in r.items())))
        return sorted(out)

    return table(state / ing.EVENTS), table(state / ing.QUARANTINE)


def cli(state: Path, events: Path, **env: str) -> subprocess.CompletedProcess[str]:
    """``kraftkeeper report --ingest-only --engine spark`` in its own process group (a kill takes
    its JVM too)."""
    cmd = [sys.executable, "-m", "kraftkeeper_reports.job", "--events", str(events),
           "--out", str(state.parent), "--state", str(state), "--ingest-only", "--engine", "spark"]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=900, start_new_session=True,
                          env={**os.environ, "SPARK_LOCAL_IP": "127.0.0.1", **env})


def merged_rows(state: Path) -> list[tuple[Any, ...]]:
    """The state's merged per-recovery rows (``merged``), every column, sorted."""
    vs = merged.versions(ing.Layout(state))
    assert len(vs) == 1, vs
    t = pq.read_table(vs[0][1])
    return sorted(tuple(json.dumps(v, default=str) for v in r.values()) for r in t.to_pylist())


def test_killed_at_each_point_of_a_commit_counts_every_line_once(
    spark: Any, log: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    clean = ingest_only([str(log)], str(tmp_path / "clean"), engine="spark")
    assert clean["state"][ing.EVENTS] + clean["state"][ing.QUARANTINE] == n_lines(log)
    want = rows(tmp_path / "clean")
    state = tmp_path / "killed" / "state"
    # Two files a batch (5 batches); each run dies at the next point of some batch's commit, the
    # last one once every batch is in, while writing the merged rows of all five.
    for point in ("staged", "planned", "moving", "committed:2", "merging"):
        r = cli(state, log, KK_INGEST_DIE_AT=point, KK_INGEST_MAX_FILES="2")
        assert r.returncode == -9, (point, r.returncode, r.stderr[-2000:])
    assert sorted(p.name for p in (state / "merged").iterdir())[:1] == [".v4.tmp"], "no version written aside"
    assert not merged.versions(ing.Layout(state))
    monkeypatch.setenv("KK_INGEST_MAX_FILES", "2")
    done = ingest_only([str(log)], str(state), engine="spark")  # in this process: no JVM to start
    assert done["batches"] == 0 and done["state"] == {**clean["state"], "batches": 5}
    got = rows(state)
    assert len(got[0]) == clean["state"][ing.EVENTS] and len(got[1]) == clean["state"][ing.QUARANTINE]
    assert got == want
    assert not list((state / "staging").glob("*")) and not list((state / "batches").glob("*.pending"))
    # Five batches merged at once after a kill equal one batch of every line.
    assert [p.name for p in (state / "merged").iterdir()] == ["v4"]
    assert merged_rows(state) == merged_rows(tmp_path / "clean")


def _summary(out: Path) -> dict[str, Any]:
    s = json.loads((out / "tables" / "summary.json").read_text())
    s.pop("inputs")
    return dict(s)


def test_incremental_runs_equal_a_full_rebuild_and_appended_lines_count_once(
    spark: Any, log: Path, tmp_path: Path,
) -> None:
    src = tmp_path / "src"
    days = sorted(p.name for p in log.iterdir() if p.is_dir())
    for d in days[:2]:
        shutil.copytree(log / d, src / d)
    out = tmp_path / "out"
    run_report([str(src)], str(out), engine="spark")
    first = partials.ledger(ing.Layout(out / "state"))
    for d in days[2:]:
        shutil.copytree(log / d, src / d)
    shutil.copy(log / "torn.jsonl", src / "torn.jsonl")
    # Today's partition, still being appended to: 5 complete lines and a sixth half written.
    today = datetime.now(UTC).strftime("%Y-%m-%d")
    (src / f"date={today}").mkdir()
    live = (log / days[0] / "part-00000.jsonl").read_text().splitlines()[:8]
    growing = src / f"date={today}" / "events-x.jsonl"
    growing.write_text("\n".join(live[:5]) + "\n" + live[5][:40])
    run_report([str(src)], str(out), engine="spark")
    second = partials.ledger(ing.Layout(out / "state"))
    assert second["batches"] == first["batches"] + 1
    assert second[ing.EVENTS] + second[ing.QUARANTINE] == n_lines(log) + 5
    # The writer finishes the sixth line and adds two: only those three are new.
    with open(growing, "a") as f:
        f.write(live[5][40:] + "\n" + live[6] + "\n" + live[7] + "\n")
    run_report([str(src)], str(out), engine="spark")
    third = partials.ledger(ing.Layout(out / "state"))
    assert third["batches"] == second["batches"] + 1 and third[ing.EVENTS] == second[ing.EVENTS] + 3
    summary = _summary(out)
    assert summary["lines"] == n_lines(log) + 8
    full = tmp_path / "full"
    run_report([str(src)], str(full), full=True, engine="spark")
    assert _summary(full) == summary
    assert rows(out / "state") == rows(full / "state")
    with pytest.raises(ReportError, match="built from other inputs"):
        run_report([str(log)], str(out), engine="spark")
    # A copied state would take every file again (its checkpoint names them where it was built).
    moved = tmp_path / "moved"
    shutil.copytree(out / "state", moved)
    with pytest.raises(ReportError, match="moved or copied"):
        run_report([str(src)], str(tmp_path / "out-moved"), state=str(moved), engine="spark")
    assert partials.ledger(ing.Layout(moved)) == third
    # Three batches merged one run at a time give the per-recovery rows of one partial of all.
    assert sorted(p.name for p in (out / "state" / "partials").iterdir()) == ["b0", "b1", "b2"]
    assert [p.name for p in (full / "state" / "partials").iterdir()] == ["b0"]
    assert [p.name for p in (out / "state" / "merged").iterdir()] == ["v2"]
    assert _recoveries(out) == _recoveries(full)
    assert merged_rows(out / "state") == merged_rows(full / "state")
    # What a run killed while publishing the merged rows leaves (a version written aside, Spark's
    # work, the version before the one it published) is removed; the latest version is used.
    lay = ing.Layout(out / "state")
    want = merged_rows(out / "state")
    shutil.copytree(out / "state" / "merged" / "v2", out / "state" / "merged" / "v1")
    for torn in (".v3.tmp", ".work"):
        (out / "state" / "merged" / torn).mkdir()
        (out / "state" / "merged" / torn / "part-0.parquet").write_bytes(b"PAR1 torn")
    merged.update(spark, lay)
    assert [p.name for p in (out / "state" / "merged").iterdir()] == ["v2"] and merged_rows(lay.root) == want
    # The merged rows and the partials are a cache: lost (a partial also half-written by a
    # kill), they are made again.
    shutil.rmtree(out / "state" / "merged")
    shutil.rmtree(out / "state" / "partials" / "b1")
    (out / "state" / "partials" / ".b2.tmp").mkdir()
    (out / "state" / "partials" / ".b2.tmp" / "part-0.parquet").write_bytes(b"PAR1 torn")
    run_report([str(src)], str(out), engine="spark")
    assert sorted(p.name for p in (out / "state" / "partials").iterdir()) == ["b0", "b1", "b2"]
    assert _summary(out) == summary and _recoveries(out) == _recoveries(full)
    assert merged_rows(lay.root) == want


def _recoveries(out: Path) -> list[tuple[Any, ...]]:
    t = pq.read_table(out / "tables" / "recoveries.parquet")
    return sorted(tuple(json.dumps(v, default=str) for v in r.values()) for r in t.to_pylist())
