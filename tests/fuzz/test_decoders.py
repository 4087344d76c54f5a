"""Hypothesis fuzzing of every decoder of untrusted bytes: RPC bodies (each request
and response type), the Fetch header framing, record batches, meta.properties and quorum-state.

Property: a decoder either returns a value (which then round-trips through the encoder) or
raises KraftError with a message naming what is wrong; never another exception. Runs are
derandomized (the same examples every time) and bounded by ``max_examples`` so the whole file
stays well under a minute on the 2-core machines. ``KRAFTKEEPER_FUZZ_EXAMPLES=N`` runs N random
(not derandomized) examples per test instead, for a longer hunt by hand.
"""

from __future__ import annotations

import json
import os
import struct
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from quorum.core import messages as m
from quorum.records import (
    HEADER_SIZE,
    CorruptRecordError,
    _encode,
    decode_batches,
    encode_batch,
    encode_control_batch,
)
from quorum.runtime import wire
from quorum.security.auth import authenticate, authorize
from quorum.security.clientconfig import parse_client_config
from quorum.security.tokens import TokenStore
from quorum.storage.meta import decode_meta, render_properties
from quorum.storage.quorum_state import decode_quorum_state, encode_quorum_state
from quorum.types import (
    AddVoter,
    ErrorCode,
    KraftError,
    LeaderChange,
    QuorumState,
    RemoveVoter,
    ReplicaKey,
    TargetVoters,
)

FUZZ = settings(
    derandomize=not os.environ.get("KRAFTKEEPER_FUZZ_EXAMPLES"),
    max_examples=int(os.environ.get("KRAFTKEEPER_FUZZ_EXAMPLES", "200")),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
MESSAGE_TYPES = sorted([*m.REQUEST_TYPES, *m.RESPONSE_FOR.values()], key=lambda c: c.__name__)
U1 = "00000000-0000-4000-8000-000000000001"

# JSON values a hostile peer could put in any field: the interesting edges of every type.
scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.sampled_from([0, -1, 2**31 - 1, 2**31, -(2**31) - 1, 2**63 - 1, 2**63, 10**30]),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=40),
    st.sampled_from([U1, U1.upper(), "5", "", "h:1", "127.0.0.1:9091", "NONE", "c1"]),
)
json_values = st.recursive(
    scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=12,
)


def _refused_clearly(e: KraftError) -> None:
    assert e.message and len(e.message) < 2000, e.message


def _frame(header: bytes, raw: bytes = b"") -> bytes:
    return struct.pack("<I", len(header)) + header + raw


def _sample(cls: type) -> Any:
    """A valid instance of each RPC type, to mutate field by field."""
    samples: dict[type, Any] = {
        m.VoteRequest: m.VoteRequest(1, "c1", 1, U1, 3, 2, None, 2, 10, "h:1", True),
        m.VoteResponse: m.VoteResponse(1, m.ErrorCode.NONE, 1, 3, True, "h:1", True, 2, U1),
        m.BeginQuorumEpochRequest: m.BeginQuorumEpochRequest(1, "c1", 1, 4, 2, U1, U1, "h:1"),
        m.BeginQuorumEpochResponse: m.BeginQuorumEpochResponse(1, m.ErrorCode.NONE, 1, 4, None, 2),
        m.EndQuorumEpochRequest: m.EndQuorumEpochRequest(1, "c1", 1, 2, 3, None, (ReplicaKey(1, U1),)),
        m.EndQuorumEpochResponse: m.EndQuorumEpochResponse(1, m.ErrorCode.NONE, 1, 2),
        m.FetchRequest: m.FetchRequest(7, "c1", 2, U1, 3, 10, 2, 500, 1 << 20, "h:2"),
        m.FetchResponse: m.FetchResponse(5, m.ErrorCode.NONE, 1, 3, 10, 0, b"abc"),
        m.FetchSnapshotRequest: m.FetchSnapshotRequest(1, "c1", 2, None, 3, m.OffsetAndEpoch(10, 2), 0, 100),
        m.FetchSnapshotResponse: m.FetchSnapshotResponse(1, m.ErrorCode.NONE, 1, 2, None, 0, 0, b"xx"),
    }
    return samples[cls]


def _check_decode(cls: type, body: bytes) -> None:
    try:
        msg = wire.decode(cls, body)
    except KraftError as e:
        _refused_clearly(e)
        return
    assert wire.decode(cls, wire.encode(msg)) == msg


