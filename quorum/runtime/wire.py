"""Wire encoding of the core's RPC dataclasses (``quorum.core.messages``).

A body is ``uint32 LE header length | JSON header | raw bytes``. The JSON header holds every
field except the one ``bytes`` field a message may have (Fetch ``records``, FetchSnapshot
``unaligned_records``), which follows the header unchanged: catch-up copies log bytes from
the leader's segment to the follower's without decoding or base64.

Decoding is strict (no request may crash or wedge a node): every field has an explicit rule
in :data:`FIELD_RULES` (KIP-595 types: ids and epochs int32, offsets and timestamps int64,
non-negative where the field requires; waits and sizes bounded; UUIDs canonical; strings
bounded; booleans real booleans), the JSON is parsed by
:func:`~quorum.strictjson.loads_strict` (nesting limit, no duplicate keys, no NaN),
and unknown or missing fields are refused. Anything wrong is ``KraftError(INVALID_REQUEST)``
naming the message and the field, which the server answers with 400 before the core sees it.

These rules are the reference. On the hot path a compiled codec (:mod:`quorum.runtime.wirefast`)
decodes the headers it can prove valid under them and writes byte-identical headers; whatever it
cannot take (and every refusal) goes through the rules here, so the accepted headers, the bytes
on the wire and every error message are those of the reference.
"""

from __future__ import annotations

import dataclasses
import json
import struct
from collections.abc import Callable
from typing import Any, TypeVar

from quorum.core import messages as m
from quorum.runtime import wirefast
from quorum.runtime.wirebounds import (
    DIVERGING_OFFSET,
    ENDPOINT,
    EPOCH,
    FETCH_BYTES,
    HIGH_WATERMARK,
    ID,
    ID_OR_NONE,
    MAX_CLUSTER_ID,
    MAX_ENDPOINT,
    MAX_ERROR_CODE,
    MAX_SUCCESSORS,
    OFFSET,
    WAIT_MS,
    valid_port,
)
from quorum.runtime.wirebounds import (
    MAX_BYTES as MAX_BYTES,  # re-exported: the transports size their buffers by it
)
from quorum.runtime.wirebounds import (
    MAX_HEADER as MAX_HEADER,  # re-exported: the transports bound a frame by it
)
from quorum.strictjson import get_bool, get_int, get_str, get_uuid, loads_strict
from quorum.types import CLUSTER_ID_RE, ErrorCode, KraftError, OffsetAndEpoch, ReplicaKey

_LEN = struct.Struct("<I")
T = TypeVar("T")

Rule = Callable[[dict[str, Any], str, str], Any]


def _int(bounds: tuple[int, int]) -> Rule:
    def rule(obj: dict[str, Any], name: str, what: str) -> Any:
        return get_int(obj, name, what, bounds)

    return rule


def _uuid(obj: dict[str, Any], name: str, what: str) -> Any:
    return get_uuid(obj, name, what)


def _bool(obj: dict[str, Any], name: str, what: str) -> Any:
    return get_bool(obj, name, what)


def _endpoint(obj: dict[str, Any], name: str, what: str) -> Any:
    v = get_str(obj, name, what, max_len=MAX_ENDPOINT, optional=True, pattern=ENDPOINT)
    if v is not None and not valid_port(v):
        raise KraftError(ErrorCode.INVALID_REQUEST, f"{what}: field {name}={v!r} has an invalid port")
    return v


def _cluster(obj: dict[str, Any], name: str, what: str) -> Any:
    return get_str(obj, name, what, max_len=MAX_CLUSTER_ID, pattern=CLUSTER_ID_RE)


def _error_code(obj: dict[str, Any], name: str, what: str) -> Any:
    v = get_str(obj, name, what, max_len=MAX_ERROR_CODE)
    try:
        return ErrorCode(v)
    except ValueError:
        raise KraftError(
            ErrorCode.INVALID_REQUEST, f"{what}: field {name}={v!r} is not an error code"
        ) from None


def _offset_epoch(offset: tuple[int, int]) -> Rule:
    def rule(obj: dict[str, Any], name: str, what: str) -> Any:
        v = obj.get(name)
        if v is None:
            return None
        if not isinstance(v, dict) or set(v) != {"offset", "epoch"}:
            raise KraftError(
                ErrorCode.INVALID_REQUEST, f"{what}: field {name} must be an object with offset and epoch"
            )
        where = f"{what}: {name}"
        return OffsetAndEpoch(get_int(v, "offset", where, offset), get_int(v, "epoch", where, EPOCH))

    return rule


