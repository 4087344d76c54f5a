"""``eventLog: stdout`` across an operator crash: the step the operator logged just before it
stopped (AddVoter committed, its progress not yet persisted) is logged again by the restarted one,
which cannot read standard output back. The repeat carries the first line's idempotent key
(vocabulary.py ``step_key``) and ``detail.observed: true``, and the report job counts the step
once: the first line of the key, the recovery completed and counted once.

The log is the real one: the recovery controller's passes against the in-memory quorum, its
``StdoutEventSink`` captured; the report is the real Spark job."""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from kraftkeeper_operator.controller import RecoveryController
from kraftkeeper_operator.core.recovery import RecoveryPolicy
from kraftkeeper_operator.telemetry import StdoutEventSink
from kraftkeeper_operator.testing.memory import InMemoryQuorum
from kraftkeeper_reports import events as ev
from kraftkeeper_reports.vocabulary import ONCE_TYPES, step_key

from tests.operator.helpers import Clock, crash_after_add_committed

POLICY = RecoveryPolicy(stabilization_seconds=2, max_lag=10, timeout_seconds=300, live_window_seconds=3)


async def _crash_and_resume() -> str:
    """A recovery whose operator stops right after AddVoter committed, then a restarted one that
    finishes it; both log to stdout. Returns the recovery id."""
    clock = Clock()
    q = InMemoryQuorum(3, clock.ms)
    records = await crash_after_add_committed(q, clock, POLICY, StdoutEventSink("ns/q"), "ns/q")
    again = RecoveryController(
        q, POLICY, cluster="ns/q", sink=StdoutEventSink("ns/q"), clock=clock, records=records
    )
    for _ in range(30):
        clock.t += 1
        q.tick()
        await again.reconcile()
        if not again.book.active():
            break
    (rec,) = again.book.records
    assert rec.phase.value == "Completed"
    return rec.recovery_id


@pytest.fixture
def stdout_log(capsys: pytest.CaptureFixture[str]) -> tuple[str, list[dict[str, Any]]]:
    rid = asyncio.run(_crash_and_resume())
    lines = [json.loads(x) for x in capsys.readouterr().out.splitlines() if x.startswith("{")]
    return rid, lines


def test_the_repeated_step_carries_the_first_lines_key(stdout_log: tuple[str, list[dict[str, Any]]]) -> None:
    rid, lines = stdout_log
    keys = Counter(k for k in map(step_key, lines) if k is not None)
    assert keys[("ns/q", rid, ev.ADD_VOTER_COMMITTED)] == 2, lines
    assert {k[2] for k in keys} == set(ONCE_TYPES) - {ev.RECOVERY_FAILED}
    assert all(n == 1 for k, n in keys.items() if k[2] != ev.ADD_VOTER_COMMITTED), keys
    first, repeat = (x for x in lines if x["type"] == ev.ADD_VOTER_COMMITTED)
    assert "observed" not in first["detail"] and repeat["detail"]["observed"] is True


@pytest.mark.spark
def test_the_report_counts_the_repeated_step_once(
    spark: Any, stdout_log: tuple[str, list[dict[str, Any]]], tmp_path: Path
) -> None:
    from kraftkeeper_reports.job import compute

    rid, lines = stdout_log
    (tmp_path / "stdout.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    tables = compute(spark, [tmp_path.as_uri()], top=5, collect_recoveries=True)
    assert tables.recoveries is not None
    recs = tables.recoveries.set_index("recovery_id")
    assert list(recs.index) == [rid] and recs.loc[rid]["outcome"] == "completed"
    t0 = ev.parse_ts_ms(next(x["ts"] for x in lines if x["type"] == ev.DISK_REPLACEMENT_DETECTED))
    added = ev.parse_ts_ms(next(x["ts"] for x in lines if x["type"] == ev.ADD_VOTER_COMMITTED))
    assert t0 is not None and added is not None
    assert recs.loc[rid]["under_replicated_ms"] == added - t0  # the first line of the key
    st = tables.phase_stats
    total = st[(st["cluster"] == "(all)") & (st["phase"] == "total")].iloc[0]
    assert total["recoveries"] == 1 and tables.summary["completed"] == 1
