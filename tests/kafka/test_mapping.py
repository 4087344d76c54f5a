"""The Kafka mapping both directions share (quorum.kafka.mapping): what the node's listener
encodes, the operator's backend decodes back to the same describe object; error codes and
directory ids survive the trip."""

from __future__ import annotations

import uuid

import pytest
from kafka.protocol.admin import DescribeQuorumResponse  # type: ignore[import-untyped]

from quorum.kafka.mapping import (
    FROM_KAFKA,
    TO_KAFKA,
    describe_from_response,
    describe_quorum_response,
    dir_id_to_uuid,
    kafka_code,
    kafka_error,
    to_kafka_uuid,
)
from quorum.types import ErrorCode, KraftError

U1, U2, U3 = (str(uuid.UUID(int=i << 64 | i)) for i in (1, 2, 3))


def _wire(resp: object, version: int = 2) -> object:
    """``resp`` through Kafka's wire format: encoded as the listener sends it, decoded as the
    backend's connection reads it."""
    raw = resp.encode()  # type: ignore[attr-defined]
    return DescribeQuorumResponse[version].decode(raw)


def test_describe_round_trips_through_the_wire() -> None:
    ours = {
        "cluster_id": "c1",
        "leader_id": 1,
        "leader_epoch": 7,
        "high_watermark": 40,
        "voters": [
            {
                "id": 1,
                "uuid": U1,
                "endpoint": "127.0.0.1:9001",
                "log_end_offset": 42,
                "last_fetch_timestamp": 1_000_000,
                "last_caught_up_timestamp": 1_000_000,
            },
            {
                "id": 2,
                "uuid": U2,
                "endpoint": "127.0.0.1:9002",
                "log_end_offset": 40,
                "last_fetch_timestamp": 999_000,
                "last_caught_up_timestamp": 998_000,
            },
        ],
        "observers": [
            {
                "id": 3,
                "uuid": U3,
                "endpoint": None,
                "log_end_offset": -1,
                "last_fetch_timestamp": -1,
                "last_caught_up_timestamp": -1,
            },
        ],
    }
    resp = _wire(describe_quorum_response(DescribeQuorumResponse[2], ours))
    listeners: dict[int, list[tuple[str, str, int]]] = {}
    back = describe_from_response(resp, listeners, now_ms=1_000_000, cluster_id="c1")
    for key in ("cluster_id", "leader_id", "leader_epoch", "high_watermark"):
        assert back[key] == ours[key]
    fields = ("id", "uuid", "endpoint", "log_end_offset", "last_fetch_timestamp", "last_caught_up_timestamp")
    for side in ("voters", "observers"):
        assert [{k: r[k] for k in fields} for r in back[side]] == ours[side]
    assert [r["lag"] for r in back["voters"]] == [0, 2]
    assert listeners[2] == [("KRAFTKEEPER", "127.0.0.1", 9002)]
    # the leader's clock is 5 s behind ours: every timestamp is shifted onto ours
    skewed = describe_from_response(resp, listeners, now_ms=1_005_000)
    assert [r["last_fetch_timestamp"] for r in skewed["voters"]] == [1_005_000, 1_004_000]


def test_a_refused_describe_reads_back_as_the_same_error() -> None:
    err = KraftError(ErrorCode.NOT_LEADER, "no leader yet")
    resp = _wire(describe_quorum_response(DescribeQuorumResponse[2], None, err))
    part = resp.topics[0].partitions[0]  # type: ignore[attr-defined]
    back = kafka_error(part.error_code, part.error_message, "DescribeQuorum")
    assert back.code is ErrorCode.NOT_LEADER and "no leader yet" in back.message


@pytest.mark.parametrize("code", sorted(TO_KAFKA, key=lambda c: c.value))
def test_every_code_we_send_is_one_the_backend_knows(code: ErrorCode) -> None:
    k = kafka_code(KraftError(code, "x"))
    assert k in FROM_KAFKA, f"{code} is sent as Kafka code {k}, which the backend cannot name"
    back = kafka_error(k, None, "x").code
    if list(TO_KAFKA.values()).count(k) == 1:  # Kafka has one code for several of ours otherwise
        assert back is code


def test_directory_ids_round_trip() -> None:
    for ours in (U1, U2, ""):
        assert dir_id_to_uuid(to_kafka_uuid(ours)) == ours
    assert kafka_code(KraftError(ErrorCode.CORRUPT_LOG, "x")) == -1  # no Kafka name: UNKNOWN_SERVER_ERROR
