"""What the in-process operator tests share: a settable clock, the full list of a recovery's
steps, kopf's daemon stop flag, the exception that stands for the operator process dying, and a
recorder of the Kubernetes Events a unit under test posts (kube.py's ``KubeApi.notify``)."""

from __future__ import annotations

import asyncio
from typing import Any

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
