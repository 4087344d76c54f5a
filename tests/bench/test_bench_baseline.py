"""``bench.engine --baseline REV`` (throughput before and after, same invocation).

The pure parts (round order, ratios, median round) in-process; the git export and the CLI
check against this repository's own HEAD; one short real run with HEAD as the baseline, so
both rows run real 3-node clusters interleaved in one invocation.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from bench.baseline import Pair, median_run, ratio_lines, round_order  # noqa: E402
from bench.load import LoadResult  # noqa: E402
from testkit.revision import export_tree, missing_start_flags  # noqa: E402


def run_engine(*args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "bench.engine", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def result(ok: int, clients: int = 16) -> LoadResult:
    return LoadResult("asyncio", clients, 1.0, ok, 0, 1.0, 2.0, 3.0)


def test_rounds_alternate_which_side_goes_first() -> None:
    assert [round_order(r) for r in range(4)] == [(0, 1), (1, 0), (0, 1), (1, 0)]


def test_ratio_lines_give_the_median_of_per_round_ratios() -> None:
    p = Pair("kraftkeeper fsync", "66287ff", 100)
    p.current[16] = [result(90), result(120), result(50)]
    p.baseline[16] = [result(100), result(100), result(100)]
    p.baseline[128] = [result(0, 128)]
    p.current[128] = [result(10, 128)]
    assert p.ratios(16) == [0.9, 1.2, 0.5]
    assert p.ratios(128) == []  # a baseline round that wrote nothing gives no ratio
    (line,) = ratio_lines([p], [16, 128])
    assert line.startswith("kraftkeeper fsync now / @66287ff, 100 B: 16 clients 0.90x [0.90 1.20 0.50]")
    assert "(90 vs 100 w/s)" in line and "128 clients n/a" in line
    assert median_run(p.current[16]).ok == 90
    assert median_run([result(5), result(7)]).ok == 5  # lower middle of an even count


def test_export_tree_refuses_an_unknown_revision(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="'no-such-rev-xyz': not a commit"):
        export_tree("no-such-rev-xyz", tmp_path)
    assert not list(tmp_path.iterdir())


def test_export_tree_and_its_start_flags(tmp_path: Path) -> None:
    tree = export_tree("HEAD", tmp_path)
    assert (tree.source / "quorum" / "cli.py").is_file() and len(tree.rev) >= 7
    assert tree.source.parent == tmp_path
    # The exported tree's own CLI answers, not the venv's editable install.
    assert missing_start_flags(tree, ["--listen", "--voters", "--no-such-flag-xyz"]) == ["--no-such-flag-xyz"]


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--baseline", "no-such-rev-xyz"], "not a commit"),
        (["--baseline", "HEAD", "--rounds", "0"], "--rounds must be > 0"),
        (["--rounds", "2"], "--rounds applies to --baseline only"),
        (["--baseline", "HEAD", "--kraftkeeper", "none", "--peers", "etcd"], "needs at least one"),
    ],
)
def test_engine_bench_rejects_bad_baseline_options(args: list[str], needle: str) -> None:
    res = run_engine(*args, timeout=60)
    assert res.returncode == 2, res.stderr[-2000:]
    assert needle in res.stderr


@pytest.mark.slow
def test_baseline_rows_run_interleaved_in_one_invocation(tmp_path: Path) -> None:
    out = tmp_path / "res.json"
    res = run_engine(
        "--quick", "--duration", "1", "--clients", "1,4", "--peers", "none", "--kraftkeeper", "fsync",
        "--no-half-load", "--baseline", "HEAD", "--rounds", "2", "--json", str(out),
    )  # fmt: skip
    assert res.returncode == 0, res.stderr[-3000:]
    doc = json.loads(out.read_text())
    (pair,) = doc["baseline"]
    rev = pair["rev"]
    assert {r["system"] for r in doc["rows"]} == {"kraftkeeper fsync", f"kraftkeeper fsync @{rev}"}
    for c in ("1", "4"):
        rounds = pair["rounds"][c]
        assert len(rounds["now"]) == 2 and len(rounds["baseline"]) == 2
        assert all(x["ok"] > 0 for x in rounds["now"] + rounds["baseline"])
        assert len(rounds["ratios"]) == 2 and all(r > 0 for r in rounds["ratios"])
    # interleaved: round 1 runs now then baseline, round 2 baseline then now
    runs = [ln.split("clients")[0] for ln in res.stderr.splitlines() if ln.strip().startswith("round ")]
    assert [("@" in ln) for ln in runs] == [False, True, False, True, True, False, True, False]
    assert f"kraftkeeper fsync now / @{rev}, 100 B: 1 clients" in res.stdout
    work = Path(res.stderr.splitlines()[0].split(";")[0].removeprefix("work dir "))
    assert work.name.startswith("kk-bench-") and not work.exists()  # exported tree removed too
