"""Behaviour of the log, run against SegmentedLog (real files, real fsync, tiny segments) and
MemoryLog alike."""

from __future__ import annotations

import pytest

from quorum import records
from quorum.storage.log import SegmentedLog
from quorum.types import (
    AddVoter,
    BatchInfo,
    ControlRecord,
    ErrorCode,
    KraftError,
    LeaderChange,
    OffsetAndEpoch,
    ReplicaKey,
    TargetVoters,
)
from tests.storage.conftest import LogHarness

R1 = ReplicaKey(1, "00000000-0000-4000-8000-000000000001")
R2 = ReplicaKey(2, "00000000-0000-4000-8000-000000000002")


def fill(h: LogHarness, batches: int, per_batch: int = 3, epoch: int = 1, size: int = 40) -> list[BatchInfo]:
    out = []
    for _ in range(batches):
        base = h.log.end_offset
        recs = [f"{base + j}".encode().ljust(size, b".") for j in range(per_batch)]
        out.append(h.log.append(base, epoch, recs, append_time_ms=0))
    return out


def all_records(h: LogHarness, start: int | None = None, max_bytes: int = 1 << 20) -> list[bytes]:
    off = h.log.log_start_offset if start is None else start
    out: list[bytes] = []
    while True:
        data = h.log.read(off, max_bytes)
        if not data:
            return out
        batches, used = records.decode_batches(data)
        assert used == len(data) and batches[0].info.base_offset <= off
        for b in batches:
            out.extend(records.data_records(b))
        off = batches[-1].info.next_offset


def test_fresh_log_is_empty(harness: LogHarness) -> None:
    log = harness.log
    assert (log.log_start_offset, log.end_offset, log.flushed_end_offset, log.last_epoch) == (0, 0, 0, 0)
    assert log.read(0, 100) == b""
    s = log.summary()
    assert (s.log_start_offset, s.end_offset, s.last_epoch, s.epoch_starts, s.control_batches) == (
        0,
        0,
        0,
        [],
        [],
    )


def test_append_read_flush_across_segment_rolls(harness: LogHarness) -> None:
    infos = fill(harness, 40)
    log = harness.log
    assert log.end_offset == 120 and infos[-1].last_offset == 119
    assert log.flushed_end_offset == 0
    log.flush()
    assert log.flushed_end_offset == 120
    if isinstance(log, SegmentedLog):
        assert log.segment_count > 3  # rolled: 40 batches of ~170 bytes into 1 KiB segments
    recs = all_records(harness)
    assert recs == [f"{i}".encode().ljust(40, b".") for i in range(120)]
    # small max_bytes still returns one whole batch
    one = log.read(30, 1)
    (b,), _ = records.decode_batches(one)
    assert b.info.base_offset == 30 and b.info.count == 3
    assert log.read(120, 100) == b""


def test_read_limits(harness: LogHarness) -> None:
    infos = fill(harness, 10)
    log = harness.log
    size = infos[0].size_bytes
    got, _ = records.decode_batches(log.read(0, 2 * size))
    assert [g.info.base_offset for g in got] == [0, 3]
    got, _ = records.decode_batches(log.read(0, 2 * size - 1))
    assert [g.info.base_offset for g in got] == [0]
    # inside a batch: the whole batch holding the offset (Kafka Fetch semantics)
    got, _ = records.decode_batches(log.read(4, size))
    assert [g.info.base_offset for g in got] == [3]
    # max_offset (exclusive) keeps only batches ending at or below it
    got, _ = records.decode_batches(log.read(0, 10 * size, max_offset=9))
    assert [g.info.base_offset for g in got][-1] == 6
    assert log.read(0, 10 * size, max_offset=2) == b""
    assert log.read(9, 10 * size, max_offset=9) == b""
    for bad in (-1, 31):
        with pytest.raises(KraftError) as e:
            log.read(bad, 100)
        assert e.value.code is ErrorCode.OFFSET_OUT_OF_RANGE


