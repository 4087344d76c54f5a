"""Snapshot downloads are CRC-checked and parsed as their chunks arrive: chunks that
cut batches anywhere still check every batch exactly once and yield the snapshot's content, a
damaged byte anywhere is caught (the install then verifies the whole file and names the
defect), and the install reads nothing back: it hands the parsed content to the load."""

from __future__ import annotations

import struct
import zlib
from pathlib import Path

import pytest

from quorum import records
from quorum.storage import snapshot as snapshot_module
from quorum.storage.memory import MemorySnapshotStore
from quorum.storage.snapdownload import DownloadParse
from quorum.storage.snapshot import SnapshotStore
from quorum.types import ErrorCode, KraftError, OffsetAndEpoch

SID = OffsetAndEpoch(50, 3)
CHUNKS = [bytes([i]) * (700 + 37 * i) for i in range(12)]


def _raw() -> bytes:
    source = MemorySnapshotStore()
    source.write(SID, (), CHUNKS)
    return source.read_chunk(SID, 0, 1 << 20)[0]


@pytest.mark.parametrize("step", [1, 7, 33, 500, 4096, 1 << 20])
def test_every_batch_checked_whatever_the_chunk_size(step: int) -> None:
    raw = _raw()
    crcs = DownloadParse(SID)
    for pos in range(0, len(raw), step):
        crcs.feed(raw[pos : pos + step])
    assert crcs.complete()
    assert crcs.result() == ((), CHUNKS)
    assert crcs.batches == len(CHUNKS) + 2  # header, one batch per chunk, footer
    cut = DownloadParse(SID)
    cut.feed(raw[:-3])
    assert not cut.complete()  # a partial last batch is not "checked"
    with pytest.raises(ValueError):
        cut.result()


@pytest.mark.parametrize("where", [13, 20, 40, 1000, -20])
def test_a_flipped_byte_anywhere_fails_the_check(where: int) -> None:
    raw = bytearray(_raw())
    raw[where] ^= 0x10
    crcs = DownloadParse(SID)
    for pos in range(0, len(raw), 300):
        crcs.feed(bytes(raw[pos : pos + 300]))
    assert not crcs.complete()


def test_other_epoch_or_missing_footer_is_not_complete() -> None:
    raw = _raw()
    other = DownloadParse(OffsetAndEpoch(SID.offset, SID.epoch + 1))
    other.feed(raw)
    assert not other.complete()  # every batch must carry the snapshot's epoch
    no_footer = DownloadParse(SID)
    no_footer.feed(raw[: -_footer_size(raw)])
    assert no_footer.ok and not no_footer.complete()
    twice = DownloadParse(SID)
    twice.feed(raw)
    twice.feed(raw)  # a second header after the footer
    assert not twice.ok and not twice.complete()


def _footer_size(raw: bytes) -> int:
    pos = 0
    size = 0
    while pos < len(raw):
        size = records.batch_header(raw, pos)[1]
        pos += size
    return size


def test_install_skips_the_second_crc_pass_and_the_second_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    raw = _raw()
    store = SnapshotStore(tmp_path / "s")
    seen: list[bool] = []
    parse = snapshot_module.parse_snapshot

    def spy(*args: object, **kw: object) -> object:
        seen.append(bool(kw.get("verify_crc", True)))
        return parse(*args, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(snapshot_module, "parse_snapshot", spy)
    try:
        store.begin_download(SID)
        for pos in range(0, len(raw), 999):
            store.write_chunk(SID, pos, raw[pos : pos + 999])
        store.finish_download(SID)
        assert seen == []  # checked and parsed on arrival: no second pass at all
        assert store.load(SID, verify_crc=False) == ((), CHUNKS)
        assert seen == []  # handed over, not parsed again
        assert store.load(SID) == ((), CHUNKS)  # a later load reads and verifies the file
        assert seen == [True]
    finally:
        store.close()


@pytest.mark.parametrize(("where", "says"), [(None, "CRC mismatch"), (2, "has offset")])
def test_damaged_download_still_named_by_the_full_check(tmp_path: Path, where: int | None, says: str) -> None:
    raw = bytearray(_raw())
    # the middle is covered by a CRC; byte 2 (the base offset) is not, the framing check sees it
    raw[len(raw) // 2 if where is None else where] ^= 0x01
    store = SnapshotStore(tmp_path / "s")
    try:
        store.begin_download(SID)
        for pos in range(0, len(raw), 256):
            store.write_chunk(SID, pos, bytes(raw[pos : pos + 256]))
        with pytest.raises(KraftError) as e:
            store.finish_download(SID)
        assert e.value.code is ErrorCode.CORRUPT_RECORD and says in e.value.message
        assert store.latest() is None
    finally:
        store.close()


def test_a_batch_whose_records_do_not_fill_it_is_not_complete() -> None:
    """CRC-valid but malformed (a record length that runs short): refused, no exception, so
    the install's full check names it."""
    raw = bytearray(_raw())
    first = records.batch_header(raw, 0)[1]  # the header batch; the next one holds CHUNKS[0]
    (n,) = struct.unpack_from("<I", raw, first + records.HEADER_SIZE)
    struct.pack_into("<I", raw, first + records.HEADER_SIZE, n - 1)
    end = first + records.batch_header(raw, first)[1]
    struct.pack_into("<I", raw, first + 12, zlib.crc32(raw[first + 16 : end]))
    parse = DownloadParse(SID)
    parse.feed(bytes(raw))
    assert not parse.ok and not parse.complete()


@pytest.mark.parametrize("fsync", [True, False])
def test_a_download_is_written_back_as_it_arrives(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fsync: bool
) -> None:
    """With fsync on, every SYNC_EVERY_BYTES of a download are fdatasynced as they arrive, so
    the install's final fsync has only the tail left; with fsync off, never."""
    monkeypatch.setattr(snapshot_module, "SYNC_EVERY_BYTES", 2048)
    synced: list[int] = []
    real = snapshot_module.os.fdatasync
    monkeypatch.setattr(snapshot_module.os, "fdatasync", lambda fd: (synced.append(fd), real(fd))[1])
    raw = _raw()
    store = SnapshotStore(tmp_path / "s", fsync=fsync)
    try:
        store.begin_download(SID)
        for pos in range(0, len(raw), 500):
            store.write_chunk(SID, pos, raw[pos : pos + 500])
        assert len(synced) == (len(raw) // 2048 if fsync else 0)
        store.finish_download(SID)
        assert store.load(SID) == ((), CHUNKS)
    finally:
        store.close()
