"""Fetch handling on both sides, the high-watermark rules, long polling and read_index."""

from __future__ import annotations

import pytest

from quorum.core.messages import FetchRequest, FetchResponse
from quorum.core.ready import LeaderBatch, RawBatches
from quorum.records import encode_batch
from quorum.types import ErrorCode, KraftError, OffsetAndEpoch
from tests.core.util import CLUSTER, UUIDS, Harness, fetch_responses, leader, make


def test_fetch_stale_epoch_and_wrong_cluster() -> None:
    h = leader()
    (r,) = fetch_responses(h.fetch(2, epoch=h.core.epoch - 1))
    assert (
        r.error_code is ErrorCode.FENCED_LEADER_EPOCH and r.leader_id == 1 and r.leader_epoch == h.core.epoch
    )
    (r,) = fetch_responses(h.fetch(2, cluster="other"))
    assert r.error_code is ErrorCode.INCONSISTENT_CLUSTER_ID and not r.records


def test_fetch_invalid_position_is_rejected_with_a_clear_error() -> None:
    h = leader()
    out = h.step(FetchRequest(h.next_corr(), CLUSTER, 2, UUIDS[2], h.core.epoch, -5, 0, 0, 1024))
    (r,) = fetch_responses(out)
    assert r.error_code is ErrorCode.INVALID_REQUEST


def test_fetch_returns_durable_records_and_moves_hw_by_majority() -> None:
    h = leader()
    start_hw = h.core.hw
    last = h.core.propose([b"a", b"b"], h.now)
    h.drain()
    assert h.core.hw == start_hw  # nobody else has it yet: no majority
    (r,) = fetch_responses(h.fetch(2, offset=start_hw))
    assert r.records and r.high_watermark == start_hw
    h.fetch(2, offset=last + 1)
    assert h.core.hw == last + 1  # leader + replica 2 = majority of 3


def test_diverging_epoch() -> None:
    h = leader()
    # A follower claiming epoch 0 data up to offset 10 that the leader never had.
    (r,) = fetch_responses(h.fetch(2, offset=10, last_epoch=0))
    assert r.diverging_epoch is not None
    assert r.diverging_epoch.offset == 0  # nothing of epoch 0 exists here


def test_fetch_below_log_start_answers_snapshot_id() -> None:
    h = leader()
    h.core.propose([b"x"] * 3, h.now)
    h.drain()
    h.fetch(2)
    h.fetch(3)
    hw = h.core.hw
    sid = OffsetAndEpoch(hw, h.core.epoch_at(hw - 1))
    h.store.snapshots.write(sid, h.core.controls_at(hw), [b"{}"])
    h.log.delete_before(hw)
    h.core.snapshot_taken(sid, min(h.log.log_start_offset, hw))
    (r,) = fetch_responses(h.fetch(2, offset=0, last_epoch=0))
    assert r.snapshot_id == sid and not r.records


def test_long_poll_is_parked_and_answered_when_data_is_durable() -> None:
    h = leader()
    out = h.fetch(2, max_wait=400)
    assert not fetch_responses(out)  # parked
    h.core.propose([b"new"], h.now)
    out = h.drain()
    (r,) = fetch_responses(out)
    assert r.records


def test_long_poll_times_out_with_an_empty_answer() -> None:
    h = leader()
    h.fetch(2, max_wait=300)
    out = h.tick(400)
    rs = [r for r in fetch_responses(out) if r.error_code is ErrorCode.NONE]
    assert rs and not rs[0].records


def test_read_index_waits_for_a_majority_fetch_after_the_call() -> None:
    h = leader()
    h.fetch(2, max_wait=400)  # parked before the call
    h.core.read_index(7, h.now)
    out = h.drain()
    assert not h.reads
    assert fetch_responses(out)  # the parked fetch is released so the follower comes back at once
    h.fetch(2)
    assert [(r.read_id, r.index) for r in h.reads] == [(7, h.core.hw)]


def test_read_index_many_reads_share_one_confirmation() -> None:
    h = leader()
    for i in range(5):
        h.core.read_index(i, h.now)
    h.drain()
    h.fetch(3)
    assert sorted(r.read_id for r in h.reads) == list(range(5))


def test_read_index_and_propose_refused_when_not_leader() -> None:
    h = make()
    with pytest.raises(KraftError) as e:
        h.core.read_index(1, 0)
    assert e.value.code is ErrorCode.NOT_LEADER
    with pytest.raises(KraftError) as e:
        h.core.propose([b"x"], 0)
    assert e.value.code is ErrorCode.NOT_LEADER


def test_writes_wait_for_the_bootstrap_voter_set() -> None:
    """KIP-856: no state-machine writes before the AddVoter batch reached every voter."""
    h = leader(bootstrap=False)
    with pytest.raises(KraftError) as e:
        h.core.propose([b"x"], h.now)
    assert e.value.code is ErrorCode.UNAVAILABLE


def test_group_commit_one_batch_per_ready() -> None:
    h = leader()
    offsets = [h.core.propose([f"r{i}".encode()], h.now) for i in range(128)]
    r = h.core.ready()
    assert len(r.append) == 1
    batch = r.append[0]
    assert isinstance(batch, LeaderBatch) and batch.count == 128
    assert offsets == list(range(offsets[0], offsets[0] + 128))


def test_hw_never_decreases_and_needs_own_epoch_entry() -> None:
    h = leader()
    hw = h.core.hw
    h.fetch(2, offset=0, last_epoch=0)  # a replica going back (e.g. after losing its disk)
    h.fetch(3, offset=0, last_epoch=0)
    assert h.core.hw == hw


