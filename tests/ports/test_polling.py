"""The one poll loop (quorum.polling): it returns the first truthy value, counts only the named
errors as "not yet", and on the deadline fails naming the condition and the last value; the
tests' wrapper (testkit.polling) fails the same way as an assertion."""

from __future__ import annotations

import asyncio
import itertools

import pytest

from quorum import polling
from testkit import polling as testpolling


def test_returns_the_first_truthy_value() -> None:
    calls = itertools.count(1)
    assert polling.wait_until("the third call", lambda: (n := next(calls)) >= 3 and n, 5, 0.001) == 3


def test_the_deadline_names_the_condition_and_the_last_error() -> None:
    def refused() -> None:
        raise ConnectionRefusedError("node 2 is down")

    with pytest.raises(polling.TimedOut, match=r"waiting for a leader \(last: ConnectionRefusedError"):
        polling.wait_until("a leader", refused, 0.05, 0.01, errors=(OSError,))
    with pytest.raises(AssertionError, match=r"waiting for a leader \(last: ConnectionRefusedError"):
        testpolling.wait_until("a leader", refused, 0.05, 0.01, errors=(OSError,))


def test_an_error_not_named_ends_the_wait_at_once() -> None:
    def broken() -> None:
        raise KeyError("voters")

    with pytest.raises(KeyError):
        polling.wait_until("a description", broken, 30, 0.01, errors=(OSError,))


def test_the_async_loop_fails_alike() -> None:
    async def never() -> None:
        return None

    with pytest.raises(polling.TimedOut, match=r"waiting for nothing \(last: None\)"):
        asyncio.run(polling.async_wait_until("nothing", never, 0.05, 0.01))
    with pytest.raises(AssertionError, match=r"waiting for nothing \(last: None\)"):
        asyncio.run(testpolling.async_wait_until("nothing", never, 0.05, 0.01))


def test_both_loops_take_the_same_steps() -> None:
    """The same condition through either loop: "not yet" errors and falsy values are passed over,
    the first truthy value is returned, and the context is added to the failure."""

    def script() -> object:
        outcomes = iter([OSError("starting"), 0, None, "ready", "later"])

        def cond() -> object:
            out = next(outcomes)
            if isinstance(out, BaseException):
                raise out
            return out

        return cond

    sync_cond = script()
    assert polling.wait_until("ready", sync_cond, 5, 0.001, errors=(OSError,)) == "ready"
    async_cond = script()
    assert asyncio.run(polling.async_wait_until("ready", testpolling.now(async_cond), 5, 0.001,
                                                errors=(OSError,))) == "ready"
    for wait in (testpolling.wait_until, polling.wait_until):
        with pytest.raises((AssertionError, polling.TimedOut), match=r"\(last: 0\)\nleader: none") as e:
            wait("a leader", lambda: 0, 0.02, 0.005, context=lambda: "leader: none")
        # The tests' waits fail as assertions, never as the product's TimedOut, and the other way round.
        assert isinstance(e.value, polling.TimedOut) is (wait is polling.wait_until)


def test_a_wait_fails_with_the_exception_it_is_given() -> None:
    class Gone(Exception):
        pass

    with pytest.raises(Gone, match="waiting for the node"):
        polling.wait_until("the node", lambda: None, 0.01, 0.005, fail=Gone)
