"""Waiting for a condition: the one poll loop of the product, the tests and the benchmarks.

A wait names what it waits for, gives a deadline, and fails naming that condition and the last
value seen (a value, or the error that meant "not yet"). The interval between two checks is
pacing only; nothing depends on it. The product (the demo, the Kafka probes) fails with
:class:`TimedOut`; the tests' waits in ``testkit.polling`` are these loops with ``fail`` set to
``AssertionError``, carrying the same message.

Both loops, the synchronous and the coroutine one, are the same: one check (its outcome: a value,
or an ``errors`` exception meaning "not yet"), then :meth:`_Poll.settled` decides (done, go on, or
past the deadline), then a pause. Only calling the condition and pausing differ.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any, Generic, TypeVar, cast

__all__ = ["TimedOut", "async_wait_until", "wait_until"]

T = TypeVar("T")

Errors = tuple[type[BaseException], ...]
Outcome = tuple[Any, bool]  # (the value, or the "not yet" error; whether it was an error)
Failure = Callable[[str], BaseException]  # what the deadline raises, made from the message


class TimedOut(TimeoutError):
    """The condition was not met by the deadline; the message names it and the last value."""


class _Poll(Generic[T]):
    """One wait: the deadline, the last outcome seen, and the decision after each check."""

    def __init__(self, what: str, timeout: float, context: Callable[[], str] | None, fail: Failure) -> None:
        self.what, self.timeout, self.context, self.fail = what, timeout, context, fail
        self.deadline = time.monotonic() + timeout
        self.last: Any = None

    def settled(self, outcome: Outcome) -> bool:
        """One check's outcome, kept as the last value seen: True when it meets the condition
        (a truthy value, not an error); past the deadline, the failure naming the condition and
        that last value; otherwise False (check again after the pause)."""
        self.last, failed = outcome
        if self.last and not failed:
            return True
        if time.monotonic() >= self.deadline:
            extra = f"\n{self.context()}" if self.context else ""
            raise self.fail(
                f"timed out after {self.timeout:g} s waiting for {self.what} (last: {self.last!r}){extra}"
            )
        return False

    @property
    def value(self) -> T:
        return cast(T, self.last)


def _check(cond: Callable[[], T | None], errors: Errors) -> Outcome:
    try:
        return cond(), False
    except errors as e:
        return e, True


async def _async_check(cond: Callable[[], Awaitable[T | None]], errors: Errors) -> Outcome:
    try:
        return await cond(), False
    except errors as e:
        return e, True


def wait_until(
    what: str,
    cond: Callable[[], T | None],
    timeout: float,
    interval: float = 0.2,
    *,
    errors: Errors = (),
    context: Callable[[], str] | None = None,
    fail: Failure = TimedOut,
) -> T:
    """Call ``cond()`` until it returns something truthy and return that. Exceptions of the
    ``errors`` types count as "not yet" (kept as the last value); any other propagates. On the
    deadline, raise ``fail(message)`` (:class:`TimedOut` unless asked otherwise), the message
    naming ``what``, the last value, and ``context()``."""
    p: _Poll[T] = _Poll(what, timeout, context, fail)
    while not p.settled(_check(cond, errors)):
        time.sleep(interval)
    return p.value


async def async_wait_until(
    what: str,
    cond: Callable[[], Awaitable[T | None]],
    within: float,
    interval: float = 0.05,
    *,
    errors: Errors = (),
    context: Callable[[], str] | None = None,
    fail: Failure = TimedOut,
) -> T:
    """:func:`wait_until` for a coroutine condition, inside a running event loop (the loop keeps
    serving while it waits): the same arguments in the same order and the same rules (the
    deadline is named ``within`` only because an async ``timeout`` parameter reads as an asyncio
    timeout)."""
    p: _Poll[T] = _Poll(what, within, context, fail)
    # A poll, not a wait on an event: the condition is outside this process's control.
    while not p.settled(await _async_check(cond, errors)):  # noqa: ASYNC110
        await asyncio.sleep(interval)
    return p.value
