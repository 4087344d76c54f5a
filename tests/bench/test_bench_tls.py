"""Smoke test of the TLS rows of bench/engine.py: ``kraftkeeper fsync+tls`` and
``etcd tls`` run in the same invocation as their plaintext rows, briefly, on loopback, and the
output reports the cost of TLS and the ratio to etcd with TLS."""

from __future__ import annotations

import importlib.util
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from bench.engine import Row, _tls_cost  # noqa: E402
from bench.load import LoadResult  # noqa: E402


def _res(wps: float, p99: float) -> LoadResult:
    return LoadResult(
        generator="asyncio",
        clients=8,
        duration_s=1.0,
        ok=int(wps),
        errors=0,
        p50_ms=p99 / 2,
        p99_ms=p99,
        max_ms=p99,
    )


def test_tls_cost_lines() -> None:
    rows = [
        Row("kraftkeeper fsync", "kraftkeeper", 100, runs={128: _res(1000, 10)}),
        Row("kraftkeeper fsync+tls", "kraftkeeper", 100, tls=True, runs={128: _res(800, 12)}),
        Row("etcd", "etcd", 100, runs={128: _res(500, 20)}),
        Row("etcd tls", "etcd", 100, tls=True, runs={128: _res(400, 30)}),
    ]
    lines = _tls_cost(rows, [128])
    assert any("kraftkeeper fsync+tls vs kraftkeeper fsync" in x and "-20% w/s" in x for x in lines), lines
    assert any("etcd tls vs etcd" in x and "-20% w/s" in x for x in lines), lines
    assert any("vs etcd tls at 128 clients: 2.00x" in x for x in lines), lines
    assert _tls_cost(rows[:1], [128]) == []


def test_wrk_cannot_drive_tls_rows() -> None:
    res = subprocess.run(
        [
            sys.executable,
            "-m",
            "bench.engine",
            "--generator",
            "wrk",
            "--peers",
            "none",
            "--kraftkeeper",
            "fsync+tls",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert res.returncode == 2 and ("wrk" in res.stderr), res.stderr


@pytest.mark.slow
@pytest.mark.skipif(
    importlib.util.find_spec("quorum.runtime.node") is None,
    reason="the engine runtime (quorum.runtime) is not in this checkout",
)
def test_tls_rows_quick(tmp_path: Path) -> None:
    out = tmp_path / "res.json"
    peers = "etcd,etcd-tls" if shutil.which("etcd") else "none"
    res = subprocess.run(
        [
            sys.executable,
            "-m",
            "bench.engine",
            "--quick",
            "--duration",
            "1",
            "--clients",
            "4",
            "--no-half-load",
            "--kraftkeeper",
            "fsync,fsync+tls",
            "--peers",
            peers,
            "--json",
            str(out),
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    doc = json.loads(out.read_text())
    assert doc["generator"] == "asyncio"
    systems = {r["system"]: r for r in doc["rows"]}
    expect = {"kraftkeeper fsync", "kraftkeeper fsync+tls"} | (
        {"etcd", "etcd tls"} if peers != "none" else set()
    )
    assert set(systems) == expect
    for r in systems.values():
        assert r["error"] is None and r["runs"]["4"]["ok"] > 0 and r["runs"]["4"]["errors"] == 0, r
    assert "cost of TLS, kraftkeeper fsync+tls vs kraftkeeper fsync" in res.stdout
    # the generator's own ceiling over mutual TLS, beside the plaintext one
    assert doc["ceiling"]["asyncio+tls"]["ok"] > 0 and doc["ceiling"]["asyncio+tls"]["errors"] == 0
    assert "generator ceiling: asyncio+tls" in res.stdout
    if peers != "none":
        assert "cost of TLS, etcd tls vs etcd" in res.stdout
        assert "kraftkeeper fsync+tls vs etcd tls at 4 clients" in res.stdout
