"""The mapping between KRaftKeeper's quorum model and Kafka's KRaft protocol, written once and used
in both directions: by the node's Kafka-wire listener (:mod:`quorum.kafka.server`, our quorum
answering Kafka's tools) and by the operator's Kafka backend (``kraftkeeper_operator.kafka``, the
operator reading a real Kafka quorum).

* API keys (Kafka's protocol guide) and the metadata topic KIP-595 names.
* Error codes: our :class:`~quorum.types.ErrorCode` to Kafka's (:func:`kafka_code`) and back
  (:func:`kafka_error`). Not a bijection: Kafka has one code (REQUEST_TIMED_OUT) for all of
  "busy, try again", so a code read back is the one the operator's retry rules expect, and a
  code Kafka has exactly one of our codes for reads back as itself.
* Directory ids: our storage UUID (KIP-856, canonical 8-4-4-4-12) and Kafka's directory id
  (KIP-858) are the same 128 bits; Kafka prints them in base64url and uses the zero Uuid for
  "not known", which is our "".
* DescribeQuorum: :func:`describe_quorum_response` encodes our describe object (docs/reference.md,
  ``quorum describe --json``) as Kafka's DescribeQuorum v2 answer; :func:`describe_from_response`
  reads such an answer back into a describe object.
"""

from __future__ import annotations

import base64
import uuid as _uuid
from typing import Any

from quorum.types import ErrorCode, KraftError

__all__ = [
    "API_ADD_RAFT_VOTER",
    "API_DESCRIBE_CLUSTER",
    "API_DESCRIBE_QUORUM",
    "API_REMOVE_RAFT_VOTER",
    "API_VERSIONS",
    "LISTENER_NAME",
    "METADATA_TOPIC",
    "UNSUPPORTED_VERSION",
    "base64_to_uuid",
    "describe_from_response",
    "describe_quorum_response",
    "dir_id_to_uuid",
    "kafka_code",
    "kafka_error",
    "to_kafka_uuid",
    "uuid_to_base64",
]

METADATA_TOPIC = "__cluster_metadata"
API_VERSIONS = 18
API_DESCRIBE_QUORUM = 55
API_DESCRIBE_CLUSTER = 60
API_ADD_RAFT_VOTER = 80
API_REMOVE_RAFT_VOTER = 81
UNSUPPORTED_VERSION = 35
LISTENER_NAME = "KRAFTKEEPER"  # the listener name our voters' (HTTP) endpoints are shown under

# -- error codes -------------------------------------------------------------------------------

# Our refusal -> Kafka's code, as the node's listener answers Kafka's tools.
TO_KAFKA: dict[ErrorCode, int] = {
    ErrorCode.NOT_LEADER: 6,  # NOT_LEADER_OR_FOLLOWER
    ErrorCode.UNAVAILABLE: 6,
    ErrorCode.REQUEST_TIMED_OUT: 7,
    ErrorCode.LEADERSHIP_LOST: 7,
    ErrorCode.VOTER_CHANGE_IN_PROGRESS: 7,  # KIP-853: a pending voter change -> REQUEST_TIMED_OUT
    ErrorCode.REASSIGNMENT_IN_PROGRESS: 7,
    ErrorCode.REPLICA_NOT_CAUGHT_UP: 7,
    ErrorCode.LEADER_RECOVERING: 7,
    ErrorCode.PERMISSION_DENIED: 31,  # CLUSTER_AUTHORIZATION_FAILED
    ErrorCode.UNSUPPORTED: 35,
    ErrorCode.INVALID_REQUEST: 42,
    ErrorCode.UNAUTHENTICATED: 58,  # SASL_AUTHENTICATION_FAILED
    ErrorCode.INCONSISTENT_CLUSTER_ID: 104,
    ErrorCode.VOTER_ALREADY_ADDED: 126,  # DUPLICATE_VOTER
    ErrorCode.VOTER_ALREADY_REMOVED: 127,  # VOTER_NOT_FOUND
}

