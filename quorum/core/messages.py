"""Node-to-node RPC messages of the consensus core (plain dataclasses, no I/O).

Field names follow the KIP schemas in snake_case: KIP-595 (Vote, BeginQuorumEpoch,
EndQuorumEpoch, Fetch, FetchSnapshot), KIP-856 (``candidate_uuid``, ``voter_uuid``,
``replica_uuid``, preferred successors as (id, UUID)), and the KIP-856 revision (spec 003:
leader endpoint in responses, ``replica_uuid`` in Fetch / FetchSnapshot).

Conventions:

* Every request carries ``correlation_id``, ``cluster_id`` and the sender's id / UUID /
  endpoint; every response echoes the request's ``correlation_id``. For OUTBOUND requests the
  core picks the correlation ids (unique per core instance). For INBOUND requests the driver
  should replace ``correlation_id`` with a node-local unique number
  (``dataclasses.replace``) before ``RaftCore.step`` so that two senders never collide; the
  response the core emits in ``Ready.messages`` echoes that number and the driver matches it to
  the waiting HTTP request.
* Responses carry the responder's view of the leader (``leader_id``, ``leader_epoch``,
  ``leader_endpoint``) so a replica learns about a newer epoch from any answer.
* ``bytes`` fields (Fetch ``records``, FetchSnapshot ``unaligned_records``) are raw batches
  from :mod:`quorum.records`; the transport carries them in binary.
* A transport failure (connection refused, HTTP error, timeout) of an outbound request is
  delivered back to the core as :class:`RpcFailed`.
"""

from __future__ import annotations

from dataclasses import dataclass

from quorum.types import ErrorCode, OffsetAndEpoch, ReplicaKey


@dataclass(frozen=True)
class VoteRequest:
    """KIP-595 Vote (KIP-856 adds candidate/voter UUIDs). ``pre_vote`` is the KIP-996 idea:
    asks whether a vote *would* be granted, without the candidate bumping its epoch and
    without the voter recording a vote. ``candidate_epoch`` is the epoch the candidate would
    run in (current epoch + 1 for a pre-vote)."""

    correlation_id: int
    cluster_id: str
    candidate_id: int
    candidate_uuid: str | None
    candidate_epoch: int
    voter_id: int
    voter_uuid: str | None
    last_offset_epoch: int
    last_offset: int  # the candidate's log end offset (exclusive)
    candidate_endpoint: str | None = None
    pre_vote: bool = False


@dataclass(frozen=True)
class VoteResponse:
    correlation_id: int
    error_code: ErrorCode
    leader_id: int
    leader_epoch: int
    vote_granted: bool
    leader_endpoint: str | None = None
    pre_vote: bool = False
    voter_id: int = -1  # the responder (convenience; the core also tracks correlation ids)
    voter_uuid: str | None = None


@dataclass(frozen=True)
class BeginQuorumEpochRequest:
    """KIP-595 BeginQuorumEpoch: the new leader tells the voters it won ``leader_epoch``."""

    correlation_id: int
    cluster_id: str
    leader_id: int
    leader_epoch: int
    voter_id: int
    voter_uuid: str | None
    leader_uuid: str | None = None
    leader_endpoint: str | None = None


@dataclass(frozen=True)
class BeginQuorumEpochResponse:
    correlation_id: int
    error_code: ErrorCode
    leader_id: int
    leader_epoch: int
    leader_endpoint: str | None = None
    voter_id: int = -1


@dataclass(frozen=True)
class EndQuorumEpochRequest:
    """KIP-595 EndQuorumEpoch: a leader resigning (graceful shutdown, self-removal per
    KIP-642/KIP-856). ``preferred_successors`` (spec 003: PreferredCandidates with UUIDs) are
    ordered by how far their logs have come; a successor at position i waits
    ``i * election_backoff`` before starting an election."""

    correlation_id: int
    cluster_id: str
    leader_id: int
    leader_epoch: int
    voter_id: int
    voter_uuid: str | None
    preferred_successors: tuple[ReplicaKey, ...] = ()
    leader_uuid: str | None = None
    leader_endpoint: str | None = None


@dataclass(frozen=True)
class EndQuorumEpochResponse:
    correlation_id: int
    error_code: ErrorCode
    leader_id: int
    leader_epoch: int
    leader_endpoint: str | None = None
    voter_id: int = -1


