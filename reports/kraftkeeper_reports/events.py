"""The recovery event log: its types, its checks and an appending writer.

The operator emits one JSON line per step of a KIP-856 disk-failure recovery (docs/reference.md,
"Recovery event log"); the Spark job (``kraftkeeper_reports.job``) reads them back. This module is
the single definition of what a valid event is: the operator validates before writing, and the
Spark job classifies every input line with :func:`classify_line`, so both sides agree.

It imports nothing outside the standard library (and the standard-library-only
:mod:`quorum.timefmt`) on purpose: the operator image has no Spark. The checks are
:mod:`kraftkeeper_reports.eventcheck`, re-exported here.

Invariants of a valid event (also in ``schemas/recovery-event.schema.json``):

* ``schema_version`` is the integer 1;
* ``ts`` is RFC 3339 in UTC (``Z`` or ``+00:00``) with a fractional second; the writer emits
  exactly milliseconds;
* ``cluster``, ``recovery_id``, ``type`` are non-empty strings; ``replica_id`` is an integer >= 0;
* ``old_uuid`` / ``new_uuid`` are strings or null (null when not known yet, e.g. a recovery that
  failed before the new disk was formatted); ``leader_id`` / ``leader_epoch`` are integers >= 0
  or null (null when no leader was known, e.g. ``quorum_lost``);
* ``detail`` is an object; for ``recovery_failed`` and ``unclean_recovery`` it carries ``reason``
  (a string).

Unknown types and extra fields are tolerated: readers skip unknown types and ignore extra fields,
and count both (:data:`TOLERATED`).

The Spark job applies the same rules with Spark's own JSON parser (``kraftkeeper_reports.parse``),
so some choices here are made to be expressible there exactly: a line must be one JSON value
(RFC 8259: no NaN or Infinity, no duplicate keys, no lone surrogate escapes); integers are 64-bit
(a larger one is the wrong type); "blank" means only the characters of :data:`WHITESPACE`.
"""

from __future__ import annotations

import json
import os
import re
import threading
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Final

# The vocabulary (every type, its fields, the required ones) and the checks (what a valid event
# is) are each defined in one place and re-exported here, where the writer and the readers have
# always found them.
from kraftkeeper_reports.eventcheck import (
    BAD_TIMESTAMP,
    BLANK_LINE,
    EXTRA_FIELDS,
    INT64_MAX,
    INT64_MIN,
    INVALID_VALUE,
    MALFORMED_JSON,
    MISSING_FIELD,
    NOT_AN_OBJECT,
    REASON_REQUIRED,
    REJECTED,
    TOLERATED,
    UNKNOWN_TYPE,
    UNSUPPORTED_SCHEMA_VERSION,
    WHITESPACE,
    WRONG_TYPE,
    Classified,
    Problem,
    check_event,
    classify_line,
    is_blank,
    loads_strict,
    parse_ts_ms,
    validate_event,
)
from kraftkeeper_reports.vocabulary import (
    ADD_VOTER_COMMITTED,
    ADD_VOTER_STARTED,
    DISK_REPLACEMENT_DETECTED,
    FAILURE_REASONS,
    KNOWN_TYPES,
    REASON_FELL_BEHIND,
    REASON_QUORUM_LOST,
    REASON_TIMEOUT,
    RECOVERY_COMPLETED,
    RECOVERY_FAILED,
    RECOVERY_RESUMED,
    RECURRING_TYPES,
    REMOVE_VOTER_COMMITTED,
    REMOVE_VOTER_STARTED,
    REPLICA_CAUGHT_UP,
    REPLICA_FELL_BEHIND,
    REQUIRED_FIELDS,
    SCHEMA_VERSION,
    STEP_TYPES,
    TERMINAL_TYPES,
    UNCLEAN_RECOVERY,
    UNCLEAN_RECOVERY_COMPLETED,
    UNCLEAN_TYPES,
)
from quorum.timefmt import rfc3339

__all__ = [
    "ADD_VOTER_COMMITTED", "ADD_VOTER_STARTED", "BAD_TIMESTAMP", "BLANK_LINE",
    "DISK_REPLACEMENT_DETECTED", "EXTRA_FIELDS", "FAILURE_REASONS", "INT64_MAX", "INT64_MIN",
    "INVALID_VALUE", "KNOWN_TYPES", "MALFORMED_JSON", "MISSING_FIELD", "NOT_AN_OBJECT",
    "REASON_FELL_BEHIND", "REASON_QUORUM_LOST", "REASON_REQUIRED", "REASON_TIMEOUT",
    "RECOVERY_COMPLETED", "RECOVERY_FAILED", "RECOVERY_RESUMED", "RECURRING_TYPES", "REJECTED",
    "REMOVE_VOTER_COMMITTED", "REMOVE_VOTER_STARTED", "REPLICA_CAUGHT_UP", "REPLICA_FELL_BEHIND",
    "REQUIRED_FIELDS", "SCHEMA_VERSION", "STEP_TYPES", "TERMINAL_TYPES", "TOLERATED",
    "UNCLEAN_RECOVERY", "UNCLEAN_RECOVERY_COMPLETED", "UNCLEAN_TYPES", "UNKNOWN_TYPE",
    "UNSUPPORTED_SCHEMA_VERSION", "WHITESPACE", "WRONG_TYPE", "Classified", "EventLogWriter", "Problem",
    "RecoveryEvent", "check_event", "classify_line", "is_blank", "loads_strict", "parse_ts_ms",
    "validate_event",
]


