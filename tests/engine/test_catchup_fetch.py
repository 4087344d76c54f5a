"""A large Fetch response during catch-up is checked once and taken whole or not at
all: a follower (the real core and driver) given 8 MiB of batches with one damaged batch in
the middle refuses the whole response, names the damaged batch's offset, appends nothing and
fetches again from the same offset; the undamaged response is appended byte for byte."""

from __future__ import annotations

from quorum.core.messages import BeginQuorumEpochRequest, FetchRequest, FetchResponse, FetchSnapshotResponse
from quorum.core.ready import RawBatches
from quorum.records import HEADER_SIZE, decode_batches, encode_batch
from quorum.runtime import wire
from quorum.types import ErrorCode, OffsetAndEpoch
from tests.core.util import CLUSTER, UUIDS, Harness, make

VALUE = bytes(range(256)) * 128  # 32 KiB


def _follower() -> tuple[Harness, FetchRequest]:
    h = make(local=2)
    h.step(BeginQuorumEpochRequest(h.next_corr(), CLUSTER, 1, 1, 2, UUIDS[2]))
    fetch = [o.message for o in h.sent if isinstance(o.message, FetchRequest)][-1]
    return h, fetch


def _large_fetch() -> bytes:
    out = bytearray()
    offset = 0
    for i in range(64):  # 64 batches of 4 x 32 KiB: 8 MiB
        recs = [VALUE + bytes([i, j]) for j in range(4)]
        out += encode_batch(offset, 1, recs, 0)
        offset += len(recs)
    return bytes(out)


def test_damaged_batch_in_a_large_fetch_refuses_it_whole_naming_the_offset() -> None:
    h, fetch = _follower()
    good = _large_fetch()
    batches, _ = decode_batches(good)
    bad = bytearray(good)
    victim = batches[37]
    bad[victim.position + HEADER_SIZE + 1000] ^= 0x01
    h.step(FetchResponse(fetch.correlation_id, ErrorCode.NONE, 1, 1, high_watermark=256, records=bytes(bad)))
    assert h.log.end_offset == 0 and h.core.log_end_offset == 0
    errs = [e for r in h.readies for e in r.errors]
    assert any(f"offset {victim.info.base_offset}" in e and "CRC" in e for e in errs), errs
    assert not [b for r in h.readies for b in r.append]
    assert h.core.hw == 0
    out = h.tick(200)
    again = [o.message for o in out if isinstance(o.message, FetchRequest)]
    assert again and again[-1].fetch_offset == 0  # fetched again from the same place

    h.step(FetchResponse(again[-1].correlation_id, ErrorCode.NONE, 1, 1, high_watermark=256, records=good))
    raws = [b for r in h.readies for b in r.append if isinstance(b, RawBatches)]
    assert len(raws) == 1 and raws[0].data == good  # the fetched bytes, unchanged, in one append
    assert h.log.end_offset == 256 and h.core.hw == 256
    assert h.log.read(0, len(good) + 1) == good


def test_fetched_records_are_a_view_into_the_received_body_not_a_copy() -> None:
    """The wire decode hands the core a view into the HTTP body (no copy of the
    megabytes a catch-up Fetch carries); the follower appends exactly those bytes."""
    h, fetch = _follower()
    good = _large_fetch()
    body = wire.encode(FetchResponse(fetch.correlation_id, ErrorCode.NONE, 1, 1, high_watermark=256,
                                     records=good))
    resp = wire.decode(FetchResponse, body)
    assert isinstance(resp.records, memoryview) and resp.records.obj is body
    h.step(resp)
    raws = [b for r in h.readies for b in r.append if isinstance(b, RawBatches)]
    assert len(raws) == 1 and isinstance(raws[0].data, memoryview) and raws[0].data.obj is body
    assert h.log.end_offset == 256 and h.log.read(0, len(good) + 1) == good


def test_fetched_snapshot_chunks_are_a_view_into_the_received_body() -> None:
    chunk = bytes(range(256)) * 4096  # 1 MiB
    sid = OffsetAndEpoch(10, 1)
    body = wire.encode(FetchSnapshotResponse(3, ErrorCode.NONE, 1, 1, sid, 2 << 20, 0, chunk))
    resp = wire.decode(FetchSnapshotResponse, body)
    assert isinstance(resp.unaligned_records, memoryview) and resp.unaligned_records.obj is body
    assert resp.unaligned_records == chunk and resp.size == 2 << 20
