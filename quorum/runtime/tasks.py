"""Background tasks of one node (outbound RPCs, snapshots, recovery verification), kept so
that shutdown can wait for them or cancel them; nothing is left running after ``Node.run``."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any

__all__ = ["Tasks"]


class Tasks:
    def __init__(self) -> None:
        self._tasks: set[asyncio.Task[Any]] = set()

    def spawn(self, coro: Coroutine[Any, Any, Any]) -> asyncio.Task[Any]:
        t = asyncio.create_task(coro)
        self._tasks.add(t)
        t.add_done_callback(self._tasks.discard)
        return t

    async def wait(self, limit_s: float) -> None:
        """Let running tasks finish, for at most ``limit_s`` seconds."""
        if self._tasks:
            await asyncio.wait(list(self._tasks), timeout=limit_s)

    async def cancel_all(self) -> None:
        tasks = list(self._tasks)
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