@FUZZ
@given(cls=st.sampled_from(MESSAGE_TYPES), body=st.binary(max_size=200))
def test_rpc_random_bytes(cls: type, body: bytes) -> None:
    _check_decode(cls, body)


@FUZZ
@given(
    cls=st.sampled_from(MESSAGE_TYPES),
    changes=st.dictionaries(
        st.sampled_from([*sorted(wire.FIELD_RULES), "records", "x"]), json_values, max_size=4
    ),
    drop=st.lists(st.sampled_from(sorted(wire.FIELD_RULES)), max_size=2),
    tail=st.binary(max_size=8),
)
def test_rpc_mutated_fields(cls: type, changes: dict[str, Any], drop: list[str], tail: bytes) -> None:
    header = json.loads(wire.split_frame(cls.__name__, wire.encode(_sample(cls)))[0])
    header.update(changes)
    for name in drop:
        header.pop(name, None)
    _check_decode(cls, _frame(json.dumps(header).encode(), tail))


@FUZZ
@given(cls=st.sampled_from(MESSAGE_TYPES), header=json_values, tail=st.binary(max_size=8))
def test_rpc_any_json_header(cls: type, header: Any, tail: bytes) -> None:
    _check_decode(cls, _frame(json.dumps(header).encode(), tail))


@FUZZ
@given(prefix=st.integers(0, 2**32 - 1), rest=st.binary(max_size=64))
def test_fetch_framing(prefix: int, rest: bytes) -> None:
    body = struct.pack("<I", prefix) + rest
    try:
        header, raw = wire.split_frame("FetchRequest", body)
    except KraftError as e:
        _refused_clearly(e)
        return
    assert struct.pack("<I", len(header)) + header + raw == body
    _check_decode(m.FetchResponse, body)


def _valid_batches() -> bytes:
    return encode_batch(0, 1, [b"a", b"bc"], append_time_ms=1) + encode_control_batch(
        2,
        1,
        [
            LeaderChange(1, (ReplicaKey(1, U1),), (ReplicaKey(1, U1),)),
            AddVoter(ReplicaKey(2, None), "h:2"),
            RemoveVoter(ReplicaKey(3, U1)),
            TargetVoters((1, 2)),
        ],
        append_time_ms=1,
    )


def _check_batches(buf: bytes) -> None:
    for torn in (False, True):
        try:
            batches, used = decode_batches(buf, allow_torn_tail=torn)
        except CorruptRecordError as e:
            _refused_clearly(e)
            continue
        assert 0 <= used <= len(buf)
        assert sum(len(b.data) for b in batches) == used


@FUZZ
@given(buf=st.binary(max_size=300))
def test_batches_random_bytes(buf: bytes) -> None:
    _check_batches(buf)


@FUZZ
@given(
    flips=st.lists(st.tuples(st.integers(0, 10_000), st.integers(0, 255)), min_size=1, max_size=4),
    cut=st.integers(0, 10_000),
)
def test_batches_mutated(flips: list[tuple[int, int]], cut: int) -> None:
    buf = bytearray(_valid_batches())
    for pos, val in flips:
        buf[pos % len(buf)] = val
    _check_batches(bytes(buf))
    _check_batches(bytes(buf[: cut % (len(buf) + 1)]))


@FUZZ
@given(
    record=st.one_of(json_values.map(lambda v: json.dumps(v).encode()), st.binary(max_size=60)),
    as_type=st.sampled_from([2, 3, 4, 10, 11, 12, 13, 99]),
)
def test_control_records_with_valid_crc(record: bytes, as_type: int) -> None:
    # a control record whose batch CRC is right: only the record's own checks can refuse it
    try:
        obj = json.loads(record)
    except ValueError:
        obj = None
    if isinstance(obj, dict):
        obj["type"] = as_type
        record = json.dumps(obj).encode()
    _check_batches(_encode(0, 1, [record], 1, 1))
    assert HEADER_SIZE == 33


property_lines = st.lists(
    st.one_of(
        st.sampled_from(
            [
                "version=1",
                "cluster.id=c1",
                "node.id=1",
                f"directory.id={U1}",
                f"storage.id={U1}",
                "node.id=01",
                "node.id=-1",
                "node.id=1_0",
                "version=2",
                "x=\\uD800",
                "a\\",
                "#c",
            ]
        ),
        st.text(max_size=30),
    ),
    max_size=8,
)


