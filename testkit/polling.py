"""Waiting for a condition: the one poll loop every test and benchmark helper delegates to.

The guide's rule is "poll for a condition, never sleep and hope": a test names what it waits for,
gives a deadline, and fails naming that condition and the last value seen. The interval between
two checks is pacing only; nothing depends on it.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

T = TypeVar("T")

# For a condition that asks processes which restart, move their leader or are still starting:
# any error means "not yet" (kept as the last value, so the failure names it).
ANY_ERROR: tuple[type[BaseException], ...] = (Exception,)


class _Poll:
    """The state both loops share: the deadline, the last value seen, and the failure message."""

    def __init__(self, what: str, timeout: float, errors: tuple[type[BaseException], ...],
                 context: Callable[[], str] | None) -> None:
        self.what, self.timeout, self.errors, self.context = what, timeout, errors, context
        self.deadline = time.monotonic() + timeout
        self.last: Any = None

    def over(self) -> bool:
        return time.monotonic() >= self.deadline

    def failure(self) -> AssertionError:
        extra = f"\n{self.context()}" if self.context else ""
        return AssertionError(
            f"timed out after {self.timeout:.0f} s waiting for {self.what} (last: {self.last!r}){extra}")


def wait_until(
    what: str,
    cond: Callable[[], T | None],
    timeout: float,
    interval: float = 0.2,
    *,
    errors: tuple[type[BaseException], ...] = (),
    context: Callable[[], str] | None = None,
) -> T:
    """Call ``cond()`` until it returns something truthy and return that. Exceptions of the
    ``errors`` types count as "not yet" (kept as the last value); any other propagates. On the
    deadline, fail naming ``what``, the last value, and ``context()`` if given."""
    p = _Poll(what, timeout, errors, context)
    while True:
        try:
            p.last = value = cond()
        except errors as e:
            p.last = e
        else:
            if value:
                return value
        if p.over():
            raise p.failure()
        time.sleep(interval)


async def async_wait_until(
    what: str,
    cond: Callable[[], Awaitable[T | None]],
    within: float,
    interval: float = 0.05,
    *,
    errors: tuple[type[BaseException], ...] = (),
    context: Callable[[], str] | None = None,
) -> T:
    """:func:`wait_until` for a coroutine condition, inside a running event loop (the loop keeps
    serving while it waits): the same arguments in the same order, rules and failure message (the
    deadline is named ``within`` only because an async ``timeout`` parameter reads as an
    asyncio timeout)."""
    p = _Poll(what, within, errors, context)
    while True:
        try:
            p.last = value = await cond()
        except errors as e:
            p.last = e
        else:
            if value:
                return value
        if p.over():
            raise p.failure()
        await asyncio.sleep(interval)


def now(cond: Callable[[], T | None]) -> Callable[[], Awaitable[T | None]]:
    """A synchronous condition as the coroutine condition :func:`async_wait_until` polls."""

    async def check() -> T | None:
        return cond()

    return check
