"""Crash and damage properties of SegmentedLog on real files:

* a process killed with SIGKILL while appending loses nothing it had flushed;
* flipping any single byte of the last segment stops the open with CORRUPT_LOG (files
  untouched): a written batch that fails its check is damage, never a torn write to cut
  (quorum.storage.tail), whichever batch it is.
"""

from __future__ import annotations

import hashlib
import os
import random
import shutil
import signal
import subprocess
import sys
import textwrap
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from quorum import records
from quorum.storage.log import SegmentedLog
from quorum.types import ErrorCode, KraftError

CHILD = textwrap.dedent(
    """
    import sys
    from quorum.storage.log import SegmentedLog
    log = SegmentedLog(sys.argv[1], segment_bytes=4096)
    i = 0
    while True:
        log.append(log.end_offset, 1 + i // 500, [b"r" * (i % 97 + 1)] * (i % 5 + 1))
        i += 1
        if i % 7 == 0:
            log.flush()
            print(log.flushed_end_offset, flush=True)
    """
)


@pytest.mark.slow  # starts processes
def test_sigkill_while_appending_keeps_everything_flushed(tmp_path: Path) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-c", CHILD, str(tmp_path)], stdout=subprocess.PIPE, text=True, cwd=os.getcwd()
    )
    assert proc.stdout is not None
    flushed = 0
    try:
        for line in proc.stdout:  # poll the child's own reports of what it made durable
            flushed = int(line)
            if flushed >= 3000:
                break
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    assert flushed >= 3000, "child stopped before making progress"
    with SegmentedLog(tmp_path, segment_bytes=4096) as log:
        assert log.end_offset >= flushed
        off, seen = 0, 0
        while off < log.end_offset:  # every batch readable and contiguous after recovery
            data = log.read(off, 1 << 16)
            batches, used = records.decode_batches(data)
            assert used == len(data) and batches[0].info.base_offset == off
            off = batches[-1].info.next_offset
            seen += len(batches)
        assert off == log.end_offset and seen > 0


def _digest(path: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(path.iterdir())}


@pytest.mark.parametrize("mask", [0x5A, 0xFF, 0x80])
def test_single_byte_damage_always_stops_the_open(tmp_path: Path, mask: int) -> None:
    pristine = tmp_path / "pristine"
    with SegmentedLog(pristine) as log:
        for i in range(12):
            log.append(log.end_offset, 1 + i // 4, [bytes([i]) * 30] * 2, append_time_ms=0)
        layout = [(o, p) for o, _s, p in log.batch_infos()]
        full_end = log.end_offset
    (seg,) = [p.name for p in pristine.iterdir()]
    size = (pristine / seg).stat().st_size
    last_pos = layout[-1][1]
    rng = random.Random(856 + mask)
    positions = sorted(set(rng.sample(range(size), 60)) | {0, 8, 12, 16, last_pos, last_pos + 8, size - 1})
    outcomes = {"corrupt": 0}
    for n, pos in enumerate(positions):
        work = tmp_path / f"w{n}"
        shutil.copytree(pristine, work)
        data = bytearray((work / seg).read_bytes())
        data[pos] ^= mask
        (work / seg).write_bytes(bytes(data))
        before = _digest(work)
        try:
            with SegmentedLog(work) as log:
                end = log.end_offset
        except KraftError as e:
            assert e.code is ErrorCode.CORRUPT_LOG and seg in e.message
            assert _digest(work) == before, f"byte {pos}: files changed on CORRUPT_LOG"
            outcomes["corrupt"] += 1
            continue
        raise AssertionError(f"byte {pos}: damage taken for a torn write, log cut to {end} of {full_end}")
    assert outcomes["corrupt"] == len(positions)


@pytest.mark.parametrize("fsync", [True, False])
def test_fsync_flag_only_changes_durability(tmp_path: Path, fsync: bool) -> None:
    with SegmentedLog(tmp_path, segment_bytes=512, fsync=fsync) as log:
        for i in range(20):
            log.append(i, 1, [b"z" * 40])
        log.flush()
        assert log.flushed_end_offset == 20
    with SegmentedLog(tmp_path, segment_bytes=512, fsync=fsync) as log:
        assert log.end_offset == 20


def test_flush_in_a_worker_thread_while_appending(tmp_path: Path) -> None:
    """The runtime fsyncs in an executor thread while the loop thread keeps appending: the
    flushed end never passes what was appended before the flush began."""
    with SegmentedLog(tmp_path, segment_bytes=2048) as log, ThreadPoolExecutor(1) as pool:
        pending = None
        for i in range(400):
            log.append(i, 1, [b"w" * 20])
            if pending is None or pending.done():
                if pending is not None:
                    pending.result()
                assert log.flushed_end_offset <= log.end_offset
                pending = pool.submit(log.flush)
        assert pending is not None
        pending.result()
        log.flush()
        assert log.flushed_end_offset == log.end_offset == 400
    with SegmentedLog(tmp_path, segment_bytes=2048) as log:
        assert log.end_offset == 400
