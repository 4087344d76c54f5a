"""Shared primitives of the quorum engine.

Everything here is plain data: the core (``quorum.core``), the storage layer
(``quorum.storage``), the codec (``quorum.records``) and the runtime all import it, and it
imports nothing of theirs. Field names follow the KIP schemas (KIP-595, KIP-856).
"""

from __future__ import annotations

import enum
import re
import uuid as _uuid
from dataclasses import dataclass, field


class ErrorCode(str, enum.Enum):
    """Error codes used on the wire, on the CLI (``CODE: message`` on stderr) and in HTTP
    bodies. Names follow Kafka's where Kafka has one (KIP-595, KIP-856, KIP-704)."""

    NONE = "NONE"
    NOT_LEADER = "NOT_LEADER"  # Kafka: NOT_LEADER_OR_FOLLOWER / NOT_LEADER_FOR_PARTITION
    NOT_FOUND = "NOT_FOUND"
    NOT_FORMATTED = "NOT_FORMATTED"
    ALREADY_FORMATTED = "ALREADY_FORMATTED"
    INVALID_REQUEST = "INVALID_REQUEST"
    INCONSISTENT_CLUSTER_ID = "INCONSISTENT_CLUSTER_ID"
    FENCED_LEADER_EPOCH = "FENCED_LEADER_EPOCH"
    UNKNOWN_LEADER_EPOCH = "UNKNOWN_LEADER_EPOCH"
    NOT_VOTER = "NOT_VOTER"
    VOTER_ALREADY_ADDED = "VOTER_ALREADY_ADDED"
    VOTER_ALREADY_REMOVED = "VOTER_ALREADY_REMOVED"
    VOTER_CHANGE_IN_PROGRESS = "VOTER_CHANGE_IN_PROGRESS"
    REPLICA_NOT_CAUGHT_UP = "REPLICA_NOT_CAUGHT_UP"
    REASSIGNMENT_IN_PROGRESS = "REASSIGNMENT_IN_PROGRESS"
    LEADER_RECOVERING = "LEADER_RECOVERING"  # KIP-704: reads/writes refused while RECOVERING
    OFFSET_OUT_OF_RANGE = "OFFSET_OUT_OF_RANGE"
    SNAPSHOT_NOT_FOUND = "SNAPSHOT_NOT_FOUND"
    POSITION_OUT_OF_RANGE = "POSITION_OUT_OF_RANGE"
    CORRUPT_RECORD = "CORRUPT_RECORD"
    CORRUPT_LOG = "CORRUPT_LOG"
    REQUEST_TIMED_OUT = "REQUEST_TIMED_OUT"
    LEADERSHIP_LOST = "LEADERSHIP_LOST"
    PAYLOAD_TOO_LARGE = "PAYLOAD_TOO_LARGE"
    UNSUPPORTED = "UNSUPPORTED"
    UNAVAILABLE = "UNAVAILABLE"
    UNAUTHENTICATED = "UNAUTHENTICATED"  # HTTP 401: missing or invalid credentials
    PERMISSION_DENIED = "PERMISSION_DENIED"  # HTTP 403: valid credentials, not allowed
    UNKNOWN_SERVER_ERROR = "UNKNOWN_SERVER_ERROR"


class KraftError(Exception):
    """An error with a code from :class:`ErrorCode`; ``str(e)`` is ``CODE: message``."""

    def __init__(self, code: ErrorCode, message: str, **extra: object) -> None:
        super().__init__(f"{code.value}: {message}")
        self.code = code
        self.message = message
        self.extra = extra


# The one cluster-id rule: meta.properties' ``cluster.id``, the id on every request between
# nodes, and the CA's subject all hold the same text, so one rule checks it wherever it enters.
# Kafka's cluster ids (22-character URL-safe base64 UUIDs) fit. ``\Z``, not ``$``: ``$`` would
# also accept a trailing newline.
CLUSTER_ID_RE = re.compile(r"\A[A-Za-z0-9._-]{1,128}\Z")
CLUSTER_ID_RULE = "use 1-128 characters of letters, digits, '.', '_', '-'"


def is_cluster_id(value: object) -> bool:
    """Whether ``value`` is a valid cluster id (:data:`CLUSTER_ID_RE`)."""
    return isinstance(value, str) and CLUSTER_ID_RE.match(value) is not None


def validate_cluster_id(cluster_id: str) -> str:
    """``cluster_id`` if it is valid; INVALID_REQUEST naming it and the rule otherwise."""
    if not is_cluster_id(cluster_id):
        raise KraftError(
            ErrorCode.INVALID_REQUEST, f"invalid cluster id {cluster_id!r:.60}: {CLUSTER_ID_RULE}"
        )
    return cluster_id


def canonical_uuid(value: str) -> str:
    """Return ``value`` as a canonical lower-case 8-4-4-4-12 UUID, or raise ``ValueError``."""
    return str(_uuid.UUID(value))


def new_storage_uuid() -> str:
    """A fresh storage UUID (KIP-856 ``storage.id``), canonical form.

    As Kafka's ``Uuid.randomUuid`` does, an id whose base64url text (the form Kafka's tools
    print and read, ``--controller-directory-id``) would start with '-' is drawn again: the tool
    would take it for an option. The first character is the first byte's top six bits, and '-'
    is the 63rd letter (index 62) of the base64url alphabet (RFC 4648, section 5)."""
    while True:
        u = _uuid.uuid4()
        if u.bytes[0] >> 2 != 62:
            return str(u)