@dataclass(frozen=True)
class RecoveryEvent:
    """One step of a recovery, as the operator reports it (everything but ``cluster`` and ``ts``,
    which the sink that writes it adds). Sinks take this one value instead of eight arguments.

    ``type`` is one of :data:`KNOWN_TYPES` (readers tolerate others); ``detail`` must be a JSON
    object (for ``recovery_failed`` it carries ``reason``)."""

    type: str
    recovery_id: str
    replica_id: int
    old_uuid: str | None = None
    new_uuid: str | None = None
    leader_id: int | None = None
    leader_epoch: int | None = None
    detail: dict[str, Any] = field(default_factory=dict)

    def to_record(self, cluster: str, ts: datetime | int | str | None = None) -> dict[str, Any]:
        """The full event-log record, fields in the interface's order, for ``cluster`` at ``ts``:
        a datetime (aware, or naive meaning UTC), epoch milliseconds, an RFC 3339 string, or None
        for now."""
        if ts is None:
            ts_s = rfc3339(millis=True)
        elif isinstance(ts, datetime):
            aware = ts if ts.tzinfo is not None else ts.replace(tzinfo=UTC)
            ts_s = rfc3339(int(aware.timestamp() * 1000), millis=True)
        elif isinstance(ts, int):
            ts_s = rfc3339(ts, millis=True)
        else:
            ts_s = ts
        return {
            "schema_version": SCHEMA_VERSION,
            "ts": ts_s,
            "cluster": cluster,
            "recovery_id": self.recovery_id,
            "type": self.type,
            "replica_id": self.replica_id,
            "old_uuid": self.old_uuid,
            "new_uuid": self.new_uuid,
            "leader_id": self.leader_id,
            "leader_epoch": self.leader_epoch,
            "detail": dict(self.detail) if self.detail else {},
        }


class EventLogWriter:
    """Appends recovery events as JSON lines, each flushed and fsynced before ``emit`` returns
    (an event the operator reported is on disk even if the process dies right after).

    ``path_or_dir``: a file (a name ending in .jsonl/.json/.log/.ndjson, or an existing file) is
    appended to; anything else is a directory (created if missing) under which events go to
    ``date=YYYY-MM-DD/events-<cluster>.jsonl`` by the event's UTC day, the date-partitioned
    layout the report job reads. An invalid event raises ValueError naming the problems and
    writes nothing. Thread-safe; one line per ``write`` on an O_APPEND descriptor, so concurrent
    writers of the same file do not interleave within a line.
    """

    _FILE_SUFFIXES: Final = (".jsonl", ".json", ".log", ".ndjson")

    def __init__(self, path_or_dir: str | os.PathLike[str], cluster: str) -> None:
        if not isinstance(cluster, str) or not cluster.strip():
            raise ValueError("EventLogWriter: cluster must be a non-empty string")
        self.cluster = cluster
        p = Path(path_or_dir)
        self._is_file = p.is_file() or (not p.is_dir() and p.suffix in self._FILE_SUFFIXES)
        self.root = p
        if self._is_file:
            p.parent.mkdir(parents=True, exist_ok=True)
        else:
            p.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        # Slashes of namespace/name must not become directories.
        self._file_stem = "events-" + re.sub(r"[^A-Za-z0-9._-]+", "_", cluster)

    def path_for(self, ts: str) -> Path:
        """The file an event with timestamp ``ts`` goes to."""
        if self._is_file:
            return self.root
        return self.root / f"date={ts[:10]}" / f"{self._file_stem}.jsonl"

    def emit(self, event: RecoveryEvent, ts: datetime | int | str | None = None) -> dict[str, Any]:
        """Validate, append and fsync one event of this writer's cluster at ``ts`` (None: now);
        returns the record written."""
        if not isinstance(event, RecoveryEvent):
            raise TypeError(f"EventLogWriter.emit takes a RecoveryEvent, got {type(event).__name__}")
        record = event.to_record(self.cluster, ts)
        problems = validate_event(record)
        if problems:
            raise ValueError(f"invalid recovery event {event.type!r}: " + "; ".join(problems))
        data = (json.dumps(record, separators=(",", ":"), ensure_ascii=False) + "\n").encode("utf-8")
        path = self.path_for(record["ts"])
        with self._lock:
            new_dir = not path.parent.exists()
            new_file = new_dir or not path.exists()
            path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            try:
                view = memoryview(data)
                while view:
                    n = os.write(fd, view)
                    view = view[n:]
                os.fsync(fd)
            finally:
                os.close(fd)
            # A new file (and a new partition directory) must itself be durable to be found.
            if new_file:
                _fsync_dir(path.parent)
            if new_dir:
                _fsync_dir(path.parent.parent)
        return record


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
