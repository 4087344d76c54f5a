"""The compiled fast path of the RPC header codec (msgspec), as strict as the reference rules
of :mod:`quorum.runtime.wire`, which stay the definition of a valid header.

Decoding: :func:`decode_header` returns a message's fields only for a header it can prove the
reference would accept with the same values, else ``None``, and the caller then runs the
reference decoder, which accepts the header or refuses it naming the field. So this path can
only save time: it never refuses, and it never accepts what the reference refuses. msgspec
checks each field's type and bounds (one schema per message, built below from the same bounds
as the reference's rules, unknown fields refused, nothing coerced: ``"5"``, ``5.0`` and ``true``
are not integers); what msgspec does not check is checked here:

* duplicate keys, which msgspec resolves by keeping the last. The header is taken only when it
  is ASCII without a backslash: then every ``"`` in it opens or closes a string and each string
  is a key or a string value, so the text has ``2 * (keys + string values)`` quotes, one pair
  per key *occurrence*. The decoded struct gives the distinct keys and the string values kept;
  a duplicate key adds a pair the struct does not have, so equal counts prove there is none;
* the nesting depth needs no check: the schema has no open-ended value, so nothing deeper than
  its own three levels decodes;
* NaN / Infinity are no JSON integers and no field takes a float; a header that is not UTF-8 is
  not ASCII; escapes (and with them lone surrogates) go to the reference;
* an endpoint's port range, and FetchSnapshotRequest's snapshot id (never null).

Encoding: :func:`encode_header` writes what ``json.dumps(..., separators=(",", ":"))`` of the
reference writes for headers whose text is printable ASCII without a backslash (every header our
nodes send in practice); for any other (``json.dumps`` escapes non-ASCII and DEL, msgspec does
not) it
returns ``None`` and the caller uses the reference encoder: the bytes on the wire do not change,
so nodes of either codec understand each other.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Annotated, Any, TypeVar

import msgspec
import msgspec.structs
from msgspec import UNSET, Meta, UnsetType

from quorum.core import messages as m
from quorum.runtime import wirebounds as wb
from quorum.strictjson import UUID_PATTERN
from quorum.types import CLUSTER_ID_RE, ErrorCode, OffsetAndEpoch, ReplicaKey


def _int(bounds: tuple[int, int]) -> Any:
    return Annotated[int, Meta(ge=bounds[0], le=bounds[1])]


_Id = Annotated[int, Meta(ge=wb.ID[0], le=wb.ID[1])]
_Epoch = Annotated[int, Meta(ge=wb.EPOCH[0], le=wb.EPOCH[1])]

# msgspec applies a pattern with ``re.search``: the reference's are anchored, so it is the same test.
_Uuid = Annotated[str, Meta(max_length=36, pattern=UUID_PATTERN)]
_Endpoint = Annotated[str, Meta(max_length=wb.MAX_ENDPOINT, pattern=wb.ENDPOINT.pattern)]
_Cluster = Annotated[str, Meta(max_length=wb.MAX_CLUSTER_ID, pattern=CLUSTER_ID_RE.pattern)]


class _SnapshotId(msgspec.Struct, forbid_unknown_fields=True):
    offset: Annotated[int, Meta(ge=wb.OFFSET[0], le=wb.OFFSET[1])]
    epoch: _Epoch


class _DivergingEpoch(msgspec.Struct, forbid_unknown_fields=True):
    offset: Annotated[int, Meta(ge=wb.DIVERGING_OFFSET[0], le=wb.DIVERGING_OFFSET[1])]
    epoch: _Epoch


class _Successor(msgspec.Struct, forbid_unknown_fields=True):
    id: _Id
    uuid: _Uuid | UnsetType | None = UNSET


# The field kinds the checks below tell apart.
_PLAIN, _STRING, _ENDPOINT_KIND, _OFFSET_EPOCH, _SUCCESSORS = range(5)
T = TypeVar("T")

# One type per field name, as :data:`quorum.runtime.wire.FIELD_RULES` has one rule per name.
FIELD_TYPES: dict[str, tuple[Any, int]] = {
    "correlation_id": (_int(wb.OFFSET), _PLAIN),
    "cluster_id": (_Cluster, _STRING),
    "candidate_id": (_Id, _PLAIN),
    "candidate_uuid": (_Uuid | None, _STRING),
    "candidate_epoch": (_Epoch, _PLAIN),
    "candidate_endpoint": (_Endpoint | None, _ENDPOINT_KIND),
    "voter_id": (_int(wb.ID_OR_NONE), _PLAIN),
    "voter_uuid": (_Uuid | None, _STRING),
    "last_offset_epoch": (_Epoch, _PLAIN),
    "last_offset": (_int(wb.OFFSET), _PLAIN),
    "pre_vote": (bool, _PLAIN),
    "vote_granted": (bool, _PLAIN),
    "leader_id": (_int(wb.ID_OR_NONE), _PLAIN),
    "leader_epoch": (_Epoch, _PLAIN),
    "leader_uuid": (_Uuid | None, _STRING),
    "leader_endpoint": (_Endpoint | None, _ENDPOINT_KIND),
    "preferred_successors": (Annotated[list[_Successor], Meta(max_length=wb.MAX_SUCCESSORS)], _SUCCESSORS),
    "replica_id": (_Id, _PLAIN),
    "replica_uuid": (_Uuid | None, _STRING),
    "replica_endpoint": (_Endpoint | None, _ENDPOINT_KIND),
    "current_leader_epoch": (_Epoch, _PLAIN),
    "fetch_offset": (_int(wb.OFFSET), _PLAIN),
    "last_fetched_epoch": (_Epoch, _PLAIN),
    "max_wait_ms": (_int(wb.WAIT_MS), _PLAIN),
    "max_bytes": (_int(wb.FETCH_BYTES), _PLAIN),
    "snapshot_id": (_SnapshotId | None, _OFFSET_EPOCH),
    "diverging_epoch": (_DivergingEpoch | None, _OFFSET_EPOCH),
    "position": (_int(wb.OFFSET), _PLAIN),
    "size": (_int(wb.OFFSET), _PLAIN),
    "error_code": (ErrorCode, _STRING),  # every member's value is shorter than the reference's 64
    "high_watermark": (_int(wb.HIGH_WATERMARK), _PLAIN),
    "log_start_offset": (_int(wb.OFFSET), _PLAIN),
}


@dataclasses.dataclass(frozen=True)
class _Schema:
    decoder: msgspec.json.Decoder[Any]
    optional: tuple[str, ...]  # absent from the text: UNSET, left to the dataclass's default
    strings: tuple[str, ...]  # fields whose value is a JSON string when not null
    endpoints: tuple[str, ...]
    nested: tuple[str, ...]  # objects (snapshot ids) and lists of objects (successors)
    # Built without __init__ where the dataclass has no __post_init__ (a frozen dataclass's
    # __init__ sets each field through object.__setattr__): the defaults, then the decoded fields.
    defaults: dict[str, Any] | None


_SCHEMAS: dict[type, _Schema] = {}


def _schema(cls: type) -> _Schema:
    s = _SCHEMAS.get(cls)
    if s is None:
        fields: list[tuple[str, Any] | tuple[str, Any, Any]] = []
        kinds: dict[int, list[str]] = {k: [] for k in range(5)}
        optional = []
        defaults: dict[str, Any] = {}
        for f in dataclasses.fields(cls):
            if f.name not in FIELD_TYPES:  # the raw bytes field, after the header
                typ, kind = None, None
            else:
                typ, kind = FIELD_TYPES[f.name]
                kinds[kind].append(f.name)
            if f.default is not dataclasses.MISSING:
                defaults[f.name] = f.default
            elif f.default_factory is not dataclasses.MISSING:
                defaults[f.name] = dataclasses.MISSING  # a fresh value each time: __init__ only
            if kind is None:
                continue
            if f.name not in defaults:
                fields.append((f.name, typ))
            else:  # absent stays absent: the dataclass's default applies, as in the reference
                optional.append(f.name)
                fields.append((f.name, typ | UnsetType, UNSET))
        struct = msgspec.defstruct(cls.__name__, fields, kw_only=True, forbid_unknown_fields=True)
        s = _SCHEMAS[cls] = _Schema(
            msgspec.json.Decoder(struct),
            tuple(optional),
            tuple(kinds[_STRING] + kinds[_ENDPOINT_KIND]),
            tuple(kinds[_ENDPOINT_KIND]),
            tuple(kinds[_OFFSET_EPOCH] + kinds[_SUCCESSORS]),
            None if _needs_init(cls, defaults) else defaults,
        )
    return s


def _needs_init(cls: type, defaults: dict[str, Any]) -> bool:
    """Whether instances of ``cls`` must be made by its ``__init__``: it checks or derives
    (``__post_init__``), has no ``__dict__`` (slots), or a default comes from a factory."""
    return (
        hasattr(cls, "__post_init__")
        or "__slots__" in cls.__dict__
        or any(v is dataclasses.MISSING for v in defaults.values())
    )


def _plain_nested(v: Any) -> tuple[Any, int]:
    """A nested value as the message holds it, and its keys and string values (see above)."""
    if isinstance(v, _SnapshotId | _DivergingEpoch):
        return OffsetAndEpoch(v.offset, v.epoch), 2
    out = []
    strings = 0
    for r in v:
        strings += 1
        if r.uuid is UNSET:
            out.append(ReplicaKey(r.id))
        else:
            strings += 1 + (r.uuid is not None)
            out.append(ReplicaKey(r.id, r.uuid))
    return tuple(out), strings


def decode_header(cls: type, hb: bytes) -> dict[str, Any] | None:
    """The fields of ``cls`` from its JSON header, or ``None`` where the reference must decide."""
    if not hb.isascii() or b"\\" in hb:
        return None
    schema = _SCHEMAS.get(cls) or _schema(cls)
    try:
        fields = msgspec.structs.asdict(schema.decoder.decode(hb))
    except msgspec.DecodeError:  # ValidationError included
        return None
    for name in schema.optional:
        if fields[name] is UNSET:
            del fields[name]
    # keys and string values in the text, to be matched against its quotes
    strings = len(fields) + len(schema.strings) - [fields.get(n) for n in schema.strings].count(None)
    for name in schema.endpoints:
        v = fields.get(name)
        if v is not None and not wb.valid_port(v):
            return None
    for name in schema.nested:
        v = fields.get(name)
        if v is not None:
            fields[name], n = _plain_nested(v)
            strings += n
    if hb.count(b'"') != 2 * strings:
        return None  # a duplicate key (or a quote the count cannot place): the reference decides
    if cls is m.FetchSnapshotRequest and fields.get("snapshot_id") is None:
        return None
    return fields


def build(cls: type[T], fields: dict[str, Any]) -> T:
    """``cls(**fields)``, by the cheaper route where the dataclass allows it (no __post_init__)."""
    defaults = (_SCHEMAS.get(cls) or _schema(cls)).defaults
    if defaults is None:
        return cls(**fields)
    obj: T = object.__new__(cls)
    d = obj.__dict__
    d.update(defaults)
    d.update(fields)
    return obj


_ENCODER = msgspec.json.Encoder()


def encode_header(msg: Any, names: Sequence[str]) -> bytes | None:
    """The reference's header bytes for ``msg`` (fields ``names``), or ``None`` where only the
    reference encoder writes them (text that is not plain ASCII: escapes differ)."""
    try:
        hb = _ENCODER.encode({name: getattr(msg, name) for name in names})
    except (TypeError, ValueError, OverflowError):  # a value outside the schema: the reference's call
        return None
    # json.dumps escapes DEL as well (ensure_ascii escapes all but printable ASCII)
    if not hb.isascii() or b"\\" in hb or b"\x7f" in hb:
        return None
    return hb
