"""The asyncio runner (quorum/driver/runner.py) on the in-memory storage: a single-voter
quorum commits a write; messages step the core while an fsync is in flight and their answers
wait for the next Ready; a failing port stops the runner loudly."""

from __future__ import annotations

import asyncio
import random
import threading
import time
from collections.abc import Callable

import pytest

from quorum.core.config import CoreConfig
from quorum.core.messages import FetchRequest, FetchResponse
from quorum.core.raft import RaftCore
from quorum.driver import AsyncRunner, Driver, Ports
from quorum.driver.memory import DictStateMachine, QueueTransport, RecordingSink
from quorum.storage.memory import MemoryLog
from quorum.types import ErrorCode, KraftError
from testkit.polling import async_wait_until, now
from tests.core.util import CLUSTER, UUIDS, Storage, key


class WallClock:
    def now_ms(self) -> int:
        return int(time.monotonic() * 1000)


class GatedLog(MemoryLog):
    """A log whose fsync waits for ``gate`` (when armed) or fails (when ``broken``)."""

    def __init__(self) -> None:
        super().__init__()
        self.gate: threading.Event | None = None
        self.flushing = threading.Event()
        self.broken = False

    def flush(self) -> None:
        if self.broken:
            raise OSError("the disk went away")
        if self.gate is not None:
            self.flushing.set()
            assert self.gate.wait(30)
        super().flush()


def single_voter() -> tuple[AsyncRunner, Storage, GatedLog, QueueTransport, RecordingSink, DictStateMachine]:
    store = Storage(log=GatedLog())
    clock = WallClock()
    config = CoreConfig(bootstrap_voters={1: "n1:1"}, local_endpoint="n1:1", election_timeout_ms=50)
    core = RaftCore(
        config,
        key(1),
        CLUSTER,
        store.qstore.load(),
        store.summary(),
        store.reader(),
        random.Random(1),
        clock.now_ms(),
    )
    transport, sink, sm = QueueTransport(), RecordingSink(), DictStateMachine()
    ports = Ports(store.log, store.qstore, store.snapshots, transport, clock, sm, sink)
    assert isinstance(store.log, GatedLog)
    return AsyncRunner(Driver(core, ports), tick_ms=5), store, store.log, transport, sink, sm


async def until(cond: Callable[[], bool], what: str) -> None:
    await async_wait_until(what, now(cond), 10, 0.005)


async def write(runner: AsyncRunner, record: bytes) -> int:
    def proposed() -> tuple[int] | None:
        try:
            return (runner.core.propose([record], runner.now_ms()),)  # offset 0 is falsy
        except KraftError as e:
            assert e.code in (ErrorCode.NOT_LEADER, ErrorCode.UNAVAILABLE), e
            return None

    (last,) = await async_wait_until("a leader accepting writes", now(proposed), 10, 0.005)
    runner.wake()
    return last


async def test_runner_commits_and_steps_messages_while_fsync_is_in_flight() -> None:
    runner, _store, log, transport, sink, sm = single_voter()
    stop = asyncio.Event()
    task = asyncio.create_task(runner.run(stop))
    last = await write(runner, b'{"k": "a", "v": "1"}')
    await until(lambda: any(p.last_offset == last for p in sink.proposals), "the write to commit")
    assert sm.data == {"a": "1"} and log.flushed_end_offset > last
    assert sink.roles and sink.roles[-1].role == "leader"
    # Now hold the next fsync and step an observer's Fetch while it is in flight.
    log.gate = threading.Event()
    log.flushing.clear()
    await write(runner, b'{"k": "b", "v": "2"}')
    await until(log.flushing.is_set, "the fsync to start")
    sent_before = len(transport.sent)
    fetch = FetchRequest(77, CLUSTER, 2, UUIDS[2], runner.core.epoch, 0, 0, 0, 1 << 20, "n2:1")
    runner.step(fetch)  # the core answers at once; the answer waits for the next Ready
    assert runner.driver.in_flight is not None and len(transport.sent) == sent_before
    log.gate.set()
    await until(lambda: any(isinstance(o.message, FetchResponse) for o in transport.sent), "the answer")
    stop.set()
    await task
    assert sm.data == {"a": "1", "b": "2"}


async def test_runner_answers_while_fsync_is_in_flight_what_needs_no_fsync() -> None:
    """``Driver.send_now``: a Fetch answered by the core while the leader's fsync runs leaves
    before that fsync completes (its data is written; the leader serves unflushed data), and
    the write whose fsync is held is not acknowledged before it."""
    runner, _store, log, transport, sink, _sm = single_voter()
    stop = asyncio.Event()
    task = asyncio.create_task(runner.run(stop))
    last = await write(runner, b'{"k": "a", "v": "1"}')
    await until(lambda: any(p.last_offset == last for p in sink.proposals), "the write to commit")
    log.gate = threading.Event()
    log.flushing.clear()
    held = await write(runner, b'{"k": "b", "v": "2"}')
    await until(log.flushing.is_set, "the fsync to start")
    sent_before = len(transport.sent)
    runner.step(FetchRequest(78, CLUSTER, 2, UUIDS[2], runner.core.epoch, 0, 0, 0, 1 << 20, "n2:1"))
    await until(
        lambda: any(isinstance(o.message, FetchResponse) for o in transport.sent[sent_before:]),
        "the answer while the fsync is held",
    )
    (resp,) = [o.message for o in transport.sent[sent_before:] if isinstance(o.message, FetchResponse)]
    assert resp.records and runner.driver.in_flight is not None and not log.gate.is_set()
    assert log.flushed_end_offset <= held and not any(p.last_offset == held for p in sink.proposals)
    log.gate.set()
    await until(lambda: any(p.last_offset == held for p in sink.proposals), "the held write to commit")
    stop.set()
    await task


async def test_runner_dies_loudly_when_a_port_fails() -> None:
    runner, _store, log, _transport, sink, _sm = single_voter()
    stop = asyncio.Event()
    task = asyncio.create_task(runner.run(stop))
    last = await write(runner, b'{"k": "a", "v": "1"}')
    await until(lambda: any(p.last_offset == last for p in sink.proposals), "the first write")
    log.broken = True
    await write(runner, b'{"k": "b", "v": "2"}')
    with pytest.raises(RuntimeError, match="the disk went away"):
        await asyncio.wait_for(task, 10)


async def test_runner_dies_loudly_when_an_early_send_fails() -> None:
    """An error of ``Driver.send_now`` (run while an fsync is in flight) stops the runner like
    any other driver error, instead of being lost in an event-loop callback."""
    runner, _store, log, _transport, sink, _sm = single_voter()
    stop = asyncio.Event()
    task = asyncio.create_task(runner.run(stop))
    last = await write(runner, b'{"k": "a", "v": "1"}')
    await until(lambda: any(p.last_offset == last for p in sink.proposals), "the first write")
    log.gate = threading.Event()
    log.flushing.clear()
    await write(runner, b'{"k": "b", "v": "2"}')
    await until(log.flushing.is_set, "the fsync to start")

    def broken() -> bool:
        raise RuntimeError("driver: a Fetch at offset 9 would claim more than the durable log end 1")

    runner.driver.send_now = broken  # type: ignore[method-assign]
    runner.step(FetchRequest(79, CLUSTER, 2, UUIDS[2], runner.core.epoch, 0, 0, 0, 1 << 20, "n2:1"))
    log.gate.set()
    with pytest.raises(RuntimeError, match="would claim more than the durable log end 1"):
        await asyncio.wait_for(task, 10)
