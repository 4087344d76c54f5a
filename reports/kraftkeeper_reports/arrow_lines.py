"""Event-log lines parsed in this process (no JVM) into the rows the Spark path stages: the
columns of ``ingest._rows`` (``parse.PARSED_COLUMNS`` with the line and its file for the
quarantine), written as the two tables' Parquet files.

The rules are :func:`kraftkeeper_reports.eventcheck.classify_line`'s, the one written definition
of a valid event (``parse`` expresses the same rules in Spark SQL; tests/reports/test_arrow_ingest.py
runs both over the generator's lines and mutated ones and compares every column). What this
module adds is only the Spark path's wording and shapes of what it stores: its messages (a few are
worded by Spark, e.g. a malformed line's), its notes (the tolerated problems only), a fatal line's
values left null, and detail's values as strings as Spark reads them.
"""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pyarrow as pa  # type: ignore[import-untyped]
import pyarrow.parquet as pq  # type: ignore[import-untyped]

from kraftkeeper_reports import events as ev
from kraftkeeper_reports.eventcheck import Problem, classify_line, loads_strict

EXAMPLE_CHARS = 300  # parse.EXAMPLE_CHARS (parse imports pyspark; this module must not)
MALFORMED_MESSAGE = ("not valid JSON (a syntax error, a duplicate key, NaN, a lone surrogate or "
                     "trailing data)")

# The staged columns (ingest._rows less the partition columns), in the Spark path's order and types.
_STR, _LONG = pa.string(), pa.int64()
TABLE_SCHEMA = pa.schema([
    ("ts_ms", _LONG), ("cluster", _STR), ("recovery_id", _STR), ("type", _STR), ("replica_id", _LONG),
    ("old_uuid", _STR), ("new_uuid", _STR), ("leader_id", _LONG), ("leader_epoch", _LONG),
    ("failure_reason", _STR), ("engine", _STR), ("order", _STR), ("info", _STR), ("reason", _STR),
    pa.field("notes", pa.list_(_STR), nullable=False), ("example", _STR), ("message", _STR),
    ("value", _STR), ("source", _STR),
])
_FAST_TS = re.compile(r"^[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}\.[0-9]{3}Z$")
_PLAIN = re.compile(r'^[^"\\\x00-\x1F]*$')


def source_name(path: Path) -> str:
    """A landed file's name as Spark's ``input_file_name()`` gives it (a ``file:`` URI)."""
    return "file://" + quote(str(path.resolve()), safe="/=~!$&'()*+,;:@")


def _compact(v: Any) -> str:
    """A JSON value as Spark writes a VARIANT back (compact, object keys sorted)."""
    return json.dumps(v, separators=(",", ":"), ensure_ascii=False, sort_keys=True)


def _as_string(v: Any) -> str | None:
    """A detail value as Spark reads it as a string (``try_variant_get(..., 'string')``)."""
    if v is None or isinstance(v, str):
        return v
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int | float):
        return json.dumps(v)
    return _compact(v)


def _plain_int(v: Any) -> bool:
    return type(v) is int and 0 <= v < 10**19


def _writer_form(line: str, obj: dict[str, Any]) -> bool:
    """Whether the Spark path's fast path takes the line (``parse._fast_fields``): the writer's
    exact compact form of a plainly valid event with a flat detail of plain values. It keeps
    detail's text as written where the general path writes the parsed value back."""
    if tuple(obj) != ev.REQUIRED_FIELDS or obj["type"] in ev.REASON_REQUIRED:
        return False
    if json.dumps(obj, separators=(",", ":"), ensure_ascii=False) != line:
        return False
    strings = [obj[k] for k in ("ts", "cluster", "recovery_id")]
    strings += [obj[k] for k in ("old_uuid", "new_uuid") if obj[k] is not None]
    if not all(isinstance(s, str) and _PLAIN.match(s) for s in strings) or not _FAST_TS.match(obj["ts"]):
        return False
    names = (obj["cluster"], obj["recovery_id"])
    if obj["ts"].startswith("0000") or any(s[:1] in ev.WHITESPACE for s in names):
        return False
    if not _plain_int(obj["replica_id"]) or not all(
            obj[k] is None or _plain_int(obj[k]) for k in ("leader_id", "leader_epoch")):
        return False
    for k, v in obj["detail"].items():
        if not _PLAIN.match(k) or isinstance(v, dict | list | float):
            return False
        if isinstance(v, str) and not _PLAIN.match(v):
            return False
        if type(v) is int and not -(10**19) < v < 10**19:
            return False
    return True


def _message(p: Problem, obj: Any) -> str:
    """The Spark path's message for a problem ``classify_line`` found (the same problem)."""
    if p.reason == ev.MALFORMED_JSON:
        return MALFORMED_MESSAGE
    if p.reason == ev.WRONG_TYPE:
        name = p.code.split(":", 1)[1]
        return p.message.rsplit(", got ", 1)[0] + ", got " + _compact(obj[name])[:40]
    if p.code == ev.BAD_TIMESTAMP:
        return f"ts '{obj['ts'][:40]}' is not an RFC 3339 UTC timestamp with fraction"
    if p.code == ev.UNKNOWN_TYPE:
        return f"unknown event type '{obj['type'][:40]}' (skipped)"
    return p.message


