"""The segmented log's test-only power-loss mode (``unflushed_in_memory``): written but
unflushed bytes live in process memory, so a crash (SIGKILL, or a second open of the directory
while the first log object still holds them) loses exactly what was not flushed."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest

from quorum import records
from quorum.storage.log import SegmentedLog


def _fill(log: SegmentedLog, n: int, epoch: int = 1) -> None:
    for i in range(n):
        log.append(log.end_offset, epoch, [b"x" * (i % 50 + 1)] * (i % 3 + 1))


def _power_cut(path: Path, segment_bytes: int = 512) -> SegmentedLog:
    """What a restart after power loss sees: a fresh open of the files (the old object, and
    the bytes it holds in memory, are abandoned)."""
    return SegmentedLog(path, segment_bytes=segment_bytes)


def test_unflushed_batches_are_readable_then_lost_at_power_cut(tmp_path: Path) -> None:
    log = SegmentedLog(tmp_path, segment_bytes=1 << 20, unflushed_in_memory=True)
    _fill(log, 30)
    log.flush()
    durable_end = log.end_offset
    durable_bytes = log.read(0, 1 << 20)
    _fill(log, 20, epoch=2)  # none of it flushed
    assert log.end_offset > durable_end and log.flushed_end_offset == durable_end
    unflushed = log.read(durable_end, 1 << 20)
    batches, _ = records.decode_batches(unflushed, verify_crc=True)
    assert batches[0].info.base_offset == durable_end and batches[0].info.epoch == 2
    after = _power_cut(tmp_path)
    try:
        assert after.end_offset == durable_end
        assert after.last_epoch == 1
        got = b"".join(after.read(o, 1 << 20) for o in [0])
        assert got[: len(durable_bytes)] == durable_bytes[: len(got)]
    finally:
        after.close()
    log.close()  # a clean close flushes: now everything is there
    with SegmentedLog(tmp_path, segment_bytes=1 << 20) as reopened:
        assert reopened.last_epoch == 2 and reopened.end_offset > durable_end


def test_a_roll_seals_the_finished_segment(tmp_path: Path) -> None:
    """Only the LAST segment may be torn by a power cut (the recovery rule): a roll makes the
    finished segment durable before the next one gets a byte, flush or no flush."""
    log = SegmentedLog(tmp_path, segment_bytes=512, unflushed_in_memory=True)
    _fill(log, 60)  # several rolls, never flushed
    bases = sorted({seg_base for _o, seg_base, _p in log.batch_infos()})
    assert len(bases) >= 3 and log.flushed_end_offset == 0
    with _power_cut(tmp_path) as after:
        assert after.end_offset == bases[-1]  # everything before the active segment survived
        whole = after.read(0, 1 << 20)
        assert records.decode_batches(whole, verify_crc=True)[0]
    log.close()


def test_without_the_mode_a_crash_keeps_unflushed_writes(tmp_path: Path) -> None:
    """The contrast that makes the mode necessary: plain writes reach the page cache at once."""
    log = SegmentedLog(tmp_path, segment_bytes=512)
    _fill(log, 10)
    log.flush()
    durable_end = log.end_offset
    _fill(log, 5)
    after = _power_cut(tmp_path)
    try:
        assert after.end_offset > durable_end
    finally:
        after.close()
        log.close()


def test_truncation_inside_and_below_the_unflushed_bytes(tmp_path: Path) -> None:
    log = SegmentedLog(tmp_path, segment_bytes=1 << 20, unflushed_in_memory=True)
    _fill(log, 10)
    log.flush()
    mid = log.end_offset
    _fill(log, 10, epoch=2)
    offsets = [o for o, _s, _p in log.batch_infos()]
    inside = offsets[15]  # a batch boundary inside the unflushed part
    log.truncate_to(inside)
    assert log.end_offset == inside
    _fill(log, 3, epoch=3)
    log.flush()
    with _power_cut(tmp_path) as after:
        assert after.end_offset == log.end_offset and after.last_epoch == 3
    below = offsets[4]  # below the flushed end: the file itself is cut
    log.truncate_to(below)
    _fill(log, 2, epoch=4)  # pending again, lost at the cut
    with _power_cut(tmp_path) as after:
        assert after.end_offset == below < mid
    log.close()


def test_flush_in_a_thread_while_appending_loses_nothing_flushed(tmp_path: Path) -> None:
    """The node flushes in an executor while its event loop keeps appending and reading."""
    log = SegmentedLog(tmp_path, segment_bytes=4096, unflushed_in_memory=True)
    flushed: list[int] = []
    for _round in range(20):
        _fill(log, 5)
        t = threading.Thread(target=log.flush)
        t.start()
        _fill(log, 3)  # concurrent appends stay pending for the next flush
        assert records.decode_batches(log.read(log.log_start_offset, 1 << 30), verify_crc=True)[0]
        t.join()
        flushed.append(log.flushed_end_offset)
    with _power_cut(tmp_path) as after:
        assert after.end_offset >= flushed[-1]
        whole = after.read(0, 1 << 30)
        assert whole and records.decode_batches(whole, verify_crc=True)[0]
    log.close()


CHILD = textwrap.dedent(
    """
    import signal, sys
    from quorum.storage.log import SegmentedLog
    log = SegmentedLog(sys.argv[1], segment_bytes=4096, unflushed_in_memory=sys.argv[2] == "1")
    for i in range(200):
        log.append(log.end_offset, 1, [b"r" * (i % 97 + 1)])
    log.flush()
    print(log.end_offset, flush=True)
    for i in range(50):  # written, never flushed
        log.append(log.end_offset, 1, [b"u" * 10])
    print(log.end_offset, flush=True)
    signal.pause()  # until the test kills it (the power loss)
    """
)


def _kill_child(tmp_path: Path, mode: str) -> tuple[int, int, int]:
    p = subprocess.Popen(
        [sys.executable, "-c", CHILD, str(tmp_path), mode], stdout=subprocess.PIPE, text=True
    )
    try:
        assert p.stdout is not None
        flushed, written = int(p.stdout.readline()), int(p.stdout.readline())
    finally:
        os.kill(p.pid, signal.SIGKILL)
        p.wait(timeout=30)
    with SegmentedLog(tmp_path) as after:
        return flushed, written, after.end_offset


@pytest.mark.slow  # starts processes
def test_sigkill_in_power_loss_mode_loses_exactly_the_unflushed_writes(tmp_path: Path) -> None:
    flushed, written, recovered = _kill_child(tmp_path / "a", "1")
    assert written > flushed
    assert recovered == flushed
    flushed, written, recovered = _kill_child(tmp_path / "b", "0")
    assert recovered == written  # the page cache kept them: why the mode exists
