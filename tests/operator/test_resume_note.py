"""A restarted operator with ``eventLog: stdout`` has no log to read back, so a step logged just
before the restart may be logged again: the status says so plainly while the resumed
recovery runs, and not with an event log on disk."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from kraftkeeper_operator.controller import BLIND_RESUME, RecoveryController
from kraftkeeper_operator.core.recovery import RecoveryPolicy
from kraftkeeper_operator.telemetry import EventLogSink, EventSink, FanOut, MemorySink, StdoutEventSink
from kraftkeeper_operator.testing.memory import InMemoryQuorum

from tests.operator.helpers import Clock, crash_after_add_committed

POLICY = RecoveryPolicy(stabilization_seconds=2, max_lag=10, timeout_seconds=300, live_window_seconds=3)


async def _resumed(sink: EventSink) -> str:
    """Run a recovery until the operator dies right after AddVoter committed (before its
    progress was persisted), then restart it from what was persisted, with ``sink``: the
    Recovering condition's message of the restarted operator's first pass."""
    clock = Clock()
    q = InMemoryQuorum(3, clock.ms)
    records = await crash_after_add_committed(q, clock, POLICY, MemorySink())

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
