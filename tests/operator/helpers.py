"""What the in-process operator tests share: a settable clock, the full list of a recovery's
steps, kopf's daemon stop flag, and the exception that stands for the operator process dying."""

from __future__ import annotations

import asyncio

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
