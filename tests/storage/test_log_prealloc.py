"""Preallocated segments on real files: the active segment runs ahead of its data with a zero
tail, which a reopen after a crash reads as the log's end (no warning, no cut), while a torn or
damaged batch inside that tail is still cut or refused as without preallocation; sealed
segments and a clean close leave data-only files."""

from __future__ import annotations

import logging
import os
import shutil
from pathlib import Path

import pytest

from quorum.storage.log import SegmentedLog
from quorum.storage.segment import PREALLOCATE_BYTES
from quorum.storage.tail import torn_tail
from quorum.types import ErrorCode, KraftError

SEG = 1 << 20


def segments(path: Path) -> list[Path]:
    return sorted(p for p in path.iterdir() if p.suffix == ".log")


def crashed_copy(log: SegmentedLog, src: Path, dst: Path) -> Path:
    """The directory as a killed process leaves it (page cache kept): a copy taken while open."""
    log.flush()
    shutil.copytree(src, dst)
    return dst


def fill(log: SegmentedLog, n: int, size: int = 100) -> list[bytes]:
    values = [bytes([65 + i % 26]) * size for i in range(n)]
    for v in values:
        log.append(log.end_offset, 1, [v], append_time_ms=0)
    return values


def read_all(log: SegmentedLog) -> list[int]:
    return [o for o, _s, _p in log.batch_infos()]


def test_zero_tail_is_the_end_without_warning_or_cut(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    src = tmp_path / "a"
    log = SegmentedLog(src, segment_bytes=SEG)
    fill(log, 20)
    seg = segments(src)[-1]
    data_end = log._segments[-1].size
    assert seg.stat().st_size == SEG > data_end  # preallocated up to the segment size
    crashed = crashed_copy(log, src, tmp_path / "b")
    log.close()
    assert seg.stat().st_size == data_end  # a clean close trims the zero tail
    cseg = segments(crashed)[-1]
    with caplog.at_level(logging.DEBUG, logger="quorum.storage.log"):
        again = SegmentedLog(crashed, segment_bytes=SEG)
    assert caplog.text == ""  # no torn-tail warning
    assert cseg.stat().st_size == SEG  # and no truncation at the open
    assert again.end_offset == 20
    fill(again, 5)  # appends land at the data's end, inside the zero tail
    crashed2 = crashed_copy(again, crashed, tmp_path / "c")
    again.close()
    with SegmentedLog(crashed2, segment_bytes=SEG) as third:
        assert read_all(third) == list(range(25))
        assert b"T" * 100 in third.read(19, 1)  # the last batch before the crash
        assert b"A" * 100 in third.read(20, 1)  # the first one after it, at the data's end


def test_preallocation_steps_and_sealed_segments_are_trimmed(tmp_path: Path) -> None:
    small = 4096
    with SegmentedLog(tmp_path, segment_bytes=small) as log:
        fill(log, 100)
        segs = segments(tmp_path)
        assert len(segs) > 3
        sizes = [p.stat().st_size for p in segs]
        assert all(s <= small for s in sizes[:-1])
        assert sizes[-1] == small  # the active one: preallocated to the segment size
        data = [s.size for s in log._segments]
        assert sizes[:-1] == data[:-1]  # sealed: data only
    big = tmp_path / "big"
    with SegmentedLog(big, segment_bytes=64 * PREALLOCATE_BYTES) as log:
        fill(log, 3)
        assert segments(big)[-1].stat().st_size == PREALLOCATE_BYTES  # one step, not the segment
        log.append(log.end_offset, 1, [b"x" * (PREALLOCATE_BYTES + 10)], append_time_ms=0)
        assert segments(big)[-1].stat().st_size >= log._segments[-1].size  # grown past one step
    with SegmentedLog(big, segment_bytes=64 * PREALLOCATE_BYTES) as log:
        assert log.end_offset == 4


def test_torn_batch_inside_the_zero_tail_is_cut(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    src = tmp_path / "a"
    log = SegmentedLog(src, segment_bytes=SEG)
    fill(log, 10)
    end = log._segments[-1].size
    log.append(log.end_offset, 1, [b"z" * 2000], append_time_ms=0)
    crashed = crashed_copy(log, src, tmp_path / "b")
    log.close()
    seg = segments(crashed)[-1]
    with open(seg, "r+b") as f:  # the batch's bytes from the next sector boundary on never written
        boundary = (end // 512 + 1) * 512
        f.seek(boundary)
        f.write(bytes(2100))
    with caplog.at_level(logging.WARNING, logger="quorum.storage.log"), SegmentedLog(crashed) as again:
        assert again.end_offset == 10
        assert "torn tail" in caplog.text and "partial batch" in caplog.text
        assert seg.stat().st_size == end  # cut as without preallocation
        fill(again, 2)
    with SegmentedLog(crashed) as third:
        assert third.end_offset == 12


def test_damaged_batch_before_the_zero_tail_is_refused(tmp_path: Path) -> None:
    src = tmp_path / "a"
    log = SegmentedLog(src, segment_bytes=SEG)
    fill(log, 10)
    last = log.batch_infos()[-1][2]
    crashed = crashed_copy(log, src, tmp_path / "b")
    log.close()
    seg = segments(crashed)[-1]
    with open(seg, "r+b") as f:  # a payload byte of the last, whole batch
        f.seek(last + 70)
        b = f.read(1)
        f.seek(last + 70)
        f.write(bytes([b[0] ^ 0x55]))
    before = seg.read_bytes()
    with pytest.raises(KraftError) as e:
        SegmentedLog(crashed, segment_bytes=SEG)
    assert e.value.code is ErrorCode.CORRUPT_LOG and "not a torn write" in e.value.message
    assert seg.read_bytes() == before  # nothing cut


def test_truncation_cuts_the_zero_tail_and_appends_continue(tmp_path: Path) -> None:
    src = tmp_path / "a"
    log = SegmentedLog(src, segment_bytes=SEG)
    fill(log, 10)
    log.truncate_to(6)
    assert segments(src)[-1].stat().st_size == log._segments[-1].size  # no stale bytes after the end
    fill(log, 3, size=7)
    crashed = crashed_copy(log, src, tmp_path / "b")
    log.close()
    with SegmentedLog(crashed, segment_bytes=SEG) as again:
        assert again.end_offset == 9
        assert b"A" * 7 in again.read(6, 1 << 16)


def test_older_rule_reads_a_preallocated_tail_as_never_written(tmp_path: Path) -> None:
    """A node downgraded after a crash, whose code predates preallocation, applies the tail rule
    alone: the zero tail is 'never written', cut with a warning, and no batch is lost."""
    log = SegmentedLog(tmp_path, segment_bytes=SEG)
    fill(log, 10)
    log.flush()
    buf = segments(tmp_path)[-1].read_bytes()
    end = log._segments[-1].size
    log.close()
    why = torn_tail(buf, end, 10)
    assert why is not None and "never written" in why
    os.truncate(segments(tmp_path)[-1], end)  # what that rule's cut leaves
    with SegmentedLog(tmp_path, segment_bytes=SEG) as again:
        assert again.end_offset == 10
