"""What the in-process operator tests share: a settable clock, the full list of a recovery's
steps, kopf's daemon stop flag, the exception that stands for the operator process dying (and a
recovery run until it dies right after AddVoter committed), and a recorder of the Kubernetes
Events a unit under test posts (kube.py's ``KubeApi.notify``)."""

from __future__ import annotations

import asyncio
from typing import Any

from kraftkeeper_operator.controller import RecoveryController
from kraftkeeper_operator.core.recovery import Recovery, RecoveryPolicy
from kraftkeeper_operator.telemetry import EventSink
from kraftkeeper_operator.testing.memory import InMemoryQuorum
from kraftkeeper_reports.events import RECOVERY_COMPLETED, STEP_TYPES

# Every step of a disk-replacement recovery, in the event log's order (AddThenRemove).
FULL = [*STEP_TYPES, RECOVERY_COMPLETED]


class Clock:
    """A clock the test moves (``t`` in seconds); ``ms()`` for the in-memory quorum."""

    def __init__(self) -> None:
        self.t = 1_700_000_000.0

    def __call__(self) -> float:
        return self.t

    def ms(self) -> int:
        return int(self.t * 1000)


class OperatorCrash(BaseException):
    """The operator process dies here (nothing in the operator catches a BaseException)."""


async def crash_after_add_committed(
    q: InMemoryQuorum, clock: Clock, policy: RecoveryPolicy, sink: EventSink, cluster: str = "t"
) -> list[Recovery]:
    """Replace replica 3's disk and run the controller until the operator dies right after
    AddVoter committed: its event logged to ``sink``, its progress not yet persisted. Returns the
    records persisted before that (what a restarted operator reads back)."""
    saved: list[dict[str, Any]] = []

    async def persist(recs: list[dict[str, Any]]) -> None:
        if any(r["addCommittedMs"] is not None for r in recs):
            raise OperatorCrash()
        saved[:] = recs

    ctl = RecoveryController(q, policy, cluster=cluster, sink=sink, clock=clock, persist=persist)
    q.replace_disk(3, lag=0)
    try:
        for _ in range(30):
            clock.t += 1
            q.tick()
            await ctl.reconcile()
    except OperatorCrash:
        return [Recovery.from_dict(d) for d in saved]
    raise AssertionError("the operator never reached AddVoter committed")


class Stopped:
    """kopf's DaemonStopped as the daemon uses it: truthiness and ``await stopped.wait(t)``."""

    def __init__(self) -> None:
        self.event = asyncio.Event()

    def __bool__(self) -> bool:
        return self.event.is_set()

    async def wait(self, seconds: float) -> None:
        try:
            await asyncio.wait_for(self.event.wait(), seconds)
        except TimeoutError:
            pass


class Notices:
    """Records what ``KubeApi.notify`` / ``post_event`` would post, as (type, reason), for units
    tested without an API server; ``messages`` keeps the texts."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, str]] = []
        self.messages: list[str] = []

    async def post_event(self, obj: Any, *, warning: bool, reason: str, message: str) -> None:
        self.seen.append(("Warning" if warning else "Normal", reason))
        self.messages.append(message)

    async def notify(self, obj: Any, *, warning: bool, reason: str, message: str) -> bool:
        await self.post_event(obj, warning=warning, reason=reason, message=message)
        return True
