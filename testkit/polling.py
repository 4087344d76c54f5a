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
    deadline = time.monotonic() + timeout
    last: Any = None
    while True:
        try:
            value = cond()
        except errors as e:
            last = e
        else:
            last = value
            if value:
                return value
        if time.monotonic() >= deadline:
            break
        time.sleep(interval)
    extra = f"\n{context()}" if context else ""
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what} (last: {last!r}){extra}")


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
    serving while it waits): the same rules and failure message; ``within`` is the deadline (s)."""
    deadline = time.monotonic() + within
    last: Any = None
    while True:
        try:
            value = await cond()
        except errors as e:
            last = e
        else:
            last = value
            if value:
                return value
        if time.monotonic() >= deadline:
            break
        await asyncio.sleep(interval)
    extra = f"\n{context()}" if context else ""
    raise AssertionError(f"timed out after {within:.0f} s waiting for {what} (last: {last!r}){extra}")


def now(cond: Callable[[], T | None]) -> Callable[[], Awaitable[T | None]]:
    """A synchronous condition as the coroutine condition :func:`async_wait_until` polls."""

    async def check() -> T | None:
        return cond()

    return check
