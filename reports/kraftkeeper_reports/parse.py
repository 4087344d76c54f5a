"""Parse and validate event-log lines inside Spark (the JVM): one row per line, a clean event or
the reason it is not one.

The rules are those of :func:`kraftkeeper_reports.events.classify_line` (the one written
definition of a valid event, also used by the operator's writer), expressed as Spark SQL
expressions over Spark's own JSON parser, so no line goes through a Python worker:

* each line is parsed once with ``try_parse_json`` into a VARIANT, which keeps JSON's types
  (``"3"`` stays a string, ``3`` a BIGINT, ``3.0`` a decimal): the line is wrapped in ``[ ]`` and
  must hold exactly one value, so trailing data (``{...},{...}``) is malformed as in Python;
* duplicate keys, NaN/Infinity, lone surrogates, raw control characters are malformed JSON on
  both sides (Spark's parser refuses them; ``events`` refuses them explicitly);
* the first fatal problem, in ``check_event``'s order, is the line's reason; tolerated ones
  (``unknown_type``, ``extra_fields``) are notes, as in ``classify_line``.

Lines in the writer's exact compact form (nearly every line of a real log) take a fast path
first: their fields are cut out at the quotes, the line is written again from them as the writer
would write it and compared with the original byte for byte, and short regular expressions check
the values (no JSON parser runs, and no expression over the whole line: measured ~6 us of CPU a
line against ~10 for one regular expression over the line, ~3.5 for ``from_json`` alone); only
the other lines get the full checks below.

Each expensive value (the parse, each field, its JSON type) is computed once, in its own
projection, and the checks compare those columns: nested CASE expressions that repeat variant
look-ups run an order of magnitude slower (and may exceed what Spark compiles to Java).

One known difference: a line holding a complete JSON value, then an unbalanced ``]``, then more
text (``{...}] x}``) is read as the value by Spark's parser (it ignores what follows a complete
value) and rejected by Python's. A writer's torn or interleaved line cannot look like that.
"""

from __future__ import annotations

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from kraftkeeper_reports import events as ev

EXAMPLE_CHARS = 300

# Column names of the parsed rows (the transformations downstream select from these).
PARSED_COLUMNS = (
    "reason", "notes", "example", "message", "ts_ms", "cluster", "recovery_id", "type",
    "replica_id", "old_uuid", "new_uuid", "leader_id", "leader_epoch", "failure_reason",
    "engine", "order", "info",
)

# events.WHITESPACE as a Java regex character class (one source for both sides).
_WS_CLASS = "[" + "".join(f"\\x{{{ord(c):X}}}" for c in ev.WHITESPACE) + "]"
_JSON_WS = " \t\r\n"  # what JSON (RFC 8259) itself allows around a value


def _blank(c: Column) -> Column:
    return c.rlike(f"^{_WS_CLASS}*$")


_STRING_FIELDS = ("ts", "cluster", "recovery_id", "type", "old_uuid", "new_uuid")
_INT_FIELDS = ("schema_version", "replica_id", "leader_id", "leader_epoch")


def _base(lines: DataFrame) -> list[str]:
    """The line, and the file it came from when the caller gave it as ``source`` (rows built in
    memory); lines read from files leave it out and :func:`_finish` asks Spark for the file name
    (``input_file_name``) only for the lines it shows as examples. Carrying the path on every
    line cost 3-5% of the job's CPU at 10 M events (three runs each, alternating)."""
    return ["value", "source"] if "source" in lines.columns else ["value"]


def _k(name: str) -> Column:
    """The JSON type of field ``name`` as schema_of_variant says it (BIGINT, STRING, VOID, ...);
    null when the field is missing."""
    return F.col(f"k_{name}")


def _has(name: str) -> Column:
    return F.col(f"f_{name}").isNotNull()


