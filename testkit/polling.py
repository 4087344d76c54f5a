"""Waiting for a condition in a test or a benchmark: the product's poll loop
(:mod:`quorum.polling`), failing as a test fails.

The guide's rule is "poll for a condition, never sleep and hope": a test names what it waits for,
gives a deadline, and fails naming that condition and the last value seen. The interval between
two checks is pacing only; nothing depends on it.

:func:`wait_until` and :func:`async_wait_until` are :func:`quorum.polling.wait_until` and
:func:`quorum.polling.async_wait_until` with the same arguments, raising an ``AssertionError``
with the same message on the deadline instead of ``TimedOut``.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from functools import partial
from typing import TypeVar

from quorum import polling

__all__ = ["ANY_ERROR", "async_wait_until", "now", "wait_until"]

T = TypeVar("T")

# For a condition that asks processes which restart, move their leader or are still starting:
# any error means "not yet" (kept as the last value, so the failure names it).
ANY_ERROR: tuple[type[BaseException], ...] = (Exception,)

wait_until = partial(polling.wait_until, fail=AssertionError)
async_wait_until = partial(polling.async_wait_until, fail=AssertionError)


def now(cond: Callable[[], T | None]) -> Callable[[], Awaitable[T | None]]:
    """A synchronous condition as the coroutine condition :func:`async_wait_until` polls."""

    async def check() -> T | None:
        return cond()

    return check
