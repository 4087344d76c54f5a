"""Torn appends against damage, at random positions of the last batches (quorum.storage.tail):

* a bit flipped anywhere in a batch the file holds whole is damage: the open stops with
  CORRUPT_LOG naming the segment and a position at or before the flip, and changes no file;
* what a power cut leaves of an unsynced group of several batches (the file cut anywhere, or
  extended with zeros from a sector boundary on) is a torn append: the open cuts it at the last
  whole batch, keeping every batch the file still holds whole.
"""

from __future__ import annotations

import hashlib
import random
from pathlib import Path

import pytest

from quorum.storage.log import SegmentedLog
from quorum.storage.tail import SECTOR
from quorum.types import ErrorCode, KraftError

BATCHES = 16


def _pristine(path: Path) -> tuple[bytes, list[tuple[int, int]]]:
    """One segment of batches of varied sizes; (base offset, position) of each, and
    (end offset, file size) last."""
    with SegmentedLog(path) as log:
        for i in range(BATCHES):
            log.append(log.end_offset, 1 + i // 5, [f"key{i}={'v' * (7 * i + 40)}".encode()] * (1 + i % 3))
        layout = [(o, p) for o, _s, p in log.batch_infos()]
        end = log.end_offset
    (seg,) = path.iterdir()
    data = seg.read_bytes()
    return data, [*layout, (end, len(data))]


def _open(path: Path, data: bytes) -> int:
    """Write ``data`` as the only segment and open the log; its end offset."""
    path.mkdir()
    (path / "00000000000000000000.log").write_bytes(data)
    with SegmentedLog(path) as log:
        return log.end_offset


@pytest.mark.parametrize("seed", range(4))
def test_bit_flips_in_the_last_batches_stop_the_open(tmp_path: Path, seed: int) -> None:
    data, layout = _pristine(tmp_path / "pristine")
    rng = random.Random(seed)
    first = layout[-5][1]  # the last four batches: the ones a power cut could have been writing
    for n in range(25):
        pos = rng.randrange(first, len(data))
        bad = bytearray(data)
        bad[pos] ^= 1 << rng.randrange(8)
        work = tmp_path / f"w{n}"
        with pytest.raises(KraftError) as e:
            _open(work, bytes(bad))
        assert e.value.code is ErrorCode.CORRUPT_LOG, e.value
        assert "00000000000000000000.log" in e.value.message
        assert e.value.extra["position"] <= pos, (pos, e.value.message)
        on_disk = (work / "00000000000000000000.log").read_bytes()
        assert hashlib.sha256(on_disk).digest() == hashlib.sha256(bad).digest()  # untouched


@pytest.mark.parametrize("seed", range(4))
def test_a_cut_unsynced_group_is_a_torn_append(tmp_path: Path, seed: int) -> None:
    data, layout = _pristine(tmp_path / "pristine")
    rng = random.Random(100 + seed)
    synced = layout[-6][1]  # the last fsync ended here; five batches were written after it
    for n in range(25):
        written = rng.randrange(synced, len(data) + 1)
        if rng.random() < 0.5:  # the file cut short where the writes stopped
            torn = data[:written]
        else:  # extended further, never-written bytes read as zeros from a sector boundary on
            boundary = max(synced, written // SECTOR * SECTOR)
            torn = data[:boundary] + bytes(len(data) - boundary + rng.randrange(0, 3 * SECTOR))
            written = boundary
        # the end of the batches the file still holds whole
        expected = max(o for o, p in layout if p <= written)
        assert _open(tmp_path / f"w{n}", torn) == expected, (written, len(torn))
