"""The in-process engine (``--engine arrow``): its lines, partials and merged rows are the Spark
path's, row for row; a run SIGKILLed at each point of its commit and of the merged rows' update
and run again counts every line once; a history of Spark, arrow and Spark batches equals one
``--full`` rebuild; ``auto`` routes a small increment to it and a large one to Spark, each landed
file to exactly one engine's input."""

from __future__ import annotations

import json
import os
import random
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
from kraftkeeper_reports import arrow_lines, arrow_rows, landing, merged
from kraftkeeper_reports import events as ev
from kraftkeeper_reports import ingest as ing
from kraftkeeper_reports.job import ingest_only, main, run_report

from tests.reports.test_ingest import merged_rows, n_lines, rows

pytestmark = [pytest.mark.timeout(1800)]


@pytest.fixture(scope="module")
def log(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """~1.5 k events over 4 closed days (8 files) with damaged lines, and a torn file."""
    from kraftkeeper_reports.generate import generate

    out = tmp_path_factory.mktemp("arrow-events")
    generate(out, events=1_500, clusters=2, days=4, seed=11, malformed_rate=0.02)
    (out / "torn.jsonl").write_text('{"schema_version":1,"ts":"2026-10\n[1,2]\n\n')
    return out


def _mutations(line: str, rng: random.Random) -> list[str]:
    """Damaged and unusual forms of one valid line: every check, and the forms the Spark path's
    fast path must send to its full checks (other key order, spaces, escapes, nested detail)."""
    obj = json.loads(line)
    out = [line.replace(",", ", "), json.dumps(obj), line[:-1], line + " ", " " + line, line + "x", "\t",
           json.dumps(dict(reversed(list(obj.items()))), separators=(",", ":")), f"[{line}]", "3.5", "true"]
    for k, v in (("replica_id", "3"), ("replica_id", -2), ("replica_id", 2**63), ("leader_id", None),
                 ("leader_epoch", 1.5), ("cluster", ""), ("cluster", "\u3000x"), ("cluster", 'a"b'),
                 ("cluster", "k\u00e9"), ("recovery_id", [1, 2]), ("old_uuid", 7), ("new_uuid", None),
                 ("detail", {"engine": {"a": 1}, "order": 3}), ("detail", {"reason": ""}), ("detail", []),
                 ("type", ev.RECOVERY_FAILED), ("type", "mystery"), ("type", " "), ("type", 5),
                 ("schema_version", 2), ("schema_version", True), ("ts", "2026-02-30T00:00:00.000Z"),
                 ("ts", "2026-11-01T10:00:00.1234Z"), ("ts", "2026-11-01T10:00:00.123+00:00"),
                 ("ts", "2026-11-01t10:00:00.123z"), ("ts", 17), ("extra", 1)):
        out.append(json.dumps(dict(obj, **{k: v}), separators=(",", ":"), ensure_ascii=rng.random() < 0.5))
    for k in ev.REQUIRED_FIELDS:
        out.append(json.dumps({x: y for x, y in obj.items() if x != k}, separators=(",", ":")))
    unclean = dict(obj, type=ev.UNCLEAN_RECOVERY, detail={"survivor": 2, "lost": "x", "a": True})
    out += [json.dumps(unclean, separators=(",", ":")), json.dumps(unclean),
            json.dumps(dict(unclean, host="h"), separators=(",", ":")),
            line.replace('"detail":{', '"detail":{"engine":"e","engine":"f",'),
            line.replace('"detail":{', '"detail":{"engine":"x\\u00e9",')]
    return out


@pytest.mark.spark
def test_the_lines_parse_as_in_spark(spark: Any, log: Path) -> None:
    """Every column of ``parse.parse_lines`` (Spark's fast path and full checks) equals the
    in-process parse (``eventcheck.classify_line``'s rules) on the generator's lines, damaged
    ones included, and on mutations of them."""
    from kraftkeeper_reports import parse

    rng = random.Random(5)
    lines = [x for f in sorted(log.rglob("*.jsonl")) for x in f.read_text().splitlines()]
    valid = [x for x in lines if arrow_lines.parse_line(x, "s")["reason"] is None]
    picked = lines + [m for x in rng.sample(valid, 40) for m in _mutations(x, rng)]
    src = "file:///state/landing/0~date=2026-11-01~part-00000.jsonl"
    df = spark.createDataFrame([(x, src) for x in picked], "value string, source string")
    got = [r.asDict() for r in parse.parse_lines(df).collect()]
    want = [arrow_lines.parse_line(x, src) for x in picked]
    assert len(got) == len(want) == len(picked)
    bad = [(x, {k: (g[k], w[k]) for k in parse.PARSED_COLUMNS if g[k] != w[k]})
           for x, g, w in zip(picked, got, want, strict=True)
           if any(g[k] != w[k] for k in parse.PARSED_COLUMNS)]
    assert not bad, bad[:5]
    assert {w["reason"] for w in want} >= {None, ev.BLANK_LINE, ev.MALFORMED_JSON, ev.NOT_AN_OBJECT,
                                            ev.UNKNOWN_TYPE, ev.BAD_TIMESTAMP}


@pytest.mark.spark
def test_xxhash64_is_sparks(spark: Any) -> None:
    from pyspark.sql import functions as F

    texts = ["", "a", "abcd", "x" * 7, "y" * 31, "z" * 32, "0123456789" * 13, "d\u00e9j\u00e0 \U0001f600 vu"]
    df = spark.createDataFrame([(t,) for t in texts], "t string")
    got = df.select(F.xxhash64("t").alias("a"), F.xxhash64(F.lit("any"), "t").alias("b")).collect()
    want = [(arrow_rows.spark_hash(t), arrow_rows.spark_hash("any", t)) for t in texts]
    assert [(r.a, r.b) for r in got] == want


def _schemas(state: Path) -> list[Any]:
    first = [next(iter(sorted((state / d).rglob("*.parquet")))) for d in ("events", "quarantine", "partials",
                                                                           "merged")]
    return [pq.read_schema(f).remove_metadata() for f in first]


@pytest.mark.spark
def test_the_state_is_the_spark_paths_and_so_is_the_report(spark: Any, log: Path, tmp_path: Path) -> None:
    a = ingest_only([str(log)], str(tmp_path / "spark"), engine="spark")
    b = ingest_only([str(log)], str(tmp_path / "arrow"), engine="arrow")
    assert a["state"] == b["state"] and b["state"][ing.EVENTS] + b["state"][ing.QUARANTINE] == n_lines(log)
    assert rows(tmp_path / "arrow") == rows(tmp_path / "spark")
    assert merged_rows(tmp_path / "arrow") == merged_rows(tmp_path / "spark")
    assert _schemas(tmp_path / "arrow") == _schemas(tmp_path / "spark")
    outs = []
    for engine in ("spark", "arrow"):
        out = tmp_path / f"out-{engine}"
        run_report([str(log)], str(out), engine=engine)
        tables = {p.name: sorted(p.read_bytes().splitlines()) for p in (out / "tables").glob("*.csv")
                  if p.is_file()}
        tables["recoveries"] = sorted(next((out / "tables" / "recoveries.csv").glob("*.csv")).read_bytes()
                                      .splitlines())
        # matplotlib names clip paths and markers at random
        html = re.sub(r"\b[mp][0-9a-f]{10}\b", "ID", (out / "report.html").read_text())
        outs.append((tables, (out / "tables" / "summary.json").read_text(), html))
    assert outs[0][0] == outs[1][0]
    assert outs[0][1] == outs[1][1]
    assert outs[0][2] == outs[1][2]


def cli(state: Path, events: Path, engine: str, **env: str) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "kraftkeeper_reports.job", "--events", str(events),
           "--out", str(state.parent),
           "--state", str(state), "--ingest-only", "--engine", engine]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=900, start_new_session=True,
                          env={**os.environ, "SPARK_LOCAL_IP": "127.0.0.1", **env})


