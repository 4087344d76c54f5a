"""The narrow ports the driver (``quorum.driver.driver``) needs, as Protocols.

Each port names only what the driver calls. The storage ports are satisfied by the file
implementations in ``quorum.storage`` and by their in-memory twins in
``quorum.storage.memory`` (``MemoryLog.crash()`` models a power loss); the node supplies an
HTTP transport and the wall clock, the simulation a simulated network and clock, the core
tests :class:`quorum.driver.memory.QueueTransport` and :class:`~quorum.driver.memory.ManualClock`.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Protocol

from quorum.core.ready import AdminResult, Outbound, ProposalResult, ReadResult, RoleChange
from quorum.types import BatchInfo, ControlRecord, OffsetAndEpoch, QuorumState


class LogPort(Protocol):
    """The replicated log (KIP-595): ``append`` is the leader path (encodes one batch),
    ``append_batches`` the follower path (bytes as fetched). Writes land in the page cache;
    ``flush`` makes them durable; ``truncate_to`` and ``reset_to_snapshot`` are durable on
    return."""

    @property
    def end_offset(self) -> int: ...
    @property
    def flushed_end_offset(self) -> int: ...

    def append(
        self,
        base_offset: int,
        epoch: int,
        items: Sequence[bytes] | Sequence[ControlRecord],
        append_time_ms: int | None = None,
    ) -> BatchInfo: ...
    def append_batches(self, data: bytes | memoryview, infos: Sequence[BatchInfo]) -> None: ...
    def flush(self) -> None: ...
    def truncate_to(self, end_offset: int) -> None: ...
    def read(self, offset: int, max_bytes: int, max_offset: int | None = None) -> bytes: ...
    def reset_to_snapshot(self, snapshot_id: OffsetAndEpoch) -> None: ...


class QuorumStatePort(Protocol):
    """KIP-856 QuorumStateData, saved atomically and durably."""

    def save(self, state: QuorumState) -> None: ...


class SnapshotPort(Protocol):
    """KIP-630 snapshots: serving chunks to followers and installing a fetched one."""

    def read_chunk(self, snapshot_id: OffsetAndEpoch, position: int, max_bytes: int) -> tuple[bytes, int]: ...
    def begin_download(self, snapshot_id: OffsetAndEpoch) -> None: ...
    def write_chunk(self, snapshot_id: OffsetAndEpoch, position: int, data: bytes | memoryview) -> None: ...
    def finish_download(self, snapshot_id: OffsetAndEpoch) -> str: ...
    def load(
        self, snapshot_id: OffsetAndEpoch, *, verify_crc: bool = True
    ) -> tuple[tuple[ControlRecord, ...], Sequence[bytes | memoryview]]: ...


class Transport(Protocol):
    """Carries the core's messages. ``send`` never blocks: for a request it starts the call
    and later steps the response (or ``RpcFailed`` on any failure) into the core; for a
    response it answers the waiting inbound request with the same correlation id."""

    def send(self, out: Outbound) -> None: ...


class Clock(Protocol):
    def now_ms(self) -> int: ...


class StateMachine(Protocol):
    """What committed data records are applied to (the KV store, the simulation's map)."""

    def apply_batch(self, base_offset: int, records: Iterable[bytes]) -> None: ...
    def load_snapshot(self, chunks: Iterable[bytes | memoryview], applied_offset: int) -> None: ...
    # A fetched snapshot is installed in two steps: ``prepare_snapshot`` decodes it
    # in ``persist``, off the event loop, and must not touch the live state; then
    # ``install_snapshot`` swaps the prepared state in, on the loop, in ``finish``.
    def prepare_snapshot(self, chunks: Iterable[bytes | memoryview]) -> object: ...
    def install_snapshot(self, state: object, applied_offset: int) -> None: ...


class Sink(Protocol):
    """Where the driver reports what it carried out: client completions (after the records
    they name are applied), the published role, progress of the state machine, notes."""

    def proposal_done(self, result: ProposalResult) -> None: ...
    def read_done(self, result: ReadResult) -> None: ...
    def admin_done(self, result: AdminResult) -> None: ...
    def role_changed(self, view: RoleChange) -> None: ...
    def applied(self, applied_end: int, applied_epoch: int) -> None: ...
    def recovery_needed(self) -> None: ...
    def note(self, message: str) -> None: ...