# Kafka's code -> (Kafka's name, our code), as the operator reads a Kafka answer. Retryable on our
# side: NOT_LEADER, REQUEST_TIMED_OUT, UNAVAILABLE, UNKNOWN_SERVER_ERROR; the rest refuse a step.
FROM_KAFKA: dict[int, tuple[str, ErrorCode]] = {
    -1: ("UNKNOWN_SERVER_ERROR", ErrorCode.UNKNOWN_SERVER_ERROR),
    6: ("NOT_LEADER_OR_FOLLOWER", ErrorCode.NOT_LEADER),
    7: ("REQUEST_TIMED_OUT", ErrorCode.REQUEST_TIMED_OUT),
    # A broker / controller shutting down or not yet ready: the outcome is "try again".
    15: ("COORDINATOR_NOT_AVAILABLE", ErrorCode.UNAVAILABLE),
    31: ("CLUSTER_AUTHORIZATION_FAILED", ErrorCode.PERMISSION_DENIED),
    35: ("UNSUPPORTED_VERSION", ErrorCode.UNSUPPORTED),
    41: ("NOT_CONTROLLER", ErrorCode.NOT_LEADER),
    42: ("INVALID_REQUEST", ErrorCode.INVALID_REQUEST),
    58: ("SASL_AUTHENTICATION_FAILED", ErrorCode.UNAUTHENTICATED),
    74: ("FENCED_LEADER_EPOCH", ErrorCode.NOT_LEADER),
    75: ("UNKNOWN_LEADER_EPOCH", ErrorCode.NOT_LEADER),
    104: ("INCONSISTENT_CLUSTER_ID", ErrorCode.INCONSISTENT_CLUSTER_ID),
    125: ("INVALID_VOTER_KEY", ErrorCode.INVALID_REQUEST),
    126: ("DUPLICATE_VOTER", ErrorCode.VOTER_ALREADY_ADDED),  # refined by the backend's add_voter
    127: ("VOTER_NOT_FOUND", ErrorCode.VOTER_ALREADY_REMOVED),
}


def kafka_code(e: KraftError) -> int:
    """Kafka's error code for our refusal (-1, UNKNOWN_SERVER_ERROR, for one Kafka has no name for)."""
    return TO_KAFKA.get(e.code, -1)


def kafka_error(code: int, message: str | None, what: str) -> KraftError:
    """Our error for Kafka's ``code``; the message names the request and Kafka's error name."""
    name, ours = FROM_KAFKA.get(code, (f"KAFKA_ERROR_{code}", ErrorCode.UNKNOWN_SERVER_ERROR))
    text = f"{what}: Kafka {name}" + (f": {message}" if message else "")
    return KraftError(ours, text, kafka_error=name, kafka_code=code)


# -- directory ids -----------------------------------------------------------------------------


def to_kafka_uuid(value: str | None) -> _uuid.UUID:
    """Our canonical storage UUID -> the Uuid Kafka puts on the wire ("" -> Kafka's zero Uuid)."""
    return _uuid.UUID(value) if value else _uuid.UUID(int=0)


def dir_id_to_uuid(value: Any) -> str:
    """kafka-python's decoded ``uuid`` field (a ``uuid.UUID``, or base64url text) -> canonical
    form; Kafka's zero Uuid (unknown) -> ""."""
    if isinstance(value, _uuid.UUID):
        u = value
    elif isinstance(value, str):
        u = base64_to_uuid(value) if len(value) == 22 else _uuid.UUID(value)
    elif isinstance(value, bytes | bytearray) and len(value) == 16:
        u = _uuid.UUID(bytes=bytes(value))
    else:
        return ""
    return "" if u.int == 0 else str(u)


def base64_to_uuid(text: str) -> _uuid.UUID:
    """Kafka's printed Uuid (22 chars of base64url, no padding) -> uuid.UUID."""
    try:
        raw = base64.urlsafe_b64decode(text + "==")
    except ValueError:
        raise ValueError(f"{text!r} is not a Kafka directory id (base64url)") from None
    if len(raw) != 16:
        raise ValueError(f"{text!r} is not a Kafka directory id (16 bytes of base64url)")
    return _uuid.UUID(bytes=raw)


def uuid_to_base64(value: str) -> str:
    """Canonical UUID -> Kafka's base64url form (what ``kafka-metadata-quorum`` prints)."""
    return base64.urlsafe_b64encode(_uuid.UUID(value).bytes).decode().rstrip("=")


# -- DescribeQuorum ----------------------------------------------------------------------------