def _ts_parts(ts: Column, shape_known: bool = False) -> tuple[Column, Column]:
    """(valid, epoch ms) of an RFC 3339 UTC timestamp with fraction, as events.parse_ts_ms
    (``shape_known``: a regular expression already checked the digits and separators)."""
    shape = F.lit(True) if shape_known else ts.rlike(
        r"^\d{4}-\d{2}-\d{2}[Tt]\d{2}:\d{2}:\d{2}\.\d{1,9}(Z|z|\+00:00)$"
    )

    def num(pos: int, n: int) -> Column:
        return F.substring(ts, pos, n).cast("int")

    year, hour, minute, second = num(1, 4), num(12, 2), num(15, 2), num(18, 2)
    day = F.make_date(year, num(6, 2), num(9, 2))  # null for 2026-02-30 (ANSI mode is off)
    tz_len = F.when(ts.endswith("+00:00"), F.lit(6)).otherwise(F.lit(1))
    digits = F.length(ts) - F.lit(20) - tz_len
    frac_ms = F.rpad(F.substring(ts, F.lit(21), F.least(digits, F.lit(3))), 3, "0").cast("long")
    valid = F.coalesce(
        shape & day.isNotNull() & (year >= 1) & (hour <= 23) & (minute <= 59) & (second <= 59), F.lit(False)
    )
    ms = (
        F.unix_date(day).cast("long") * 86_400_000
        + ((hour * 60 + minute) * 60 + second).cast("long") * 1000
        + frac_ms
    )
    return valid, F.when(valid, ms)


def _checks() -> list[tuple[str, Column, Column]]:
    """check_event's fatal problems, in its order, as (code, condition, message) over the
    columns of the field stage (f_*, k_*, s_*, l_*)."""
    def wrong(name: str, want: str, cond: Column) -> tuple[str, Column, Column]:
        shown = F.substring(F.to_json(F.col(f"f_{name}")), 1, 40)
        return (f"{ev.WRONG_TYPE}:{name}", _has(name) & cond,
                F.concat(F.lit(f"field '{name}' must be {want}, got "), shown))

    out: list[tuple[str, Column, Column]] = [
        (f"{ev.MISSING_FIELD}:{n}", ~_has(n), F.lit(f"field '{n}' is missing")) for n in ev.REQUIRED_FIELDS
    ]
    out += [
        wrong("schema_version", "an integer", _k("schema_version") != "BIGINT"),
        (ev.UNSUPPORTED_SCHEMA_VERSION, F.col("l_schema_version") != ev.SCHEMA_VERSION,
         F.format_string("schema_version %d is not supported (only 1)", F.col("l_schema_version"))),
        wrong("ts", "an RFC 3339 UTC timestamp string", _k("ts") != "STRING"),
        (ev.BAD_TIMESTAMP, _has("ts") & ~F.col("ts_valid"),
         F.format_string("ts '%s' is not an RFC 3339 UTC timestamp with fraction",
                         F.substring(F.col("s_ts"), 1, 40))),
    ]
    for name in ("cluster", "recovery_id", "type"):
        out += [
            wrong(name, "a string", _k(name) != "STRING"),
            (f"{ev.INVALID_VALUE}:{name}", _blank(F.col(f"s_{name}")),
             F.lit(f"field '{name}' must not be empty")),
        ]
    for name, nullable in (("replica_id", False), ("leader_id", True), ("leader_epoch", True)):
        ok = (_k(name) == "BIGINT") | ((_k(name) == "VOID") if nullable else F.lit(False))
        out += [
            wrong(name, "an integer or null" if nullable else "an integer", ~ok),
            (f"{ev.INVALID_VALUE}:{name}", F.col(f"l_{name}") < 0,
             F.format_string(f"{name} %d is negative", F.col(f"l_{name}"))),
        ]
    for name in ("old_uuid", "new_uuid"):
        out.append(wrong(name, "a string or null", ~_k(name).isin("STRING", "VOID")))
    out += [
        wrong("detail", "an object", ~_k("detail").startswith("OBJECT")),
        (f"{ev.INVALID_VALUE}:detail.reason",
         F.col("s_type").isin(*ev.REASON_REQUIRED) & _k("detail").startswith("OBJECT")
         & ~F.coalesce((F.col("k_reason") == "STRING") & (F.length("s_reason") > 0), F.lit(False)),
         F.concat(F.col("s_type"), F.lit(" needs detail.reason (a string)"))),
    ]
    return out


def _json_kind(c: Column) -> Column:
    """The JSON kind of a variant, in the words of Python's json module (list, int, ...)."""
    s = F.schema_of_variant(c)
    return (
        F.when(s.startswith("ARRAY"), F.lit("list"))
        .when(s == "STRING", F.lit("str"))
        .when(s == "BIGINT", F.lit("int"))
        .when(s == "BOOLEAN", F.lit("bool"))
        .when(s == "VOID", F.lit("NoneType"))
        .otherwise(F.lit("float"))
    )


