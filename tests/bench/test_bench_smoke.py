"""Smoke tests of the benchmark harness (bench/): the real scripts, run briefly, on loopback.

The full comparison (etcd, wrk) is not run here: it needs scripts/install-bench.sh and minutes of
machine time. These tests run the kraftkeeper side and the PySyncObj side in ``--quick`` mode for
a few seconds with whichever generator is present, and check bad options and the cleanup of
process groups.
"""

from __future__ import annotations

import base64
import contextlib
import importlib.util
import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
# The benchmarks are scripts run as `python -m bench.engine` from the repository root; make the
# same import work in-process for the small checks below.
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from bench.load import _b64, _request_bytes, wrk_script  # noqa: E402
from bench.procs import ProcessSet  # noqa: E402
from testkit.polling import wait_until  # noqa: E402

NEEDS_PYSYNCOBJ = pytest.mark.skipif(
    importlib.util.find_spec("pysyncobj") is None, reason="pysyncobj (dev extra) is not installed"
)


def run_bench(module: str, *args: str, timeout: float = 240) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", module, *args], cwd=REPO, capture_output=True, text=True, timeout=timeout,
    )


def test_etcd_keys_compose_from_3_byte_chunks() -> None:
    # The wrk script builds etcd's base64 keys by concatenating the base64 of 3-byte chunks.
    assert _b64(b"b1-") + _b64(b"012") + _b64(b"345") == base64.b64encode(b"b1-012345").decode()
    script = wrk_script("etcd", 100)
    assert '"' + _b64(b"999") + '"' in script and "/v3/kv/put" in script
    with pytest.raises(ValueError, match="unknown target kind 'nope'"):
        wrk_script("nope", 100)


def test_request_bytes_are_valid_http() -> None:
    raw = _request_bytes("etcd", "127.0.0.1", 42, 3, b"x" * 100)
    head, _, body = raw.partition(b"\r\n\r\n")
    assert head.startswith(b"POST /v3/kv/put HTTP/1.1")
    assert f"Content-Length: {len(body)}".encode() in head
    doc = json.loads(body)
    assert base64.b64decode(doc["key"]) == b"b3-000042"
    assert base64.b64decode(doc["value"]) == b"x" * 100
    kv = _request_bytes("kv", "h", 7, 1, b"abc")
    assert kv.startswith(b"PUT /v1/kv/b1-000007 HTTP/1.1") and kv.endswith(b"\r\n\r\nabc")


def test_process_set_kills_whole_groups(tmp_path: Path) -> None:
    pidfile = tmp_path / "child.pid"
    # A parent that starts a grandchild and ignores SIGTERM: close() must still end both.
    code = (
        "import os, signal, subprocess, sys\n"
        "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
        "c = subprocess.Popen([sys.executable, '-c', 'import signal; signal.pause()'])\n"
        f"open({str(pidfile)!r}, 'w').write(str(c.pid))\n"
        "signal.pause()\n"  # both run until killed: that is what close() is tested on
    )
    procs = ProcessSet(tmp_path / "logs")
    parent = procs.spawn("parent", [sys.executable, "-c", code])
    wait_until("the grandchild to start", lambda: pidfile.exists() and pidfile.read_text(), 30, 0.05)
    child = int(pidfile.read_text())
    procs.close()
    assert parent.popen.poll() is not None

    def gone(pid: int) -> bool:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        # A zombie re-parented to init counts as gone once reaped; check its state.
        stat = Path(f"/proc/{pid}/stat")
        return stat.exists() and stat.read_text().split(") ")[1].startswith("Z")

    wait_until(f"grandchild {child} to be gone after ProcessSet.close()", lambda: gone(child), 30, 0.05)


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--clients", "0"], "--clients"),
        (["--clients", "1,x"], "--clients"),
        (["--peers", "consul"], "consul"),
        (["--kraftkeeper", "fast"], "fast"),
        (["--duration", "-1"], "--duration"),
    ],
)
def test_engine_bench_rejects_bad_options(args: list[str], needle: str) -> None:
    res = run_bench("bench.engine", *args, timeout=60)
    assert res.returncode == 2
    assert needle in res.stderr


def test_recovery_bench_rejects_bad_sizes() -> None:
    res = run_bench("bench.recovery", "--sizes", "10XB", timeout=60)
    assert res.returncode == 2
    assert "10XB" in res.stderr


