"""Strict JSON decoding shared by every decoder of untrusted bytes.

Used by the RPC codec (:mod:`quorum.runtime.wire`), the persisted files (``quorum-state``), the
client config and, through :func:`loads_strict` and the field checkers, any HTTP handler that
reads a JSON body. The rules, each closing a way untrusted input could hurt a node:

* a bounded nesting depth, checked *before* the parser runs, so deeply nested input is a clear
  refusal instead of a ``RecursionError`` (a 500 on the server);
* no ``NaN`` / ``Infinity`` literals, no duplicate object keys (the last-one-wins rule of
  ``json.loads`` lets two readers see different values);
* integers are JSON integers: ``"5"``, ``5.0`` and ``true`` are refused, and each field has a
  range (int32 for ids and epochs, int64 for offsets and timestamps, as KIP-595's schemas);
* strings have a maximum length; UUIDs must already be canonical (8-4-4-4-12 lower-case hex).

Every refusal is ``KraftError(code, "<what>: field <name>: <problem>")``; the code is
``INVALID_REQUEST`` unless the caller asks for another (``CORRUPT_LOG`` for files).
"""

from __future__ import annotations

import json
import re
from typing import Any

from quorum.types import ErrorCode, KraftError

__all__ = [
    "INT32",
    "INT64",
    "MAX_DEPTH",
    "UUID_PATTERN",
    "check_depth",
    "get_bool",
    "get_int",
    "get_str",
    "get_uuid",
    "loads_strict",
]

INT32 = (-(2**31), 2**31 - 1)
INT64 = (-(2**63), 2**63 - 1)
MAX_DEPTH = 8  # our deepest message is 3 levels; 8 leaves room without allowing abuse
UUID_PATTERN = r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$"
_UUID = re.compile(UUID_PATTERN)


def _fail(code: ErrorCode, what: str, msg: str) -> KraftError:
    return KraftError(code, f"{what}: {msg}")


def check_depth(raw: bytes, max_depth: int, what: str, code: ErrorCode = ErrorCode.INVALID_REQUEST) -> None:
    """Refuse JSON text nested deeper than ``max_depth`` (arrays and objects), without parsing.

    Fast path: text with no more brackets than the limit cannot be deeper than it."""
    if raw.count(b"[") + raw.count(b"{") <= max_depth:
        return
    depth = 0
    in_str = False
    esc = False
    for b in raw:
        if in_str:
            if esc:
                esc = False
            elif b == 0x5C:  # backslash
                esc = True
            elif b == 0x22:  # quote
                in_str = False
        elif b == 0x22:
            in_str = True
        elif b in (0x5B, 0x7B):  # [ {
            depth += 1
            if depth > max_depth:
                raise _fail(code, what, f"JSON nested deeper than {max_depth} levels")
        elif b in (0x5D, 0x7D):
            depth -= 1


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not allowed")


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in pairs:
        if k in out:
            raise ValueError(f"duplicate key {k!r}")
        out[k] = v
    return out


def loads_strict(
    raw: bytes | bytearray | memoryview,
    what: str,
    *,
    max_depth: int = MAX_DEPTH,
    code: ErrorCode = ErrorCode.INVALID_REQUEST,
) -> Any:
    """Parse UTF-8 JSON text under the rules above; raises ``KraftError(code)`` naming ``what``."""
    data = bytes(raw)
    check_depth(data, max_depth, what, code)
    try:
        text = data.decode("utf-8")
        return json.loads(text, parse_constant=_reject_constant, object_pairs_hook=_no_duplicates)
    except UnicodeDecodeError as e:
        raise _fail(code, what, f"not valid JSON: not UTF-8 ({e.reason} at byte {e.start})") from None
    except (ValueError, RecursionError) as e:
        raise _fail(code, what, f"not valid JSON ({e})") from None


def get_int(
    obj: dict[str, Any],
    name: str,
    what: str,
    bounds: tuple[int, int] = INT64,
    *,
    default: int | None = None,
    code: ErrorCode = ErrorCode.INVALID_REQUEST,
) -> int:
    """``obj[name]`` as an integer within ``bounds`` (inclusive); ``default`` if absent and given."""
    if name not in obj and default is not None:
        return default
    v = _required(obj, name, what, code)
    if isinstance(v, bool) or not isinstance(v, int):
        raise _fail(code, what, f"field {name} must be an integer, got {_show(v)}")
    if not bounds[0] <= v <= bounds[1]:
        raise _fail(code, what, f"field {name}={_show(v)} is out of range {bounds[0]}..{bounds[1]}")
    return v


def get_bool(
    obj: dict[str, Any],
    name: str,
    what: str,
    *,
    default: bool | None = None,
    code: ErrorCode = ErrorCode.INVALID_REQUEST,
) -> bool:
    if name not in obj and default is not None:
        return default
    v = _required(obj, name, what, code)
    if not isinstance(v, bool):
        raise _fail(code, what, f"field {name} must be true or false, got {_show(v)}")
    return v


def get_str(
    obj: dict[str, Any],
    name: str,
    what: str,
    *,
    max_len: int = 256,
    optional: bool = False,
    pattern: re.Pattern[str] | None = None,
    code: ErrorCode = ErrorCode.INVALID_REQUEST,
) -> str | None:
    """``obj[name]`` as a string of at most ``max_len`` characters (``None`` allowed, and the
    default when absent, if ``optional``)."""
    v = obj.get(name)
    if v is None:
        if optional:
            return None
        raise _fail(code, what, f"field {name} is missing")
    if not isinstance(v, str):
        raise _fail(code, what, f"field {name} must be a string, got {_show(v)}")
    if len(v) > max_len:
        raise _fail(code, what, f"field {name} is longer than {max_len} characters")
    if pattern is not None and not pattern.match(v):
        raise _fail(code, what, f"field {name}={_show(v)} has an invalid format")
    return v


def get_uuid(
    obj: dict[str, Any],
    name: str,
    what: str,
    *,
    optional: bool = True,
    code: ErrorCode = ErrorCode.INVALID_REQUEST,
) -> str | None:
    """A canonical storage UUID (KIP-856), or ``None`` where ``optional``."""
    v = get_str(obj, name, what, max_len=36, optional=optional, code=code)
    if v is not None and not _UUID.match(v):
        raise _fail(code, what, f"field {name}={_show(v)} is not a canonical UUID")
    return v


def _required(obj: dict[str, Any], name: str, what: str, code: ErrorCode) -> Any:
    if name not in obj:
        raise _fail(code, what, f"field {name} is missing")
    return obj[name]


def _show(v: Any) -> str:
    """A short, safe rendering of a bad value for an error message."""
    s = repr(v) if not isinstance(v, int) or isinstance(v, bool) or abs(v) < 10**30 else "<huge integer>"
    return s if len(s) <= 60 else s[:57] + "..."
