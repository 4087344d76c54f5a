"""Waiting for a condition in a test or a benchmark: the product's poll loop
(:mod:`quorum.polling`), failing as a test fails.

The guide's rule is "poll for a condition, never sleep and hope": a test names what it waits for,
gives a deadline, and fails naming that condition and the last value seen. The interval between
two checks is pacing only; nothing depends on it.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TypeVar

from quorum import polling

__all__ = ["ANY_ERROR", "async_wait_until", "now", "wait_until"]

T = TypeVar("T")

# For a condition that asks processes which restart, move their leader or are still starting:
# any error means "not yet" (kept as the last value, so the failure names it).
ANY_ERROR: tuple[type[BaseException], ...] = (Exception,)


def wait_until(
    what: str,
    cond: Callable[[], T | None],
    timeout: float,
    interval: float = 0.2,
    *,
    errors: tuple[type[BaseException], ...] = (),
    context: Callable[[], str] | None = None,
) -> T:
    """:func:`quorum.polling.wait_until`; on the deadline an ``AssertionError`` naming ``what``,
    the last value, and ``context()`` if given."""
    try:
        return polling.wait_until(what, cond, timeout, interval, errors=errors, context=context)
    except polling.TimedOut as e:
        raise AssertionError(str(e)) from None


async def async_wait_until(
    what: str,
    cond: Callable[[], Awaitable[T | None]],
    within: float,
    interval: float = 0.05,
    *,
    errors: tuple[type[BaseException], ...] = (),
    context: Callable[[], str] | None = None,
) -> T:
    """:func:`quorum.polling.async_wait_until`, failing as :func:`wait_until` does."""
    try:
        return await polling.async_wait_until(what, cond, within, interval, errors=errors, context=context)
    except polling.TimedOut as e:
        raise AssertionError(str(e)) from None


def now(cond: Callable[[], T | None]) -> Callable[[], Awaitable[T | None]]:
    """A synchronous condition as the coroutine condition :func:`async_wait_until` polls."""

    async def check() -> T | None:
        return cond()

    return check
