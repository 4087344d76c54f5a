"""A restarted operator with ``eventLog: stdout`` has no log to read back, so a step logged just
before the restart may be logged again: the status says so plainly while the resumed
recovery runs, and not with an event log on disk."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from kraftkeeper_operator.controller import BLIND_RESUME, RecoveryController
from kraftkeeper_operator.core.recovery import Recovery, RecoveryPolicy
from kraftkeeper_operator.telemetry import EventLogSink, EventSink, FanOut, MemorySink, StdoutEventSink
from kraftkeeper_operator.testing.memory import InMemoryQuorum

from tests.operator.helpers import Clock, OperatorCrash

POLICY = RecoveryPolicy(stabilization_seconds=2, max_lag=10, timeout_seconds=300, live_window_seconds=3)


async def _resumed(sink: EventSink) -> str:
    """Run a recovery until the operator dies right after AddVoter committed (before its
    progress was persisted), then restart it from what was persisted, with ``sink``: the
    Recovering condition's message of the restarted operator's first pass."""
    clock = Clock()
    q = InMemoryQuorum(3, clock.ms)
    saved: list[dict[str, Any]] = []

    async def persist(recs: list[dict[str, Any]]) -> None:
        if any(r["addCommittedMs"] is not None for r in recs):
            raise OperatorCrash()
        saved[:] = recs

    first = RecoveryController(q, POLICY, cluster="t", sink=MemorySink(), clock=clock, persist=persist)
    q.replace_disk(3, lag=0)
    with pytest.raises(OperatorCrash):
        for _ in range(30):
            clock.t += 1
            q.tick()
            await first.reconcile()
    records = [Recovery.from_dict(d) for d in saved]

    async def unreachable(*_: Any) -> dict[str, Any]:
        raise TimeoutError("leader busy")  # retried later: the recovery stays in progress

    q.remove_voter = unreachable  # type: ignore[method-assign,assignment]
    again = RecoveryController(q, POLICY, cluster="t", sink=sink, clock=clock, records=records)
    clock.t += 0.1
    st = await again.reconcile()
    assert st.condition("Recovering").status  # RemoveVoter is still to come
    return st.condition("Recovering").message


@pytest.mark.parametrize("stdout", [True, False])
async def test_a_blind_resume_is_said_in_the_status(tmp_path: Path, stdout: bool) -> None:
    log: EventSink = StdoutEventSink("t") if stdout else EventLogSink(tmp_path, "t")
    sink = FanOut(log, MemorySink())
    msg = await _resumed(sink)
    assert (BLIND_RESUME in msg) is stdout, msg
