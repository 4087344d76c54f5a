"""The one driver of the core: carries out a :class:`~quorum.core.ready.Ready` through the ports.

The contract itself is written once, in :mod:`quorum.core.ready`; this module is where it is
enforced, for the node (through :class:`quorum.driver.runner.AsyncRunner`), the simulation
and the core tests alike. A Ready is carried out in three synchronous phases so that an
asyncio node and a deterministic simulation can interleave other work between them:

``begin(ready)``
    page-cache work: truncate, the leader's append (a follower's fetched batches are written
    by ``persist``, off the loop); the leader's fast path (Fetch responses for what was
    just written leave before the fsync) and the follower's (the next FetchSnapshot leaves
    before this chunk is written). When the Ready saves no quorum state, its messages leave
    here too, and its commit and client results when the commit is already durable locally
    (see "early send" below). Returns a :class:`Pending` saying what must be persisted.
``persist(pending)``
    blocking: write a follower's fetched batches and snapshot chunks (after the last chunk:
    verify the download and decode its state), save the quorum state, fsync the log.
    The node runs it in an executor while inbound RPCs keep stepping the core; the simulation
    completes it later, or crashes first.
``finish(pending)``
    swap in a snapshot ``persist`` prepared, ``core.advance``, send what ``begin`` did not,
    apply the commit, complete client waits, publish the role. Refuses to run before
    ``persist`` when something needed persisting.

Persist-before-send is enforced here, in ``_send``: a message leaves before its Ready's persist
only if that Ready saves no quorum state (a vote, an epoch, a role: every promise a message can
make was then saved by an earlier Ready, which completed before this one began), and a Fetch
never leaves with an offset above the log's fsynced end at that moment (what a follower's Fetch
claims, and the leader counts toward the high watermark) unless the offset is at or
below the core's high watermark (committed records: the pipelining rule of
``quorum.core.replication``). The core queues a strict Fetch only once its whole log
is fsynced, and a pipelined one with the append it follows; the check is the backstop.
Early send is what keeps a write's commit from waiting for a second fsync: the answers
a leader can give once a follower's Fetch proves a batch durable (the Fetch arrives while the
next batch's fsync runs) leave as that fsync completes and the following Ready begins, not after
the following Ready's own fsync. The commit leaves early only up to the local fsynced end: a
follower applies nothing its own log could still lose.

Only one Ready is in flight at a time; whatever the core queues meanwhile waits for the next,
except what ``send_now`` hands out while the persist runs (messages, and a commit within the
durable log with its answers; see ``RaftCore.ready_to_send``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from quorum.core.messages import FetchRequest, FetchSnapshotRequest
from quorum.core.raft import RaftCore
from quorum.core.ready import LeaderBatch, Outbound, RawBatches, Ready, SnapshotChunk
from quorum.driver.ports import Clock, LogPort, QuorumStatePort, Sink, SnapshotPort, StateMachine, Transport
from quorum.driver.recent import DEFAULT_LIMIT_BYTES, RecentBatches
from quorum.records import data_records, decode_batches
from quorum.types import ControlRecord, ErrorCode, KraftError, LogSummary, OffsetAndEpoch, QuorumState

APPLY_READ_BYTES = 16 * 1024 * 1024


class StorageReader:
    """The core's ``LogReader`` over the log and snapshot ports: the WRITTEN log (flushed or
    not; see ``ReplicationMixin.serve_fetch`` for why that is safe) and snapshot chunks."""

    def __init__(self, log: LogPort, snapshots: SnapshotPort) -> None:
        self.log = log
        self.snapshots = snapshots

    def read(self, offset: int, max_bytes: int) -> bytes:
        if offset >= self.log.end_offset:
            return b""
        return self.log.read(offset, max_bytes)

    def read_snapshot(self, snapshot: OffsetAndEpoch, position: int, max_bytes: int) -> tuple[bytes, int]:
        return self.snapshots.read_chunk(snapshot, position, max_bytes)


@dataclass
class Pending:
    """A Ready between ``begin`` and ``finish``: what ``persist`` must do, and whether it did."""

    ready: Ready
    quorum_state: QuorumState | None
    flush: bool
    persisted: bool = False
    durable_end: int = -1
    # ``begin`` applied the commit and completed the client results (early send).
    completed: bool = False
    # How many of ``ready.messages`` ``begin`` saw: the core adds nothing to a Ready in flight.
    taken: int = 0
    # FetchSnapshot chunks written by ``persist`` (off the loop), and the messages ``finish``
    # still has to send (``begin`` may have sent the FetchSnapshot requests already).
    chunks: list[SnapshotChunk] = field(default_factory=list)
    messages: list[Outbound] = field(default_factory=list)
    # A fetched snapshot to install: ``persist`` verifies and decodes it off the loop (its
    # controls and prepared state, or why it was rejected), ``finish`` swaps it in.
    install: OffsetAndEpoch | None = None
    loaded: tuple[tuple[ControlRecord, ...], object] | str | None = None
    # A follower's fetched batches, written by ``persist`` (off the loop) before its fsync.
    raw: list[RawBatches] = field(default_factory=list)

    @property
    def needs_persist(self) -> bool:
        return (
            self.quorum_state is not None or self.flush or bool(self.chunks) or self.install is not None
            or bool(self.raw)
        )


@dataclass
class Ports:
    """Everything the driver talks to (grouped so the constructor stays readable)."""

    log: LogPort
    quorum_state: QuorumStatePort
    snapshots: SnapshotPort
    transport: Transport
    clock: Clock
    state_machine: StateMachine
    sink: Sink


class Driver:
    """Carries out the core's Readies. ``applied_end`` / ``applied_epoch``: what the state
    machine holds at start (the loaded snapshot's end, see :func:`load_latest_snapshot`)."""

    def __init__(self, core: RaftCore, ports: Ports, applied_end: int = 0, applied_epoch: int = 0) -> None:
        self.core = core
        self.ports = ports
        self.applied_end = applied_end
        self.applied_epoch = applied_epoch
        self.in_flight: Pending | None = None
        # Appended, not yet applied: applied without a read-back. Room for what a follower
        # batching its catch-up fsyncs holds unapplied (quorum.core.catchup: the fsync budget
        # and two responses), or those batches would be read back from the log.
        cfg = core.config
        self.recent = RecentBatches(
            max(DEFAULT_LIMIT_BYTES, cfg.catchup_flush_bytes + 2 * cfg.catchup_fetch_max_bytes)
        )
        self.published = core.role_view()  # replaced by the first Ready's role_change

    # ------------------------------------------------------------------ phases

    def begin(self, ready: Ready) -> Pending:
        """Phase 1 (in-memory / page-cache writes). Raises if a Ready is already in flight."""
        if self.in_flight is not None:
            raise RuntimeError("driver: begin() while another Ready is in flight")
        log = self.ports.log
        if ready.truncate_to is not None:
            if self.applied_end > ready.truncate_to:
                raise KraftError(
                    ErrorCode.CORRUPT_LOG,
                    f"truncation to {ready.truncate_to} below the applied offset {self.applied_end}",
                )
            log.truncate_to(ready.truncate_to)
            self.recent.clear()
        chunks: list[SnapshotChunk] = ready.snapshot_chunks
        install = ready.install_snapshot
        # A follower's fetched batches are written by ``persist``, off the loop, which
        # meanwhile receives the next response (a pipelined Fetch leaves below, in this begin).
        raw = [b for b in ready.append if isinstance(b, RawBatches)]
        defer = install is None and len(raw) == len(ready.append)
        if install is not None and ready.append:
            # Never expected (the core drops unsent appends when a download completes): the
            # appends must land in the installed log, so install here, on the loop.
            self._write_chunks(chunks)
            self._install_loaded(install, self._load_fetched(install))
            chunks, install = [], None
        for b in ready.append:
            if isinstance(b, LeaderBatch):
                log.append(b.base_offset, b.epoch, b.items(), b.append_time_ms)
                self.recent.add_leader(b)
            else:
                if not defer:
                    log.append_batches(b.data, b.infos)
                self.recent.add_fetched(b)
        if ready.append and ready.quorum_state is None and not defer:
            # Fast path (leader): parked Fetches get what was just written before our fsync.
            # Not while this Ready's epoch change is unsaved: responses carry the epoch.
            for out in self.core.appended(log.end_offset, self.ports.clock.now_ms()):
                self.ports.transport.send(out)
        messages = ready.messages
        if chunks and ready.quorum_state is None:
            # KIP-630 catch-up pipelined: the next FetchSnapshot leaves now and travels while
            # ``persist`` writes this chunk off the loop. It claims nothing durable (a download
            # cut short restarts from position 0), so it need not wait for the write; chunks
            # still reach the file in order (one Ready in flight at a time).
            early = [o for o in messages if isinstance(o.message, FetchSnapshotRequest)]
            for out in early:
                self.ports.transport.send(out)
            messages = [o for o in messages if not isinstance(o.message, FetchSnapshotRequest)]
        pending = Pending(ready, ready.quorum_state, ready.flush, chunks=chunks, messages=messages,
                          install=install, raw=raw if defer else [])
        pending.taken = len(ready.messages)
        self.in_flight = pending
        if ready.quorum_state is None:
            # Early send (module docstring): nothing here waits for this Ready's persist.
            self._send(pending.messages)
            pending.messages = []
            if ready.commit is None or ready.commit <= log.flushed_end_offset:
                self._complete(ready)
                pending.completed = True
        return pending

    def send_now(self) -> bool:
        """While a Ready's persist runs (between ``begin`` and ``finish``): send what the core
        lets leave without a persist (``RaftCore.ready_to_send``: messages, and a commit within
        the durable log with its client answers). Nothing while the Ready in flight saves
        quorum state (the messages could carry the epoch or vote it saves). A Fetch that proves
        a batch durable on a follower then commits it and answers its clients at once, instead
        of after the fsync of the batch the leader is writing meanwhile. True if anything left."""
        if self.in_flight is not None and self.in_flight.quorum_state is not None:
            return False
        ready = self.core.ready_to_send()
        if ready is None or ready.is_empty():
            return False
        self._send(ready.messages)
        self._complete(ready)
        return True

    def _send(self, messages: list[Outbound]) -> None:
        flushed = self.ports.log.flushed_end_offset
        for out in messages:
            msg = out.message
            if isinstance(msg, FetchRequest) and msg.fetch_offset > max(flushed, self.core.hw):
                # The leader would count records we could still lose: a core bug.
                raise RuntimeError(
                    f"driver: a Fetch at offset {msg.fetch_offset} would claim more than the "
                    f"durable log end {flushed} and the high watermark {self.core.hw}"
                )
            self.ports.transport.send(out)

    def _complete(self, ready: Ready) -> None:
        """Apply the commit, then complete the client waits it names."""
        sink = self.ports.sink
        if ready.commit is not None:
            # Never beyond the local fsynced end: a follower batching its catch-up fsyncs
            # (quorum.core.replication) applies what it fetched once it is durable here.
            self.apply_to(min(ready.commit, self.ports.log.flushed_end_offset))
        for pr in ready.proposal_results:
            sink.proposal_done(pr)
        for rr in ready.reads:
            sink.read_done(rr)
        for ar in ready.admin_results:
            sink.admin_done(ar)

    def _write_chunks(self, chunks: list[SnapshotChunk]) -> None:
        for ch in chunks:
            if ch.position == 0:
                self.ports.snapshots.begin_download(ch.snapshot_id)
            self.ports.snapshots.write_chunk(ch.snapshot_id, ch.position, ch.data)

    def persist(self, pending: Pending) -> int:
        """Phase 2 (blocking; safe to run in an executor: touches storage only). Returns the
        durable log end."""
        self._write_chunks(pending.chunks)
        if pending.install is not None:
            pending.loaded = self._load_fetched(pending.install)
        for b in pending.raw:
            self.ports.log.append_batches(b.data, b.infos)
        if pending.quorum_state is not None:
            self.ports.quorum_state.save(pending.quorum_state)
        if pending.flush:
            self.ports.log.flush()
        pending.durable_end = self.ports.log.flushed_end_offset
        pending.persisted = True
        return pending.durable_end

    def finish(self, pending: Pending) -> None:
        """Phase 3: advance the core, then send, apply and complete."""
        if pending is not self.in_flight:
            raise RuntimeError("driver: finish() of a Ready that is not the one in flight")
        if pending.needs_persist and not pending.persisted:
            raise RuntimeError("driver: finish() before persist(): messages would promise unsaved state")
        self.in_flight = None
        durable = pending.durable_end if pending.persisted else self.ports.log.flushed_end_offset
        if pending.install is not None and pending.loaded is not None:
            self._install_loaded(pending.install, pending.loaded)
            durable = self.ports.log.flushed_end_offset  # the log now starts at the snapshot
        ready = pending.ready
        self.core.advance(ready, durable)
        # The core adds nothing to a Ready in flight (quorum.core.ready); for a core that does
        # (the old one with the Fetch-offset durability hole, kept in tests/core) every Fetch
        # claim is still checked.
        self._send(pending.messages + ready.messages[pending.taken :])
        if not pending.completed:
            self._complete(ready)
        caught = min(self.core.hw, self.ports.log.flushed_end_offset)
        if self.applied_end < caught:
            self.apply_to(caught)  # committed earlier, durable only with this Ready's fsync
        sink = self.ports.sink
        if ready.role_change is not None:
            self.published = ready.role_change
            sink.role_changed(ready.role_change)
        if ready.recovery_needed:
            sink.recovery_needed()
        for e in ready.errors:
            sink.note(e)

    def carry_out(self, ready: Ready) -> None:
        """All three phases at once (tests, tools)."""
        pending = self.begin(ready)
        if pending.needs_persist:
            self.persist(pending)
        self.finish(pending)

    def run_until_idle(self, limit: int = 1000) -> int:
        """Carry out Readies until the core has nothing to do; returns how many. Raises if the
        core never goes idle (a bug: a Ready that always asks for another)."""
        for n in range(limit):
            ready = self.core.ready()
            if ready.is_empty():
                return n
            self.carry_out(ready)
        raise RuntimeError(f"driver: the core produced {limit} Readies without going idle")

    # ------------------------------------------------------------------ state machine

    def apply_to(self, commit: int) -> None:
        """Apply committed data batches below ``commit`` (control batches only advance the
        applied offset; the core applied them when they were appended, KIP-856). Batches this
        node appended since it started come from memory (``recent``); others from the log."""
        sm = self.ports.state_machine
        start = self.applied_end
        while self.applied_end < commit:
            b = self.recent.take(self.applied_end)
            if b is None:
                if not self._apply_from_log(commit):
                    break
                continue
            if b.next_offset > commit:
                self.recent.put_back(b)
                break
            if not b.is_control:
                sm.apply_batch(b.base_offset, b.data())
            self.applied_end = b.next_offset
            self.applied_epoch = b.epoch
        if self.applied_end != start:
            self.ports.sink.applied(self.applied_end, self.applied_epoch)

    def _apply_from_log(self, commit: int) -> bool:
        """Apply committed batches read back from the log, up to the next one held in memory;
        False if nothing could be applied."""
        log, sm = self.ports.log, self.ports.state_machine
        held = self.recent.peek_base()
        stop = commit if held is None or held <= self.applied_end else min(commit, held)
        data = log.read(self.applied_end, APPLY_READ_BYTES, stop)
        if not data:
            return False
        start = self.applied_end
        batches, _used = decode_batches(data, verify_crc=False)
        for b in batches:
            if b.info.next_offset > stop:
                break
            if not b.info.is_control:
                sm.apply_batch(b.info.base_offset, data_records(b))
            self.applied_end = b.info.next_offset
            self.applied_epoch = b.info.epoch
        return self.applied_end != start

    def _load_fetched(self, sid: OffsetAndEpoch) -> tuple[tuple[ControlRecord, ...], object] | str:
        """The blocking half of installing a fetched snapshot (``persist``, off the loop; it
        touches storage and builds a new state, never the live one): verify and commit the
        download, decode its state. Returns (controls, prepared state), or why it failed."""
        try:
            self.ports.snapshots.finish_download(sid)  # verifies every CRC before it counts
            controls, chunks = self.ports.snapshots.load(sid, verify_crc=False)
            return tuple(controls), self.ports.state_machine.prepare_snapshot(chunks)
        except KraftError as e:
            return str(e)

    def _install_loaded(
        self, sid: OffsetAndEpoch, loaded: tuple[tuple[ControlRecord, ...], object] | str
    ) -> None:
        """The loop half: swap the prepared state in, reset the log, tell the core."""
        if isinstance(loaded, str):
            self.ports.sink.note(f"fetched snapshot {sid} rejected: {loaded}")
            self.core.snapshot_rejected(sid, loaded)
            return
        controls, state = loaded
        self.ports.state_machine.install_snapshot(state, sid.offset - 1)
        self.ports.log.reset_to_snapshot(sid)
        self.recent.clear()
        self.applied_end = sid.offset
        self.applied_epoch = sid.epoch
        self.core.snapshot_installed(sid, controls)


def load_latest_snapshot(snapshots: SnapshotPort, summary: LogSummary, sm: StateMachine) -> tuple[int, int]:
    """At start: load the snapshot the log summary names into the state machine; returns the
    ``(applied_end, applied_epoch)`` to construct the :class:`Driver` with."""
    if summary.snapshot is None:
        return summary.log_start_offset, 0
    _controls, chunks = snapshots.load(summary.snapshot)
    sm.load_snapshot(chunks, summary.snapshot.offset - 1)
    return summary.snapshot.offset, summary.snapshot.epoch