_NULL_EVENT = dict.fromkeys(("ts_ms", "cluster", "recovery_id", "type", "replica_id", "old_uuid", "new_uuid",
                             "leader_id", "leader_epoch", "failure_reason", "engine", "order", "info"))


def parse_line(line: str, source: str) -> dict[str, Any]:
    """One line as the Spark path's staged row (``ingest._rows``): a usable event, with its notes
    if any, or the reason it is not one with the line and its file."""
    c = classify_line(line)
    problems = ([c.problem] if c.problem else []) + list(c.notes)
    # The problem that rejects or skips the line (a blank line is skipped, not counted as bad).
    fatal = c.problem if c.problem is not None and c.problem.code != ev.UNKNOWN_TYPE else None
    unknown = next((p for p in problems if p.code == ev.UNKNOWN_TYPE), None)
    extra = next((p for p in problems if p.code == ev.EXTRA_FIELDS), None)
    reason = fatal.code if fatal else (ev.UNKNOWN_TYPE if unknown else None)
    row: dict[str, Any] = dict(_NULL_EVENT)
    obj: Any = c.event
    if reason is not None or extra is not None:
        shows_value = fatal is not None and fatal.reason in (ev.WRONG_TYPE, ev.BAD_TIMESTAMP)
        if obj is None and (unknown or shows_value):
            obj = loads_strict(line)  # the rare rejected line whose message shows a value
        if fatal is not None:
            message = _message(fatal, obj)
        else:
            message = "; ".join(_message(p, obj) for p in (unknown, extra) if p is not None)
        short = "/".join(source.rstrip("/").rsplit("/", 2)[-2:])
        row.update(example=f"{short}: {line[:EXAMPLE_CHARS]}", message=message)
        notes = [ev.UNKNOWN_TYPE] if fatal is not None and unknown else []
        row["notes"] = notes + ([ev.EXTRA_FIELDS] if extra else [])
    else:
        row.update(example=None, message=None, notes=[])
    if reason is not None:
        row.update(reason=reason, value=line, source=source)
        return row
    assert isinstance(obj, dict)
    detail = obj["detail"]
    typ = obj["type"]
    row.update(
        ts_ms=c.ts_ms, cluster=obj["cluster"], recovery_id=obj["recovery_id"], type=typ,
        replica_id=obj["replica_id"], old_uuid=obj["old_uuid"], new_uuid=obj["new_uuid"],
        leader_id=obj["leader_id"], leader_epoch=obj["leader_epoch"],
        failure_reason=detail.get("reason") if typ == ev.RECOVERY_FAILED else None,
        engine=_as_string(detail.get("engine")), order=_as_string(detail.get("order")),
        reason=None, value=None, source=None,
    )
    if typ in ev.UNCLEAN_TYPES:
        fast = extra is None and _writer_form(line, obj)
        row["info"] = line[line.rindex(',"detail":') + 10:-1] if fast else _compact(detail)
    return row


def read_lines(path: Path) -> list[str]:
    """A landed file's lines as Spark's text source splits them (\\n, \\r\\n or \\r; no empty
    line after a final line end)."""
    lines = re.split(r"\r\n|\r|\n", path.read_bytes().decode("utf-8", errors="replace"))
    return lines[:-1] if lines[-1] == "" else lines


def parse_files(files: list[Path]) -> list[dict[str, Any]]:
    """Every line of ``files`` as staged rows (:func:`parse_line`)."""
    rows: list[dict[str, Any]] = []
    for f in files:
        src = source_name(f)
        rows.extend(parse_line(line, src) for line in read_lines(f))
    return rows


def day(ts_ms: int) -> str:
    return datetime.fromtimestamp(ts_ms / 1000, UTC).strftime("%Y-%m-%d")


def stage(rows: list[dict[str, Any]], stage_dir: Path) -> None:
    """Write ``rows`` into ``stage_dir`` laid out as the Spark path's staged output
    (``kk_table=<table>/date=<day>/part-*.parquet``), so ``ingest``'s plan and renames apply."""
    by_dir: dict[str, list[dict[str, Any]]] = {}
    for r in rows:
        where = ("kk_table=events/date=" + day(r["ts_ms"]) if r["reason"] is None
                 else "kk_table=quarantine/date=__HIVE_DEFAULT_PARTITION__")
        by_dir.setdefault(where, []).append(r)
    for where, part in sorted(by_dir.items()):
        d = stage_dir / where
        d.mkdir(parents=True, exist_ok=True)
        cols = {f.name: [r[f.name] for r in part] for f in TABLE_SCHEMA}
        pq.write_table(pa.table(cols, schema=TABLE_SCHEMA), d / "part-00000-arrow.snappy.parquet",
                       compression="snappy")
