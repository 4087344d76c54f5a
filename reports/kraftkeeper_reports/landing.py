"""Landing: what the ingestion query reads (``--state DIR/landing/``), made from the input
files so that Spark's file source only ever sees complete files, each byte of an input once.

A file no writer appends to any more (the operator writes each event to ``date=<its UTC
day>/...``, so a past day's files, :data:`CLOSE_GRACE_S` after the day ended) is linked whole;
a file still being appended to (today's, or the operator's single log file) is copied in
segments of complete lines, each named by its byte offset, and ``landed.json`` records how far
each file was taken (:mod:`kraftkeeper_reports.ingest` describes the whole state). Each run's
new pieces go to one engine's directory, ``landing/`` (Spark's file source) or
``arrow/landing/`` (the in-process engine), and stay there: no file is seen by both engines.
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

from kraftkeeper_reports import ingest as ing
from kraftkeeper_reports.ingest import Layout, StateError, read_record
from quorum.storage.atomic import atomic_write, fsync_dir

__all__ = ["ARROW_MAX_BYTES", "AUTO", "CLOSE_GRACE_S", "ENGINES", "data_files", "is_closed", "land",
           "sources_for"]

CLOSE_GRACE_S = float(os.environ.get("KK_REPORT_CLOSE_GRACE_S", "3600"))
AUTO = "auto"
ENGINES = (AUTO, ing.SPARK, ing.ARROW)
# ``--engine auto``: new input below this many bytes is ingested in process (about 250 k lines).
ARROW_MAX_BYTES = int(os.environ.get("KK_REPORT_ARROW_MAX_BYTES", str(64 << 20)))
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


def _landed_in(lay: Layout, name: str) -> Path | None:
    """The landing directory a piece called ``name`` was published to by an earlier (killed)
    run, if any: a piece never moves to the other engine's input."""
    for d in (lay.landing, lay.arrow_landing):
        if (d / name).exists():
            return d
    return None


def land(lay: Layout, roots: list[Path], now_s: float, engine: str = ing.SPARK) -> str:
    """Put what is new in the input files into the landing directory of one engine (``engine``:
    spark, arrow, or auto: arrow when the new bytes are fewer than :data:`ARROW_MAX_BYTES`),
    each byte once (``landed.json`` records how far each file was taken, and by which engine);
    the engine chosen. Before a piece is published for Spark, ``spark.due`` is written (Spark's
    run removes it once its stream has taken every file), so a run killed in between still
    leaves Spark's part to the next run.

    A file that no writer appends to any more (:func:`is_closed`) and was never taken is linked
    whole (a hard link: no copy). A file still being appended to (the current day's, the
    operator's single log file) is taken in segments: each run copies its complete lines since
    the last run into a new landing file named by its byte offset, so every line is ingested
    once, the run after it was written. Landing names keep the path below the root (``~`` for
    ``/``, the root's index first), so a quarantined line names its file."""
    lay.landing.mkdir(parents=True, exist_ok=True)
    lay.arrow_landing.mkdir(parents=True, exist_ok=True)
    landed: dict[str, dict[str, Any]] = read_record(lay.landed, dict) if lay.landed.exists() else {}
    pieces: list[tuple[str, str, Callable[[Path], None], dict[str, Any], Path | None, int]] = []
    for i, root in enumerate(roots):
        for f in data_files(root):
            key = f"{i}~" + (f.name if root.is_file() else str(f.relative_to(root)).replace(os.sep, "~"))
            size = f.stat().st_size
            was = landed.get(key)
            if was is None and is_closed(f, now_s):
                where = _landed_in(lay, key)
                pieces.append((key, key, _link_or_copy(f), {"size": size, "whole": True}, where, size))
                continue
            start = 0 if was is None else int(was["size"])
            if size < start:
                raise StateError(f"{f} is shorter than when it was ingested ({size} < {start} bytes): "
                                 "a log must only be appended to; --full rebuilds the state")
            if size == start or (was is not None and was.get("whole")):
                continue  # nothing new (a closed file taken whole is not appended to)
            name = f"{key}~at{start}"
            where = _landed_in(lay, name)
            if where is not None:  # landed by a run killed before its record: that run's extent
                end = start + (where / name).stat().st_size
            else:  # a closed file's last line is complete even without its newline
                end = size if is_closed(f, now_s) else _complete_end(f, start, size)
            if end == start:
                continue
            entry = {"size": end, "whole": False}
            pieces.append((key, name, _segment(f, start, end), entry, where, end - start))
    new_bytes = sum(n for *_, where, n in pieces if where is None)
    if engine == AUTO:
        engine = ing.ARROW if new_bytes < ARROW_MAX_BYTES else ing.SPARK
    if engine == ing.SPARK and any(where is None for *_, where, _n in pieces):
        atomic_write(lay.spark_due, b"{}\n")
    for key, name, fill, entry, where, _n in pieces:
        d = where or (lay.landing if engine == ing.SPARK else lay.arrow_landing)
        _publish(d / name, fill)
        landed[key] = {**entry, "engine": ing.SPARK if d == lay.landing else ing.ARROW}
    fsync_dir(lay.landing)
    fsync_dir(lay.arrow_landing)
    if pieces:
        atomic_write(lay.landed, (json.dumps(landed, indent=0, sort_keys=True) + "\n").encode())
    return engine


def _stream_unfinished(lay: Layout) -> bool:
    """Whether Spark's checkpoint holds a batch it planned and did not commit (a state whose
    Spark run was killed before ``spark.due`` existed)."""
    def last(d: Path) -> int:
        return max((int(p.name) for p in d.iterdir() if p.name.isdigit()), default=-1) if d.is_dir() else -1
    return last(lay.checkpoint / "offsets") > last(lay.checkpoint / "commits")


def sources_for(lay: Layout, inputs: list[str], now_s: float | None = None, engine: str = ing.SPARK,
                ) -> tuple[list[str], str]:
    """The file-source directories for Spark, and the engine the new local input went to:
    local inputs are landed (:func:`land`) into ``landing/`` (Spark's) or ``arrow/landing/``;
    URLs are streamed from directly by Spark (every file there taken as complete)."""
    local = [Path(p) for p in inputs if not _is_url(p)]
    urls = [p for p in inputs if _is_url(p)]
    if urls and engine == AUTO:
        engine = ing.SPARK
    chosen = land(lay, local, time.time() if now_s is None else now_s, engine) if local else engine
    due = lay.spark_due.exists() or bool(urls) or _stream_unfinished(lay)
    return ([str(lay.landing)] if local and due else []) + urls, chosen
