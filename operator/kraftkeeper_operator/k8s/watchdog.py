"""The watchdog of a KRaftQuorum daemon's passes (lifecycle.py): one pass of one KRaftQuorum may
not take longer than its membership backend's budget (for ``spec.kafka``, derived from the Kafka
client's timeouts; none for our engine, whose every call is bounded), and each Kubernetes API
call of a pass is bounded (:func:`within`).

Every Kafka call is bounded by the client's own timeouts (backend.py: ``request.timeout.ms`` per
request, ``default.api.timeout.ms`` per operation), and the pass makes only a handful of them, so
a pass that runs past its budget is waiting on something that will not end by itself (a hung
Kubernetes API request has no timeout of its own, for one). Without this guard such a pass keeps
the daemon, and so the resource's status, frozen at whatever it last wrote, with no trace in the
log. With it the stuck pass is logged with the stack of the await it hangs in, cancelled, and the
daemon rebuilds its client and controller from the persisted status (as a restarted operator
would: the recovery records are written before every voter change), and the condition
``Degraded`` says why the status was not refreshed (crdstatus.py ``stale_conditions``).
"""

from __future__ import annotations

import asyncio
import io
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TypeVar

log = logging.getLogger("kraftkeeper.operator")

T = TypeVar("T")

# One Kubernetes API call of the daemon: its client has no timeout of its own, so a request that
# never gets an answer would hold the pass for ever.
KUBE_CALL_S = 30.0
# A cancelled pass normally ends at once; one that ignores the cancellation is left behind (its
# client and controller are dropped, so nothing it holds is used again).
CANCEL_GRACE_S = 5.0


class CallTimedOut(RuntimeError):
    """One awaited call (a Kubernetes API request) gave no answer within its bound."""


async def within(what: str, call: Awaitable[T], seconds: float = KUBE_CALL_S) -> T:
    """``call`` within ``seconds``; past it :class:`CallTimedOut` naming ``what`` (the pass fails
    and the next one retries)."""
    try:
        return await asyncio.wait_for(call, seconds)
    except TimeoutError:
        raise CallTimedOut(f"{what}: no answer from the API server within {seconds:g}s") from None


class PassCancelled(RuntimeError):
    """A pass ended cancelled although neither the watchdog nor the daemon's stop cancelled it."""


@dataclass
class PassOutcome:
    """What one watched pass gave: its value, or why there is none."""

    value: object = None
    hung: str = ""  # non-empty: the pass ran past its budget and was cancelled (the message)
    seconds: float = 0.0


def task_stack(task: asyncio.Task[object]) -> str:
    """The awaits a task is suspended in, innermost last (asyncio's own format)."""
    out = io.StringIO()
    task.print_stack(file=out)
    return out.getvalue()


async def watched(
    key: str,
    step: Callable[[], Awaitable[T]],
    budget: Callable[[], float],
    slow_after: Callable[[], float],
) -> PassOutcome:
    """Run ``step()`` as its own task for at most ``budget()`` seconds (asked again while it runs:
    a pass may build a client with other timeouts). A pass slower than ``slow_after()`` is logged
    (it finished); one past ``budget()`` is logged with its stack and cancelled. Exceptions of the
    pass propagate to the caller."""
    started = time.monotonic()
    task: asyncio.Task[object] = asyncio.ensure_future(step())
    try:
        while not task.done():
            left = started + budget() - time.monotonic()
            if left <= 0:
                break
            await asyncio.wait({task}, timeout=left)
    except asyncio.CancelledError:  # the daemon itself is being stopped
        task.cancel()
        raise
    took = time.monotonic() - started
    if task.done():
        if task.cancelled():
            # Not by us and not by the daemon's stop (that lands above): a cancellation that leaked
            # out of a library. Passed on as CancelledError it would end the kopf daemon for good
            # (kopf never restarts a daemon that exits by itself); it is a failed pass instead.
            raise PassCancelled(f"the pass was cancelled from inside after {took:.1f}s")
        value = task.result()  # raises the pass's exception, if any
        if took > slow_after():
            log.warning(
                "%s: a membership pass took %.1fs (slow-pass threshold %.0fs)", key, took, slow_after()
            )
        return PassOutcome(value=value, seconds=took)
    limit = budget()
    stack = task_stack(task)
    task.cancel()
    finished, _ = await asyncio.wait({task}, timeout=CANCEL_GRACE_S)
    for t in finished:
        if not t.cancelled():
            t.exception()  # retrieved: an error raised while it was being cancelled is moot
    if not finished:
        _abandoned.add(task)  # keep a reference: an unreferenced pending task may be collected
        task.add_done_callback(_abandoned.discard)
    message = (
        f"a membership pass did not finish within {limit:.0f}s and was cancelled; the client "
        "and controller are rebuilt from the persisted status"
    )
    log.error("%s: %s. It was waiting in:\n%s", key, message, stack)
    return PassOutcome(hung=message, seconds=took)


_abandoned: set[asyncio.Task[object]] = set()