def _successors(obj: dict[str, Any], name: str, what: str) -> Any:
    v = obj.get(name)
    if not isinstance(v, list) or len(v) > MAX_SUCCESSORS:
        raise KraftError(
            ErrorCode.INVALID_REQUEST,
            f"{what}: field {name} must be a list of at most {MAX_SUCCESSORS} replicas",
        )
    out = []
    for i, item in enumerate(v):
        where = f"{what}: {name}[{i}]"
        if not isinstance(item, dict) or not set(item) <= {"id", "uuid"}:
            raise KraftError(ErrorCode.INVALID_REQUEST, f"{where} must be an object with id and uuid")
        out.append(ReplicaKey(get_int(item, "id", where, ID), get_uuid(item, "uuid", where)))
    return tuple(out)


# One rule per field name across all RPC messages (KIP-595 / KIP-630 / KIP-856 field types).
FIELD_RULES: dict[str, Rule] = {
    "correlation_id": _int(OFFSET),
    "cluster_id": _cluster,
    "candidate_id": _int(ID),
    "candidate_uuid": _uuid,
    "candidate_epoch": _int(EPOCH),
    "candidate_endpoint": _endpoint,
    "voter_id": _int(ID_OR_NONE),
    "voter_uuid": _uuid,
    "last_offset_epoch": _int(EPOCH),
    "last_offset": _int(OFFSET),
    "pre_vote": _bool,
    "vote_granted": _bool,
    "leader_id": _int(ID_OR_NONE),
    "leader_epoch": _int(EPOCH),
    "leader_uuid": _uuid,
    "leader_endpoint": _endpoint,
    "preferred_successors": _successors,
    "replica_id": _int(ID),
    "replica_uuid": _uuid,
    "replica_endpoint": _endpoint,
    "current_leader_epoch": _int(EPOCH),
    "fetch_offset": _int(OFFSET),
    "last_fetched_epoch": _int(EPOCH),
    "max_wait_ms": _int(WAIT_MS),
    "max_bytes": _int(FETCH_BYTES),
    "snapshot_id": _offset_epoch(OFFSET),
    "diverging_epoch": _offset_epoch(DIVERGING_OFFSET),
    "position": _int(OFFSET),
    "size": _int(OFFSET),
    "error_code": _error_code,
    "high_watermark": _int(HIGH_WATERMARK),
    "log_start_offset": _int(OFFSET),
}


@dataclasses.dataclass(frozen=True)
class _Spec:
    bytes_field: str | None
    required: frozenset[str]
    fields: tuple[str, ...]
    # The bytes field takes a memoryview: decode hands it a view into the body, no copy.
    view: bool = False


_BYTES_TYPES = ("bytes", bytes, "bytes | memoryview")


_SPECS: dict[type, _Spec] = {}


def _spec(cls: type) -> _Spec:
    s = _SPECS.get(cls)
    if s is None:
        fs = dataclasses.fields(cls)
        bf = next((f.name for f in fs if f.type in _BYTES_TYPES), None)
        missing = [f.name for f in fs if f.name != bf and f.name not in FIELD_RULES]
        if missing:  # pragma: no cover - a new message field needs a rule first
            raise TypeError(f"{cls.__name__}: no wire rule for {missing}")
        required = frozenset(
            f.name
            for f in fs
            if f.name != bf and f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
        )
        view = any(f.name == bf and f.type == "bytes | memoryview" for f in fs)
        s = _SPECS[cls] = _Spec(bf, required, tuple(f.name for f in fs if f.name != bf), view)
    return s


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


# Below this many raw bytes a body is sent joined (one small write costs less than two).
FRAME_MIN_RAW = 64 * 1024


@dataclasses.dataclass(frozen=True)
class Frame:
    """An encoded body in its two parts, sent as two writes: ``head`` (length
    prefix and JSON header) and ``raw`` (the segment or snapshot bytes as read), so that a
    32 MiB Fetch response is not copied into one joined body on the leader's event loop."""

    head: bytes
    raw: bytes | memoryview

    def __len__(self) -> int:
        return len(self.head) + memoryview(self.raw).nbytes

    def __bytes__(self) -> bytes:
        return b"".join((self.head, self.raw))


def encode_header_reference(msg: Any) -> bytes:
    """The JSON header of ``msg`` by the standard library: the reference for the wire's bytes
    (:func:`~quorum.runtime.wirefast.encode_header` must give the same, or defer to this)."""
    header = {name: _plain(getattr(msg, name)) for name in _spec(type(msg)).fields}
    return json.dumps(header, separators=(",", ":")).encode()


