"""What a valid recovery event is: the reason codes of a bad line, the checks of one event
(:func:`check_event`, :func:`validate_event`), the strict JSON reading of a line and its
classification (:func:`classify_line`), and the strict RFC 3339 reading of ``ts``
(:func:`parse_ts_ms`). The writer (:mod:`kraftkeeper_reports.events`) validates with it before
writing, and the Spark job's line parser (:mod:`kraftkeeper_reports.parse`) applies the same
rules, so both sides agree. Standard library only, as the writer.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Final

from kraftkeeper_reports.vocabulary import BY_NAME as _BY_NAME
from kraftkeeper_reports.vocabulary import (
    KNOWN_TYPES,
    REQUIRED_FIELDS,
    SCHEMA_VERSION,
)

# Types whose detail must carry ``reason`` (a non-empty string).
REASON_REQUIRED: Final = tuple(n for n, t in _BY_NAME.items() if "reason" in t.required_detail)


# Line-level reason codes, as counted by the Spark job's bad-input table. A reason in REJECTED
# removes the line from the analysis; one in TOLERATED keeps (extra fields) or skips (unknown
# type, blank line) it as the interface allows. Field-specific reasons carry the field name
# after a colon, e.g. "missing_field:ts", "wrong_type:leader_epoch".
MALFORMED_JSON: Final = "malformed_json"


NOT_AN_OBJECT: Final = "not_an_object"


MISSING_FIELD: Final = "missing_field"


WRONG_TYPE: Final = "wrong_type"


INVALID_VALUE: Final = "invalid_value"


BAD_TIMESTAMP: Final = "bad_timestamp"


UNSUPPORTED_SCHEMA_VERSION: Final = "unsupported_schema_version"


UNKNOWN_TYPE: Final = "unknown_type"


EXTRA_FIELDS: Final = "extra_fields"


BLANK_LINE: Final = "blank_line"


REJECTED: Final = (
    MALFORMED_JSON,
    NOT_AN_OBJECT,
    MISSING_FIELD,
    WRONG_TYPE,
    INVALID_VALUE,
    BAD_TIMESTAMP,
    UNSUPPORTED_SCHEMA_VERSION,
)


TOLERATED: Final = (UNKNOWN_TYPE, EXTRA_FIELDS, BLANK_LINE)


# RFC 3339 date-time (section 5.6) restricted to UTC, fraction required (1-9 digits so that a
# writer with micro- or nanoseconds is still read; ours writes milliseconds).
# Unicode White_Space (the characters a line or a name may consist of and still be "blank"), spelt
# out so that the Spark job's regular expression uses exactly the same set.
WHITESPACE: Final = (
    "\t\n\x0b\x0c\r \x85\xa0\u1680" + "".join(chr(c) for c in range(0x2000, 0x200B))
    + "\u2028\u2029\u202f\u205f\u3000"
)


INT64_MIN: Final = -(2**63)


INT64_MAX: Final = 2**63 - 1


_TS_RE: Final = re.compile(r"^(\d{4})-(\d{2})-(\d{2})[Tt](\d{2}):(\d{2}):(\d{2})\.(\d{1,9})(Z|z|\+00:00)$")


@dataclass(frozen=True)
class Problem:
    """One thing wrong with an event: a reason code (see REJECTED / TOLERATED) and a message."""

    code: str
    message: str

    @property
    def reason(self) -> str:
        """The code without its field suffix ("missing_field:ts" -> "missing_field")."""
        return self.code.split(":", 1)[0]

    @property
    def fatal(self) -> bool:
        return self.reason in REJECTED


def _day_ms(day: str) -> int | None:
    """Epoch milliseconds of a YYYY-MM-DD day, or None if there is no such day (2026-02-30)."""
    try:
        return int(datetime(int(day[0:4]), int(day[5:7]), int(day[8:10]), tzinfo=UTC).timestamp()) * 1000
    except ValueError:
        return None


_DAY_CACHE: dict[str, int | None] = {}


def parse_ts_ms(value: str) -> int | None:
    """Milliseconds since the epoch for an RFC 3339 UTC timestamp, or None if it is not one.

    Sub-millisecond digits are truncated (the log's unit is the millisecond). Hot path of the
    report job (once per line): days are cached, the time of day is plain arithmetic."""
    m = _TS_RE.match(value)
    if m is None:
        return None
    day = value[:10]
    base = _DAY_CACHE.get(day, -1)
    if base == -1:
        base = _day_ms(day)
        if len(_DAY_CACHE) < 100_000:
            _DAY_CACHE[day] = base
    if base is None:
        return None
    hour, minute, second = int(value[11:13]), int(value[14:16]), int(value[17:19])
    # RFC 3339 allows second 60 (a leap second); Python's datetime does not, nor do we.
    if hour > 23 or minute > 59 or second > 59:
        return None
    frac = m.group(7)
    frac_ms = int(frac[:3]) * (10 ** (3 - len(frac))) if len(frac) < 3 else int(frac[:3])
    return base + ((hour * 60 + minute) * 60 + second) * 1000 + frac_ms


def _is_int(v: object) -> bool:
    # bool is a subclass of int in Python; JSON true is not an integer. 64-bit, as Spark's BIGINT.
    return isinstance(v, int) and not isinstance(v, bool) and INT64_MIN <= v <= INT64_MAX


def is_blank(s: str) -> bool:
    """True when ``s`` is empty or only :data:`WHITESPACE`."""
    return not s.strip(WHITESPACE)


def check_event(obj: object) -> list[Problem]:
    """Every problem with one decoded event, fatal ones first; [] when it is valid.

    Extra fields are reported as a tolerated problem (EXTRA_FIELDS), an unknown ``type`` as
    UNKNOWN_TYPE; neither is fatal (:attr:`Problem.fatal`)."""
    if not isinstance(obj, dict):
        return [Problem(NOT_AN_OBJECT, f"an event must be a JSON object, got {type(obj).__name__}")]
    problems: list[Problem] = []
    for name in REQUIRED_FIELDS:
        if name not in obj:
            problems.append(Problem(f"{MISSING_FIELD}:{name}", f"field {name!r} is missing"))

    def wrong(name: str, want: str) -> None:
        got = obj[name]
        shown = json.dumps(got)[:40]
        problems.append(Problem(f"{WRONG_TYPE}:{name}", f"field {name!r} must be {want}, got {shown}"))

    sv = obj.get("schema_version")
    if "schema_version" in obj:
        if not _is_int(sv):
            wrong("schema_version", "an integer")
        elif sv != SCHEMA_VERSION:
            problems.append(
                Problem(UNSUPPORTED_SCHEMA_VERSION, f"schema_version {sv} is not supported (only 1)")
            )
    if "ts" in obj:
        ts = obj["ts"]
        if not isinstance(ts, str):
            wrong("ts", "an RFC 3339 UTC timestamp string")
        elif parse_ts_ms(ts) is None:
            problems.append(
                Problem(BAD_TIMESTAMP, f"ts {ts[:40]!r} is not an RFC 3339 UTC timestamp with fraction")
            )
    for name in ("cluster", "recovery_id", "type"):
        if name in obj:
            v = obj[name]
            if not isinstance(v, str):
                wrong(name, "a string")
            elif is_blank(v):
                problems.append(Problem(f"{INVALID_VALUE}:{name}", f"field {name!r} must not be empty"))
    if "replica_id" in obj:
        v = obj["replica_id"]
        if not _is_int(v):
            wrong("replica_id", "an integer")
        elif v < 0:
            problems.append(Problem(f"{INVALID_VALUE}:replica_id", f"replica_id {v} is negative"))
    for name in ("leader_id", "leader_epoch"):
        if name in obj:
            v = obj[name]
            if v is not None and not _is_int(v):
                wrong(name, "an integer or null")
            elif v is not None and v < 0:
                problems.append(Problem(f"{INVALID_VALUE}:{name}", f"{name} {v} is negative"))
    for name in ("old_uuid", "new_uuid"):
        if name in obj and obj[name] is not None and not isinstance(obj[name], str):
            wrong(name, "a string or null")
    detail = obj.get("detail")
    if "detail" in obj and not isinstance(detail, dict):
        wrong("detail", "an object")
    typ = obj.get("type")
    if typ in REASON_REQUIRED and isinstance(detail, dict):
        reason = detail.get("reason")
        if not isinstance(reason, str) or not reason:
            problems.append(
                Problem(f"{INVALID_VALUE}:detail.reason", f"{typ} needs detail.reason (a string)")
            )
    # Tolerated ones last, so the first problem of a rejected line is the fatal one.
    if isinstance(typ, str) and not is_blank(typ) and typ not in KNOWN_TYPES:
        problems.append(Problem(UNKNOWN_TYPE, f"unknown event type {typ[:40]!r} (skipped)"))
    extra = sorted(k for k in obj if k not in REQUIRED_FIELDS)
    if extra:
        shown = ", ".join(extra[:5])
        problems.append(Problem(EXTRA_FIELDS, f"extra field(s) ignored: {shown}"))
    problems.sort(key=lambda p: not p.fatal)
    return problems


_REQUIRED_SET: Final = frozenset(REQUIRED_FIELDS)


_KNOWN_SET: Final = frozenset(KNOWN_TYPES)


def _fast_valid_ts(obj: object) -> int | None:
    """The timestamp of an event that is plainly valid (exactly the required fields, right
    types, known type), else None and check_event decides. The report job runs this once per
    line; it accepts nothing that check_event would reject (tests compare both)."""
    if type(obj) is not dict or obj.keys() != _REQUIRED_SET:
        return None
    sv, ts, typ, detail = obj["schema_version"], obj["ts"], obj["type"], obj["detail"]
    c, rid, rep = obj["cluster"], obj["recovery_id"], obj["replica_id"]
    lid, lep, old, new = obj["leader_id"], obj["leader_epoch"], obj["old_uuid"], obj["new_uuid"]
    if not (
        type(sv) is int and sv == 1 and type(ts) is str and type(typ) is str and typ in _KNOWN_SET
        and type(c) is str and type(rid) is str and not is_blank(c) and not is_blank(rid)
        and type(rep) is int and 0 <= rep <= INT64_MAX and type(detail) is dict
        and (lid is None or (type(lid) is int and 0 <= lid <= INT64_MAX))
        and (lep is None or (type(lep) is int and 0 <= lep <= INT64_MAX))
        and (old is None or type(old) is str) and (new is None or type(new) is str)
    ):
        return None
    if typ in REASON_REQUIRED:
        reason = detail.get("reason")
        if type(reason) is not str or not reason:
            return None
    return parse_ts_ms(ts)


def validate_event(obj: object) -> list[str]:
    """Problems that make ``obj`` an invalid event, as messages; [] when it is valid.

    Tolerated deviations (extra fields, an unknown type) are not problems here."""
    return [p.message for p in check_event(obj) if p.fatal]


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    d = dict(pairs)
    if len(d) != len(pairs):
        seen: set[str] = set()
        for k, _ in pairs:
            if k in seen:
                raise ValueError(f"duplicate key {k[:40]!r}")
            seen.add(k)
    return d


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def _has_lone_surrogate(obj: object) -> bool:
    try:
        json.dumps(obj, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


def loads_strict(line: str) -> Any:
    """json.loads limited to RFC 8259 JSON, as Spark's parser reads it: a duplicate key,
    NaN/Infinity or an escaped lone surrogate raise ValueError."""
    obj = json.loads(line, object_pairs_hook=_no_duplicates, parse_constant=_no_constant)
    # Only a \u escape can produce a lone surrogate (the text itself came from valid UTF-8).
    if "\\u" in line and _has_lone_surrogate(obj):
        raise ValueError("a \\u escape is a lone UTF-16 surrogate")
    return obj


@dataclass(frozen=True)
class Classified:
    """What a reader makes of one line: the event (None if rejected or skipped), the problem
    that decided it (None if clean) and the tolerated notes."""

    event: dict[str, Any] | None
    ts_ms: int | None
    problem: Problem | None
    notes: tuple[Problem, ...]


def classify_line(line: str) -> Classified:
    """Decode and check one log line. Never raises: every outcome is a value to count."""
    if is_blank(line):
        return Classified(None, None, Problem(BLANK_LINE, "blank line (skipped)"), ())
    try:
        obj = loads_strict(line)
    except ValueError as e:  # json.JSONDecodeError, a duplicate key, NaN, a lone surrogate
        return Classified(None, None, Problem(MALFORMED_JSON, f"not valid JSON: {e}"), ())
    except RecursionError:
        return Classified(None, None, Problem(MALFORMED_JSON, "JSON nested too deeply"), ())
    ms = _fast_valid_ts(obj)
    if ms is not None:
        return Classified(obj, ms, None, ())
    problems = check_event(obj)
    if problems and problems[0].fatal:
        return Classified(None, None, problems[0], tuple(problems[1:]))
    assert isinstance(obj, dict)
    unknown = [p for p in problems if p.code == UNKNOWN_TYPE]
    if unknown:
        return Classified(None, None, unknown[0], tuple(p for p in problems if p is not unknown[0]))
    return Classified(obj, parse_ts_ms(obj["ts"]), None, tuple(problems))
