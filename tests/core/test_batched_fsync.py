"""Batched catch-up fsyncs: ``quorum.core.replication``, "Batched fsync".

While a follower's log end stays below the high watermark its leader told it, the Ready that
hands over fetched batches asks for no fsync until ``catchup_flush_bytes`` were appended since
the last one. The Ready that reaches the leader's high watermark fsyncs everything; so does
one that crosses the byte budget, and the first Ready once the node stops following. Every
Fetch sent meanwhile claims only committed offsets, and the state machine applies only what
is fsynced locally. While far behind, Fetches ask for (and the leader serves, below its high
watermark) ``catchup_fetch_max_bytes`` instead of ``fetch_max_bytes``.
"""

from __future__ import annotations

from quorum.core.messages import FetchRequest, FetchResponse
from quorum.records import encode_batch
from quorum.types import ErrorCode
from tests.core.test_early_send import Claims, follower, last_fetch, response
from tests.core.util import Harness, fetch_responses, leader


def take(h: Harness, base: int, hw: int) -> tuple[bool, int, int]:
    """Step a one-record response at ``base`` with the leader's ``hw`` and carry out its Ready;
    (whether it asked for an fsync, fsynced end, applied end) afterwards."""
    h.core.step(response(last_fetch(h), base, [b"x" * 100], hw), h.now)
    ready = h.core.ready()
    assert ready.append, "the response was appended"
    pending = h.driver.begin(ready)
    h.driver.persist(pending)
    h.driver.finish(pending)
    return ready.flush, h.log.flushed_end_offset, h.driver.applied_end


def claims_within(claims: Claims, committed: int) -> None:
    """Every Fetch claim beyond the fsynced end names only committed offsets."""
    assert all(off <= max(durable, committed) for off, durable in claims.claims), claims.claims


def test_no_fsync_below_the_leaders_high_watermark_until_the_tail() -> None:
    h, claims = follower()
    for base in range(4):
        flush, durable, applied = take(h, base, 5)
        assert (flush, durable, applied) == (False, 0, 0)  # written, not fsynced nor applied
        assert h.log.end_offset == base + 1
        assert last_fetch(h).fetch_offset == base + 1  # pipelined: it left before any fsync
    # The response reaching the leader's high watermark fsyncs everything and applies it.
    assert take(h, 4, 5) == (True, 5, 5)
    assert h.core.meta.durable_end == 5
    claims_within(claims, 5)


def test_the_fetch_reaching_the_leaders_high_watermark_follows_the_fsync() -> None:
    """Pipelining stops at the tail: the Fetch that tells the leader this replica caught up
    (what KIP-856 AddVoter checks, and bench/recovery times) claims only fsynced records."""
    h, claims = follower()
    take(h, 0, 3)
    h.core.step(response(last_fetch(h), 1, [b"a", b"b"], 3), h.now)  # reaches the leader's 3
    pending = h.driver.begin(h.core.ready())
    assert claims.claims[-1] == (1, 0)  # nothing new left before the fsync
    h.driver.persist(pending)
    h.driver.finish(pending)
    h.drain()
    assert claims.claims[-1] == (3, 3)


def test_the_byte_budget_forces_an_fsync_while_far_behind() -> None:
    # Each one-record batch is 137 bytes: the second one reaches a 250-byte budget.
    h, claims = follower(catchup_flush_bytes=250)
    assert take(h, 0, 100)[:2] == (False, 0)
    assert take(h, 1, 100) == (True, 2, 2)
    assert take(h, 2, 100)[:2] == (False, 2)  # the budget starts over after the fsync
    assert take(h, 3, 100) == (True, 4, 4)
    claims_within(claims, 100)


def test_zero_budget_fsyncs_every_fetch() -> None:
    h, _claims = follower(catchup_flush_bytes=0)
    for base in range(3):
        assert take(h, base, 100) == (True, base + 1, base + 1)


def test_a_response_above_the_high_watermark_is_fsynced_before_the_next_fetch() -> None:
    h, claims = follower()
    assert take(h, 0, 10)[:2] == (False, 0)
    # The leader's high watermark is now 1: this batch (offset 1) is not committed.
    h.core.step(response(last_fetch(h), 1, [b"y"], 1), h.now)
    ready = h.core.ready()
    assert ready.flush and not [o for o in ready.messages if isinstance(o.message, FetchRequest)]
    pending = h.driver.begin(ready)
    h.driver.persist(pending)
    h.driver.finish(pending)
    h.drain()
    assert h.log.flushed_end_offset == 2 and claims.claims[-1] == (2, 2)
    claims_within(claims, 1)