def _copy_days(log: Path, src: Path, days: slice) -> None:
    for d in sorted(p.name for p in log.iterdir() if p.is_dir())[days]:
        shutil.copytree(log / d, src / d)


def test_killed_at_each_point_counts_every_line_once(log: Path, tmp_path: Path) -> None:
    """SIGKILL at each point of an arrow batch's commit and of the merged rows' update, then a
    run to the end: the tables and merged rows equal a clean run's (no JVM in any run)."""
    clean = cli(tmp_path / "clean" / "state", log, "arrow")
    assert clean.returncode == 0, clean.stderr[-2000:]
    src = tmp_path / "src"
    _copy_days(log, src, slice(0, 2))
    state = tmp_path / "killed" / "state"
    for point in ("staged", "planned", "moving", "committed", "merging", "merged"):
        r = cli(state, src, "arrow", KK_INGEST_DIE_AT=point)
        assert r.returncode == -9, (point, r.returncode, r.stderr[-2000:])
    assert [p.name for p in (state / "merged").iterdir()] == ["v0"]
    _copy_days(log, src, slice(2, None))
    shutil.copy(log / "torn.jsonl", src / "torn.jsonl")
    for point in ("staged", "moving", "merging"):
        r = cli(state, src, "arrow", KK_INGEST_DIE_AT=point)
        assert r.returncode == -9, (point, r.returncode, r.stderr[-2000:])
    done = cli(state, src, "arrow")
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads(done.stdout)["state"]["batches"] == 2
    assert rows(state) == rows(tmp_path / "clean" / "state")
    assert merged_rows(state) == merged_rows(tmp_path / "clean" / "state")
    assert not list((state / "staging").glob("*")) and not list((state / "batches").glob("*.pending"))
    assert not (state / "batches" / ing.ARROW_NEXT).exists() and not (state / "checkpoint").exists()


