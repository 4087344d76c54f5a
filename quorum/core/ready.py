"""What the core asks the driver to do: :class:`Ready` and its parts. THE core contract.

This docstring is the one statement of the contract (docs/design.md points here);
``quorum.driver`` carries it out for the node, the simulation and the core tests alike.

The driver loop is ``ready = core.ready()``, carry it out, ``core.advance(ready, durable_end)``,
repeat. Inbound requests, responses and ticks may be stepped into the core at ANY time, also
while a ``Ready`` is being carried out (the node steps RPCs while its fsync runs in an
executor). Whatever the core queues after ``ready()`` returned belongs to the NEXT ``Ready``;
``advance`` never adds to the ``Ready`` being carried out. A ``Ready`` is carried out in this
order:

1. ``truncate_to``: truncate the log to this end offset (KIP-595 DivergingEpoch).
2. ``snapshot_chunks`` then ``install_snapshot``: write FetchSnapshot chunks into the pending
   snapshot at their positions; when ``install_snapshot`` is set the snapshot is complete:
   verify it, install it (log reset so that log start = end = ``install_snapshot.offset``),
   load it into the state machine and call ``core.snapshot_installed(id, controls)`` with the
   control records it carries (or ``core.snapshot_rejected(id, reason)`` if it does not verify).
3. ``append``: batches to write: :class:`LeaderBatch` (records or control records the leader
   appends, encoded by the log's leader path ``LogStorage.append``) or :class:`RawBatches`
   (already-encoded bytes a follower fetched, CRC-checked by the core; these may be written
   in step 4 instead, before the fsync and off the event loop, when the Ready holds no
   leader batch and no snapshot install). Optional fast path,
   leader only: once written (not yet fsynced) call ``core.appended(written_end, now)`` and send
   the Fetch responses it returns at once (KIP-595 leaders serve unflushed data; the high
   watermark still counts the leader's own log only up to its durable end).
4. Persist: save ``quorum_state`` (atomically) if set, and if ``flush`` fsync the log.
5. ``core.advance(ready, durable_end)`` with the log's durable (fsynced) end offset.
6. ``messages``: send requests / answer inbound requests. Persist-before-send: when the Ready
   saves ``quorum_state``, nothing in ``messages`` leaves before step 4 completed (a vote, an
   epoch). Without it, the messages may leave right after step 3, before the fsync: every
   promise they make was saved by an earlier Ready, the leader serves unflushed data anyway
   (step 3), and a Fetch's offset never claims more than the log fsynced before this Ready,
   or else only committed records (see the durability rule below; the driver checks it
   against the log's fsynced end and the core's high watermark).
7. ``commit``: the new high watermark; apply records up to it to the state machine. Without
   ``quorum_state``, this and step 8's client results may also come right after step 3 when
   ``commit`` is at most the log's fsynced end (a leader's always is; a follower's may name
   records of this Ready's own append, which it must not apply before they are durable).
8. ``proposal_results``, ``reads``, ``admin_results``: complete client waits (after the
   records they name are applied); ``role_change``: publish the role (the first ``Ready`` of a
   core carries its restored role); ``recovery_needed`` (KIP-704): the local leader's log is
   RECOVERING: verify the state, snapshot, then call ``core.recovery_verified(lost_after)``;
   ``errors``: log these human-readable notes of rejected input (nothing was applied from them).

While a Ready that saves no quorum state is being persisted, the driver may also take
``core.ready_to_send()``: the messages queued since, and the commit with its client results
when the high watermark is within the local durable log, under the same rules as steps 6-7
(nothing of it waits for the fsync in flight). Everything else stays queued for the next
``Ready``.

Durability rule for followers (the reason for "queued after ``ready()`` waits"): a Fetch's
``fetch_offset`` tells the leader "I hold everything below this durably", and the leader counts
it toward the high watermark. A follower therefore sends its next Fetch only once its whole
log is durable (``durable_end == end``), and the Fetch sits in the Ready after the one whose
fsync made it so; EXCEPT that a Fetch may claim records not yet durable when its offset is at
or below the follower's high watermark (already committed, so the claim cannot move any high
watermark: the invariant and its argument are in :mod:`quorum.core.replication`, "Pipelined
catch-up"). Such a Fetch sits in the same Ready as the append it follows (the next
batch travels while this one is fsynced).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

from quorum.core.messages import Message, is_request
from quorum.core.roles import RoleName
from quorum.types import BatchInfo, ControlRecord, ErrorCode, OffsetAndEpoch, QuorumState


class LogReader(Protocol):
    """Read access to the WRITTEN log (flushed or not) and the snapshots, given to the core.

    ``read(offset, max_bytes)``: whole batches starting exactly at batch boundary ``offset``;
    at least one batch even if it is larger than ``max_bytes``; ``b""`` at the end of the
    written log. Serving unflushed batches is safe: see ``ReplicationMixin.serve_fetch``.
    ``read_snapshot(id, position, max_bytes)``: ``(chunk, total_size)``; raises
    ``KraftError(SNAPSHOT_NOT_FOUND)`` if there is no such snapshot."""

    def read(self, offset: int, max_bytes: int) -> bytes: ...

    def read_snapshot(self, snapshot: OffsetAndEpoch, position: int, max_bytes: int) -> tuple[bytes, int]: ...


@dataclass(frozen=True)
class LeaderBatch:
    """A batch the leader appends: data ``records`` (opaque bytes) or ``controls``."""

    base_offset: int
    epoch: int
    records: tuple[bytes, ...] = ()
    controls: tuple[ControlRecord, ...] = ()
    append_time_ms: int = 0

    @property
    def count(self) -> int:
        return len(self.controls) if self.controls else len(self.records)

    @property
    def next_offset(self) -> int:
        return self.base_offset + self.count

    def items(self) -> tuple[bytes, ...] | tuple[ControlRecord, ...]:
        """What ``LogStorage.append`` encodes: the data records or the control records."""
        return self.controls if self.controls else self.records

    def info(self, size_bytes: int = 0) -> BatchInfo:
        return BatchInfo(self.base_offset, self.epoch, self.count, size_bytes, self.controls)


@dataclass(frozen=True)
class RawBatches:
    """Batches a follower fetched: the exact bytes (write them as they are) and their headers.
    ``infos[0].base_offset`` is where they go; they end at ``infos[-1].next_offset``."""

    data: bytes | memoryview
    infos: tuple[BatchInfo, ...]

    @property
    def base_offset(self) -> int:
        return self.infos[0].base_offset

    @property
    def next_offset(self) -> int:
        return self.infos[-1].next_offset


AppendBatch = LeaderBatch | RawBatches


@dataclass(frozen=True)
class Outbound:
    """A message to send. For a request the driver POSTs it to ``destination_endpoint``
    (resolved by the core; ``None`` if unknown — then the driver reports ``RpcFailed``) and
    steps the response (or ``RpcFailed``) back in. For a response, the driver answers the
    waiting inbound request with the same ``correlation_id``."""

    destination_id: int
    destination_endpoint: str | None
    message: Message

    @property
    def is_request(self) -> bool:
        return is_request(self.message)


@dataclass(frozen=True)
class ProposalResult:
    """Outcome of one ``propose`` call, keyed by the last offset it returned. ``NONE`` once
    committed; ``LEADERSHIP_LOST`` if the records were truncated away or the leader lost its
    epoch before they committed (they may still commit under a later leader only if they
    were not truncated; the client must treat LEADERSHIP_LOST as unknown outcome)."""

    last_offset: int
    epoch: int
    error: ErrorCode = ErrorCode.NONE
    message: str = ""


@dataclass(frozen=True)
class ReadResult:
    """Linearizable read: serve ``read_id`` once the state machine has applied ``index``."""

    read_id: int
    index: int
    error: ErrorCode = ErrorCode.NONE
    message: str = ""


@dataclass(frozen=True)
class AdminResult:
    """Completion of ``add_voter`` / ``remove_voter`` / ``reassign`` (KIP-856 step 7)."""

    request_id: int
    error: ErrorCode = ErrorCode.NONE
    message: str = ""
    leader_id: int = -1
    leader_epoch: int = 0
    leader_endpoint: str | None = None


@dataclass(frozen=True)
class RoleChange:
    """The role to publish: a transition, or (in a core's first ``Ready``) the role it restored
    from its quorum state. ``election_latency_ms``: for a new leader, time since the replica
    last lost contact with a leader (KIP-595 election-latency metric); else None."""

    role: RoleName
    epoch: int
    leader_id: int
    leader_endpoint: str | None
    is_voter: bool
    at_ms: int
    election_latency_ms: int | None = None


@dataclass(frozen=True)
class SnapshotChunk:
    """Part of a snapshot being fetched: write ``data`` at ``position`` of snapshot ``snapshot_id``
    (``size`` bytes in all)."""

    snapshot_id: OffsetAndEpoch
    position: int
    data: bytes | memoryview
    size: int


@dataclass
class Ready:
    truncate_to: int | None = None
    snapshot_chunks: list[SnapshotChunk] = field(default_factory=list)
    install_snapshot: OffsetAndEpoch | None = None
    append: list[AppendBatch] = field(default_factory=list)
    quorum_state: QuorumState | None = None
    flush: bool = False
    messages: list[Outbound] = field(default_factory=list)
    commit: int | None = None
    proposal_results: list[ProposalResult] = field(default_factory=list)
    reads: list[ReadResult] = field(default_factory=list)
    admin_results: list[AdminResult] = field(default_factory=list)
    role_change: RoleChange | None = None
    recovery_needed: bool = False
    errors: list[str] = field(default_factory=list)
    # The log end offset the core expects once ``append`` is written (for ``advance``).
    end_offset: int = 0

    def is_empty(self) -> bool:
        return not (
            self.truncate_to is not None
            or self.snapshot_chunks
            or self.install_snapshot is not None
            or self.append
            or self.quorum_state is not None
            or self.flush
            or self.messages
            or self.commit is not None
            or self.proposal_results
            or self.reads
            or self.admin_results
            or self.role_change is not None
            or self.recovery_needed
            or self.errors
        )
