"""Pipelined catch-up: the rule of ``quorum.core.replication`` ("Pipelined catch-up").

A follower's next Fetch may leave before the batch it just received is fsynced only when its offset
is at or below the follower's high watermark (records already committed: the claim cannot move any
high watermark). Near the tail (offset above the high watermark) the strict Fetch-offset durability
rule stands. The pipelined Fetch leaves in the same Ready as the append it follows (written, not
fsynced); a response arriving while that fsync runs waits for the next Ready, so at most one batch
is fsynced while one travels. The driver refuses any Fetch beyond both the fsynced end and the high
watermark. The fetched batches themselves are written by the driver's persist (off the event loop in
a node), before its fsync."""

from __future__ import annotations

import pytest

from quorum.core.messages import FetchRequest
from quorum.core.ready import Outbound, Ready
from tests.core.test_early_send import follower, last_fetch, response
from tests.core.util import CLUSTER, UUIDS, leader, make


def test_fetch_for_committed_records_leaves_with_the_append_before_its_fsync() -> None:
    h, claims = follower(catchup_flush_bytes=0)  # an fsync per Fetch (test_batched_fsync.py)
    # The leader's high watermark (10) is past everything this response brings.
    h.core.step(response(last_fetch(h), 0, [b"a", b"b"], 10), h.now)
    ready = h.core.ready()
    fetches = [o.message for o in ready.messages if isinstance(o.message, FetchRequest)]
    assert ready.append and [f.fetch_offset for f in fetches] == [2]
    sent = len(claims.claims)
    pending = h.driver.begin(ready)
    # Sent in begin, after the write and before the fsync: it claims 2 with 0 fsynced.
    assert claims.claims[sent:] == [(2, 0)] and pending.needs_persist
    assert h.core.hw == 2  # the local high watermark: the leader's, capped at the local end
    assert h.log.end_offset == 0  # the batch is written by persist (off the loop in a node)
    h.driver.persist(pending)
    assert h.log.end_offset == 2 and h.log.flushed_end_offset == 2
    h.driver.finish(pending)
    assert h.driver.applied_end == 2  # applied only once durable here
    assert all(off <= max(durable, 2) for off, durable in claims.claims)


def test_tail_fetch_above_the_high_watermark_waits_for_the_fsync() -> None:
    h, claims = follower()
    h.core.step(response(last_fetch(h), 0, [b"a", b"b"], 1), h.now)  # hw 1 < end 2
    ready = h.core.ready()
    assert ready.append and not [o for o in ready.messages if isinstance(o.message, FetchRequest)]
    sent = len(claims.claims)
    pending = h.driver.begin(ready)
    h.core.tick(h.now + 10_000)
    h.driver.send_now()
    assert len(claims.claims) == sent  # nothing claims the unflushed offset 2
    h.driver.persist(pending)
    h.driver.finish(pending)
    h.drain()
    assert claims.claims[sent:] == [(2, 2)]


def test_response_during_the_fsync_waits_for_the_next_ready() -> None:
    """Bounded pipelining: while batch 1 is fsynced and batch 2 waits in the core, no third
    Fetch leaves; it leaves with batch 2's Ready. (An fsync per Fetch here: batching them is
    test_batched_fsync.py's.)"""
    h, claims = follower(catchup_flush_bytes=0)
    h.core.step(response(last_fetch(h), 0, [b"a"], 10), h.now)
    p1 = h.driver.begin(h.core.ready())  # batch 1 written, Fetch at 1 sent, fsync in flight
    assert claims.claims[-1] == (1, 0)
    h.core.step(response(last_fetch(h), 1, [b"b"], 10), h.now)  # batch 2 arrives meanwhile
    h.core.tick(h.now + 100)  # (within the fetch timeout: still a follower)
    sent = len(claims.claims)
    h.driver.send_now()
    assert len(claims.claims) == sent  # batch 2 is not handed to the driver yet
    h.driver.persist(p1)
    h.driver.finish(p1)
    assert len(claims.claims) == sent
    p2 = h.driver.begin(h.core.ready())
    assert claims.claims[sent:] == [(2, 1)]  # with batch 2's write, before its fsync
    h.driver.persist(p2)
    h.driver.finish(p2)
    assert h.driver.applied_end == 2 and h.log.flushed_end_offset == 2


def test_claim_ok_is_the_durable_end_or_the_high_watermark() -> None:
    h, _claims = follower()
    core = h.core
    h.core.step(response(last_fetch(h), 0, [b"a", b"b", b"c"], 2), h.now)
    assert core.meta.durable_end == 0 and core.hw == 2 and core.meta.end == 3
    assert core.fetch_claim_ok(0) and core.fetch_claim_ok(2) and not core.fetch_claim_ok(3)


def test_driver_refuses_a_fetch_beyond_both_the_fsynced_end_and_the_high_watermark() -> None:
    h = make(local=2)
    assert h.core.hw == 0
    bad = FetchRequest(h.next_corr(), CLUSTER, 2, UUIDS[2], 0, 5, 1, 0, 1024)
    with pytest.raises(RuntimeError, match="offset 5 would claim more than the durable log end 0 "
                                           "and the high watermark 0"):
        h.driver.begin(Ready(messages=[Outbound(1, "n1:1", bad)]))


def test_a_claim_at_or_below_the_high_watermark_moves_no_high_watermark() -> None:
    """Leader side of the argument: with replica 3 silent, replica 2 claiming the committed
    offsets (even the leader's whole written log, while only the high watermark is committed)
    cannot commit anything beyond what a durable majority holds."""
    h = leader()
    hw = h.core.hw
    h.core.propose([b"x", b"y"], h.now)
    ready = h.core.ready()
    pending = h.driver.begin(ready)  # written, not fsynced on the leader
    epoch = h.core.epoch
    for off in range(0, hw + 1):
        h.core.step(FetchRequest(h.next_corr(), CLUSTER, 2, UUIDS[2], epoch, off, epoch, 0, 1024), h.now)
        assert h.core.hw == hw
    h.driver.persist(pending)
    h.driver.finish(pending)
    assert h.core.hw == hw  # the leader's own fsync alone is no majority of three