def test_leaving_the_follower_role_fsyncs_what_catch_up_left_unsynced() -> None:
    h, _claims = follower()
    for base in range(3):
        take(h, base, 50)
    assert h.log.flushed_end_offset == 0 and h.log.end_offset == 3
    # No answer from the leader: the fetch timeout makes this voter a (pre-)candidate.
    h.tick(h.core.config.fetch_timeout_ms + 2 * h.core.config.election_timeout_ms + 100)
    assert h.core.role.name != "follower"
    assert h.log.flushed_end_offset == 3 and h.core.meta.durable_end == 3


# ---------------------------------------------------------------- larger fetches while far behind


def test_follower_asks_for_larger_fetches_only_while_far_behind() -> None:
    h, _claims = follower(fetch_max_bytes=1000, catchup_fetch_max_bytes=5000)
    assert last_fetch(h).max_bytes == 1000  # nothing told yet
    take(h, 0, 10)
    assert last_fetch(h).max_bytes == 5000  # end 1 < the leader's high watermark 10
    for base in range(1, 10):
        take(h, base, 10)
    h.drain()
    assert h.log.end_offset == 10 and last_fetch(h).max_bytes == 1000  # at the tail


def committed_leader() -> Harness:
    """A leader (fetch_max_bytes 1000, catch-up 5000) with ten committed 300-byte batches."""
    h = leader(fetch_max_bytes=1000, catchup_fetch_max_bytes=5000)
    start = h.log.end_offset
    for i in range(10):
        h.core.propose([bytes([i]) * 300], h.now)
        h.drain()
    for _ in range(3):
        h.fetch(2)
        h.fetch(3)
    assert h.core.hw == h.log.end_offset >= start + 10
    return h


def test_leader_serves_the_larger_size_only_below_its_high_watermark() -> None:
    h = committed_leader()
    below = fetch_responses(h.fetch(4, offset=0, last_epoch=0))[-1]
    assert 1000 < len(below.records) <= 5000
    # A fetch asking for less gets no more than it asked (one whole batch at least).
    h.core.propose([b"z" * 300], h.now)
    h.drain()
    tail = fetch_responses(h.fetch(2, offset=h.core.hw))[-1]
    assert 0 < len(tail.records) <= 1000


def test_corrupt_batch_inside_a_large_fetch_is_refused_naming_its_offset() -> None:
    h, _claims = follower(catchup_flush_bytes=0)
    take(h, 0, 50)
    data = bytearray(b"".join(encode_batch(o, 1, [bytes([o]) * 400], 0) for o in range(1, 21)))
    size = len(data) // 20
    data[size * 13 + 80] ^= 0xFF  # a record byte of the 14th batch: offset 14
    fetch = last_fetch(h)
    h.core.step(FetchResponse(fetch.correlation_id, ErrorCode.NONE, 1, 1, high_watermark=50,
                              records=bytes(data)), h.now)
    ready = h.core.ready()
    assert not ready.append and any("offset 14" in e and "CRC" in e for e in ready.errors), ready.errors
    h.driver.carry_out(ready)
    assert h.log.end_offset == 1  # nothing of the response was appended


def test_batched_catch_up_applies_from_memory_without_reading_the_log_back() -> None:
    """Three 30 MiB responses below the leader's high watermark stay unapplied until the fsync
    (90 MiB, past the 64 MiB the driver used to keep): all applied from memory."""
    h, _claims = follower()
    reads: list[int] = []
    real_read = h.log.read

    def counting_read(offset: int, max_bytes: int, max_offset: int | None = None) -> bytes:
        reads.append(offset)
        return real_read(offset, max_bytes, max_offset)

    h.log.read = counting_read  # type: ignore[method-assign]
    big = b"v" * (30 * 1024 * 1024)
    for base in range(3):
        h.core.step(response(last_fetch(h), base, [big], 3), h.now)
        pending = h.driver.begin(h.core.ready())
        h.driver.persist(pending)
        h.driver.finish(pending)
    assert h.log.flushed_end_offset == 3 and h.driver.applied_end == 3
    assert reads == []
