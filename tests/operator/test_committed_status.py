"""The status a controller pass returns after it committed a voter change lists the voter set that
change made, in every mode (the status written with a Succeeded record showed the voter set read
before the change until the next pass). In process, against the in-memory quorum, one pass per
reconcile so the pass that commits is the one whose status is published."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from kraftkeeper_operator.controller import RecoveryController
from kraftkeeper_operator.core.recovery import Order, RecoveryPolicy
from kraftkeeper_operator.telemetry import MemorySink
from kraftkeeper_operator.testing.memory import InMemoryQuorum

from tests.operator.helpers import Clock


@pytest.mark.parametrize("order", [Order.ADD_THEN_REMOVE, Order.REMOVE_THEN_ADD])
def test_the_pass_that_commits_publishes_the_voter_set_it_made(order: Order) -> None:
    policy = RecoveryPolicy(
        stabilization_seconds=1, max_lag=10, timeout_seconds=300, live_window_seconds=3, order=order
    )
    clock = Clock()
    q = InMemoryQuorum(3, clock.ms)
    ctl = RecoveryController(q, policy, cluster="t", sink=MemorySink(), clock=clock)
    ctl.MAX_STEPS = 1  # each reconcile is one pass: its status is the one of the committing pass

    async def main() -> list[dict[str, Any]]:
        q.tick()
        await ctl.reconcile()
        old = next(k for k in q.voters if k[0] == 3)
        new = (3, q.replace_disk(3, lag=0))
        published = []
        for _ in range(20):
            clock.t += 0.5
            q.tick()
            st = await ctl.reconcile()
            s = st.to_status()
            published.append(s)
            if st.committed:
                keys = {(v["id"], v["uuid"]) for v in s["voters"]}
                assert keys == set(q.voters), (st.action, keys, q.voters)
            if any(r.phase.value == "Completed" for r in st.records):
                keys = {(v["id"], v["uuid"]) for v in s["voters"]}
                assert new in keys and old not in keys, s
                return published
        raise AssertionError(f"the recovery did not complete: {published[-1]}")

    published = asyncio.run(main())
    assert sum(1 for s in published if s["phase"] == "Recovering") >= 1