@FUZZ
@given(lines=property_lines, junk=st.binary(max_size=20))
def test_meta_properties(lines: list[str], junk: bytes) -> None:
    for raw in ("\n".join(lines).encode("utf-8", "surrogatepass"), junk):
        try:
            cluster_id, node_id, uuid, extra = decode_meta(raw, "/d/meta.properties")
        except KraftError as e:
            _refused_clearly(e)
            assert "/d/meta.properties" in e.message
            continue
        # whatever was accepted can be written back and read again identically
        props = dict(extra, **{"version": "1", "cluster.id": cluster_id, "node.id": str(node_id)})
        if uuid is not None:
            props["directory.id"] = uuid
        assert decode_meta(render_properties(props), "x") == (cluster_id, node_id, uuid, extra)


@FUZZ
@given(
    changes=st.dictionaries(
        st.sampled_from(
            [
                "cluster_id",
                "leader_id",
                "leader_epoch",
                "voted_id",
                "voted_uuid",
                "applied_offset",
                "data_version",
                "other",
            ]
        ),
        json_values,
        max_size=4,
    ),
    junk=st.binary(max_size=30),
)
def test_quorum_state(changes: dict[str, Any], junk: bytes) -> None:
    base = json.loads(encode_quorum_state(QuorumState("c1", 1, 5, 1, U1, 10)))
    base.update(changes)
    for raw in (json.dumps(base).encode(), junk):
        try:
            state = decode_quorum_state(raw, "/d/quorum-state")
        except KraftError as e:
            _refused_clearly(e)
            assert "/d/quorum-state" in e.message
            continue
        assert decode_quorum_state(encode_quorum_state(state)) == state


@FUZZ
@given(
    obj=st.one_of(
        json_values,
        st.dictionaries(
            st.sampled_from(["ca_file", "cert_file", "key_file", "token_file", "cafile", ""]),
            json_values,
            max_size=5,
        ),
    ),
    junk=st.binary(max_size=30),
)
def test_client_config(obj: Any, junk: bytes) -> None:
    for raw in (json.dumps(obj).encode(), junk):
        try:
            cfg = parse_client_config(raw, "/etc/kk/client.json", "/etc/kk")
        except KraftError as e:
            _refused_clearly(e)
            assert "/etc/kk/client.json" in e.message
            continue
        assert cfg.cert_file is not None or cfg.token_file is not None
        assert (cfg.cert_file is None) == (cfg.key_file is None)


@FUZZ
@given(obj=json_values, junk=st.binary(max_size=40))
def test_tokens_file(obj: Any, junk: bytes) -> None:
    base = {"version": 1, "tokens": [{"name": "a", "role": "read", "sha256": "0" * 64}]}
    for raw in (json.dumps(obj).encode(), json.dumps(dict(base, tokens=[obj])).encode(), junk):
        try:
            entries = TokenStore.parse(raw, "/d/tokens.json")
        except KraftError as e:
            _refused_clearly(e)
            assert "/d/tokens.json" in e.message
            continue
        assert all(e.role in ("admin", "readwrite", "read") for e in entries)


@FUZZ
@given(
    header=st.one_of(st.none(), st.text(max_size=80), st.text(max_size=40).map(lambda t: "Bearer " + t)),
    uri=st.one_of(
        st.text(max_size=60),
        st.sampled_from(["kraftkeeper://c1/replica/", "kraftkeeper://c1/client/"]).flatmap(
            lambda p: st.text(max_size=30).map(lambda t: p + t)
        ),
    ),
)
def test_authenticate_untrusted_header_and_identity(header: str | None, uri: str) -> None:
    store = TokenStore([])
    token = store.add("app", "read")
    cert = {
        "notBefore": "Jan  1 00:00:00 2020 GMT",
        "notAfter": "Jan  1 00:00:00 2999 GMT",
        "subjectAltName": (("URI", uri),),
    }
    for h in (header, f"Bearer {token}"):
        try:
            p = authenticate(cert, h, cluster_id="c1", tokens=store)
        except KraftError as e:
            assert e.code in (ErrorCode.UNAUTHENTICATED,)
            _refused_clearly(e)
            continue
        assert p.cluster_id == "c1"
        authorize_outcome(p)


def authorize_outcome(p: Any) -> None:
    for method, path in (("GET", "/v1/kv/a"), ("POST", "/raft/v1/fetch"), ("GET", "/v1/quorum/describe")):
        try:
            authorize(p, method, path, p.replica_id)
        except KraftError as e:
            assert e.code is ErrorCode.PERMISSION_DENIED
