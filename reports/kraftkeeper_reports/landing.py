"""Landing: what the ingestion query reads (``--state DIR/landing/``), made from the input
files so that Spark's file source only ever sees complete files, each byte of an input once.

A file no writer appends to any more (the operator writes each event to ``date=<its UTC
day>/...``, so a past day's files, :data:`CLOSE_GRACE_S` after the day ended) is linked whole;
a file still being appended to (today's, or the operator's single log file) is copied in
segments of complete lines, each named by its byte offset, and ``landed.json`` records how far
each file was taken (:mod:`kraftkeeper_reports.ingest` describes the whole state).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from kraftkeeper_reports.ingest import Layout, StateError, read_record
from quorum.storage.atomic import atomic_write, fsync_dir

__all__ = ["CLOSE_GRACE_S", "data_files", "is_closed", "land", "sources_for"]

CLOSE_GRACE_S = float(os.environ.get("KK_REPORT_CLOSE_GRACE_S", "3600"))
_DATE_DIR = re.compile(r"^date=(\d{4}-\d{2}-\d{2})$")


def _is_url(p: str) -> bool:
    return "://" in p


def _day_closed(day: str, now_s: float) -> bool:
    try:
        start = datetime.strptime(day, "%Y-%m-%d").replace(tzinfo=UTC).timestamp()
    except ValueError:
        return True  # not a day: no writer appends there by its clock
    return now_s >= start + 86_400 + CLOSE_GRACE_S


def data_files(root: Path) -> list[Path]:
    """The data files under ``root`` (a file or a directory); hidden and ``_``-prefixed names
    are not data."""
    if root.is_file():
        return [root]
    return sorted(
        f for f in root.rglob("*")
        if f.is_file() and not any(p.startswith((".", "_")) for p in f.relative_to(root).parts)
    )


def is_closed(f: Path, now_s: float) -> bool:
    """Whether no writer appends to ``f`` any more: under a ``date=D`` directory, once that day
    is over; elsewhere, once it has not changed for :data:`CLOSE_GRACE_S`."""
    days = [m.group(1) for p in f.parent.parts if (m := _DATE_DIR.match(p))]
    if days:
        return _day_closed(days[-1], now_s)
    return f.stat().st_mtime <= now_s - CLOSE_GRACE_S


def _publish(dst: Path, fill: Callable[[Path], None]) -> None:
    """Make ``dst`` appear whole (``fill`` writes a temporary name, then a rename), once: a
    landing name is never written twice, so a run killed after this and before its record
    does the same again harmlessly."""
    if dst.exists():
        return
    tmp = dst.with_name(f".{dst.name}.tmp")
    tmp.unlink(missing_ok=True)
    fill(tmp)
    os.replace(tmp, dst)


def _link_or_copy(src: Path) -> Callable[[Path], None]:
    def fill(tmp: Path) -> None:
        try:
            os.link(src, tmp)
        except OSError:  # another filesystem: a copy
            shutil.copyfile(src, tmp)
            with open(tmp, "rb") as f:
                os.fsync(f.fileno())
    return fill


def _segment(src: Path, start: int, end: int) -> Callable[[Path], None]:
    def fill(tmp: Path) -> None:
        with open(src, "rb") as r, open(tmp, "wb") as w:
            r.seek(start)
            left = end - start
            while left > 0:
                buf = r.read(min(left, 1 << 22))
                if not buf:
                    break
                w.write(buf)
                left -= len(buf)
            w.flush()
            os.fsync(w.fileno())
    return fill


def _complete_end(src: Path, start: int, size: int) -> int:
    """The end of the last complete line (one ending in a newline) in ``src[start:size]``;
    ``start`` when there is none. A line still being written waits for the next run."""
    with open(src, "rb") as f:
        pos = size
        while pos > start:
            n = min(1 << 16, pos - start)
            f.seek(pos - n)
            buf = f.read(n)
            i = buf.rfind(b"\n")
            if i >= 0:
                return pos - n + i + 1
            pos -= n
    return start


def land(lay: Layout, roots: list[Path], now_s: float) -> None:
    """Put what is new in the input files into ``landing/``, the ingestion query's input, each
    byte once (``landed.json`` records how far each file was taken).

    A file that no writer appends to any more (:func:`is_closed`) and was never taken is linked
    whole (a hard link: no copy). A file still being appended to (the current day's, the
    operator's single log file) is taken in segments: each run copies its complete lines since
    the last run into a new landing file named by its byte offset, so every line is ingested
    once, the run after it was written. Landing names keep the path below the root (``~`` for
    ``/``, the root's index first), so a quarantined line names its file."""
    lay.landing.mkdir(parents=True, exist_ok=True)
    landed: dict[str, dict[str, Any]] = read_record(lay.landed, dict) if lay.landed.exists() else {}
    changed = False
    for i, root in enumerate(roots):
        for f in data_files(root):
            key = f"{i}~" + (f.name if root.is_file() else str(f.relative_to(root)).replace(os.sep, "~"))
            size = f.stat().st_size
            was = landed.get(key)
            if was is None and is_closed(f, now_s):
                _publish(lay.landing / key, _link_or_copy(f))
                landed[key] = {"size": size, "whole": True}
                changed = True
                continue
            start = 0 if was is None else int(was["size"])
            if size < start:
                raise StateError(f"{f} is shorter than when it was ingested ({size} < {start} bytes): "
                                 "a log must only be appended to; --full rebuilds the state")
            if size == start or (was is not None and was.get("whole")):
                continue  # nothing new (a closed file taken whole is not appended to)
            seg = lay.landing / f"{key}~at{start}"
            if seg.exists():  # landed by a run killed before its record: that run's extent
                end = start + seg.stat().st_size
            else:  # a closed file's last line is complete even without its newline
                end = size if is_closed(f, now_s) else _complete_end(f, start, size)
            if end == start:
                continue
            _publish(seg, _segment(f, start, end))
            landed[key] = {"size": end, "whole": False}
            changed = True
    fsync_dir(lay.landing)
    if changed:
        atomic_write(lay.landed, (json.dumps(landed, indent=0, sort_keys=True) + "\n").encode())



def sources_for(lay: Layout, inputs: list[str], now_s: float | None = None) -> list[str]:
    """The file-source directories for ``inputs``: local inputs are landed (:func:`land`) into
    ``landing/``, URLs are streamed from directly (every file there taken as complete)."""
    local = [Path(p) for p in inputs if not _is_url(p)]
    if local:
        land(lay, local, time.time() if now_s is None else now_s)
    return ([str(lay.landing)] if local else []) + [p for p in inputs if _is_url(p)]
