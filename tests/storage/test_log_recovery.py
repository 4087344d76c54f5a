"""SegmentedLog recovery on open, on real files: a torn tail of the last segment is cut with a
warning; any other damage stops with CORRUPT_LOG and leaves every file byte-for-byte as it was."""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
from pathlib import Path

import pytest

from quorum import records
from quorum.storage.log import SegmentedLog, segment_name
from quorum.storage.memory import MemoryLog
from quorum.types import AddVoter, ErrorCode, KraftError, ReplicaKey

BIG = 1 << 20  # one segment for the whole test log
SMALL = 1024


def build(path: Path, batches: int, segment_bytes: int = BIG, epoch: int = 1) -> list[tuple[int, int]]:
    """Write ``batches`` batches of 3 records; returns (base offset, size) of each."""
    out = []
    with SegmentedLog(path, segment_bytes=segment_bytes) as log:
        for i in range(batches):
            base = log.end_offset
            if i == 2:
                info = log.append(base, epoch, [AddVoter(ReplicaKey(9, None))], append_time_ms=0)
            else:
                info = log.append(base, epoch, [bytes([i]) * 50] * 3, append_time_ms=0)
            out.append((info.base_offset, info.size_bytes))
        log.flush()
    return out


def digest(path: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(path.iterdir())}


def segments(path: Path) -> list[Path]:
    return sorted(p for p in path.iterdir() if p.suffix == ".log")


def flip(path: Path, position: int) -> None:
    with open(path, "r+b") as f:
        f.seek(position)
        b = f.read(1)
        f.seek(position)
        f.write(bytes([b[0] ^ 0xFF]))


def expect_corrupt(path: Path, *words: str, segment_bytes: int = BIG) -> KraftError:
    before = digest(path)
    with pytest.raises(KraftError) as e:
        SegmentedLog(path, segment_bytes=segment_bytes)
    assert e.value.code is ErrorCode.CORRUPT_LOG
    for w in words:
        assert w in e.value.message, e.value.message
    assert digest(path) == before  # nothing committed lost, nothing modified
    return e.value


def test_clean_reopen(tmp_path: Path) -> None:
    layout = build(tmp_path, 12)
    with SegmentedLog(tmp_path, segment_bytes=BIG) as log:
        assert log.end_offset == sum(1 if i == 2 else 3 for i in range(12))
        assert [b for b, _ in layout] == [o for o, _s, _p in log.batch_infos()]
        assert [b.base_offset for b in log.summary().control_batches] == [layout[2][0]]


@pytest.mark.parametrize("cut", [1, 5, 40])
def test_torn_tail_partial_batch_is_truncated(
    tmp_path: Path, cut: int, caplog: pytest.LogCaptureFixture
) -> None:
    layout = build(tmp_path, 10)
    seg = segments(tmp_path)[-1]
    full = seg.stat().st_size
    os.truncate(seg, full - cut)
    with caplog.at_level(logging.WARNING, logger="quorum.storage.log"), SegmentedLog(tmp_path) as log:
        assert log.end_offset == layout[-1][0]
        assert seg.stat().st_size == full - layout[-1][1]
        assert "torn tail" in caplog.text and seg.name in caplog.text
        log.append(log.end_offset, 1, [b"again"])  # writable at the cut
        log.flush()
    with SegmentedLog(tmp_path) as log:
        assert log.end_offset == layout[-1][0] + 1


@pytest.mark.parametrize("where", ["crc-field", "payload", "length-up", "count"])
def test_damaged_final_batch_is_not_a_torn_tail(tmp_path: Path, where: str) -> None:
    """The last batch was written whole (the file holds all of it): a failed check is damage to
    something the node may have acknowledged, so the log is not cut."""
    layout = build(tmp_path, 10)
    seg = segments(tmp_path)[-1]
    last_pos = seg.stat().st_size - layout[-1][1]
    if where == "length-up":  # now claims to run past the file end, like a partial batch
        with open(seg, "r+b") as f:
            f.seek(last_pos + 8)
            f.write((layout[-1][1] - 12 + 64).to_bytes(4, "little"))
    else:
        at = {"crc-field": last_pos + 13, "payload": seg.stat().st_size - 2, "count": last_pos + 21}
        flip(seg, at[where])
    expect_corrupt(tmp_path, seg.name, "not a torn write", f"position {last_pos}")


