"""Wire encoding of the core's RPC dataclasses (``quorum.core.messages``).

A body is ``uint32 LE header length | JSON header | raw bytes``. The JSON header holds every
field except the one ``bytes`` field a message may have (Fetch ``records``, FetchSnapshot
``unaligned_records``), which follows the header unchanged: catch-up copies log bytes from
the leader's segment to the follower's without decoding or base64.

Decoding validates types with pydantic and rejects unknown fields, so a malformed or
mismatched body becomes a clear ``INVALID_REQUEST`` naming the field instead of an exception
deep inside the core.
"""

from __future__ import annotations

import dataclasses
import json
import struct
from typing import Any, TypeVar

from pydantic import TypeAdapter, ValidationError

from quorum.core import messages as m
from quorum.types import ErrorCode, KraftError, OffsetAndEpoch, ReplicaKey

_LEN = struct.Struct("<I")
MAX_HEADER = 64 * 1024
T = TypeVar("T")


_BYTES_FIELD: dict[type, str | None] = {}
_ADAPTERS: dict[type, TypeAdapter[Any]] = {}
_FIELDS: dict[type, frozenset[str]] = {}


def _bytes_field(cls: type) -> str | None:
    if cls not in _BYTES_FIELD:
        _BYTES_FIELD[cls] = next(
            (f.name for f in dataclasses.fields(cls) if f.type in ("bytes", bytes)), None
        )
    return _BYTES_FIELD[cls]


def _adapter(cls: type) -> TypeAdapter[Any]:
    if cls not in _ADAPTERS:
        _ADAPTERS[cls] = TypeAdapter(cls)
    return _ADAPTERS[cls]


def _field_names(cls: type) -> frozenset[str]:
    if cls not in _FIELDS:
        _FIELDS[cls] = frozenset(f.name for f in dataclasses.fields(cls))
    return _FIELDS[cls]


def _plain(v: Any) -> Any:
    if isinstance(v, ErrorCode):
        return v.value
    if isinstance(v, OffsetAndEpoch):
        return {"offset": v.offset, "epoch": v.epoch}
    if isinstance(v, ReplicaKey):
        return {"id": v.id, "uuid": v.uuid}
    if isinstance(v, tuple | list):
        return [_plain(x) for x in v]
    return v


def encode(msg: Any) -> bytes:
    """Serialize one message dataclass."""
    cls = type(msg)
    bf = _bytes_field(cls)
    header = {f.name: _plain(getattr(msg, f.name)) for f in dataclasses.fields(cls) if f.name != bf}
    hb = json.dumps(header, separators=(",", ":")).encode()
    raw = getattr(msg, bf) if bf else b""
    return b"".join((_LEN.pack(len(hb)), hb, raw))


def decode(cls: type[T], body: bytes) -> T:
    """Parse a body into ``cls``; raises ``KraftError(INVALID_REQUEST)`` naming the problem."""
    name = cls.__name__
    if len(body) < 4:
        raise KraftError(ErrorCode.INVALID_REQUEST, f"{name}: body of {len(body)} bytes is too short")
    (hl,) = _LEN.unpack_from(body, 0)
    if hl > MAX_HEADER or 4 + hl > len(body):
        raise KraftError(ErrorCode.INVALID_REQUEST, f"{name}: header length {hl} does not fit the body")
    try:
        header = json.loads(body[4 : 4 + hl])
    except ValueError as e:
        raise KraftError(ErrorCode.INVALID_REQUEST, f"{name}: header is not JSON ({e})") from None
    if not isinstance(header, dict):
        raise KraftError(ErrorCode.INVALID_REQUEST, f"{name}: header is not a JSON object")
    unknown = sorted(set(header) - _field_names(cls))
    if unknown:
        raise KraftError(ErrorCode.INVALID_REQUEST, f"{name}: unknown field(s) {', '.join(unknown)}")
    bf = _bytes_field(cls)
    if bf is not None:
        if bf in header:
            raise KraftError(ErrorCode.INVALID_REQUEST, f"{name}: field {bf} belongs after the header")
        header[bf] = body[4 + hl :]
    elif len(body) != 4 + hl:
        raise KraftError(
            ErrorCode.INVALID_REQUEST, f"{name}: {len(body) - 4 - hl} unexpected bytes after the header"
        )
    try:
        obj: T = _adapter(cls).validate_python(header)
    except ValidationError as e:
        first = e.errors()[0]
        loc = ".".join(str(x) for x in first.get("loc", ()))
        raise KraftError(
            ErrorCode.INVALID_REQUEST, f"{name}: field {loc or '?'}: {first.get('msg')}"
        ) from None
    return obj


REQUEST_BY_PATH: dict[str, type] = {path: cls for cls, path in m.RPC_PATHS.items()}