@pytest.mark.spark
def test_spark_arrow_spark_equals_a_full_rebuild(spark: Any, log: Path, tmp_path: Path) -> None:
    src, out = tmp_path / "src", tmp_path / "out"
    _copy_days(log, src, slice(0, 2))
    run_report([str(src)], str(out), engine="spark")
    _copy_days(log, src, slice(2, 3))
    run_report([str(src)], str(out), engine="arrow")
    _copy_days(log, src, slice(3, None))
    shutil.copy(log / "torn.jsonl", src / "torn.jsonl")
    run_report([str(src)], str(out), engine="spark")
    records = [json.loads((out / "state" / "batches" / f"{n}.json").read_text()) for n in range(3)]
    assert [r["engine"] for r in records] == ["spark", "arrow", "spark"]
    assert records[2]["stream_batch"] == 1  # Spark's second batch, the state's third
    full = tmp_path / "full"
    run_report([str(src)], str(full), full=True, engine="spark")
    assert rows(out / "state") == rows(full / "state")
    assert merged_rows(out / "state") == merged_rows(full / "state")
    for name in ("summary.json", "recoveries.csv/part-00000.csv", "bad_input.csv", "phase_stats.csv"):
        a, b = (out / "tables" / name).read_bytes(), (full / "tables" / name).read_bytes()
        assert sorted(a.splitlines()) == sorted(b.splitlines()), name
    # The merged rows were updated by both engines; made again by Spark from every partial
    # (two written by Spark, one in process), they are the same.
    want = merged_rows(out / "state")
    shutil.rmtree(out / "state" / "merged")
    merged.update(spark, ing.Layout(out / "state"))
    assert merged_rows(out / "state") == want


def test_auto_routes_each_file_to_one_engine(
    log: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    src = tmp_path / "src"
    _copy_days(log, src, slice(0, 1))
    lay = ing.Layout(tmp_path / "state")
    monkeypatch.setattr(landing, "ARROW_MAX_BYTES", 1)  # every input is "large"
    assert landing.land(lay, [src], 2e9, landing.AUTO) == ing.SPARK
    assert lay.spark_due.exists()
    first = sorted(p.name for p in lay.landing.iterdir())
    assert first and not list(lay.arrow_landing.iterdir())
    monkeypatch.setattr(landing, "ARROW_MAX_BYTES", 1 << 30)
    _copy_days(log, src, slice(1, 2))
    assert landing.land(lay, [src], 2e9, landing.AUTO) == ing.ARROW
    assert sorted(p.name for p in lay.landing.iterdir()) == first  # nothing more for Spark
    second = sorted(p.name for p in lay.arrow_landing.iterdir())
    assert second and not set(first) & set(second)
    assert {v["engine"] for v in json.loads(lay.landed.read_text()).values()} == {"spark", "arrow"}
    # Nothing new: nothing lands anywhere, whichever engine is named.
    assert landing.land(lay, [src], 2e9, ing.SPARK) == ing.SPARK
    assert sorted(p.name for p in lay.arrow_landing.iterdir()) == second


def test_an_arrow_run_starts_no_jvm_and_bad_engines_are_refused(log: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    cmd = [sys.executable, "-m", "kraftkeeper_reports.job", "--events", str(log), "--out", str(out)]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=900,
                       env={**os.environ, "KK_REPORT_TIMINGS": "1"})
    assert r.returncode == 0, r.stderr[-2000:]
    assert "(new input: arrow)" in r.stderr and "JVM" not in r.stderr and "Spark session" not in r.stderr
    assert (out / "report.html").exists() and not (out / "state" / "checkpoint").exists()
    assert json.loads((out / "state" / "batches" / "0.json").read_text())["engine"] == "arrow"
    for bad in ("duckdb", "ARROW", ""):
        with pytest.raises(SystemExit) as e:
            main(["--events", str(log), "--out", str(out), "--engine", bad])
        assert e.value.code == 2
