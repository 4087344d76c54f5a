"""Strict decoding of RPC bodies, record batches, meta.properties and quorum-state:
each bad input is a KraftError naming the field, never another exception."""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

import pytest

from quorum.core import messages as m
from quorum.records import (
    CorruptRecordError,
    _encode,
    decode_batches,
    encode_batch,
    encode_control_batch,
)
from quorum.runtime import wire
from quorum.storage.meta import decode_meta
from quorum.storage.quorum_state import decode_quorum_state
from quorum.strictjson import loads_strict
from quorum.types import AddVoter, ErrorCode, KraftError, OffsetAndEpoch, ReplicaKey

U1 = "00000000-0000-4000-8000-000000000001"
FETCH = m.FetchRequest(7, "c1", 2, U1, 3, 10, 2, 500, 1 << 20, "127.0.0.1:9092")


def _body(header: dict[str, Any], raw: bytes = b"") -> bytes:
    hb = json.dumps(header).encode()
    return struct.pack("<I", len(hb)) + hb + raw


def _fetch_header() -> dict[str, Any]:
    obj: dict[str, Any] = json.loads(wire.encode(FETCH)[4:])
    return obj


def test_every_rpc_round_trips() -> None:
    msgs: list[Any] = [
        m.VoteRequest(1, "c1", 1, U1, 3, 2, None, 2, 10, "127.0.0.1:9091", True),
        m.VoteResponse(1, ErrorCode.NONE, 1, 3, True, "h:1", True, 2, U1),
        m.BeginQuorumEpochRequest(1, "c1", 1, 4, 2, U1, U1, "h:1"),
        m.BeginQuorumEpochResponse(1, ErrorCode.FENCED_LEADER_EPOCH, -1, 4, None, 2),
        m.EndQuorumEpochRequest(1, "c1", 1, 2, 3, None, (ReplicaKey(1, U1), ReplicaKey(2, None))),
        m.EndQuorumEpochResponse(1, ErrorCode.NONE, 1, 2),
        FETCH,
        m.FetchResponse(5, ErrorCode.NONE, 1, 3, 10, 0, b"abc", None, OffsetAndEpoch(3, 1), "h:2"),
        m.FetchResponse(5, ErrorCode.NONE, 1, 3, -1, 0, b"", OffsetAndEpoch(-1, 0)),
        m.FetchSnapshotRequest(1, "c1", 2, None, 3, OffsetAndEpoch(10, 2), 0, 100),
        m.FetchSnapshotResponse(1, ErrorCode.SNAPSHOT_NOT_FOUND, 1, 2, None, 0, 0, b"xx"),
    ]
    for msg in msgs:
        assert wire.decode(type(msg), wire.encode(msg)) == msg


@pytest.mark.parametrize(
    ("field", "value", "words"),
    [
        ("max_wait_ms", 10**400, "max_wait_ms"),
        ("max_wait_ms", 600_001, "max_wait_ms"),
        ("max_bytes", 2**40, "max_bytes"),
        ("replica_id", "5", "replica_id"),
        ("replica_id", True, "replica_id"),
        ("replica_id", -1, "replica_id"),
        ("fetch_offset", 1.0, "fetch_offset"),
        ("fetch_offset", -1, "fetch_offset"),
        ("current_leader_epoch", 2**31, "current_leader_epoch"),
        ("last_fetched_epoch", None, "last_fetched_epoch"),
        ("replica_uuid", "ABCDEF00-0000-4000-8000-000000000001", "replica_uuid"),
        ("replica_uuid", "not-a-uuid", "replica_uuid"),
        ("replica_endpoint", "x" * 300 + ":1", "replica_endpoint"),
        ("replica_endpoint", "host:0", "replica_endpoint"),
        ("cluster_id", "a/b", "cluster_id"),
        ("cluster_id", 5, "cluster_id"),
        ("records", "abc", "records"),
        ("bogus", 1, "bogus"),
    ],
)
def test_fetch_field_is_refused_by_name(field: str, value: object, words: str) -> None:
    h = _fetch_header()
    h[field] = value
    with pytest.raises(KraftError) as e:
        wire.decode(m.FetchRequest, _body(h))
    assert e.value.code is ErrorCode.INVALID_REQUEST
    assert words in e.value.message and "FetchRequest" in e.value.message


