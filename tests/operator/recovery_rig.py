"""The recovery tests' rig (:class:`Rig`): the operator's recovery controller over the in-memory
quorum model (``kraftkeeper_operator.testing.memory``), a test clock, the telemetry sink and the
metrics, with helpers to replace a disk, run passes and restart the operator from its status.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from kraftkeeper_operator.controller import ControllerStatus, RecoveryController
from kraftkeeper_operator.core.recovery import (
    Recovery,
    RecoveryPolicy,
)
from kraftkeeper_operator.telemetry import MemorySink, OperatorMetrics
from kraftkeeper_operator.testing.memory import InMemoryQuorum

from tests.operator.helpers import Clock, OperatorCrash

POLICY = RecoveryPolicy(stabilization_seconds=10, max_lag=10, timeout_seconds=300, live_window_seconds=3)


class Rig:
    def __init__(self, n: int = 3, policy: RecoveryPolicy = POLICY, records: Iterable[Recovery] = ()) -> None:
        self.clock = Clock()
        self.q = InMemoryQuorum(n, self.clock.ms)
        self.sink = MemorySink()
        self.metrics = OperatorMetrics()
        self.saved: list[dict[str, Any]] = []
        self.ctl = self.controller(policy, records)

    def controller(
        self, policy: RecoveryPolicy = POLICY, records: Iterable[Recovery] = ()
    ) -> RecoveryController:
        async def persist(recs: list[dict[str, Any]]) -> None:
            self.saved = recs

        return RecoveryController(
            self.q,
            policy,
            cluster="test",
            sink=self.sink,
            metrics=self.metrics,
            clock=self.clock,
            records=records,
            persist=persist,
        )

    async def step(self, seconds: float = 1.0) -> ControllerStatus:
        self.clock.t += seconds
        self.q.tick()
        return await self.ctl.reconcile()

    async def run_until(self, cond: Any, limit: int = 200) -> ControllerStatus:
        for _ in range(limit):
            st = await self.step()
            if cond(st):
                return st
        raise AssertionError(f"condition not reached; events {self.sink.types()}")

    def crash_on(self, op: str) -> None:
        """The operator process dies when it next calls ``op`` on the quorum (before the call
        reaches it): a step was recorded as started, never issued."""
        real = getattr(self.q, op)

        async def crash(*args: Any) -> Any:
            setattr(self.q, op, real)  # once
            raise OperatorCrash(op)

        setattr(self.q, op, crash)

    async def run_until_crash(self, limit: int = 200) -> None:
        for _ in range(limit):
            try:
                await self.step()
            except OperatorCrash:
                return
        raise AssertionError(f"the operator never reached the crash point; events {self.sink.types()}")

    def voters(self) -> set[tuple[int, str]]:
        return set(self.q.voters)

    def changes(self) -> list[tuple[str, Any]]:
        return [c for c in self.q.calls if c[0] != "describe"]


def recovered(st: ControllerStatus) -> bool:
    return any(r["phase"] == "Completed" for r in st.recoveries)