def test_partial_final_batch_with_zeros_after_a_sector_boundary_is_torn(tmp_path: Path) -> None:
    """A power cut after the file was extended, before its last sectors were written: the
    batch's bytes from a sector boundary on read back as zeros."""
    with SegmentedLog(tmp_path, segment_bytes=BIG) as log:
        for i in range(6):
            log.append(log.end_offset, 1, [bytes([65 + i]) * 300] * 2, append_time_ms=0)
        infos = log.batch_infos()
    seg = segments(tmp_path)[-1]
    data = bytearray(seg.read_bytes())
    last_pos = infos[-1][2]
    boundary = (last_pos // 512 + 1) * 512
    assert boundary < len(data)
    data[boundary:] = bytes(len(data) - boundary + 700)  # and the file was extended further
    seg.write_bytes(bytes(data))
    with SegmentedLog(tmp_path) as log:
        assert log.end_offset == infos[-1][0]
    assert seg.stat().st_size == last_pos


@pytest.mark.parametrize("tail", [b"\x00" * 4096, b"\x00" * 10, b"\x07" * 20])
def test_torn_tail_garbage_after_last_batch(tmp_path: Path, tail: bytes) -> None:
    layout = build(tmp_path, 5)
    seg = segments(tmp_path)[-1]
    with open(seg, "ab") as f:
        f.write(tail)
    with SegmentedLog(tmp_path) as log:
        assert log.end_offset == layout[-1][0] + 3
    assert seg.stat().st_size == sum(s for _, s in layout)


def test_torn_tail_of_a_rolled_last_segment(tmp_path: Path) -> None:
    build(tmp_path, 30, segment_bytes=SMALL)
    segs = segments(tmp_path)
    assert len(segs) > 2
    last = segs[-1]
    first_base = int(last.name[:20])
    os.truncate(last, 7)  # the only batch of the last segment is torn
    with SegmentedLog(tmp_path, segment_bytes=SMALL) as log:
        assert log.end_offset == first_base
        assert [int(p.name[:20]) for p in segments(tmp_path)][-1] == first_base


def test_corrupt_batch_before_the_tail(tmp_path: Path) -> None:
    layout = build(tmp_path, 10)
    seg = segments(tmp_path)[-1]
    pos = sum(s for _, s in layout[:4])
    flip(seg, pos + 40)  # payload of batch 4, valid batches follow
    expect_corrupt(tmp_path, seg.name, "CRC", f"position {pos}")


def test_corrupt_length_field_before_the_tail(tmp_path: Path) -> None:
    layout = build(tmp_path, 10)
    seg = segments(tmp_path)[-1]
    pos = sum(s for _, s in layout[:4])
    with open(seg, "r+b") as f:  # batch 4 now claims to run past the end of the file
        f.seek(pos + 8)
        f.write((10_000).to_bytes(4, "little"))
    expect_corrupt(tmp_path, seg.name, "valid batch", f"offset {layout[4][0]}")


@pytest.mark.parametrize("field", ["count", "epoch", "length"])
def test_invalid_header_before_the_tail(tmp_path: Path, field: str) -> None:
    layout = build(tmp_path, 10)
    seg = segments(tmp_path)[-1]
    pos = sum(s for _, s in layout[:8])  # two valid batches follow, fewer than 4 KiB
    at, value = {"count": (21, -1), "epoch": (16, -7), "length": (8, 3)}[field]
    with open(seg, "r+b") as f:
        f.seek(pos + at)
        f.write(value.to_bytes(4, "little", signed=True))
    expect_corrupt(tmp_path, seg.name)


def test_corrupt_batch_in_non_final_segment(tmp_path: Path) -> None:
    build(tmp_path, 30, segment_bytes=SMALL)
    first = segments(tmp_path)[0]
    with open(first, "r+b") as f:  # base offset of the second batch
        f.seek(records.batch_header(f.read(), 0)[1])
        f.write((77).to_bytes(8, "little"))
    expect_corrupt(tmp_path, first.name, "base offset 77", segment_bytes=SMALL)


def test_partial_batch_in_non_final_segment(tmp_path: Path) -> None:
    build(tmp_path, 30, segment_bytes=SMALL)
    first = segments(tmp_path)[0]
    os.truncate(first, first.stat().st_size - 3)
    e = expect_corrupt(tmp_path, first.name, segment_bytes=SMALL)
    assert "partial batch" in e.message or "gap" in e.message


def test_corrupt_control_batch_in_non_final_segment(tmp_path: Path) -> None:
    layout = build(tmp_path, 30, segment_bytes=SMALL)
    first = segments(tmp_path)[0]
    pos = layout[0][1] + layout[1][1]  # batch 2 is the control batch
    flip(first, pos + 40)
    expect_corrupt(tmp_path, first.name, "control batch", segment_bytes=SMALL)


def test_missing_segment_is_a_gap(tmp_path: Path) -> None:
    build(tmp_path, 30, segment_bytes=SMALL)
    segs = segments(tmp_path)
    segs[1].unlink()
    expect_corrupt(tmp_path, segs[2].name, "gap", segment_bytes=SMALL)


def test_overlapping_segments(tmp_path: Path) -> None:
    build(tmp_path, 30, segment_bytes=SMALL)
    segs = segments(tmp_path)
    shutil.copy(segs[1], tmp_path / segment_name(int(segs[1].name[:20]) - 3))
    expect_corrupt(tmp_path, "overlap", segment_bytes=SMALL)


def test_decreasing_epoch(tmp_path: Path) -> None:
    data = (
        records.encode_batch(0, 5, [b"a"])
        + records.encode_batch(1, 3, [b"b"])
        + records.encode_batch(2, 5, [b"c"])
    )
    (tmp_path / segment_name(0)).write_bytes(data)
    expect_corrupt(tmp_path, "epoch 3")


def test_first_batch_not_at_segment_base(tmp_path: Path) -> None:
    (tmp_path / segment_name(10)).write_bytes(
        records.encode_batch(11, 1, [b"a"]) + records.encode_batch(12, 1, [b"b"])
    )
    expect_corrupt(tmp_path, "base offset 11", "expected 10")


def test_unrelated_files_are_ignored(tmp_path: Path) -> None:
    build(tmp_path, 3)
    (tmp_path / "notes.txt").write_text("hello")
    (tmp_path / "123.log").write_text("not a segment name")
    with SegmentedLog(tmp_path) as log:
        assert log.end_offset == 7


def test_unflushed_appends_survive_a_clean_close_and_flush_is_batched(tmp_path: Path) -> None:
    log = SegmentedLog(tmp_path, segment_bytes=SMALL)
    for i in range(50):
        log.append(i, 1, [b"x" * 30])
    assert log.flushed_end_offset == 0
    log.flush()
    assert log.flushed_end_offset == 50
    log.append(50, 1, [b"y"])
    log.close()  # close flushes
    with SegmentedLog(tmp_path, segment_bytes=SMALL) as log2:
        assert log2.end_offset == 51


def test_memory_crash_drops_unflushed() -> None:
    log = MemoryLog()
    log.append(0, 1, [b"a"])
    log.append(1, 1, [AddVoter(ReplicaKey(4, None))])
    log.flush()
    log.append(2, 2, [b"b"])
    log.append(3, 2, [AddVoter(ReplicaKey(5, None))])
    log.crash()
    assert (log.end_offset, log.flushed_end_offset, log.last_epoch) == (2, 2, 1)
    assert [b.base_offset for b in log.summary().control_batches] == [1]
    log.append(2, 3, [b"c"])
    assert log.end_offset == 3