@pytest.mark.parametrize(
    ("body", "words"),
    [
        (b"", "too short"),
        (b"\xff\xff\xff\xff{}", "header length"),
        (struct.pack("<I", 2) + b"[]", "not a JSON object"),
        (struct.pack("<I", 3) + b"{,}", "not valid JSON"),
        (struct.pack("<I", 4) + b"\xff\xfe{}", "UTF-8"),
        (struct.pack("<I", 4000) + b"[" * 4000, "nested"),
        (_body({"correlation_id": 1, "correlation_id ": 2}), "unknown"),
    ],
)
def test_framing_and_json_errors(body: bytes, words: str) -> None:
    with pytest.raises(KraftError) as e:
        wire.decode(m.FetchRequest, body)
    assert e.value.code is ErrorCode.INVALID_REQUEST and words in e.value.message


def test_missing_field_and_trailing_bytes() -> None:
    h = _fetch_header()
    del h["fetch_offset"]
    with pytest.raises(KraftError, match=r"missing field.*fetch_offset"):
        wire.decode(m.FetchRequest, _body(h))
    vote = wire.encode(m.VoteRequest(1, "c1", 1, U1, 3, 2, None, 2, 10))
    with pytest.raises(KraftError, match="unexpected bytes"):
        wire.decode(m.VoteRequest, vote + b"x")


def test_strict_json_refuses_duplicates_and_constants() -> None:
    cases = ((b'{"a": 1, "a": 2}', "duplicate"), (b'{"a": NaN}', "NaN"), (b"[Infinity]", "Infinity"))
    for raw, words in cases:
        with pytest.raises(KraftError) as e:
            loads_strict(raw, "thing")
        assert words in e.value.message and e.value.message.startswith("thing:")


def test_control_record_fields_are_strict() -> None:
    good = encode_control_batch(0, 1, [AddVoter(ReplicaKey(1, U1), "h:1")], append_time_ms=1)
    assert decode_batches(good)[0][0].info.controls[0] == AddVoter(ReplicaKey(1, U1), "h:1")
    # batches built with a valid CRC so that only the control record's field is wrong
    for rec, words in (
        (b'{"type":10,"voter":{"id":"1","uuid":null}}', "id"),
        (b'{"type":10,"voter":{"id":1,"uuid":"ABC"}}', "uuid"),
        (b'{"type":12,"ids":[1,true]}', "id"),
        (b'{"type":2,"leader_id":1.0,"voters":[],"granting_voters":[]}', "leader_id"),
        (b'{"type":11,"voter":{"id":1},"extra":1}', "unknown"),
        (b'{"type":99}', "99"),
        (b"[" * 5000, "nested"),
    ):
        with pytest.raises(CorruptRecordError) as e:
            decode_batches(_encode(0, 1, [rec], 1, 1))
        assert words in e.value.message


def test_batch_header_attributes_and_offset_overflow() -> None:
    b = bytearray(encode_batch(0, 1, [b"x"], append_time_ms=1))
    b[20] = 0x80  # unknown attribute bit
    with pytest.raises(CorruptRecordError, match="attributes"):
        decode_batches(bytes(b), verify_crc=False)
    big = encode_batch(2**63 - 1, 1, [b"x"], append_time_ms=1)
    with pytest.raises(CorruptRecordError, match="base offset"):
        decode_batches(big)


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("version=1\ncluster.id=c\nnode.id=1_0\n", "node.id"),
        ("version=1\ncluster.id=c\nnode.id=\u0665\n", "node.id"),
        ("version=1\ncluster.id=c\nnode.id=1\nnode.id=2\n", "twice"),
        ("version=1\ncluster.id=c\nnode.id=1\nx=\\uD800\n", "escape"),
        ("version=1\ncluster.id=c\nnode.id=4294967296\n", "node.id"),
    ],
)
def test_meta_properties_strict(text: str, words: str) -> None:
    with pytest.raises(KraftError) as e:
        decode_meta(text.encode(), "/d/meta.properties")
    assert e.value.code is ErrorCode.CORRUPT_LOG
    assert "/d/meta.properties" in e.value.message and words in e.value.message


@pytest.mark.parametrize(
    ("raw", "words"),
    [
        (b'{"cluster_id":"c","applied_offset":0,"leader_epoch":true}', "leader_epoch"),
        (b'{"cluster_id":"c","applied_offset":0,"leader_epoch":2147483648}', "leader_epoch"),
        (b'{"cluster_id":"c","applied_offset":0,"surprise":1}', "surprise"),
        (b'{"cluster_id":"c","applied_offset":0,"applied_offset":1}', "duplicate"),
        (b'{"cluster_id":"c","applied_offset":' + b"[" * 100 + b"]" * 100 + b"}", "nested"),
    ],
)
def test_quorum_state_strict(tmp_path: Path, raw: bytes, words: str) -> None:
    with pytest.raises(KraftError) as e:
        decode_quorum_state(raw, "/d/quorum-state")
    assert e.value.code is ErrorCode.CORRUPT_LOG
    assert "/d/quorum-state" in e.value.message and words in e.value.message