# The exact form the writer emits (EventLogWriter, compact JSON in the interface's field order)
# for a step that is plainly valid: simple strings (no escapes, the names not blank), integers
# >= 0 that fit in 64 bits, a known type other than recovery_failed (whose detail.reason must be
# checked), a millisecond UTC timestamp, and a flat detail object of plain values. Such a line
# is valid JSON whatever its values, except for a duplicate key inside detail (checked below).
# The fast path proves a line has that form without a JSON parser and without one regular
# expression over the whole line (measured ~3.3 us a line, a third of the parse): it cuts the
# fields at the quotes (no value of that form holds one), writes the line again from them as the
# writer would (integers in canonical decimal, null as null) and compares the two byte for byte;
# short regular expressions check only the values (timestamp shape, names, detail). A line cut
# wrongly, or with a value of another JSON type, cannot be written back identically, so it
# fails the comparison and takes the full checks of parse_general.
_STR = r'[^"\\\x00-\x1F]*'
_NAME = r'[^"\\\x00-\x1F' + _WS_CLASS[1:-1] + r'][^"\\\x00-\x1F]*'
_NUM = r"(0|[1-9][0-9]{0,18})"
_VALUE = rf'("{_STR}"|-?{_NUM}|true|false|null)'
_FAST_TYPES = tuple(t for t in ev.KNOWN_TYPES if t not in ev.REASON_REQUIRED)
# The values of a line, joined by quotes (ts, cluster, recovery_id, old_uuid, new_uuid, then
# detail with the line's closing brace); old/new_uuid empty when null (the comparison with the
# line tells null from "").
_VALUES = (
    r'^[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}\.[0-9]{3}Z'
    rf'"{_NAME}"{_NAME}"{_STR}"{_STR}"\{{("{_STR}":{_VALUE}(,"{_STR}":{_VALUE})*)?\}}\}}$'
)
_DETAIL_KEY = ',"detail":'


