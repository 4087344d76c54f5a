"""Model check: random operation sequences applied to SegmentedLog (tiny segments, real files)
and MemoryLog give the same observable log: end offset, epochs, control batches and the bytes
read from every batch boundary."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from quorum import records
from quorum.storage.log import SegmentedLog
from quorum.storage.memory import MemoryLog
from quorum.types import AddVoter, OffsetAndEpoch, ReplicaKey


def batches_from(log: SegmentedLog | MemoryLog, start: int) -> list[bytes]:
    out = []
    off = start
    while off < log.end_offset:
        data = log.read(off, 1)  # one batch at a time
        (b,), _ = records.decode_batches(data)
        assert b.info.base_offset == off
        out.append(bytes(b.data))
        off = b.info.next_offset
    return out


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_file_and_memory_logs_agree(tmp_path: Path, seed: int) -> None:
    rng = random.Random(seed)
    file_log = SegmentedLog(tmp_path, segment_bytes=rng.choice([200, 700, 3000]))
    mem = MemoryLog()
    epoch = 1
    try:
        for step in range(250):
            op = rng.choices(
                ["append", "raw", "truncate", "flush", "restart", "delete", "reset"], [8, 3, 2, 2, 1, 1, 0.3]
            )[0]
            if op == "append":
                epoch += rng.random() < 0.1
                base = mem.end_offset
                items: list[bytes] | list[AddVoter]
                if rng.random() < 0.15:
                    items = [AddVoter(ReplicaKey(rng.randrange(9), None))]
                else:
                    items = [rng.randbytes(rng.randrange(1, 80)) for _ in range(rng.randrange(1, 6))]
                assert file_log.append(base, epoch, items, step) == mem.append(base, epoch, items, step)
            elif op == "raw":
                base = mem.end_offset
                raw = b"".join(
                    records.encode_batch(base + i, epoch, [b"r%d" % i], step)
                    for i in range(rng.randrange(1, 9))
                )
                infos = [d.info for d in records.decode_batches(raw)[0]]
                file_log.append_batches(raw, infos)
                mem.append_batches(raw, infos)
            elif op == "truncate":
                bounds = [mem.end_offset]
                off = mem.log_start_offset
                while off < mem.end_offset:
                    (one,), _ = records.decode_batches(mem.read(off, 1))
                    bounds.append(off)
                    off = one.info.next_offset
                target = rng.choice(bounds)
                if target < file_log.log_start_offset:
                    continue
                file_log.truncate_to(target)
                mem.truncate_to(target)
                epoch = max(mem.last_epoch, 1)
            elif op == "flush":
                file_log.flush()
                mem.flush()
                assert file_log.flushed_end_offset == mem.flushed_end_offset == mem.end_offset
            elif op == "restart":
                file_log.close()
                file_log = SegmentedLog(tmp_path, segment_bytes=file_log.segment_bytes)
                mem.close()
                mem.reopen()
            elif op == "delete":
                at = rng.randrange(mem.log_start_offset, mem.end_offset + 1)
                file_log.delete_before(at)
                mem.delete_before(at)
                assert file_log.log_start_offset <= at and mem.log_start_offset <= at
            elif op == "reset":
                sid = OffsetAndEpoch(mem.end_offset + rng.randrange(0, 50), epoch)
                file_log.reset_to_snapshot(sid)
                mem.reset_to_snapshot(sid)
            assert file_log.end_offset == mem.end_offset, (step, op)
            if (
                mem.end_offset > mem.log_start_offset
            ):  # an empty reopened log learns its epoch from the snapshot
                assert file_log.last_epoch == mem.last_epoch, (step, op)
            start = max(file_log.log_start_offset, mem.log_start_offset)
            assert batches_from(file_log, start) == batches_from(mem, start), (step, op)
            snap = OffsetAndEpoch(start, 0)
            fs, ms = file_log.summary(snap), mem.summary(snap)
            assert (fs.end_offset, fs.epoch_starts, fs.control_batches) == (
                ms.end_offset,
                ms.epoch_starts,
                ms.control_batches,
            )
    finally:
        file_log.close()