def encode_frame(msg: Any) -> Frame:
    """Serialize one message dataclass into its two parts (see :class:`Frame`)."""
    spec = _spec(type(msg))
    hb = wirefast.encode_header(msg, spec.fields)
    if hb is None:
        hb = encode_header_reference(msg)
    raw = getattr(msg, spec.bytes_field) if spec.bytes_field else b""
    return Frame(_LEN.pack(len(hb)) + hb, raw)


def encode(msg: Any) -> bytes:
    """Serialize one message dataclass."""
    return bytes(encode_frame(msg))


def encode_body(msg: Any) -> bytes | Frame:
    """A response body as the server sends it: a :class:`Frame` when it carries at least
    :data:`FRAME_MIN_RAW` raw bytes, else joined."""
    frame = encode_frame(msg)
    return frame if memoryview(frame.raw).nbytes >= FRAME_MIN_RAW else bytes(frame)


def _header_length(name: str, body: bytes | bytearray) -> int:
    if len(body) < 4:
        raise KraftError(ErrorCode.INVALID_REQUEST, f"{name}: body of {len(body)} bytes is too short")
    (hl,) = _LEN.unpack_from(body, 0)
    if hl > MAX_HEADER or 4 + hl > len(body):
        raise KraftError(ErrorCode.INVALID_REQUEST, f"{name}: header length {hl} does not fit the body")
    return int(hl)


def split_frame(name: str, body: bytes) -> tuple[bytes, bytes]:
    """The framing alone: (JSON header bytes, trailing raw bytes); INVALID_REQUEST if the
    length prefix is missing, larger than :data:`MAX_HEADER` or runs past the body."""
    hl = _header_length(name, body)
    return body[4 : 4 + hl], body[4 + hl :]


def decode(cls: type[T], body: bytes | bytearray) -> T:
    """Parse a body into ``cls``; raises ``KraftError(INVALID_REQUEST)`` naming the problem.

    The compiled decoder (:mod:`~quorum.runtime.wirefast`) takes the headers it can prove valid;
    any other header goes through the reference rules below, which accept it or name what is
    wrong. Both accept the same headers (tests/fuzz check it), so the compiled one only saves
    time."""
    return _decode(cls, body, fast=True)


def decode_reference(cls: type[T], body: bytes | bytearray) -> T:
    """:func:`decode` by the reference rules alone (the property tests and the bench compare)."""
    return _decode(cls, body, fast=False)


def _decode(cls: type[T], body: bytes | bytearray, fast: bool) -> T:
    name = cls.__name__
    spec = _spec(cls)
    hl = _header_length(name, body)
    hb = bytes(body[4 : 4 + hl])  # body may be a bytearray (the transport's one-copy read)
    # Catch-up bodies are megabytes: a view into the body where the message accepts one.
    tail = memoryview(body)[4 + hl :]
    rest: bytes | memoryview = tail if spec.view else bytes(tail)
    if fast and (spec.bytes_field is not None or not rest):
        kwargs = wirefast.decode_header(cls, hb)
        if kwargs is not None:
            if spec.bytes_field is not None:
                kwargs[spec.bytes_field] = rest
            return wirefast.build(cls, kwargs)
    header = loads_strict(hb, f"{name} header")
    if not isinstance(header, dict):
        raise KraftError(ErrorCode.INVALID_REQUEST, f"{name}: header is not a JSON object")
    if spec.bytes_field is not None and spec.bytes_field in header:
        raise KraftError(
            ErrorCode.INVALID_REQUEST, f"{name}: field {spec.bytes_field} belongs after the header"
        )
    unknown = sorted(set(header) - set(spec.fields))
    if unknown:
        raise KraftError(ErrorCode.INVALID_REQUEST, f"{name}: unknown field(s) {', '.join(unknown)[:200]}")
    missing = sorted(spec.required - set(header))
    if missing:
        raise KraftError(ErrorCode.INVALID_REQUEST, f"{name}: missing field(s) {', '.join(missing)}")
    if spec.bytes_field is None and rest:
        raise KraftError(ErrorCode.INVALID_REQUEST, f"{name}: {len(rest)} unexpected bytes after the header")
    kwargs = {f: FIELD_RULES[f](header, f, name) for f in spec.fields if f in header}
    if spec.bytes_field is not None:
        kwargs[spec.bytes_field] = rest
    if cls is m.FetchSnapshotRequest and kwargs.get("snapshot_id") is None:
        raise KraftError(ErrorCode.INVALID_REQUEST, f"{name}: field snapshot_id is missing")
    obj: T = cls(**kwargs)
    return obj


REQUEST_BY_PATH: dict[str, type] = {path: cls for cls, path in m.RPC_PATHS.items()}
