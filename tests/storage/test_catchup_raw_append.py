"""Catch-up appends the bytes it fetched, unchanged: a follower's log built from the
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
from quorum.storage.atomic import CATCHUP_DROP_MIN_BYTES, drop_synced
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
    """The driver writes a follower's fetched batches in its persist thread while the
    event loop may delete a snapshotted log prefix: the two take turns (the log's structural
    lock), and the log that results is the leader's from the deleted prefix on, byte for byte."""
    leader, _batches = _leader_log(tmp_path / "leader")
    follower = SegmentedLog(tmp_path / "follower", segment_bytes=256 * 1024, fsync=False)
    errors: list[BaseException] = []
    # The writer holds back its last quarter until a deletion has taken effect, so a prefix is
    # always deleted while appends are still running (a loaded machine could otherwise let the
    # writer finish before the loop's first deletion crossed a segment).
    deleted = threading.Event()

    def writer() -> None:
        try:
            while follower.end_offset < leader.end_offset:
                if follower.end_offset >= leader.end_offset * 3 // 4:
                    deleted.wait(60)
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
        if follower.log_start_offset > 0:
            deleted.set()
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


@pytest.mark.parametrize("fsync", [True, False])
def test_large_follower_appends_free_their_page_cache_only_once_fsynced(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fsync: bool
) -> None:
    """Catch-up appends (one fetch of at least CATCHUP_DROP_MIN_BYTES) have their page cache
    freed, and only after the flush fsynced them: the advice is given per segment
    range written, after every fdatasync of that flush; small appends keep theirs, and so does
    a log without fsync. What was dropped reads back unchanged (from the file)."""
    events: list[tuple[str, int, int]] = []
    real_sync = os.fdatasync
    monkeypatch.setattr(
        "quorum.storage.log.drop_synced", lambda fd, start, n: events.append(("drop", start, n))
    )
    monkeypatch.setattr(os, "fdatasync", lambda fd: (events.append(("sync", fd, 0)), real_sync(fd))[1])
    leader = SegmentedLog(tmp_path / "leader", segment_bytes=1 << 30, fsync=False)
    follower = SegmentedLog(tmp_path / "follower", segment_bytes=1536 * 1024, fsync=fsync)
    try:
        offset = 0
        for i in range(3000):  # ~1 KiB batches, ~3 MiB
            leader.append(offset, 1, [bytes([i % 251]) * 1000])
            offset += 1
        small = leader.read(0, 64 * 1024)
        follower.append_batches(small, [b.info for b in records.decode_batches(small)[0]])
        large = leader.read(follower.end_offset, CATCHUP_DROP_MIN_BYTES * 2)
        assert len(large) >= CATCHUP_DROP_MIN_BYTES
        follower.append_batches(large, [b.info for b in records.decode_batches(large)[0]])
        assert follower.segment_count == 2  # the large fetch ran over a segment roll
        assert not [e for e in events if e[0] == "drop"]  # nothing before the flush
        events.clear()
        follower.flush()
        drops = [e for e in events if e[0] == "drop"]
        if not fsync:
            assert drops == []
        else:
            assert sum(n for _, _, n in drops) == len(large) and len(drops) == 2
            assert drops[0][1] == len(small)  # from where the large fetch started in segment 1
            assert drops[1][1] == 0  # and the whole written part of segment 2
            first_drop = events.index(drops[0])
            assert all(e[0] == "drop" for e in events[first_drop:])  # after every fdatasync
            assert any(e[0] == "sync" for e in events[:first_drop])
            events.clear()
            follower.flush()  # dropped once: a later flush has nothing left to drop
            assert not [e for e in events if e[0] == "drop"]
        assert _read_from(follower, 0) == small + large
    finally:
        follower.close()
        leader.close()


def test_drop_synced_keeps_the_content(tmp_path: Path) -> None:
    p = tmp_path / "f"
    p.write_bytes(b"x" * 100_000)
    fd = os.open(p, os.O_RDONLY)
    try:
        drop_synced(fd, 0, 100_000)
        drop_synced(fd, 0, 0)  # nothing to do
        drop_synced(-1, 0, 10)  # a removed segment's fd: ignored
        assert os.pread(fd, 100_000, 0) == b"x" * 100_000
    finally:
        os.close(fd)
