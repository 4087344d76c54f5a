"""The whole job against numbers computed independently, in plain Python, from the raw lines;
and its command-line errors."""

from __future__ import annotations

import hashlib
import json
from collections import Counter, defaultdict
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
from kraftkeeper_reports.job import main

from quorum.timefmt import parse_rfc3339


def tree_digest(root: Path) -> str:
    h = hashlib.sha256()
    for f in sorted(root.rglob("*")):
        if f.is_file():
            h.update(str(f.relative_to(root)).encode())
            h.update(f.read_bytes())
    return h.hexdigest()


def independent(root: Path) -> dict[str, Any]:
    """Per-recovery durations straight from the JSON lines (no project code involved)."""
    recs: dict[tuple[str, str], dict[str, Any]] = defaultdict(dict)
    for f in sorted(root.rglob("*.jsonl")):
        for raw in f.read_text(encoding="utf-8").splitlines():
            try:
                e = json.loads(raw)
            except ValueError:
                continue
            if not isinstance(e, dict):
                continue
            ms = parse_rfc3339(e["ts"])
            r = recs[(e["cluster"], e["recovery_id"])]
            r.setdefault(e["type"], ms)
            if e["type"] == "recovery_failed":
                r["reason"] = e["detail"]["reason"]
    phases: dict[str, dict[str, list[int]]] = defaultdict(lambda: defaultdict(list))
    fails: Counter[str] = Counter()
    days: Counter[str] = Counter()
    totals = []
    for (cluster, rid), r in recs.items():
        days[datetime.fromtimestamp(r["disk_replacement_detected"] / 1000, UTC).strftime("%Y-%m-%d")] += 1
        if "recovery_failed" in r:
            fails[r["reason"]] += 1
            continue
        d = r["disk_replacement_detected"]
        vals = {
            "catch_up": r["replica_caught_up"] - d,
            "add_voter": r["add_voter_committed"] - r["replica_caught_up"],
            "remove_voter": r["remove_voter_committed"] - r["add_voter_committed"],
            "under_replicated": r["add_voter_committed"] - d,
            "exposure": r["remove_voter_committed"] - d,
            "degraded": r["remove_voter_committed"] - d,  # AddThenRemove: until the second change
            "total": r["recovery_completed"] - d,
        }
        totals.append((vals["total"], cluster, rid))
        for k, v in vals.items():
            phases[k][cluster].append(v)
            phases[k]["(all)"].append(v)
    return {"phases": phases, "fails": fails, "days": days, "totals": sorted(totals, reverse=True)}


@pytest.mark.spark
def test_report_numbers_match_plain_python(
    report_run: tuple[Path, str], clean_events: tuple[Path, Any, str]
) -> None:
    out, stdout = report_run
    root, gen_stats, digest = clean_events
    assert stdout.strip().splitlines()[-1] == str((out / "report.html").resolve())
    assert tree_digest(root) == digest  # the input is only read
    ind = independent(root)
    stats = pd.read_parquet(out / "tables" / "phase_stats.parquet")
    checked = 0
    for phase, by_cluster in ind["phases"].items():
        for cluster, values in by_cluster.items():
            row = stats[(stats["phase"] == phase) & (stats["cluster"] == cluster)]
            assert len(row) == 1, (phase, cluster)
            r = row.iloc[0]
            assert r["recoveries"] == len(values)
            assert r["max_ms"] == max(values) and r["min_ms"] == min(values)
            for q in (50, 90, 99):
                assert r[f"p{q}_ms"] == pytest.approx(np.percentile(values, q), abs=1e-6), (phase, cluster, q)
            checked += 1
    assert checked == len(stats) and checked >= 6 * 3
    fails = pd.read_csv(out / "tables" / "failures.csv")
    allf = fails[fails["cluster"] == "(all)"]
    assert dict(zip(allf["failure_reason"], allf["failures"], strict=True)) == dict(ind["fails"])
    assert dict(ind["fails"]) == dict(gen_stats.failure_reasons)
    daily = pd.read_parquet(out / "tables" / "daily.parquet")
    assert {str(d): n for d, n in zip(daily["date"], daily["recoveries"], strict=True)} == dict(ind["days"])
    slow = pd.read_parquet(out / "tables" / "slowest.parquet")
    assert slow["total_ms"].tolist() == [t for t, _, _ in ind["totals"][:12]]
    summary = json.loads((out / "tables" / "summary.json").read_text())
    assert summary["completed"] == gen_stats.outcomes["completed"]
    assert summary["failed"] == gen_stats.outcomes["failed"]
    assert summary["rejected_lines"] == 3 and summary["skipped_lines"] == 1
    assert summary["events"] == gen_stats.events
    recs = pd.read_parquet(out / "tables" / "recoveries.parquet")
    assert len(recs) == gen_stats.recoveries
    assert (out / "tables" / "recoveries.csv").is_dir()
    # The headline shows the same median as the table.
    from kraftkeeper_reports.render import fmt_ms

    html = (out / "report.html").read_text()
    assert fmt_ms(float(np.percentile(ind["phases"]["total"]["(all)"], 50))) in html


def run_main(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    rc = main(argv)
    cap = capsys.readouterr()
    return rc, cap.out, cap.err


def test_missing_input_is_a_clear_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, err = run_main(["--events", str(tmp_path / "nope"), "--out", str(tmp_path / "o")], capsys)
    assert rc == 2 and out == ""
    want = f"INVALID_REQUEST: no events found at {tmp_path / 'nope'}: no such file or directory"
    assert err.strip() == want
    (tmp_path / "empty").mkdir()
    rc, _, err = run_main(["--events", str(tmp_path / "empty"), "--out", str(tmp_path / "o")], capsys)
    assert rc == 2 and err.startswith("INVALID_REQUEST: no events found at ") and "holds no files" in err


def test_bad_arguments_are_clear_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as e:
        main(["--events", str(tmp_path)])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert "INVALID_REQUEST: kraftkeeper report: the following arguments are required: --out" in err
    f = tmp_path / "log.jsonl"
    f.write_text("{}\n")
    (tmp_path / "file").write_text("x")
    rc, _, err = run_main(["--events", str(f), "--out", str(tmp_path / "file")], capsys)
    assert rc == 2 and "exists and is not a directory" in err
    assert (tmp_path / "file").read_text() == "x"


@pytest.mark.spark
def test_empty_files_are_a_clear_error(
    spark: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "a.jsonl").write_text("")
    rc, out, err = run_main(["--events", str(tmp_path / "in"), "--out", str(tmp_path / "o")], capsys)
    assert rc == 2 and out == ""
    assert err.startswith("INVALID_REQUEST: no events found at ") and "empty" in err