def _fast_fields(lines: DataFrame, keep: list[str]) -> DataFrame:
    """The fast path's columns (q_*, ``ok``) next to the line: set only for lines in the
    writer's exact form (see above).

    Split at its quotes, such a line has its fields at fixed places, shifted by two for each of
    old_uuid and new_uuid that is a string: ``{ schema_version :1, ts : T , cluster : C ,
    recovery_id : R , type : Y , replica_id :N, old_uuid :null, new_uuid ...`` (one split and
    array look-ups: measured several times cheaper than cutting each field out with
    substring_index). detail is what follows the last ``,"detail":``."""
    v = F.col("value")
    base = _base(lines)
    s1 = lines.select(*base, *keep, F.split(v, '"').alias("q_a"))
    a = F.col("q_a")

    def at(i: int | Column) -> Column:  # 0-based, as in the docstring
        return F.element_at(a, (F.lit(i) if isinstance(i, int) else i) + 1)

    def number(token: Column) -> Column:  # ":12," or ":null," -> 12 or null
        # The token less its first and last character: trim(token, ":,") went through Spark's
        # collation-aware trim (~5% of the job's CPU at 10 M events, profiled with JFR). A token
        # of another shape yields another number or null, and the line then fails the comparison.
        return F.substring(token, F.lit(2), F.length(token) - 2).cast("long")

    old_is_str = F.coalesce(at(22) == ":", F.lit(False))
    o = F.when(old_is_str, F.lit(2)).otherwise(F.lit(0))
    new_is_str = F.coalesce(at(o + 24) == ":", F.lit(False))
    on = o + F.when(new_is_str, F.lit(2)).otherwise(F.lit(0))
    s2 = s1.select(
        *base, *keep,
        at(5).alias("q_ts"), at(9).alias("q_cluster"), at(13).alias("q_recovery_id"), at(17).alias("q_type"),
        number(at(20)).alias("q_replica_id"),
        F.when(old_is_str, at(23)).alias("q_old_uuid"),
        F.when(new_is_str, at(o + 25)).alias("q_new_uuid"),
        number(at(on + 26)).alias("q_leader_id"),
        number(at(on + 28)).alias("q_leader_epoch"),
        F.substring_index(v, _DETAIL_KEY, -1).alias("q_rest"),
    )

    def quoted(c: str) -> Column:
        return F.concat(F.lit('"'), F.col(c), F.lit('"'))

    def num(c: str) -> Column:
        return F.coalesce(F.col(c).cast("string"), F.lit("null"))

    written = F.concat(
        F.lit('{"schema_version":1,"ts":'), quoted("q_ts"), F.lit(',"cluster":'), quoted("q_cluster"),
        F.lit(',"recovery_id":'), quoted("q_recovery_id"), F.lit(',"type":'), quoted("q_type"),
        F.lit(',"replica_id":'), num("q_replica_id"),
        F.lit(',"old_uuid":'), F.coalesce(quoted("q_old_uuid"), F.lit("null")),
        F.lit(',"new_uuid":'), F.coalesce(quoted("q_new_uuid"), F.lit("null")),
        F.lit(',"leader_id":'), num("q_leader_id"), F.lit(',"leader_epoch":'), num("q_leader_epoch"),
        F.lit(_DETAIL_KEY), F.col("q_rest"),
    )
    values = F.concat_ws('"', F.col("q_ts"), F.col("q_cluster"), F.col("q_recovery_id"),
                         *[F.coalesce(F.col(c), F.lit("")) for c in ("q_old_uuid", "q_new_uuid")],
                         F.col("q_rest"))
    ts = F.col("q_ts")
    # The expression fixed the timestamp's digits and separators; Spark's own cast rejects a
    # day or time that does not exist (2026-02-30, 24:00, second 60) as parse_ts_ms does, but
    # accepts year 0, which Python's datetime does not.
    ts_ms = F.unix_millis(ts.cast("timestamp"))
    detail = F.substring(F.col("q_rest"), 1, F.length("q_rest") - 1)
    non_negative = F.col("q_replica_id") >= 0
    for c in ("q_leader_id", "q_leader_epoch"):
        non_negative = non_negative & F.coalesce(F.col(c) >= 0, F.lit(True))
    ok = (
        (written == v) & F.col("q_type").isin(*_FAST_TYPES) & non_negative & values.rlike(_VALUES)
        & ts_ms.isNotNull() & ~ts.startswith("0000")
        # A flat object of plain values is valid JSON but for a duplicate key (both readers
        # refuse those): parse detail only when it has two keys or more.
        & (~F.col("q_rest").contains(",") | F.try_parse_json(detail).isNotNull())
    )
    s3 = s2.select("*", F.coalesce(ok, F.lit(False)).alias("ok"))
    ok_c = F.col("ok")

    def in_detail(key: str) -> Column:
        return F.when(ok_c & F.col("q_rest").contains(f'"{key}":'), F.get_json_object(detail, f"$.{key}"))

    return s3.select(
        "*", F.when(ok_c, ts_ms).alias("q_ts_ms"),
        in_detail("engine").alias("q_engine"), in_detail("order").alias("q_order"),
        F.when(ok_c & F.col("q_type").isin(*ev.UNCLEAN_TYPES), detail).alias("q_info"),
    )


_EVENT_FIELDS = ("cluster", "recovery_id", "type", "old_uuid", "new_uuid", "replica_id", "leader_id",
                 "leader_epoch", "engine", "order", "info")


def parse_lines(lines: DataFrame) -> DataFrame:
    """One row per input line (PARSED_COLUMNS): a clean event, or the reason it is not one.

    ``lines`` has ``value`` (the line) and may have ``source`` (the file it came from; without
    it, the file being read, see :func:`_base`); other columns are carried through. One
    projection over one scan of the input: lines in the writer's exact form take the fast path
    (:func:`_fast_fields`, one split and one comparison per line), and the full checks of
    :func:`parse_general` run, guarded, only on the lines it did not prove valid.
    (A union of the two paths read and matched every line twice: measured twice as slow.)"""
    keep = [c for c in lines.columns if c not in ("value", "source")]
    both = _fast_fields(lines, keep)
    q = ["ok", "q_ts_ms", *[f"q_{n}" for n in _EVENT_FIELDS]]
    g = parse_general(both.select(*_base(lines), *keep, *q), guard="ok")
    ok = F.col("ok")
    fast = {n: F.when(ok, F.col(f"q_{n}")).otherwise(F.col(n)).alias(n) for n in _EVENT_FIELDS}
    fast["ts_ms"] = F.when(ok, F.col("q_ts_ms")).otherwise(F.col("ts_ms")).alias("ts_ms")
    return g.select(*[fast.get(c, F.col(c)) for c in PARSED_COLUMNS], *keep)


