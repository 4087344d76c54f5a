"""Catch-up appends the bytes it fetched, unchanged (issue 10): a follower's log built from the
leader's raw batches in large fetches (``append_batches``, the follower path) is the same log,
byte for byte and segment for segment, as the leader's built by encoding each batch
(``append``, the leader path), before and after reopening. A damaged batch anywhere in a large
fetch is named by its offset and nothing of the fetch is written."""

from __future__ import annotations

import dataclasses
import os
import threading
from pathlib import Path

import pytest

from quorum import records
from quorum.storage.log import SegmentedLog
from quorum.types import ErrorCode, KraftError

FETCH_BYTES = 4 * 1024 * 1024


def _leader_log(path: Path) -> tuple[SegmentedLog, list[list[bytes]]]:
    log = SegmentedLog(path, segment_bytes=256 * 1024, fsync=False)
    batches: list[list[bytes]] = []
    offset = 0
    for i in range(400):
        recs = [bytes([i % 251]) * (100 + 37 * ((i * 7 + j) % 50)) for j in range(1 + i % 9)]
        epoch = 1 + i // 150  # three epochs
        log.append(offset, epoch, recs, append_time_ms=1_700_000_000_000 + i)
        batches.append(recs)
        offset += len(recs)
    return log, batches


def _fetch_all(leader: SegmentedLog, follower: SegmentedLog) -> int:
    fetches = 0
    while follower.end_offset < leader.end_offset:
        data = leader.read(follower.end_offset, FETCH_BYTES)
        decoded, used = records.decode_batches(data)  # the follower's one CRC check
        assert used == len(data)
        follower.append_batches(data, [b.info for b in decoded])
        fetches += 1
    return fetches


def _files(path: Path) -> dict[str, bytes]:
    return {name: (path / name).read_bytes() for name in sorted(os.listdir(path))}


def test_raw_append_of_large_fetches_equals_the_encoded_log(tmp_path: Path) -> None:
    leader, batches = _leader_log(tmp_path / "leader")
    follower = SegmentedLog(tmp_path / "follower", segment_bytes=256 * 1024, fsync=False)
    try:
        fetches = _fetch_all(leader, follower)
        assert fetches < len(batches) // 10  # many batches per fetch, several segments per fetch
        assert leader.segment_count > 3
        follower.flush()
        leader.flush()
        assert _files(tmp_path / "follower") == _files(tmp_path / "leader")
        assert follower.batch_infos() == leader.batch_infos()
        assert follower.summary() == leader.summary()
        seen: list[list[bytes]] = []  # reads stop at a segment's end: walk them
        off = 0
        while off < follower.end_offset:
            data = follower.read(off, FETCH_BYTES)
            for b in records.decode_batches(data)[0]:
                seen.append(records.data_records(b))
                off = b.info.next_offset
        assert seen == batches
    finally:
        follower.close()
        leader.close()
    reopened = SegmentedLog(tmp_path / "follower", segment_bytes=256 * 1024, fsync=False)
    try:
        again = SegmentedLog(tmp_path / "leader", segment_bytes=256 * 1024, fsync=False)
        try:
            assert reopened.batch_infos() == again.batch_infos()
            assert reopened.summary() == again.summary()
        finally:
            again.close()
    finally:
        reopened.close()


@pytest.mark.parametrize("which", [0, 31, -1])
def test_a_damaged_batch_in_a_large_fetch_is_named_and_nothing_is_written(tmp_path: Path, which: int) -> None:
    leader, _ = _leader_log(tmp_path / "leader")
    try:
        data = bytearray(leader.read(0, FETCH_BYTES))
        decoded, _ = records.decode_batches(bytes(data))
        assert len(decoded) > 40  # one segment's worth
        victim = decoded[which]
        data[victim.position + records.HEADER_SIZE + 5] ^= 0x40  # inside its records: CRC covers it
        with pytest.raises(records.CorruptRecordError) as e:
            records.decode_batches(bytes(data))
        assert f"offset {victim.info.base_offset}" in e.value.message
        # and the log refuses bytes that do not match the batch infos claimed for them
        follower = SegmentedLog(tmp_path / "follower", segment_bytes=256 * 1024, fsync=False)
        try:
            infos = [b.info for b in decoded]
            infos[which] = dataclasses.replace(infos[which], count=infos[which].count + 1)
            with pytest.raises(KraftError) as ke:
                follower.append_batches(bytes(data), infos)
            assert ke.value.code is ErrorCode.INVALID_REQUEST
            assert follower.end_offset == 0 and follower.batch_infos() == []
        finally:
            follower.close()
    finally:
        leader.close()


def _read_from(log: SegmentedLog, offset: int) -> bytes:
    out = bytearray()
    while offset < log.end_offset:
        data = log.read(offset, 1 << 30)
        out += data
        offset = records.decode_batches(data, verify_crc=False)[0][-1].info.next_offset
    return bytes(out)


def test_raw_appends_in_a_worker_thread_while_the_loop_deletes_a_prefix(tmp_path: Path) -> None:
    """The driver writes a follower's fetched batches in its persist thread (issue 10) while the
    event loop may delete a snapshotted log prefix: the two take turns (the log's structural
    lock), and the log that results is the leader's from the deleted prefix on, byte for byte."""
    leader, _batches = _leader_log(tmp_path / "leader")
    follower = SegmentedLog(tmp_path / "follower", segment_bytes=256 * 1024, fsync=False)
    errors: list[BaseException] = []

    def writer() -> None:
        try:
            while follower.end_offset < leader.end_offset:
                data = leader.read(follower.end_offset, 64 * 1024)
                decoded, _used = records.decode_batches(data)
                follower.append_batches(data, [b.info for b in decoded])
        except BaseException as e:  # reported below
            errors.append(e)

    t = threading.Thread(target=writer)
    t.start()
    deletes = 0
    while t.is_alive():
        follower.delete_before(follower.end_offset // 2)
        deletes += 1
    t.join()
    try:
        assert not errors, errors
        assert deletes > 0 and follower.end_offset == leader.end_offset
        start = follower.log_start_offset
        assert start > 0
        assert _read_from(follower, start) == _read_from(leader, start)
    finally:
        follower.close()
        leader.close()
