"""The compiled RPC header codec (:mod:`quorum.runtime.wirefast`, msgspec) against the reference
rules of :mod:`quorum.runtime.wire`: the same bytes on the wire for every message (nodes of either
codec understand each other during a rolling upgrade), the same headers accepted with the same
values, the same refusals with the same messages. Hypothesis, on the strategies of
``test_decoders`` and on hand-written texts (duplicate keys, whitespace, escapes, non-ASCII)."""

from __future__ import annotations

import json
import re
import struct
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from quorum.core import messages as m
from quorum.runtime import wire, wirefast
from quorum.types import ErrorCode, KraftError, OffsetAndEpoch, ReplicaKey
from tests.fuzz.test_decoders import FUZZ, MESSAGE_TYPES, U1, _sample, json_values

U2 = "a1b2c3d4-e5f6-4a7b-8c9d-0e1f2a3b4c5d"


def _frame(header: bytes, raw: bytes = b"") -> bytes:
    return struct.pack("<I", len(header)) + header + raw


def _outcome(decode: Any, cls: type, body: bytes) -> tuple[str, Any]:
    try:
        return "ok", decode(cls, body)
    except KraftError as e:
        return "refused", (e.code, e.message)


def _same(cls: type, body: bytes) -> tuple[str, Any]:
    fast = _outcome(wire.decode, cls, body)
    ref = _outcome(wire.decode_reference, cls, body)
    assert fast == ref, (cls.__name__, body)
    return fast


def _reference_bytes(msg: Any) -> bytes:
    hb = wire.encode_header_reference(msg)
    raw = next((getattr(msg, n) for n in ("records", "unaligned_records") if hasattr(msg, n)), b"")
    return _frame(hb, bytes(raw))


def test_field_types_cover_the_reference_rules() -> None:
    assert set(wirefast.FIELD_TYPES) == set(wire.FIELD_RULES)


@pytest.mark.parametrize("cls", MESSAGE_TYPES, ids=lambda c: c.__name__)
def test_a_valid_header_takes_the_compiled_path(cls: type, monkeypatch: pytest.MonkeyPatch) -> None:
    """Without this the compiled decoder could defer everything and the property below would
    still hold: every message our nodes send must decode without the reference parser."""
    body = wire.encode(_sample(cls))

    def no_reference(*_: Any, **__: Any) -> Any:
        raise AssertionError("the reference decoder ran")

    monkeypatch.setattr(wire, "loads_strict", no_reference)
    assert wire.decode(cls, body) == _sample(cls)
    assert body == _reference_bytes(_sample(cls))


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        (b'"correlation_id":7,"correlation_id":8', "duplicate key 'correlation_id'"),
        (b'"correlation_id" : 7, "correlation_id":8', "duplicate key 'correlation_id'"),
        (b'"replica_uuid":null,"replica_uuid":"' + U1.encode() + b'"', "duplicate key 'replica_uuid'"),
        (b'"max_wait_ms":NaN', "NaN is not allowed"),
        (b'"max_wait_ms":"5"', "field max_wait_ms must be an integer"),
        (b'"max_wait_ms":5.0', "field max_wait_ms must be an integer"),
        (b'"max_wait_ms":true', "field max_wait_ms must be an integer"),
        (b'"max_wait_ms":60001', "field max_wait_ms=60001 is out of range 0..60000"),
        (b'"replica_id":2147483648', "field replica_id=2147483648 is out of range 0..2147483647"),
        (b'"fetch_offset":9223372036854775808', "out of range 0..9223372036854775807"),
        (b'"replica_uuid":"' + U2.upper().encode() + b'"', "is not a canonical UUID"),
        (b'"replica_endpoint":"h:65536"', "has an invalid port"),
        (b'"replica_endpoint":"h:0"', "has an invalid port"),
        (b'"cluster_id":"' + b"c" * 129 + b'"', "field cluster_id is longer than 128 characters"),
        (b'"x":1', "unknown field(s) x"),
        (b'"records":"abc"', "unknown field(s) records"),
    ],
)
def test_refusals_keep_the_reference_message(text: bytes, problem: str) -> None:
    header = json.loads(wire.encode_header_reference(_sample(m.FetchRequest)))
    for key in re.findall(rb'"(\w+)"\s*:', text):
        header.pop(key.decode(), None)
    body = _frame(json.dumps(header, separators=(",", ":")).encode()[:-1] + b"," + text + b"}")
    kind, detail = _same(m.FetchRequest, body)
    assert kind == "refused" and detail[0] == ErrorCode.INVALID_REQUEST and problem in detail[1], detail


def test_deep_nesting_and_snapshot_id() -> None:
    deep = b'{"correlation_id":' + b"[" * 50 + b"]" * 50 + b"}"
    kind, detail = _same(m.FetchRequest, _frame(deep))
    assert kind == "refused" and "nested deeper than 8" in detail[1]
    hb = wire.encode_header_reference(_sample(m.FetchSnapshotRequest)).replace(
        b'{"offset":10,"epoch":2}', b"null"
    )
    kind, detail = _same(m.FetchSnapshotRequest, _frame(hb))
    assert kind == "refused" and "field snapshot_id is missing" in detail[1]


