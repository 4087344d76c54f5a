"""One lifecycle per KRaftQuorum: the loop of its one kopf daemon (handlers.py) over a membership
backend port, :class:`Membership`, with our engine (:class:`EngineMembership`, the passes of
quorums.py) or an existing Kafka controller quorum (``spec.kafka``: kafkaquorums.py's
:class:`~.kafkaquorums.KafkaMembership`) behind it, chosen from the live body at each pass.

Each pass runs as its own task under the watchdog (watchdog.py ``watched``), so that:

* a pass past its backend's budget is cancelled and said in status (``Degraded``,
  ``StatusNotRefreshed``: voters and phase as last written must not pass for current), and the
  backend rebuilds its clients from the persisted status, as a restarted operator does;
* a cancellation that leaks out of a pass (a library's) is a failed pass, told apart from kopf
  stopping the daemon: passed on as CancelledError it would end the daemon for good, and kopf
  never restarts a daemon that returned;
* any other failure is logged and said in status the same way; the next pass retries.

Between passes the daemon waits for the backend's next deadline, the daemon's stop, or a wake-up
(``OperatorContext.wake``: the quorum's pods changed).
"""

from __future__ import annotations

import asyncio
import logging
import math
from typing import Any, Protocol

import kopf

from .context import OperatorContext
from .kafkaquorums import KafkaMembership
from .kafkaspec import is_kafka
from .quorums import daemon_pass, next_pass_in
from .watchdog import watched

log = logging.getLogger("kraftkeeper.operator")


class Membership(Protocol):
    """A KRaftQuorum's membership backend, as its daemon drives it."""

    async def step(self) -> float:
        """One pass; the seconds to wait before the next."""
        ...

    def pass_budget(self) -> float:
        """The watchdog's limit for one pass (``math.inf``: none)."""
        ...

    def slow_after(self) -> float:
        """A pass longer than this is worth a log line."""
        ...

    async def report_stale(self, why: str) -> None:
        """Say in status that it was not refreshed, and why (a failed or hung pass)."""
        ...

    async def abandon(self) -> None:
        """Drop the clients after a hung pass; the next pass rebuilds them from the status."""
        ...

    async def close(self) -> None: ...


class EngineMembership:
    """Our engine's quorum: the passes of quorums.py over the resource's ``Managed`` entry (built
    by the create / update / resume handler). No budget: every API call is bounded in kube.py,
    every quorum call by the quorum timeout."""

    def __init__(self, ctx: OperatorContext, key: str) -> None:
        self.ctx, self.key = ctx, key

    async def step(self) -> float:
        await daemon_pass(self.ctx, self.key)
        return next_pass_in(self.ctx, self.key)

    def pass_budget(self) -> float:
        return math.inf

    def slow_after(self) -> float:
        return math.inf

    async def report_stale(self, why: str) -> None:
        m = self.ctx.managed.get(self.key)
        if m is not None and m.status is not None:
            await m.status.report_stale(why)

    async def abandon(self) -> None:
        return None  # never hung: no budget

    async def close(self) -> None:
        return None  # the Managed entry is the delete handler's (OperatorContext.forget)


def membership_of(ctx: OperatorContext, body: kopf.Body, key: str) -> Membership:
    """The backend ``body`` asks for: Kafka with ``spec.kafka``, else our engine."""
    if is_kafka(body):
        return KafkaMembership(ctx, body)
    return EngineMembership(ctx, key)


async def run_lifecycle(
    ctx: OperatorContext, body: kopf.Body, stopped: kopf.DaemonStopped, logger: Any
) -> None:
    """The daemon's loop until kopf stops it (module docstring). ``body`` is kopf's live view:
    a spec change takes effect on the next pass."""
    meta = body.get("metadata") or {}
    key = f"{meta['namespace']}/{meta['name']}"
    backend: Membership | None = None
    try:
        while not stopped:
            if backend is None or isinstance(backend, KafkaMembership) != is_kafka(body):
                if backend is not None:
                    await backend.close()
                backend = membership_of(ctx, body, key)
            pause = ctx.interval
            try:
                out = await watched(key, backend.step, backend.pass_budget, backend.slow_after)
                if out.hung:
                    await backend.report_stale(out.hung)
                    await backend.abandon()
                elif isinstance(out.value, int | float):
                    pause = float(out.value)
            except asyncio.CancelledError:
                raise
            except Exception as e:  # the daemon must survive anything: the next pass retries
                logger.exception("membership pass of %s failed", key)
                await backend.report_stale(f"the last membership pass failed: {type(e).__name__}: {e}")
            await sleep_until_due(ctx, key, stopped, pause)
    finally:
        if backend is not None:
            await backend.close()


async def sleep_until_due(
    ctx: OperatorContext, key: str, stopped: kopf.DaemonStopped, seconds: float
) -> None:
    """Until the next pass is due, the daemon is stopped, or the resource's pods changed
    (``OperatorContext.wake``: a quorum in its idle back-off starts at once)."""
    wake = ctx.wake_event(key)
    if wake.is_set():  # pods changed during the pass: look again now
        wake.clear()
        return
    waits = [asyncio.ensure_future(wake.wait()), asyncio.ensure_future(stopped.wait(seconds))]
    try:
        await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for w in waits:
            w.cancel()
    wake.clear()