def parse_general(lines: DataFrame, guard: str | None = None) -> DataFrame:
    """Every check of ``events.classify_line`` on any line (the slow path); with ``guard`` (a
    boolean column), only on the lines where it is false: elsewhere every output is null."""
    # 1. The parse: the line wrapped in [ ] so that exactly one JSON value is accepted.
    active = F.lit(True) if guard is None else ~F.col(guard)
    wrapped = F.when(active, F.try_parse_json(F.concat(F.lit("["), F.col("value"), F.lit("]"))))
    keep = [c for c in lines.columns if c not in ("value", "source")]
    base = _base(lines)
    s1 = lines.select(
        *base, *keep, F.when(active, _blank(F.col("value"))).alias("blank"), wrapped.alias("w")
    )
    malformed = (
        F.col("w").isNull()
        | F.try_variant_get("w", "$[0]", "variant").isNull()
        | F.try_variant_get("w", "$[1]", "variant").isNotNull()
    )
    s2 = s1.select(
        *base, *keep, "blank", "w",
        F.coalesce(~F.col("blank") & malformed, F.lit(False)).alias("malformed"),
        F.try_variant_get("w", "$[0]", "map<string,variant>").alias("m"),
    )
    # 2. The fields, once each.
    m = F.col("m")
    s3 = s2.select(
        *base, *keep, "blank", "w", "malformed", "m",
        *[m.getItem(n).alias(f"f_{n}") for n in ev.REQUIRED_FIELDS],
    )
    reason_v = F.try_variant_get("f_detail", "$.reason", "variant")
    s4 = s3.select(
        "*",
        *[F.schema_of_variant(f"f_{n}").alias(f"k_{n}") for n in ev.REQUIRED_FIELDS],
        *[F.try_variant_get(f"f_{n}", "$", "string").alias(f"s_{n}") for n in _STRING_FIELDS],
        *[F.try_variant_get(f"f_{n}", "$", "long").alias(f"l_{n}") for n in _INT_FIELDS],
        F.schema_of_variant(reason_v).alias("k_reason"),
        F.try_variant_get(reason_v, "$", "string").alias("s_reason"),
        F.try_variant_get("f_detail", "$.engine", "string").alias("engine"),
        F.try_variant_get("f_detail", "$.order", "string").alias("order"),
        # The whole detail of the rare events the report shows in full (unclean recoveries).
        F.when(F.try_variant_get("f_type", "$", "string").isin(*ev.UNCLEAN_TYPES),
               F.to_json(F.col("f_detail"))).alias("info"),
    )
    # Typed values only where the JSON type is right (try_variant_get would cast "3" to 3).
    s4 = s4.select(
        *[c for c in s4.columns if not c.startswith(("s_", "l_"))],
        *[F.when(_k(n) == "STRING", F.col(f"s_{n}")).alias(f"s_{n}") for n in _STRING_FIELDS],
        *[F.when(_k(n) == "BIGINT", F.col(f"l_{n}")).alias(f"l_{n}") for n in _INT_FIELDS],
        F.col("s_reason"),
    )
    ts_valid, ts_ms = _ts_parts(F.col("s_ts"))
    s5 = s4.select("*", ts_valid.alias("ts_valid"), ts_ms.alias("ts_ms_v"))
    # 3. The first fatal problem (check_event's order), then the tolerated notes.
    checks = _checks()
    code: Column = F.lit(None).cast("string")
    for c, cond, _ in reversed(checks):
        code = F.when(F.coalesce(cond, F.lit(False)), F.lit(c)).otherwise(code)
    code = (
        F.when(F.col("blank"), F.lit(ev.BLANK_LINE))
        .when(F.col("malformed"), F.lit(ev.MALFORMED_JSON))
        .when(m.isNull(), F.lit(ev.NOT_AN_OBJECT))
        .otherwise(code)
    )
    known = F.array(*[F.lit(n) for n in ev.REQUIRED_FIELDS])
    n_present = sum((F.col(f"f_{n}").isNotNull().cast("int") for n in ev.REQUIRED_FIELDS), F.lit(0))
    s_type = F.col("s_type")
    unknown = (F.col("k_type") == "STRING") & ~_blank(s_type) & ~s_type.isin(*ev.KNOWN_TYPES)
    s6 = s5.select(
        "*", F.when(active, code).alias("fatal"),
        F.coalesce(active & ~F.col("malformed") & unknown, F.lit(False)).alias("unknown"),
        F.coalesce(active & ~F.col("malformed") & (F.size(m) > n_present), F.lit(False)).alias("extra"),
    )
    return _finish(s6, checks, known, keep)


