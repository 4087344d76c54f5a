"""Restart cost of the fsync on open: ``open_storage`` of a data directory holding a large log
(1 GB by default), with its fsync of what the previous process left unsynced and without it
(``sync_on_open=False``, the old behaviour), side by side in one invocation.

Two states of the directory before each open, each measured ``--rounds`` times, alternating
with and without the fsync:

* **clean stop**: the previous process flushed everything (the ordinary restart);
* **killed**: the previous process was killed with ``--unsynced`` bytes (default 64 MiB: the
  follower's catch-up fsync budget, the most a node leaves unsynced by design) written to the
  last segment but not fsynced. Before each open the tail is truncated and written again
  without an fsync, so each open finds the same amount of dirty page cache.

The open is what a restart spends on storage: lock, fsyncs, scan of the segment headers and a
CRC check of the last segment (64 MiB), snapshots. The process start and the core's start come
on top and do not change with the fsync. The write path (``bench/engine.py``) is not touched:
the fsync runs at open only.

Run ``python -m bench.recovery --restart [--log-bytes 1GB] [--unsynced 64MB] [--rounds 5]``
(or ``python -m bench.restart``). Prints one line per state: the median open time with and
without the fsync and the difference.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

if __package__ in (None, ""):
    sys.path[0] = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

from quorum.storage import METADATA_DIR, format_dir, open_storage
from quorum.storage.log import DEFAULT_SEGMENT_BYTES

BATCH_BYTES = 1024 * 1024
RECORD = b"r" * (BATCH_BYTES // 16 - 4)


def parse_size(text: str) -> int:
    units = {"KB": 1024, "MB": 1024**2, "GB": 1024**3}
    t = text.strip().upper()
    for u, m in units.items():
        if t.endswith(u):
            return int(float(t[: -len(u)]) * m)
    return int(t)


def fill(directory: Path, log_bytes: int) -> None:
    """A formatted directory whose log holds ``log_bytes`` in 1 MiB batches, all fsynced."""
    format_dir(directory, "bench-restart", 1)
    _m, _q, log, snaps, _s = open_storage(directory)
    try:
        while log.end_offset * (len(RECORD) + 4) < log_bytes:
            log.append(log.end_offset, 1, [RECORD] * 16)
            if log.end_offset % 1024 == 0:
                log.flush()
        log.flush()
    finally:
        log.close()
        snaps.close()


def dirty_tail(directory: Path, unsynced: int) -> None:
    """Rewrite the last ``unsynced`` bytes of the last segment without an fsync: what a
    process killed before its fsync leaves in the page cache."""
    seg = sorted((directory / METADATA_DIR).glob("*.log"))[-1]
    size = seg.stat().st_size
    start = max(0, size - unsynced)
    fd = os.open(seg, os.O_RDWR)
    try:
        tail = os.pread(fd, size - start, start)
        os.fsync(fd)
        os.ftruncate(fd, start)
        os.fsync(fd)
        os.pwrite(fd, tail, start)  # no fsync: dirty page cache
    finally:
        os.close(fd)


def time_open(directory: Path, sync_on_open: bool) -> float:
    t0 = time.perf_counter()
    _m, _q, log, snaps, _s = open_storage(directory, sync_on_open=sync_on_open)
    took = time.perf_counter() - t0
    log.close()
    snaps.close()
    return took


def measure(directory: Path, unsynced: int, rounds: int) -> dict[bool, list[float]]:
    times: dict[bool, list[float]] = {True: [], False: []}
    for r in range(rounds):
        for sync in ((True, False) if r % 2 == 0 else (False, True)):
            if unsynced:
                dirty_tail(directory, unsynced)
            else:
                os.sync()  # nothing dirty from the previous round
            times[sync].append(time_open(directory, sync))
    return times


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m bench.recovery --restart", description=__doc__.split("\n")[0]
    )
    ap.add_argument("--log-bytes", type=parse_size, default=parse_size("1GB"))
    ap.add_argument("--unsynced", type=parse_size, default=parse_size("64MB"))
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--workdir", type=Path, default=None, help="where the log goes (default: a temp dir)")
    args = ap.parse_args(argv)
    root = Path(tempfile.mkdtemp(prefix="kk-restart-", dir=args.workdir))
    try:
        d = root / "data"
        t0 = time.perf_counter()
        fill(d, args.log_bytes)
        segs = len(list((d / METADATA_DIR).glob("*.log")))
        mib = DEFAULT_SEGMENT_BYTES >> 20
        print(
            f"log: {args.log_bytes / 2**20:.0f} MiB in {segs} segments of {mib} MiB (written in "
            f"{time.perf_counter() - t0:.1f} s); open_storage, median of {args.rounds}:"
        )
        states = (("clean stop", 0), (f"killed, {args.unsynced >> 20} MiB unsynced", args.unsynced))
        for label, unsynced in states:
            times = measure(d, unsynced, args.rounds)
            with_, without = statistics.median(times[True]), statistics.median(times[False])
            print(
                f"  {label:<28} with fsync on open {with_ * 1000:8.1f} ms   "
                f"without {without * 1000:8.1f} ms   added {(with_ - without) * 1000:8.1f} ms"
            )
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