def test_escapes_and_non_ascii_are_left_to_the_reference() -> None:
    """Valid headers the compiled decoder does not take, accepted all the same."""
    hb = wire.encode_header_reference(_sample(m.FetchRequest))
    escaped = hb.replace(b'"cluster_id"', b'"\\u0063luster_id"')
    assert wirefast.decode_header(m.FetchRequest, escaped) is None
    assert _same(m.FetchRequest, _frame(escaped)) == ("ok", _sample(m.FetchRequest))
    msg = m.FetchRequest(7, "c1", 2, U1, 3, 10, 2, 500, 1 << 20, "n\u00e9ud:2")
    assert wire.encode(msg) == _reference_bytes(msg)  # json.dumps escapes the é: so do we
    assert _same(m.FetchRequest, wire.encode(msg)) == ("ok", msg)
    raw = _frame(
        json.dumps(json.loads(wire.split_frame("F", wire.encode(msg))[0]), ensure_ascii=False).encode()
    )
    assert _same(m.FetchRequest, raw) == ("ok", msg)


# Field values for messages the core could send: the edges of each type, and strings of any kind
# (the encoder writes whatever a message holds, so its bytes must match the reference's for all).
_ints = st.one_of(st.integers(-(2**63), 2**63 - 1), st.sampled_from([0, -1, 2**31 - 1, 2**63 - 1]))
_strs = st.one_of(st.none(), st.text(max_size=30), st.sampled_from([U1, U2, "h:1", "node-1.kk:9093"]))
_oe = st.one_of(st.none(), st.builds(OffsetAndEpoch, _ints, _ints))
_FIELD_VALUES: dict[str, Any] = {
    "cluster_id": st.one_of(st.text(max_size=20), st.just("c1")),
    "pre_vote": st.booleans(),
    "vote_granted": st.booleans(),
    "error_code": st.sampled_from(ErrorCode),
    "snapshot_id": _oe,
    "diverging_epoch": _oe,
    "preferred_successors": st.lists(st.builds(ReplicaKey, _ints, _strs), max_size=3).map(tuple),
}


def _messages(cls: type) -> Any:
    fields = {}
    for name in cls.__dataclass_fields__:
        if name in ("records", "unaligned_records"):
            fields[name] = st.binary(max_size=16)
        elif name in _FIELD_VALUES:
            fields[name] = _FIELD_VALUES[name]
        else:
            fields[name] = _strs if name.endswith(("_uuid", "_endpoint")) else _ints
    return st.fixed_dictionaries(fields).map(lambda kw: cls(**kw))


@FUZZ
@given(msg=st.sampled_from(MESSAGE_TYPES).flatmap(_messages))
def test_encoded_bytes_equal_the_reference(msg: Any) -> None:
    body = wire.encode(msg)
    assert body == _reference_bytes(msg)
    _same(type(msg), body)  # in range or not, both decoders judge it alike


def _render(items: list[tuple[str, Any]], item_sep: str, key_sep: str, ascii_only: bool) -> bytes:
    parts = [
        json.dumps(k, ensure_ascii=ascii_only) + key_sep + json.dumps(v, ensure_ascii=ascii_only)
        for k, v in items
    ]
    return ("{" + item_sep.join(parts) + "}").encode()


@FUZZ
@given(
    cls=st.sampled_from(MESSAGE_TYPES),
    changes=st.dictionaries(
        st.sampled_from([*sorted(wire.FIELD_RULES), "records", "x"]), json_values, max_size=3
    ),
    dup=st.one_of(st.none(), st.tuples(st.integers(0, 20), json_values)),
    layout=st.sampled_from([(",", ":"), (", ", ": "), (",", " :"), ("\n,", ":\t")]),
    ascii_only=st.booleans(),
    tail=st.one_of(st.just(b""), st.binary(max_size=4)),
)
def test_both_decoders_agree(
    cls: type,
    changes: dict[str, Any],
    dup: tuple[int, Any] | None,
    layout: tuple[str, str],
    ascii_only: bool,
    tail: bytes,
) -> None:
    header = json.loads(wire.split_frame(cls.__name__, wire.encode(_sample(cls)))[0])
    header.update(changes)
    items = list(header.items())
    if dup is not None and items:
        i, value = dup
        items.insert(i % (len(items) + 1), (items[i % len(items)][0], value))
    _same(cls, _frame(_render(items, *layout, ascii_only), tail))


@FUZZ
@given(cls=st.sampled_from(MESSAGE_TYPES), header=json_values, body=st.binary(max_size=120))
def test_both_decoders_agree_on_any_json_and_any_bytes(cls: type, header: Any, body: bytes) -> None:
    _same(cls, _frame(json.dumps(header).encode()))
    _same(cls, body)
