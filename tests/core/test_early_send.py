"""Early send (throughput after the one-driver refactor): what a Ready carries leaves
in ``Driver.begin``, before that Ready's fsync, when nothing in it needs the fsync.

The rules checked here (``quorum.driver.driver``'s docstring, ``quorum.core.ready`` steps 6-7):
a Ready that saves no quorum state sends its messages in ``begin``; its commit and client
results go there too when the commit is at most the log's fsynced end; a Fetch never leaves
with an offset above the fsynced end, also when it leaves right after the fsync; a Ready that
saves quorum state sends nothing before its persist.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from quorum.core.messages import (
    BeginQuorumEpochRequest,
    FetchRequest,
    FetchResponse,
    VoteRequest,
    VoteResponse,
)
from quorum.core.ready import Outbound, Ready
from quorum.records import encode_batch
from quorum.storage.memory import MemoryLog
from quorum.types import ErrorCode
from tests.core.util import CLUSTER, UUIDS, Harness, fetch_responses, leader, make


@dataclass
class Claims:
    """Wraps the harness transport: (fetch_offset, fsynced end) of every Fetch when it is sent."""

    log: MemoryLog
    inner: object
    claims: list[tuple[int, int]] = field(default_factory=list)

    def send(self, out: Outbound) -> None:
        if isinstance(out.message, FetchRequest):
            self.claims.append((out.message.fetch_offset, self.log.flushed_end_offset))
        self.inner.send(out)  # type: ignore[attr-defined]


def follower(**cfg: int) -> tuple[Harness, Claims]:
    h = make(local=2, **cfg)
    claims = Claims(h.log, h.transport)
    h.driver.ports.transport = claims
    h.step(BeginQuorumEpochRequest(h.next_corr(), CLUSTER, 1, 1, 2, UUIDS[2]))
    assert claims.claims and claims.claims[-1] == (0, 0)
    return h, claims


def last_fetch(h: Harness) -> FetchRequest:
    return [o.message for o in h.sent if isinstance(o.message, FetchRequest)][-1]


def response(fetch: FetchRequest, base: int, records: list[bytes], hw: int) -> FetchResponse:
    data = encode_batch(base, 1, records, 0)
    return FetchResponse(fetch.correlation_id, ErrorCode.NONE, 1, 1, high_watermark=hw, records=data)


def test_follower_next_fetch_leaves_right_after_its_fsync_claiming_only_the_fsynced_end() -> None:
    h, claims = follower()
    h.core.step(response(last_fetch(h), 0, [b"a", b"b"], 0), h.now)
    pending = h.driver.begin(h.core.ready())
    # The fetched batch is written by persist, off the loop: not yet here.
    assert pending.needs_persist and h.log.end_offset == 0 and h.durable_end == 0
    assert pending.raw and pending.raw[0].next_offset == 2
    sent = len(claims.claims)
    # While the fsync runs, the next response cannot come (one Fetch in flight) and no Fetch
    # leaves: the log is not durable yet.
    assert h.core.ready().is_empty()
    h.driver.persist(pending)
    h.driver.finish(pending)
    assert len(claims.claims) == sent  # queued by advance: it belongs to the next Ready
    nxt = h.core.ready()
    assert not nxt.append and not nxt.flush and nxt.quorum_state is None
    p2 = h.driver.begin(nxt)
    # ... which sends it in begin (no persist needed), claiming exactly the fsynced end.
    assert claims.claims[sent:] == [(2, 2)] and not p2.needs_persist
    h.driver.finish(p2)
    assert all(off <= durable for off, durable in claims.claims)


def test_follower_response_during_fsync_then_fetch_never_claims_the_unflushed_batch() -> None:
    h, claims = follower()
    h.core.step(response(last_fetch(h), 0, [b"a"], 0), h.now)
    p1 = h.driver.begin(h.core.ready())
    h.driver.persist(p1)
    h.driver.finish(p1)
    p2 = h.driver.begin(h.core.ready())  # the Fetch at 1 leaves here
    h.driver.finish(p2)
    # The next response arrives and its batch is written; its fsync is in flight.
    h.core.step(response(last_fetch(h), 1, [b"b", b"c"], 1), h.now)
    p3 = h.driver.begin(h.core.ready())
    assert h.core.log_end_offset == 3 and h.durable_end == 1  # written by p3's persist
    # Nothing the core holds may claim offset 3 yet, whatever is stepped in meanwhile.
    h.core.tick(h.now + 10_000)
    early = h.core.ready()
    assert not [o for o in early.messages if isinstance(o.message, FetchRequest)]
    h.driver.persist(p3)
    h.driver.in_flight = None
    h.core.advance(p3.ready, h.durable_end)
    h.drain()
    assert claims.claims[-1] == (3, 3)
    assert all(off <= durable for off, durable in claims.claims)


def test_follower_applies_a_commit_only_once_its_own_log_holds_it_durably() -> None:
    h, _claims = follower()
    # The leader's high watermark already covers the two records this response brings.
    h.core.step(response(last_fetch(h), 0, [b"a", b"b"], 2), h.now)
    ready = h.core.ready()
    assert ready.commit == 2 and ready.append
    pending = h.driver.begin(ready)
    assert h.driver.applied_end == 0 and not pending.completed  # not durable here yet
    h.driver.persist(pending)
    h.driver.finish(pending)
    assert h.driver.applied_end == 2


def test_leader_answers_a_commit_before_the_next_batch_fsync() -> None:
    h = leader()
    start = h.core.hw
    last_a = h.core.propose([b"a"], h.now)
    h.drain()  # batch A written and fsynced on the leader
    fetch_responses(h.fetch(2, offset=start))  # replica 2 gets A
    h.core.propose([b"b"], h.now)
    p1 = h.driver.begin(h.core.ready())  # batch B: its fsync is in flight ...
    h.core.step(  # ... when replica 2's next Fetch proves A durable there
        FetchRequest(h.next_corr(), CLUSTER, 2, UUIDS[2], h.core.epoch, last_a + 1, h.core.epoch, 0, 1 << 20),
        h.now,
    )
    assert h.core.hw == last_a + 1
    h.driver.persist(p1)
    h.driver.finish(p1)
    assert [p.last_offset for p in h.sink.proposals if p.last_offset == last_a] == []
    h.core.propose([b"c"], h.now)
    ready = h.core.ready()
    assert ready.append and ready.commit == last_a + 1 and ready.quorum_state is None
    sent = len(h.sent)
    p2 = h.driver.begin(ready)  # batch C written, not fsynced
    assert h.durable_end < h.log.end_offset
    # A's client is answered and replica 2 gets its Fetch response now, not after C's fsync;
    # what is answered is durable on the leader.
    assert [p.last_offset for p in h.sink.proposals][-1] == last_a and p2.completed
    assert last_a < h.durable_end
    assert fetch_responses(h.sent[sent:])
    h.driver.persist(p2)
    h.driver.finish(p2)


def test_nothing_leaves_before_the_quorum_state_is_saved() -> None:
    h = make(local=2)
    req = VoteRequest(h.next_corr(), CLUSTER, 3, UUIDS[3], 5, 2, UUIDS[2], 0, 0)
    h.core.step(req, h.now)
    ready = h.core.ready()
    assert ready.quorum_state is not None and ready.quorum_state.voted_id == 3
    sent = len(h.sent)
    pending = h.driver.begin(ready)
    assert len(h.sent) == sent  # the granted vote waits for the saved vote
    h.driver.persist(pending)
    h.driver.finish(pending)
    (resp,) = [o.message for o in h.sent[sent:] if isinstance(o.message, VoteResponse)]
    assert resp.vote_granted and h.qs.voted_id == 3


def test_driver_refuses_an_early_fetch_claiming_beyond_the_fsynced_end() -> None:
    h = make(local=2)
    bad = FetchRequest(h.next_corr(), CLUSTER, 2, UUIDS[2], 0, 5, 1, 0, 1024)
    with pytest.raises(RuntimeError, match="offset 5 would claim more than the durable log end 0"):
        h.driver.begin(Ready(messages=[Outbound(1, "n1:1", bad)]))


# ---------------------------------------------------------------- while a persist is in flight


def test_leader_commits_and_answers_while_the_next_batch_fsync_runs() -> None:
    h = leader()
    start = h.core.hw
    last_a = h.core.propose([b"a"], h.now)
    h.drain()
    fetch_responses(h.fetch(2, offset=start))  # replica 2 gets A
    h.core.propose([b"b"], h.now)
    p1 = h.driver.begin(h.core.ready())  # B written, its fsync in flight
    sent = len(h.sent)
    h.core.step(  # replica 2 proves A durable there
        FetchRequest(h.next_corr(), CLUSTER, 2, UUIDS[2], h.core.epoch, last_a + 1, h.core.epoch, 0, 1 << 20),
        h.now,
    )
    h.core.propose([b"c"], h.now)  # a proposal arriving meanwhile stays for the next Ready
    assert h.driver.send_now()
    # A is answered and replica 2 gets B (written, not yet fsynced here) before B's fsync.
    assert [p.last_offset for p in h.sink.proposals][-1] == last_a and last_a < h.durable_end
    (resp,) = fetch_responses(h.sent[sent:])
    assert resp.records and resp.high_watermark == last_a + 1
    assert h.log.end_offset > h.durable_end
    assert not h.driver.send_now()  # nothing more to send
    h.driver.persist(p1)
    h.driver.finish(p1)
    nxt = h.core.ready()
    assert [b.count for b in nxt.append] == [1] and nxt.commit is None  # C; A's commit went out


def test_nothing_is_sent_early_while_the_ready_in_flight_saves_quorum_state() -> None:
    h = make(local=2)
    h.core.step(VoteRequest(h.next_corr(), CLUSTER, 3, UUIDS[3], 5, 2, UUIDS[2], 0, 0), h.now)
    pending = h.driver.begin(h.core.ready())
    assert pending.quorum_state is not None
    sent = len(h.sent)
    h.core.step(VoteRequest(h.next_corr(), CLUSTER, 1, UUIDS[1], 5, 2, UUIDS[2], 0, 0), h.now)
    assert not h.driver.send_now() and len(h.sent) == sent  # not even the refusal to node 1
    h.driver.persist(pending)
    h.driver.finish(pending)
    h.drain()
    granted = {
        o.destination_id: o.message.vote_granted for o in h.sent[sent:] if isinstance(o.message, VoteResponse)
    }
    assert granted == {3: True, 1: False}


def test_follower_sends_no_fetch_and_applies_nothing_early_while_its_fsync_runs() -> None:
    h, claims = follower()
    # The leader's high watermark (1) is below the new end (2): the strict rule holds (records
    # all committed would let the Fetch leave at once: tests/core/test_pipelined_fetch.py).
    h.core.step(response(last_fetch(h), 0, [b"a", b"b"], 1), h.now)
    pending = h.driver.begin(h.core.ready())
    sent = len(claims.claims)
    for t in range(1, 6):  # ticks past any retry timer while the fsync is in flight
        h.core.tick(h.now + 1000 * t)
        h.driver.send_now()
    assert len(claims.claims) == sent and h.driver.applied_end == 0
    h.driver.persist(pending)
    h.driver.finish(pending)
    h.drain()
    assert claims.claims[-1] == (2, 2) and h.driver.applied_end == 0
    h.step(FetchResponse(last_fetch(h).correlation_id, ErrorCode.NONE, 1, 1, high_watermark=2))
    h.drain()
    assert h.driver.applied_end == 2
    assert all(off <= durable for off, durable in claims.claims)