def test_control_batches_and_summary(harness: LogHarness) -> None:
    log = harness.log
    lc = LeaderChange(1, (R1, R2), (R1,))
    log.append(0, 1, [lc])
    fill(harness, 2, epoch=1)
    controls: list[ControlRecord] = [AddVoter(R2, "127.0.0.1:9002"), TargetVoters((1, 2))]
    info = log.append(log.end_offset, 3, controls)
    assert info.is_control and info.controls[0] == AddVoter(R2, "127.0.0.1:9002")
    fill(harness, 2, epoch=3)
    log.flush()
    for restart in (False, True):
        log = harness.restart() if restart else harness.log
        s = log.summary()
        assert s.end_offset == 15 and s.last_epoch == 3
        assert s.epoch_starts == [(1, 0), (3, 7)]
        assert [b.base_offset for b in s.control_batches] == [0, 7]
        assert s.control_batches[0].controls == (lc,)
        assert s.control_batches[1].controls == (AddVoter(R2, "127.0.0.1:9002"), TargetVoters((1, 2)))


def test_append_checks_offsets_and_epochs(harness: LogHarness) -> None:
    fill(harness, 2, epoch=5)
    log = harness.log
    with pytest.raises(KraftError) as e:
        log.append(5, 5, [b"x"])
    assert e.value.code is ErrorCode.INVALID_REQUEST and "log ends at 6" in e.value.message
    with pytest.raises(KraftError) as e:
        log.append(6, 4, [b"x"])
    assert e.value.code is ErrorCode.INVALID_REQUEST and "epoch 4" in e.value.message
    with pytest.raises(KraftError) as e:
        log.append(6, 5, [])
    assert e.value.code is ErrorCode.INVALID_REQUEST
    with pytest.raises(KraftError) as e:
        log.append(6, 5, [b"x", TargetVoters(None)])  # type: ignore[arg-type]
    assert e.value.code is ErrorCode.INVALID_REQUEST
    assert log.end_offset == 6 and len(all_records(harness)) == 6  # nothing written by the failures


def test_append_batches_follower_path(harness: LogHarness) -> None:
    leader = [records.encode_batch(0, 2, [b"a", b"b"]), records.encode_batch(2, 2, [b"c"] * 50)]
    raw = b"".join(leader)
    batches, _ = records.decode_batches(raw)
    harness.log.append_batches(raw, [b.info for b in batches])
    assert harness.log.end_offset == 52
    assert harness.log.read(0, 1 << 20) == raw
    # mismatched infos are refused and nothing is written
    more = records.encode_batch(52, 2, [b"d"])
    bad_infos = [
        [BatchInfo(53, 2, 1)],  # not at the log end
        [BatchInfo(52, 3, 1)],  # header says epoch 2
        [BatchInfo(52, 2, 2)],  # header says 1 record
        [BatchInfo(52, 2, 1, size_bytes=len(more) + 1)],
        [],
    ]
    for infos in bad_infos:
        with pytest.raises(KraftError) as e:
            harness.log.append_batches(more, infos)
        assert e.value.code is ErrorCode.INVALID_REQUEST
    with pytest.raises(KraftError):
        harness.log.append_batches(more + b"\x00", [BatchInfo(52, 2, 1)])  # trailing bytes
    with pytest.raises(KraftError):
        harness.log.append_batches(more[:-3], [BatchInfo(52, 2, 1)])  # cut short
    assert harness.log.end_offset == 52
    harness.log.append_batches(more, [BatchInfo(52, 2, 1)])
    assert harness.log.end_offset == 53


def test_append_batches_many_at_once_rolls_segments(harness: LogHarness) -> None:
    raw = b"".join(records.encode_batch(i * 2, 1, [b"x" * 100, b"y" * 100]) for i in range(30))
    batches, _ = records.decode_batches(raw)
    harness.log.append_batches(raw, [b.info for b in batches])
    harness.log.flush()
    log = harness.restart()
    assert log.end_offset == 60
    assert len(all_records(harness)) == 60
    if isinstance(log, SegmentedLog):
        assert log.segment_count > 3