def _follower() -> tuple[Harness, FetchRequest]:
    h = make(local=2)
    from quorum.core.messages import BeginQuorumEpochRequest

    h.step(BeginQuorumEpochRequest(h.next_corr(), CLUSTER, 1, 1, 2, UUIDS[2]))
    fetch = [o.message for o in h.sent if isinstance(o.message, FetchRequest)][-1]
    return h, fetch


def test_follower_rejects_corrupt_fetch_response_and_appends_nothing() -> None:
    h, fetch = _follower()
    good = encode_batch(0, 1, [b"a", b"b"], 0)
    bad = bytearray(good)
    bad[-1] ^= 0xFF
    out = h.step(
        FetchResponse(fetch.correlation_id, ErrorCode.NONE, 1, 1, high_watermark=2, records=bytes(bad))
    )
    assert h.log.end_offset == 0 and h.core.log_end_offset == 0
    errs = [e for r in h.readies for e in r.errors]
    assert any("corrupt" in e.lower() for e in errs)
    assert h.core.hw == 0
    # It retries the fetch.
    out = h.tick(200)
    assert any(isinstance(o.message, FetchRequest) and o.message.fetch_offset == 0 for o in out)


def test_follower_rejects_batches_that_do_not_start_at_its_log_end() -> None:
    h, fetch = _follower()
    h.step(
        FetchResponse(
            fetch.correlation_id,
            ErrorCode.NONE,
            1,
            1,
            high_watermark=2,
            records=encode_batch(5, 1, [b"a"], 0),
        )
    )
    assert h.log.end_offset == 0
    assert any("does not follow" in e for r in h.readies for e in r.errors)


def test_follower_appends_raw_bytes_and_caps_hw_at_its_log_end() -> None:
    h, fetch = _follower()
    data = encode_batch(0, 1, [b"a", b"b"], 0)
    h.step(FetchResponse(fetch.correlation_id, ErrorCode.NONE, 1, 1, high_watermark=50, records=data))
    raws = [b for r in h.readies for b in r.append if isinstance(b, RawBatches)]
    assert raws and raws[0].data == data
    assert h.log.end_offset == 2 and h.core.hw == 2


def test_follower_truncates_on_diverging_epoch_but_never_below_hw() -> None:
    h, fetch = _follower()
    data = encode_batch(0, 1, [b"a", b"b"], 0) + encode_batch(2, 1, [b"c"], 0)
    h.step(FetchResponse(fetch.correlation_id, ErrorCode.NONE, 1, 1, high_watermark=2, records=data))
    nxt = [o.message for o in h.sent if isinstance(o.message, FetchRequest)][-1]
    h.step(
        FetchResponse(
            nxt.correlation_id, ErrorCode.NONE, 1, 1, high_watermark=2, diverging_epoch=OffsetAndEpoch(0, 0)
        )
    )
    assert h.log.end_offset == 3  # 0 is below the high watermark 2: refused
    assert any("below the high watermark" in e for r in h.readies for e in r.errors)
    h.tick(1100)  # the retry after the refused truncation
    assert h.core.role_name == "follower"
    nxt = [o.message for o in h.sent if isinstance(o.message, FetchRequest)][-1]
    h.step(
        FetchResponse(
            nxt.correlation_id, ErrorCode.NONE, 1, 1, high_watermark=2, diverging_epoch=OffsetAndEpoch(2, 1)
        )
    )
    assert h.log.end_offset == 2


def test_diverging_epoch_of_another_epoch_truncates_at_our_epoch_end() -> None:
    """KIP-595 / Kafka ``truncateToEndOffset``: when the leader's diverging epoch (2) is not our
    last epoch at or below it (1), truncate to where OUR epoch 1 ends (a batch boundary here),
    not to the leader's offset, which can fall inside one of our batches (the power-loss
    simulation found such a split)."""
    from quorum.core.messages import BeginQuorumEpochRequest

    h = make(local=2)
    h.step(BeginQuorumEpochRequest(h.next_corr(), CLUSTER, 1, 3, 2, UUIDS[2]))
    fetch = [o.message for o in h.sent if isinstance(o.message, FetchRequest)][-1]
    data = (
        encode_batch(0, 1, [b"a", b"b"], 0)
        + encode_batch(2, 1, [b"c", b"d"], 0)
        + encode_batch(4, 3, [b"e"], 0)
    )
    h.step(FetchResponse(fetch.correlation_id, ErrorCode.NONE, 1, 3, high_watermark=2, records=data))
    assert h.log.end_offset == 5
    nxt = [o.message for o in h.sent if isinstance(o.message, FetchRequest)][-1]
    assert (nxt.fetch_offset, nxt.last_fetched_epoch) == (5, 3)
    # The leader's log: epoch 1 up to 2, then epoch 2 up to 3.
    h.step(
        FetchResponse(
            nxt.correlation_id, ErrorCode.NONE, 1, 3, high_watermark=2, diverging_epoch=OffsetAndEpoch(3, 2)
        )
    )
    assert h.log.end_offset == 4 and not [e for r in h.readies for e in r.errors]
    nxt = [o.message for o in h.sent if isinstance(o.message, FetchRequest)][-1]
    assert (nxt.fetch_offset, nxt.last_fetched_epoch) == (4, 1)
    h.step(
        FetchResponse(
            nxt.correlation_id, ErrorCode.NONE, 1, 3, high_watermark=2, diverging_epoch=OffsetAndEpoch(2, 1)
        )
    )
    assert h.log.end_offset == 2 and h.core.hw == 2