@dataclass(frozen=True)
class FetchRequest:
    """KIP-595 Fetch (pull replication) with KIP-856 ``replica_uuid``. ``fetch_offset`` is the
    follower's log end offset, ``last_fetched_epoch`` the epoch of its last batch, used by the
    leader to find divergence. ``replica_endpoint`` lets the leader learn where an observer
    listens (needed when it becomes a voter)."""

    correlation_id: int
    cluster_id: str
    replica_id: int
    replica_uuid: str | None
    current_leader_epoch: int
    fetch_offset: int
    last_fetched_epoch: int
    max_wait_ms: int
    max_bytes: int
    replica_endpoint: str | None = None


@dataclass(frozen=True)
class FetchResponse:
    """KIP-595 FetchResponse. Exactly one of: ``records`` (possibly empty), ``diverging_epoch``
    (truncate to ``diverging_epoch.offset`` then re-fetch: epoch and its end offset on the
    leader), ``snapshot_id`` (fetch below the leader's log start: fetch this snapshot)."""

    correlation_id: int
    error_code: ErrorCode
    leader_id: int
    leader_epoch: int
    high_watermark: int = -1
    log_start_offset: int = 0
    # A view into the received body when decoded from the wire (no copy of it).
    records: bytes | memoryview = b""
    diverging_epoch: OffsetAndEpoch | None = None
    snapshot_id: OffsetAndEpoch | None = None
    leader_endpoint: str | None = None


@dataclass(frozen=True)
class FetchSnapshotRequest:
    """KIP-630 FetchSnapshot (KIP-856 revision adds ``replica_uuid``)."""

    correlation_id: int
    cluster_id: str
    replica_id: int
    replica_uuid: str | None
    current_leader_epoch: int
    snapshot_id: OffsetAndEpoch
    position: int
    max_bytes: int
    replica_endpoint: str | None = None


@dataclass(frozen=True)
class FetchSnapshotResponse:
    correlation_id: int
    error_code: ErrorCode
    leader_id: int
    leader_epoch: int
    snapshot_id: OffsetAndEpoch | None = None
    size: int = 0  # total size of the snapshot in bytes
    position: int = 0  # where ``unaligned_records`` starts
    unaligned_records: bytes | memoryview = b""  # a view into the received body
    leader_endpoint: str | None = None


@dataclass(frozen=True)
class RpcFailed:
    """The transport could not deliver ``correlation_id`` to ``destination_id`` or got no
    answer (refused, timeout, HTTP error, undecodable body). Stepped into the core like a
    response."""

    correlation_id: int
    destination_id: int
    reason: str = ""


Request = VoteRequest | BeginQuorumEpochRequest | EndQuorumEpochRequest | FetchRequest | FetchSnapshotRequest
Response = (
    VoteResponse
    | BeginQuorumEpochResponse
    | EndQuorumEpochResponse
    | FetchResponse
    | FetchSnapshotResponse
    | RpcFailed
)
Message = Request | Response

REQUEST_TYPES: tuple[type, ...] = (
    VoteRequest,
    BeginQuorumEpochRequest,
    EndQuorumEpochRequest,
    FetchRequest,
    FetchSnapshotRequest,
)

# HTTP path (after /raft/v1/) of each request type, for the transport.
RPC_PATHS: dict[type, str] = {
    VoteRequest: "vote",
    BeginQuorumEpochRequest: "begin_quorum_epoch",
    EndQuorumEpochRequest: "end_quorum_epoch",
    FetchRequest: "fetch",
    FetchSnapshotRequest: "fetch_snapshot",
}

# The response type of each request type.
RESPONSE_FOR: dict[type, type] = {
    VoteRequest: VoteResponse,
    BeginQuorumEpochRequest: BeginQuorumEpochResponse,
    EndQuorumEpochRequest: EndQuorumEpochResponse,
    FetchRequest: FetchResponse,
    FetchSnapshotRequest: FetchSnapshotResponse,
}


def is_request(message: Message) -> bool:
    return isinstance(message, REQUEST_TYPES)


__all__ = [
    "REQUEST_TYPES",
    "RESPONSE_FOR",
    "RPC_PATHS",
    "BeginQuorumEpochRequest",
    "BeginQuorumEpochResponse",
    "EndQuorumEpochRequest",
    "EndQuorumEpochResponse",
    "FetchRequest",
    "FetchResponse",
    "FetchSnapshotRequest",
    "FetchSnapshotResponse",
    "Message",
    "Request",
    "Response",
    "RpcFailed",
    "VoteRequest",
    "VoteResponse",
    "is_request",
]