def _finish(
    df: DataFrame, checks: list[tuple[str, Column, Column]], known: Column, keep: list[str]
) -> DataFrame:
    """The output row: reason, notes, example and message (built only for lines with a
    problem), and the event's typed fields for clean lines."""
    fatal, unknown, extra = F.col("fatal"), F.col("unknown"), F.col("extra")
    reason = F.coalesce(fatal, F.when(unknown, F.lit(ev.UNKNOWN_TYPE)))
    unknown_msg = F.format_string("unknown event type '%s' (skipped)", F.substring("s_type", 1, 40))
    # sort_array, not array_sort: array_sort is a higher-order function, which Spark runs
    # outside the generated code (transform._outside_codegen), and this projection is on every line.
    extra_names = F.sort_array(F.array_except(F.map_keys("m"), known))
    extra_msg = F.concat(F.lit("extra field(s) ignored: "), F.array_join(F.slice(extra_names, 1, 5), ", "))
    fatal_msg: Column = F.lit(None).cast("string")
    for c, _, msg in reversed(checks):
        fatal_msg = F.when(fatal == c, msg).otherwise(fatal_msg)
    fatal_msg = (
        F.when(fatal == ev.BLANK_LINE, F.lit("blank line (skipped)"))
        .when(fatal == ev.MALFORMED_JSON,
              F.lit("not valid JSON (a syntax error, a duplicate key, NaN, a lone surrogate or "
                    "trailing data)"))
        .when(fatal == ev.NOT_AN_OBJECT,
              F.concat(F.lit("an event must be a JSON object, got "),
                       _json_kind(F.try_variant_get("w", "$[0]", "variant"))))
        .otherwise(fatal_msg)
    )
    message = F.when(
        reason.isNotNull() | extra,
        F.coalesce(fatal_msg, F.concat_ws("; ", F.when(unknown, unknown_msg), F.when(extra, extra_msg))),
    )
    # Plain CASE, no array_compact: a higher-order function is not compiled by Spark and would
    # make the whole projection run interpreted.
    fatal_unknown = fatal.isNotNull() & unknown
    notes = (
        F.when(fatal_unknown & extra, F.array(F.lit(ev.UNKNOWN_TYPE), F.lit(ev.EXTRA_FIELDS)))
        .when(fatal_unknown, F.array(F.lit(ev.UNKNOWN_TYPE)))
        .when(extra, F.array(F.lit(ev.EXTRA_FIELDS)))
        .otherwise(F.array().cast("array<string>"))
    )
    # input_file_name() is the file of the row being read, so it must be evaluated in the stage
    # that scans the files, as this projection is (before any shuffle; a test checks the name).
    path = F.col("source") if "source" in df.columns else F.input_file_name()
    short_source = F.substring_index(F.regexp_replace(path, "/+$", ""), "/", -2)
    shown = F.concat(short_source, F.lit(": "), F.substring("value", 1, EXAMPLE_CHARS))
    example = F.when(reason.isNotNull() | extra, shown)
    ok = reason.isNull()
    return df.select(
        reason.alias("reason"), notes.alias("notes"), example.alias("example"), message.alias("message"),
        F.when(ok, F.col("ts_ms_v")).alias("ts_ms"),
        *[F.when(ok, F.col(f"s_{n}")).alias(n)
          for n in ("cluster", "recovery_id", "type", "old_uuid", "new_uuid")],
        *[F.when(ok, F.col(f"l_{n}")).alias(n) for n in ("replica_id", "leader_id", "leader_epoch")],
        F.when(ok & (F.col("s_type") == ev.RECOVERY_FAILED), F.col("s_reason")).alias("failure_reason"),
        F.when(ok, F.col("engine")).alias("engine"),
        F.when(ok, F.col("order")).alias("order"),
        F.when(ok, F.col("info")).alias("info"),
        *keep,
    )