def describe_quorum_response(resp_cls: Any, d: dict[str, Any] | None, err: KraftError | None = None) -> Any:
    """Our describe object ``d`` as a DescribeQuorum answer (``resp_cls``: kafka-python's
    DescribeQuorumResponse); ``d`` None answers the partition with ``err``'s Kafka code."""
    topic_cls = resp_cls.TopicData
    part_cls = topic_cls.PartitionData
    state_cls = part_cls.ReplicaState
    if d is None:
        assert err is not None
        part = part_cls(
            partition_index=0,
            error_code=kafka_code(err),
            error_message=err.message,
            leader_id=-1,
            leader_epoch=-1,
            high_watermark=-1,
            current_voters=[],
            observers=[],
        )
        return resp_cls(
            error_code=0,
            error_message=None,
            topics=[topic_cls(topic_name=METADATA_TOPIC, partitions=[part])],
            nodes=[],
        )

    def state(r: dict[str, Any]) -> Any:
        return state_cls(
            replica_id=int(r["id"]),
            replica_directory_id=to_kafka_uuid(r.get("uuid")),
            log_end_offset=int(r.get("log_end_offset", -1)),
            last_fetch_timestamp=int(r.get("last_fetch_timestamp", -1)),
            last_caught_up_timestamp=int(r.get("last_caught_up_timestamp", -1)),
        )

    part = part_cls(
        partition_index=0,
        error_code=0,
        error_message=None,
        leader_id=int(d["leader_id"]),
        leader_epoch=int(d["leader_epoch"]),
        high_watermark=int(d.get("high_watermark", -1)),
        current_voters=[state(v) for v in d["voters"]],
        observers=[state(o) for o in d.get("observers") or []],
    )
    nodes = []
    for v in d["voters"]:
        ep = v.get("endpoint")
        if ep and ":" in ep:
            h, _, p = str(ep).rpartition(":")
            lst = resp_cls.Node.Listener(name=LISTENER_NAME, host=h, port=int(p))
            nodes.append(resp_cls.Node(node_id=int(v["id"]), listeners=[lst]))
    # Kafka's Nodes is keyed by node id: one entry per id.
    unique = {n.node_id: n for n in nodes}
    topic = topic_cls(topic_name=METADATA_TOPIC, partitions=[part])
    return resp_cls(error_code=0, error_message=None, topics=[topic], nodes=list(unique.values()))


def describe_from_response(
    resp: Any, listeners: dict[int, list[tuple[str, str, int]]], now_ms: int, cluster_id: str = ""
) -> dict[str, Any]:
    """A DescribeQuorum (v2) answer as our describe object. ``listeners`` (node id -> (name, host,
    port)) is updated from the answer's ``Nodes`` and gives each replica's endpoint: Kafka lists
    only the voters' endpoints (a removed node's vanish, observers never carry theirs), so the
    caller keeps it across answers. Timestamps are shifted by (``now_ms`` - the leader's own
    ``LastFetchTimestamp``, which Kafka sets to its "now"), so liveness windows do not depend on
    clock skew; ``lag`` is the leader's log end offset minus the replica's, as Kafka's tool
    computes it."""
    part = resp.topics[0].partitions[0]
    for n in getattr(resp, "nodes", None) or []:
        listeners[int(n.node_id)] = [(str(x.name), str(x.host), int(x.port)) for x in n.listeners]
    leader_id = int(part.leader_id)
    voters = list(part.current_voters)
    leader_entry = next((r for r in voters if r.replica_id == leader_id), None)
    leader_leo = int(leader_entry.log_end_offset) if leader_entry is not None else int(part.high_watermark)
    leader_now = int(getattr(leader_entry, "last_fetch_timestamp", -1)) if leader_entry is not None else -1
    skew = now_ms - leader_now if leader_now > 0 else 0

    def entry(r: Any) -> dict[str, Any]:
        leo = int(r.log_end_offset)
        fetch = int(getattr(r, "last_fetch_timestamp", -1))
        caught = int(getattr(r, "last_caught_up_timestamp", -1))
        lst = listeners.get(int(r.replica_id))
        return {
            "id": int(r.replica_id),
            "uuid": dir_id_to_uuid(getattr(r, "replica_directory_id", None)),
            "endpoint": f"{lst[0][1]}:{lst[0][2]}" if lst else None,
            "log_end_offset": leo,
            "lag": max(0, leader_leo - leo) if leo >= 0 else -1,
            "last_fetch_timestamp": fetch + skew if fetch >= 0 else -1,
            "last_caught_up_timestamp": caught + skew if caught >= 0 else -1,
        }

    return {
        "cluster_id": cluster_id,
        "leader_id": leader_id,
        "leader_epoch": int(part.leader_epoch),
        "high_watermark": int(part.high_watermark),
        "voters": [entry(r) for r in voters],
        "observers": [entry(r) for r in part.observers],
        # Kafka does not expose an uncommitted voter change; it refuses a second one with
        # REQUEST_TIMED_OUT (KIP-853), which the controller retries.
        "pending_voter_change": None,
        "target_voters": None,
        "leader_recovery_state": "RECOVERED",
    }
