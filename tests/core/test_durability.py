"""The Fetch-offset durability hole, driven by hand.

A follower's Fetch offset tells the leader "everything below is durable here", and the leader
counts it toward the high watermark. The node steps RPCs into the core while a Ready's fsync
runs; the old core then let ``advance`` add a Fetch built from the log end (including batches
of the NEXT Ready, not yet written) to the Ready being carried out. A leader and that follower
losing power could then lose an acknowledged write.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from quorum.core.messages import BeginQuorumEpochRequest, FetchRequest, FetchResponse
from quorum.core.raft import RaftCore
from quorum.core.ready import Outbound
from quorum.records import encode_batch
from quorum.storage.memory import MemoryLog
from quorum.types import ErrorCode
from tests.core.old_core import OldRaftCore
from tests.core.util import CLUSTER, UUIDS, Harness, make


@dataclass
class FetchClaims:
    """Wraps the harness transport: records (fetch_offset, durable end) of each Fetch sent."""

    log: MemoryLog
    inner: object
    claims: list[tuple[int, int]] = field(default_factory=list)

    def send(self, out: Outbound) -> None:
        if isinstance(out.message, FetchRequest):
            self.claims.append((out.message.fetch_offset, self.log.flushed_end_offset))
        self.inner.send(out)  # type: ignore[attr-defined]


def follower(core_cls: type[RaftCore]) -> tuple[Harness, FetchClaims, FetchRequest]:
    h = make(local=2, core_cls=core_cls)
    claims = FetchClaims(h.log, h.transport)
    h.driver.ports.transport = claims
    h.step(BeginQuorumEpochRequest(h.next_corr(), CLUSTER, 1, 1, 2, UUIDS[2]))
    fetch = [o.message for o in h.sent if isinstance(o.message, FetchRequest)][-1]
    return h, claims, fetch


def response_during_persist(h: Harness, fetch: FetchRequest) -> None:
    """Take a Ready, and step a Fetch response (two records) while it is being carried out."""
    pending = h.driver.begin(h.core.ready())
    data = encode_batch(0, 1, [b"a", b"b"], 0)
    h.core.step(
        FetchResponse(fetch.correlation_id, ErrorCode.NONE, 1, 1, high_watermark=0, records=data), h.now
    )
    if pending.needs_persist:
        h.driver.persist(pending)
    h.driver.finish(pending)
    h.drain()


def test_old_core_claims_beyond_the_durable_end_and_the_driver_refuses() -> None:
    """The old core path: a Fetch at offset 2 rode on the Ready in flight while the durable
    log ended at 0. The driver now refuses to send such a Fetch (and dies loudly)."""
    h, claims, fetch = follower(OldRaftCore)
    with pytest.raises(RuntimeError, match="offset 2 would claim more than the durable log end 0"):
        response_during_persist(h, fetch)
    assert all(off <= durable for off, durable in claims.claims)


def test_fetch_offset_never_beyond_the_durable_end() -> None:
    h, claims, fetch = follower(RaftCore)
    response_during_persist(h, fetch)
    assert all(off <= durable for off, durable in claims.claims)
    # ... and the follower still fetches on, from its log end, once that is durable.
    assert claims.claims[-1] == (2, 2) and h.durable_end == 2


def test_nothing_queued_after_ready_joins_the_ready_in_flight() -> None:
    h, _claims, fetch = follower(RaftCore)
    ready = h.core.ready()
    pending = h.driver.begin(ready)
    before = list(ready.messages)
    data = encode_batch(0, 1, [b"a"], 0)
    h.core.step(
        FetchResponse(fetch.correlation_id, ErrorCode.NONE, 1, 1, high_watermark=1, records=data), h.now
    )
    h.core.advance(ready, h.durable_end)
    assert ready.messages == before and ready.commit is None and not ready.append
    h.driver.in_flight = None  # advance was called by hand above
    del pending
    nxt = h.core.ready()
    assert [b.base_offset for b in nxt.append] == [0] and nxt.flush


def test_driver_refuses_to_send_before_persist() -> None:
    h, _claims, fetch = follower(RaftCore)
    h.core.step(
        FetchResponse(
            fetch.correlation_id,
            ErrorCode.NONE,
            1,
            1,
            high_watermark=0,
            records=encode_batch(0, 1, [b"a"], 0),
        ),
        h.now,
    )
    pending = h.driver.begin(h.core.ready())
    assert pending.needs_persist
    with pytest.raises(RuntimeError, match="before persist"):
        h.driver.finish(pending)
    with pytest.raises(RuntimeError, match="in flight"):
        h.driver.begin(h.core.ready())
    h.driver.persist(pending)
    h.driver.finish(pending)
    assert h.durable_end == 1


def test_a_restarted_follower_publishes_its_restored_role() -> None:
    """A node restarted on its own directory must publish the role and leader it
    restored (not 'unattached, leader -1' until its next transition)."""
    import random

    h, _claims, _fetch = follower(RaftCore)
    assert h.driver.published.role == "follower"
    core = RaftCore(
        h.core.config, h.core.local, CLUSTER, h.qs, h.store.summary(), h.store.reader(), random.Random(2), 0
    )
    again = Harness(core, h.store)
    assert again.drain() is not None
    (first,) = again.sink.roles
    assert (first.role, first.leader_id, first.epoch) == ("follower", 1, 1)
    assert again.driver.published == first
