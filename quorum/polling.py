"""Waiting for a condition: the one poll loop of the product, the tests and the benchmarks.

A wait names what it waits for, gives a deadline, and fails naming that condition and the last
value seen (a value, or the error that meant "not yet"). The interval between two checks is
pacing only; nothing depends on it. The product (the demo, the Kafka probes) fails with
:class:`TimedOut`; the tests' wrappers in ``testkit.polling`` fail with an ``AssertionError``
carrying the same message.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

__all__ = ["TimedOut", "async_wait_until", "wait_until"]

T = TypeVar("T")


class TimedOut(TimeoutError):
    """The condition was not met by the deadline; the message names it and the last value."""


class _Poll:
    """The state both loops share: the deadline, the last value seen, and the failure message."""

    def __init__(self, what: str, timeout: float, errors: tuple[type[BaseException], ...],
                 context: Callable[[], str] | None) -> None:
        self.what, self.timeout, self.errors, self.context = what, timeout, errors, context
        self.deadline = time.monotonic() + timeout
        self.last: Any = None

    def over(self) -> bool:
        return time.monotonic() >= self.deadline

    def failure(self) -> TimedOut:
        extra = f"\n{self.context()}" if self.context else ""
        return TimedOut(
            f"timed out after {self.timeout:g} s waiting for {self.what} (last: {self.last!r}){extra}")


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
    deadline, raise :class:`TimedOut` naming ``what``, the last value, and ``context()``."""
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
    serving while it waits): the same arguments in the same order and the same rules (the
    deadline is named ``within`` only because an async ``timeout`` parameter reads as an asyncio
    timeout)."""
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