@pytest.mark.parametrize("script", ["engine", "recovery", "operator", "report"])
def test_bench_entry_points_run_as_files_from_anywhere(script: str, tmp_path: Path) -> None:
    """`python bench/<name>.py` works as `python -m bench.<name>` does, from any directory (the
    issues and the bench docstrings name the files). The scripts put the repository root on the
    path instead of bench/, where operator.py would shadow the standard library's module."""
    path = REPO / "bench" / f"{script}.py"
    ok = subprocess.run([sys.executable, str(path), "--help"], cwd=tmp_path, capture_output=True,
                        text=True, timeout=60)
    assert ok.returncode == 0, ok.stderr
    assert ok.stdout.startswith("usage:"), ok.stdout
    bad = subprocess.run([sys.executable, str(path), "--no-such-option"], cwd=tmp_path,
                         capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "--no-such-option" in bad.stderr, bad.stderr


def _check_rows(doc: dict[str, object], expect: set[str], clients: list[int]) -> None:
    rows = doc["rows"]
    assert isinstance(rows, list)
    assert {r["system"] for r in rows} == expect
    for r in rows:
        assert r["error"] is None, r
        for c in clients:
            run = r["runs"][str(c)]
            assert run["ok"] > 0 and run["writes_per_s"] > 0, r
            assert 0 < run["p50_ms"] <= run["p99_ms"], r
        assert r["half_load"] is not None and r["half_load"]["ok"] > 0, r


@pytest.mark.slow
@NEEDS_PYSYNCOBJ
def test_pysyncobj_side_quick(tmp_path: Path) -> None:
    out = tmp_path / "res.json"
    res = run_bench("bench.engine", "--quick", "--duration", "1", "--clients", "1,4", "--kraftkeeper", "none",
                    "--peers", "pysyncobj", "--json", str(out))
    assert res.returncode == 0, res.stderr[-3000:]
    _check_rows(json.loads(out.read_text()), {"pysyncobj batch", "pysyncobj nobatch"}, [1, 4])
    assert "generator ceiling" in res.stdout
    assert "pysyncobj nobatch" in res.stdout and "p99 @50% peak" in res.stdout


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("quorum.runtime.node") is None,
                    reason="the engine runtime (quorum.runtime) is not in this checkout")
def test_kraftkeeper_side_quick(tmp_path: Path) -> None:
    out = tmp_path / "res.json"
    # The asyncio generator here (wrk, when installed, drives the PySyncObj test above): it is
    # what a machine without scripts/install-bench.sh uses, so both paths stay tested.
    res = run_bench("bench.engine", "--quick", "--duration", "1", "--clients", "1,8", "--peers", "none",
                    "--kraftkeeper", "fsync,nofsync", "--generator", "asyncio", "--json", str(out))
    assert res.returncode == 0, res.stderr[-3000:]
    doc = json.loads(out.read_text())
    assert doc["generator"] == "asyncio"
    _check_rows(doc, {"kraftkeeper fsync", "kraftkeeper nofsync"}, [1, 8])
    assert "kraftkeeper fsync" in res.stdout


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("quorum.runtime.node") is None,
                    reason="the engine runtime (quorum.runtime) is not in this checkout")
def test_recovery_bench_small_log(tmp_path: Path) -> None:
    out = tmp_path / "rec.json"
    res = run_bench("bench.recovery", "--sizes", "2MB", "--value-bytes", "16384", "--json", str(out))
    assert res.returncode == 0, res.stderr[-3000:]
    (r,) = json.loads(out.read_text())
    assert r["filled_bytes"] >= 2_000_000
    assert r["catch_up_s"] > 0 and r["add_voter_s"] > 0 and r["remove_voter_s"] > 0
    assert r["total_s"] >= r["catch_up_s"]
    assert "remove-voter ms" in res.stdout


def _sigint_default() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)


@pytest.mark.slow
@NEEDS_PYSYNCOBJ
def test_interrupt_cleans_up_every_process(tmp_path: Path) -> None:
    psutil = pytest.importorskip("psutil", reason="psutil (dev extra) is not installed")
    err = tmp_path / "stderr"
    with open(err, "w") as f:
        bench = subprocess.Popen(
            [sys.executable, "-m", "bench.engine", "--duration", "60", "--clients", "4",
             "--kraftkeeper", "none", "--peers", "pysyncobj", "--sizes", "100"],
            cwd=REPO, stdout=subprocess.DEVNULL, stderr=f, start_new_session=True,
            # Ctrl-C reaches a foreground process, whose SIGINT is at its default. A suite run in
            # the background of a non-interactive shell inherits SIGINT *ignored*, and Python then
            # installs no KeyboardInterrupt handler: the SIGINT below would be dropped.
            preexec_fn=_sigint_default,
        )
    kids: list[Any] = []
    try:
        me = psutil.Process(bench.pid)

        def cluster_up() -> bool:
            # The cluster and a load run are up: 3 nodes + a generator are descendants.
            assert bench.poll() is None, err.read_text()[-2000:]
            return "starting pysyncobj" in err.read_text() and len(me.children(recursive=True)) >= 4

        wait_until("the benchmark to start its cluster", cluster_up, 120, 0.1)
        kids = me.children(recursive=True)
        assert len(kids) >= 3
        os.kill(bench.pid, signal.SIGINT)  # what Ctrl-C delivers
        assert bench.wait(120) == 130, err.read_text()[-2000:]
        assert "interrupted: all benchmark processes stopped" in err.read_text()
        _, alive = psutil.wait_procs(kids, timeout=30)
        assert alive == [], f"left running after Ctrl-C: {alive}"
    finally:
        if bench.poll() is None:
            os.killpg(bench.pid, signal.SIGKILL)
            bench.wait()
        # The nodes run in their own sessions: a failed stop must not leave them to the next tests.
        for kid in kids:
            with contextlib.suppress(psutil.Error):
                kid.kill()


def test_operator_bench_hands_kafka_rows_to_the_kafka_bench() -> None:
    """`python -m bench.operator kafka ...` is bench/kafka_recovery.py (the Kafka rows)."""
    res = subprocess.run([sys.executable, "-m", "bench.operator", "kafka", "--modes", "bogus"],
                         cwd=REPO, capture_output=True, text=True, timeout=120)
    assert res.returncode == 2
    assert "--modes ['bogus'] unknown (known: watch-0, watch-default, auto-join, manual)" in res.stderr