@dataclass(frozen=True, order=True)
class ReplicaKey:
    """A replica named by (replica id, storage UUID) as KIP-856 requires of voters.

    ``uuid`` is ``None`` only where the UUID is not known (a bootstrap voter whose UUID the
    leader has not yet learned, or a request that left the optional field out)."""

    id: int
    uuid: str | None = None

    def __str__(self) -> str:
        return f"{self.id}:{self.uuid or '-'}"


class ControlType(enum.IntEnum):
    """Control record types. LEADER_CHANGE, SNAPSHOT_HEADER and SNAPSHOT_FOOTER carry Kafka's
    numbers; KIP-856 leaves the voter records' numbers TBD, so ours are our own."""

    LEADER_CHANGE = 2
    SNAPSHOT_HEADER = 3
    SNAPSHOT_FOOTER = 4
    ADD_VOTER = 10  # KIP-856 AddVoterRecord
    REMOVE_VOTER = 11  # KIP-856 RemoveVoterRecord
    TARGET_VOTERS = 12  # KIP-642 target voter set (None clears / cancels)
    LEADER_RECOVERY = 13  # KIP-704 style leader recovery state change


class LeaderRecoveryState(str, enum.Enum):
    """KIP-704: a leader elected uncleanly is RECOVERING until it has verified its state."""

    RECOVERED = "RECOVERED"
    RECOVERING = "RECOVERING"


@dataclass(frozen=True)
class LeaderChange:
    """KIP-595 LeaderChangeMessage (KIP-856 v1 adds the voter UUIDs)."""

    leader_id: int
    voters: tuple[ReplicaKey, ...]
    granting_voters: tuple[ReplicaKey, ...]
    type: ControlType = field(default=ControlType.LEADER_CHANGE, init=False)


@dataclass(frozen=True)
class AddVoter:
    """KIP-856 AddVoterRecord: applied when read, committed or not."""

    voter: ReplicaKey
    endpoint: str | None = None  # HOST:PORT the voter listens on (as KIP-853's VotersRecord)
    type: ControlType = field(default=ControlType.ADD_VOTER, init=False)


@dataclass(frozen=True)
class RemoveVoter:
    """KIP-856 RemoveVoterRecord: applied when read, committed or not."""

    voter: ReplicaKey
    type: ControlType = field(default=ControlType.REMOVE_VOTER, init=False)


@dataclass(frozen=True)
class TargetVoters:
    """KIP-642 TargetVoters: the set the leader is reassigning towards; ``None`` = no
    reassignment (completed or cancelled)."""

    ids: tuple[int, ...] | None
    type: ControlType = field(default=ControlType.TARGET_VOTERS, init=False)


@dataclass(frozen=True)
class LeaderRecovery:
    """KIP-704 leader recovery state, written RECOVERING by ``recover-unclean`` and RECOVERED
    once the sole leader has verified its log and snapshot. ``lost_after`` is the first offset
    that might have been lost (committed elsewhere but never seen here), -1 if unknown."""

    state: LeaderRecoveryState
    lost_after: int = -1
    type: ControlType = field(default=ControlType.LEADER_RECOVERY, init=False)


@dataclass(frozen=True)
class SnapshotHeader:
    """First record of a snapshot (KIP-630): when the state was taken."""

    last_contained_log_timestamp: int
    type: ControlType = field(default=ControlType.SNAPSHOT_HEADER, init=False)


@dataclass(frozen=True)
class SnapshotFooter:
    """Last record of a snapshot (KIP-630)."""

    type: ControlType = field(default=ControlType.SNAPSHOT_FOOTER, init=False)


ControlRecord = (
    LeaderChange | AddVoter | RemoveVoter | TargetVoters | LeaderRecovery | SnapshotHeader | SnapshotFooter
)


@dataclass(frozen=True)
class BatchInfo:
    """Header facts of one record batch, as the core needs them.

    A batch is either a control batch (``controls`` non-empty, ``count == len(controls)``) or a
    data batch (``controls`` empty; the records are opaque bytes the core never looks at).
    Offsets: the batch holds ``base_offset .. base_offset + count - 1``."""

    base_offset: int
    epoch: int
    count: int
    size_bytes: int = 0
    controls: tuple[ControlRecord, ...] = ()

    @property
    def last_offset(self) -> int:
        return self.base_offset + self.count - 1

    @property
    def next_offset(self) -> int:
        return self.base_offset + self.count

    @property
    def is_control(self) -> bool:
        return bool(self.controls)


@dataclass(frozen=True, order=True)
class OffsetAndEpoch:
    """A position in the log: ``offset`` exclusive end (snapshot ids, KIP-630) and its epoch."""

    offset: int
    epoch: int


@dataclass
class QuorumState:
    """KIP-856 QuorumStateData (quorum-state file): persisted atomically before any message
    that depends on it is sent."""

    cluster_id: str
    leader_id: int = -1
    leader_epoch: int = 0
    voted_id: int = -1
    voted_uuid: str | None = None
    applied_offset: int = 0


@dataclass
class LogSummary:
    """What the storage layer hands the core when a node starts: enough to rebuild the epoch
    cache and the voter set without reading data records.

    ``snapshot`` is the latest snapshot id (None if none); ``snapshot_controls`` the control
    records it carries (voter set, target voters, recovery state); ``control_batches`` every
    control batch after the snapshot, in log order; ``epoch_starts`` the (epoch, start offset)
    pairs of the log after the snapshot, ascending."""

    log_start_offset: int
    end_offset: int
    last_epoch: int
    snapshot: OffsetAndEpoch | None = None
    snapshot_controls: tuple[ControlRecord, ...] = ()
    control_batches: list[BatchInfo] = field(default_factory=list)
    epoch_starts: list[tuple[int, int]] = field(default_factory=list)