def test_truncate_across_segments(harness: LogHarness) -> None:
    infos = fill(harness, 30, epoch=1)
    fill(harness, 10, epoch=2)
    harness.log.flush()
    log = harness.log
    with pytest.raises(KraftError) as e:
        log.truncate_to(31)  # inside the batch 30..32
    assert e.value.code is ErrorCode.INVALID_REQUEST and "inside the batch" in e.value.message
    with pytest.raises(KraftError) as e:
        log.truncate_to(121)
    assert e.value.code is ErrorCode.OFFSET_OUT_OF_RANGE
    assert log.end_offset == 120
    log.truncate_to(infos[10].base_offset)
    assert log.end_offset == 30 and log.last_epoch == 1 and log.flushed_end_offset == 30
    assert log.summary().epoch_starts == [(1, 0)]
    assert all_records(harness) == [f"{i}".encode().ljust(40, b".") for i in range(30)]
    fill(harness, 2, epoch=4)  # appending after a truncation continues at the cut
    log.flush()
    log = harness.restart()
    assert log.end_offset == 36 and log.summary().epoch_starts == [(1, 0), (4, 30)]
    log.truncate_to(0)
    assert (log.end_offset, log.last_epoch) == (0, 0)
    log = harness.restart()
    assert log.end_offset == 0 and log.read(0, 100) == b""


def test_truncate_drops_controls(harness: LogHarness) -> None:
    fill(harness, 1)
    harness.log.append(3, 2, [AddVoter(R2)])
    harness.log.truncate_to(3)
    assert harness.log.summary().control_batches == []


def test_delete_before_keeps_everything_at_or_after(harness: LogHarness) -> None:
    fill(harness, 40)
    harness.log.flush()
    harness.log.delete_before(60)
    log = harness.log
    assert 0 < log.log_start_offset <= 60
    assert all_records(harness, 60)[0] == b"60".ljust(40, b".")
    with pytest.raises(KraftError) as e:
        log.read(log.log_start_offset - 1, 100)
    assert e.value.code is ErrorCode.OFFSET_OUT_OF_RANGE
    start = log.log_start_offset
    log = harness.restart()
    assert log.log_start_offset == start and log.end_offset == 120
    s = log.summary(OffsetAndEpoch(60, 1))
    assert s.epoch_starts == [(1, 60)] and s.snapshot == OffsetAndEpoch(60, 1)


def test_reset_to_snapshot(harness: LogHarness) -> None:
    fill(harness, 20, epoch=2)
    harness.log.reset_to_snapshot(OffsetAndEpoch(500, 7))
    log = harness.log
    assert (log.log_start_offset, log.end_offset, log.last_epoch, log.flushed_end_offset) == (
        500,
        500,
        7,
        500,
    )
    assert log.read(500, 100) == b""
    with pytest.raises(KraftError):
        log.read(10, 100)
    with pytest.raises(KraftError):
        log.append(500, 6, [b"older epoch"])
    log.append(500, 7, [b"a"])
    log.flush()
    log = harness.restart()
    assert (log.log_start_offset, log.end_offset) == (500, 501)
    s = log.summary(OffsetAndEpoch(500, 7))
    assert s.epoch_starts == [(7, 500)] and s.last_epoch == 7


def test_summary_after_snapshot(harness: LogHarness) -> None:
    harness.log.append(0, 1, [AddVoter(R1)])
    fill(harness, 5, epoch=1)  # 1..15
    harness.log.append(16, 2, [AddVoter(R2)])
    fill(harness, 1, epoch=2)  # 17..19
    s = harness.log.summary(OffsetAndEpoch(10, 1), (AddVoter(R1),))
    assert s.snapshot_controls == (AddVoter(R1),)
    assert [b.base_offset for b in s.control_batches] == [16]
    assert s.epoch_starts == [(1, 10), (2, 16)]
    s = harness.log.summary(OffsetAndEpoch(20, 2))
    assert s.epoch_starts == [] and s.last_epoch == 2 and s.control_batches == []


def test_closed_log_refuses_use(harness: LogHarness) -> None:
    harness.log.close()
    with pytest.raises(KraftError) as e:
        harness.log.append(0, 1, [b"x"])
    assert e.value.code is ErrorCode.UNAVAILABLE
    harness.log.close()  # idempotent


def test_batch_larger_than_a_segment(harness: LogHarness) -> None:
    fill(harness, 2)
    big = harness.log.append(6, 1, [b"B" * 3000])  # bigger than the 1 KiB test segments
    fill(harness, 2)
    harness.log.flush()
    log = harness.restart()
    assert log.end_offset == 13
    (b,), _ = records.decode_batches(log.read(6, 0))  # max_bytes 0 still gives one whole batch
    assert b.info.base_offset == 6 and b.info.size_bytes == big.size_bytes
    assert records.data_records(b) == [b"B" * 3000]
