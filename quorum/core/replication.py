"""Pull replication (KIP-595 Fetch, KIP-630 FetchSnapshot) on both sides.

Leader side: validates the fetch position against the epoch cache (DivergingEpoch) and the log
start (snapshot id), records the replica's progress under its (id, UUID) (KIP-856), moves the
high watermark, and answers from the WRITTEN log (``LogReader``, fsynced or not: see
``serve_fetch``), or parks the request (long poll) until data is written, the high watermark
moves, a read-index round needs confirmation, or ``max_wait`` passes.

Follower side: one Fetch in flight; its offset is a claim the leader counts toward the high
watermark, so it is sent only when :meth:`ReplicationMixin.fetch_claim_ok` holds (the whole
local log is durable, or the offset is already committed: the pipelining rule below); a response's
bytes are decoded with ``quorum.records.decode_batches`` (CRC checked, headers only) and
must start exactly at the local log end with non-decreasing epochs no newer than the leader's,
else the response is rejected (noted in ``Ready.errors``) and the fetch retried: nothing of it
is appended. Control batches update the voter history at once (KIP-856). The local high
watermark is the leader's capped at the local log end.

Replicas that know no leader (observers, a replaced disk, a voter that missed
BeginQuorumEpoch) send "discovery" Fetches to a known voter; any answer names the leader.

Pipelined catch-up, with no wire change. INVARIANT: a Fetch whose ``fetch_offset``
is above the sender's fsynced log end names an offset at or below the sender's high watermark,
and a replica's high watermark is always an offset some leader committed (the leader's, capped
at the local end; at start the applied offset or the snapshot's). Why a claim about committed,
not yet durable records is harmless: the leader counts a replica's claim ``c`` only toward a
candidate high watermark ``x <= c`` (``LeaderState.majority_end``), and moves its high watermark
only to an ``x`` above both its current one and its epoch start offset (``update_leader_hw``;
KIP-595 Fetch handling, leader step 4: only once an entry of its own epoch is on a majority).
If the claim names the leader's own committed offsets, ``x <= c <= hw`` moves nothing; if it
names offsets committed under an earlier leader, the current leader holds them (KIP-595 leader
completeness), so ``c <= epoch start offset < x``. So every majority that moves a high
watermark consists of durable claims, in any voter set, also one that has just added this
replica (KIP-853, as KIP-642 says: replicas act on a voter set as soon as it is appended, and
the new set's high watermark is counted the same way). A power cut loses the non-durable
records; the replica then fetches from its real end, and those records stay durable on the
majority that committed them. Near the tail (offset above the known high watermark) the strict
rule stands: the next Fetch waits for the fsync; so does the one whose batches reach the high
watermark the leader told (``catchup.far_behind`` no longer holds), and any Fetch of a replica
not following: the leader hears "caught up" only from a durable log. Memory stays bounded: the
next Fetch leaves only once every fetched batch has been handed to the driver (``ready`` sends it in the same
Ready as the append, before that Ready's write and fsync), so one response travels while the
previous one is written and fsynced. The simulation checks every such claim against what was
really committed, with power cuts (tests/sim, ``test_pipelined_catchup_power_loss``).

Batched fsyncs and larger fetches while far behind: :mod:`quorum.core.catchup`.
"""

from __future__ import annotations

from quorum.core import catchup
from quorum.core.base import InFlight, epoch_allowed
from quorum.core.election import ElectionMixin
from quorum.core.messages import FetchRequest, FetchResponse, FetchSnapshotRequest, FetchSnapshotResponse
from quorum.core.progress import LeaderState, ParkedFetch
from quorum.core.ready import LeaderBatch, RawBatches, SnapshotChunk
from quorum.core.roles import Follower, Leader
from quorum.records import CorruptRecordError, decode_batches
from quorum.types import ErrorCode, KraftError, OffsetAndEpoch, ReplicaKey


class ReplicationMixin(ElectionMixin):
    # When this leader last served a FetchSnapshot chunk (-1: never). A new snapshot deletes
    # the one a replica is downloading, and its log prefix with it, so the download would start
    # over: the node's snapshotter waits while a download is going on.
    snapshot_served_ms: int = -1

    # ================================================================== leader side

    def snapshot_being_fetched(self, within_ms: int) -> bool:
        """A replica fetched a snapshot chunk from this leader in the last ``within_ms``."""
        return self.snapshot_served_ms >= 0 and self.now - self.snapshot_served_ms < within_ms

    def fetch_response(self, req: FetchRequest, code: ErrorCode, **kw: object) -> FetchResponse:
        return FetchResponse(
            correlation_id=req.correlation_id,
            error_code=code,
            leader_id=self.leader_id(),
            leader_epoch=self.epoch,
            high_watermark=self.hw,
            log_start_offset=self.meta.log_start,
            leader_endpoint=self.leader_endpoint(),
            **kw,  # type: ignore[arg-type]
        )

    def answer_fetch_not_leader(self, req: FetchRequest) -> None:
        code = ErrorCode.NOT_LEADER
        if req.current_leader_epoch < self.epoch:
            code = ErrorCode.FENCED_LEADER_EPOCH
        elif req.current_leader_epoch > self.epoch:
            code = ErrorCode.UNKNOWN_LEADER_EPOCH
        self.respond(req.replica_id, self.fetch_response(req, code))

    def handle_fetch_request(self, req: FetchRequest) -> None:
        if req.cluster_id != self.cluster_id:
            self.respond(req.replica_id, self.fetch_response(req, ErrorCode.INCONSISTENT_CLUSTER_ID))
            return
        if (
            req.fetch_offset < 0
            or req.last_fetched_epoch < 0
            or req.max_bytes <= 0
            or req.max_wait_ms < 0
            or not epoch_allowed(req.current_leader_epoch)
            or not epoch_allowed(req.last_fetched_epoch)
        ):
            self.respond(req.replica_id, self.fetch_response(req, ErrorCode.INVALID_REQUEST))
            return
        if self.retired(req.replica_id, req.replica_uuid):
            self.respond(req.replica_id, self.fetch_response(req, ErrorCode.NOT_VOTER))
            return
        # Where we send requests is learned from the voter set and configuration only (issue
        # 8: a Fetch claiming replica 2 must not redirect anyone's traffic); the endpoint a
        # replica reports is kept in its progress, for the AddVoter record that may name it.
        self.learn_uuid(req.replica_id, req.replica_uuid)
        # A Fetch is a leader-only request: one from a higher epoch never unseats us, whoever
        # sends it (Kafka's validateLeaderOnlyRequest answers UNKNOWN_LEADER_EPOCH, KIP-595).
        ls = self.leader_state()
        if (
            ls is not None
            and req.current_leader_epoch > self.epoch
            and self.voters().contains(ReplicaKey(req.replica_id, req.replica_uuid))
        ):
            # A current VOTER ahead of our epoch (it campaigned while cut off; the others refuse
            # its Votes while we lead) has no other way back: we answer UNKNOWN_LEADER_EPOCH and
            # run for the epoch above its, with our log (the longest) and our followers' votes
            # (they grant their own leader's Vote), so the same leader leads on in an epoch the
            # stranded voter can follow.
            self.answer_fetch_not_leader(req)
            self.campaign_above(req.current_leader_epoch)
            return
        if ls is None or req.current_leader_epoch != self.epoch:
            self.answer_fetch_not_leader(req)
            return
        key = ReplicaKey(req.replica_id, req.replica_uuid)
        if key not in ls.progress and not self.voters().contains(key):
            cfg = self.config  # room for one more observer
            ls.forget_observers(self.voters(), self.now, cfg.observer_expiry_ms, cfg.max_observers - 1)
        p = ls.replica(key)
        p.last_fetch_ms = self.now
        p.acked_round = ls.read_round
        if req.replica_endpoint:
            p.endpoint = req.replica_endpoint
        # KIP-630: below the log start the replica must fetch the snapshot.
        if req.fetch_offset < self.meta.log_start and self.meta.snapshot is not None:
            self.respond(
                req.replica_id, self.fetch_response(req, ErrorCode.NONE, snapshot_id=self.meta.snapshot)
            )
            return
        diverging = self.check_divergence(req.fetch_offset, req.last_fetched_epoch)
        if diverging is not None:
            if (
                diverging.offset < self.meta.log_start or diverging.offset < 0
            ) and self.meta.snapshot is not None:
                self.respond(
                    req.replica_id, self.fetch_response(req, ErrorCode.NONE, snapshot_id=self.meta.snapshot)
                )
            else:
                if diverging.offset < 0:
                    diverging = OffsetAndEpoch(self.meta.log_start, 0)
                self.respond(
                    req.replica_id, self.fetch_response(req, ErrorCode.NONE, diverging_epoch=diverging)
                )
            return
        p.end_offset = req.fetch_offset
        if req.fetch_offset >= self.meta.durable_end:
            p.last_caught_up_ms = self.now
        if self.voters().contains(key):
            # A voter fetching in this epoch knows the leader: stop BeginQuorumEpoch retries
            # (entries may be keyed by the bootstrap form (id, None) or by (id, UUID)).
            for k in [k for k in ls.begin_epoch_due if k.id == key.id and k.uuid in (None, key.uuid)]:
                del ls.begin_epoch_due[k]
        self.update_leader_hw()
        self.on_replica_progress(ls, key)
        if self.leader_state() is not ls:
            self.answer_fetch_not_leader(req)
            return
        self.serve_fetch(ls, req, allow_park=True)

    def on_replica_progress(self, ls: LeaderState, key: ReplicaKey) -> None:
        """Hook: membership checks catch-up conditions and bootstrapping."""

    def check_divergence(self, fetch_offset: int, last_epoch: int) -> OffsetAndEpoch | None:
        """KIP-595: None if the follower's log is a prefix of ours at ``fetch_offset``, else
        the (end offset, epoch) it must truncate to."""
        if fetch_offset == 0 and last_epoch == 0:
            return None
        found = self.meta.end_offset_for_epoch(last_epoch)
        if found is None:
            # Older than anything this log knows: only the snapshot can help (the caller
            # turns an offset below the log start into a snapshot id).
            return OffsetAndEpoch(-1, 0)
        if found.epoch != last_epoch or found.offset < fetch_offset:
            return found
        if fetch_offset > self.meta.end:
            return OffsetAndEpoch(self.meta.end, self.meta.last_epoch())
        return None

    def serve_fetch(self, ls: LeaderState, req: FetchRequest, allow_park: bool) -> None:
        # Serve what is written, fsynced or not (as Kafka's leader does), so the followers'
        # fsyncs overlap the leader's. Safe: the high watermark counts the leader's own log only
        # up to its durable end and a follower's only up to the offset it fetches next, which it
        # sends after its own fsync; a committed record is therefore durable on a majority.
        data = b""
        if req.fetch_offset < self.meta.written_end:
            limit = catchup.serve_max_bytes(req.fetch_offset, self.hw, self.config)
            data = self.reader.read(req.fetch_offset, min(req.max_bytes, limit))
        if not data and allow_park and req.max_wait_ms > 0 and not ls.pending_reads:
            wait = min(req.max_wait_ms, self.config.fetch_max_wait_ms)
            ls.parked[req.correlation_id] = ParkedFetch(req, self.now + wait)
            return
        self.respond(req.replica_id, self.fetch_response(req, ErrorCode.NONE, records=data))

    def release_parked(self, ls: LeaderState, everything: bool) -> None:
        """Answer parked fetches: those with written data to send, or all of them (the high
        watermark moved, a read-index round needs confirmation, or the leader steps down)."""
        for corr, pf in list(ls.parked.items()):
            if everything or pf.request.fetch_offset < self.meta.written_end or self.now >= pf.deadline:
                del ls.parked[corr]
                self.serve_fetch(ls, pf.request, allow_park=False)

    def update_leader_hw(self) -> None:
        ls = self.leader_state()
        if ls is None:
            return
        candidate = ls.majority_end(self.voters(), self.local, self.meta.durable_end)
        # Only once the leader's own epoch has an entry committed (its LeaderChangeMessage).
        if candidate > ls.epoch_start_offset and candidate > self.hw:
            self.set_hw(candidate)
            self.release_parked(ls, everything=True)

    def handle_fetch_snapshot_request(self, req: FetchSnapshotRequest) -> None:
        def answer(code: ErrorCode, **kw: object) -> None:
            self.respond(
                req.replica_id,
                FetchSnapshotResponse(
                    req.correlation_id,
                    code,
                    self.leader_id(),
                    self.epoch,
                    leader_endpoint=self.leader_endpoint(),
                    **kw,  # type: ignore[arg-type]
                ),
            )

        if req.cluster_id != self.cluster_id:
            answer(ErrorCode.INCONSISTENT_CLUSTER_ID)
            return
        if self.retired(req.replica_id, req.replica_uuid):
            answer(ErrorCode.NOT_VOTER)
            return
        ls = self.leader_state()
        if ls is None or req.current_leader_epoch != self.epoch:
            code = ErrorCode.NOT_LEADER
            if req.current_leader_epoch < self.epoch:
                code = ErrorCode.FENCED_LEADER_EPOCH
            answer(code)
            return
        p = ls.replica(ReplicaKey(req.replica_id, req.replica_uuid))
        p.last_fetch_ms = self.now
        if req.position < 0 or req.max_bytes <= 0:
            answer(ErrorCode.INVALID_REQUEST)
            return
        try:
            chunk, size = self.reader.read_snapshot(
                req.snapshot_id, req.position, min(req.max_bytes, self.config.snapshot_chunk_bytes)
            )
        except KraftError as e:
            answer(e.code if e.code is ErrorCode.POSITION_OUT_OF_RANGE else ErrorCode.SNAPSHOT_NOT_FOUND)
            return
        if req.position > size:
            answer(ErrorCode.POSITION_OUT_OF_RANGE)
            return
        self.snapshot_served_ms = self.now
        answer(
            ErrorCode.NONE,
            snapshot_id=req.snapshot_id,
            size=size,
            position=req.position,
            unaligned_records=chunk,
        )

    # ================================================================== follower side

    def fetch_claim_ok(self, offset: int) -> bool:
        """May a Fetch claim ``offset`` (module docstring, "Pipelined catch-up")? True when the
        log below it is fsynced, or when it is at or below the (committed) high watermark."""
        return offset <= self.meta.durable_end or offset <= self.hw

    def send_fetch(self, dest: ReplicaKey) -> None:
        assert self.fetch_claim_ok(self.meta.end), "a Fetch may claim only durable or committed records"
        req = FetchRequest(
            correlation_id=self.new_corr(),
            cluster_id=self.cluster_id,
            replica_id=self.local.id,
            replica_uuid=self.local.uuid,
            current_leader_epoch=self.epoch,
            fetch_offset=self.meta.end,
            last_fetched_epoch=self.meta.last_epoch() if self.meta.end > 0 else 0,
            max_wait_ms=self.config.fetch_max_wait_ms,
            max_bytes=catchup.fetch_max_bytes(self.role, self.meta.end, self.config),
            replica_endpoint=self.config.local_endpoint,
        )
        self.fetch_corr = req.correlation_id
        self.send_request(dest, "fetch", req, extra_timeout=self.config.fetch_max_wait_ms)

    def send_fetch_snapshot(self, dest: ReplicaKey) -> None:
        assert self.snap_fetch is not None
        sid, position, _size = self.snap_fetch
        req = FetchSnapshotRequest(
            correlation_id=self.new_corr(),
            cluster_id=self.cluster_id,
            replica_id=self.local.id,
            replica_uuid=self.local.uuid,
            current_leader_epoch=self.epoch,
            snapshot_id=sid,
            position=position,
            max_bytes=self.config.snapshot_chunk_bytes,
            replica_endpoint=self.config.local_endpoint,
        )
        self.fetch_corr = req.correlation_id
        self.send_request(dest, "fetch_snapshot", req)

    def tick_fetch(self) -> None:
        """Keep one Fetch in flight to the leader, or a discovery Fetch when leaderless."""
        if self.fetch_corr is not None or self.snap_installing is not None:
            return
        if self.meta.durable_end < self.meta.end and (
            self._append
            or not self.fetch_claim_ok(self.meta.end)
            or not catchup.far_behind(self.role, self.meta.end)
        ):
            # A Fetch's offset claims "durable below here" and the leader counts it toward the
            # high watermark: wait until the appended batches are fsynced (``advance``), unless
            # they are committed already and handed to the driver (pipelining, module docstring)
            # and more committed records are still to fetch: the Fetch that tells the leader
            # this replica caught up (KIP-856 AddVoter's check) follows the fsync of everything.
            return
        role = self.role
        if isinstance(role, Leader):
            return
        if isinstance(role, Follower):
            if self.now < self.fetch_retry_at:
                return
            dest = ReplicaKey(role.leader_id, None)
            if self.snap_fetch is not None:
                self.send_fetch_snapshot(dest)
            else:
                self.send_fetch(dest)
            return
        if self.now < self.discovery_at:
            return
        self.discovery_at = self.now + self.config.election_timeout_ms // 2
        candidates = sorted(i for i in self.endpoints if i != self.local.id)
        if self.voters().ids():
            pref = sorted(i for i in self.voters().ids() if i != self.local.id and i in self.endpoints)
            candidates = pref or candidates
        if candidates:
            self.send_fetch(ReplicaKey(self.rng.choice(candidates), None))

    def fetch_failed(self, inf: InFlight) -> None:
        if inf.correlation_id == self.fetch_corr:
            self.fetch_corr = None
            self.fetch_retry_at = self.now + min(100, self.config.election_timeout_ms // 10)

    def handle_fetch_response(self, resp: FetchResponse, inf: InFlight) -> None:
        if inf.correlation_id != self.fetch_corr:
            return
        self.fetch_corr = None
        if resp.leader_id == inf.destination.id and resp.error_code is ErrorCode.NONE:
            self.abandoned = (-1, -1)  # the leader itself answered: it is alive
        if resp.leader_epoch > self.epoch or (
            resp.leader_epoch == self.epoch and resp.leader_id >= 0 and not isinstance(self.role, Follower)
        ):
            self.observe_leader(resp.leader_epoch, resp.leader_id, resp.leader_endpoint)
        role = self.role
        if (
            not isinstance(role, Follower)
            or resp.leader_epoch != self.epoch
            or resp.leader_id != role.leader_id
        ):
            return
        if resp.error_code is not ErrorCode.NONE:
            self.fetch_retry_at = self.now + min(100, self.config.election_timeout_ms // 10)
            return
        self.last_leader_contact_ms = self.now
        role.fetch_deadline = self.now + self.config.fetch_timeout_ms
        if resp.diverging_epoch is not None:
            to = self.truncation_point(resp.diverging_epoch)
            if to < self.hw:
                self._errors.append(
                    f"leader asked to truncate to {to} below the high watermark {self.hw}; ignored"
                )
                self.fetch_retry_at = self.now + self.config.election_timeout_ms
                return
            self.truncate(to)
            return
        if resp.snapshot_id is not None:
            self.snapshot_offered(resp.snapshot_id, resp.log_start_offset)
            return
        if resp.records:
            if not self.append_fetched(resp.records, resp.leader_epoch):
                self.fetch_retry_at = self.now + min(100, self.config.election_timeout_ms // 10)
                return
        if resp.high_watermark >= 0:
            role.leader_hw = resp.high_watermark
            self.set_hw(min(resp.high_watermark, self.meta.end))

    def defer_flush(self, append: list[LeaderBatch | RawBatches]) -> bool:
        """May the Ready handing over ``append`` skip its fsync (:mod:`quorum.core.catchup`)?"""
        return catchup.defer_flush(self.role, self.meta.end, self.config.catchup_flush_bytes, append)

    def snapshot_offered(self, snapshot_id: OffsetAndEpoch, leader_log_start: int) -> None:
        """The leader of our epoch names a snapshot to fetch (KIP-630). Installing it replaces
        the whole local log, so only a snapshot past our high watermark is taken,
        and only while our fetch position is below the leader's log start. If it is not (our
        log diverges below the leader's log start), the uncommitted entries above our high
        watermark go first: the next Fetch, from there, gets the snapshot the normal way."""
        if snapshot_id.offset <= self.hw or snapshot_id.offset < leader_log_start:
            self._errors.append(
                f"snapshot {snapshot_id} offered with log start {leader_log_start} at high watermark "
                f"{self.hw}: refused (it would replace committed records)"
            )
            self.fetch_retry_at = self.now + self.config.election_timeout_ms
            return
        if self.meta.end >= leader_log_start:
            if self.meta.end > self.hw:
                self.truncate(self.hw)
            return
        self.snap_fetch = (snapshot_id, 0, -1)

    def truncation_point(self, diverging: OffsetAndEpoch) -> int:
        """Where to truncate for the leader's DivergingEpoch (KIP-595; as Kafka's
        ``truncateToEndOffset``). Only when this log's last epoch at or below the named one IS
        that epoch do the two logs share its batches (copied byte for byte from that epoch's
        leader), so the smaller end is a batch boundary here too. Otherwise truncate to where
        this log's own epoch ends (a boundary); the next Fetch narrows the divergence further.
        Cutting at the leader's offset there could split one of our batches."""
        mine = self.meta.end_offset_for_epoch(diverging.epoch)
        if mine is None:
            to = diverging.offset
        elif mine.epoch == diverging.epoch:
            to = min(diverging.offset, mine.offset)
        else:
            to = mine.offset
        return min(to, self.meta.end)

    def append_fetched(self, records: bytes | memoryview, leader_epoch: int) -> bool:
        try:
            batches, used = decode_batches(records)
        except CorruptRecordError as e:
            self._errors.append(f"corrupt Fetch response rejected: {e.message}")
            return False
        if used != len(records) or not batches:
            self._errors.append("Fetch response holds a partial batch; rejected")
            return False
        expect = self.meta.end
        last_epoch = self.meta.last_epoch()
        for b in batches:
            if b.info.base_offset != expect or b.info.epoch < last_epoch or b.info.epoch > leader_epoch:
                self._errors.append(
                    f"Fetch response batch at offset {b.info.base_offset} epoch {b.info.epoch} does not "
                    f"follow the local log (end {expect}, last epoch {last_epoch}); rejected"
                )
                return False
            expect = b.info.next_offset
            last_epoch = b.info.epoch
        infos = tuple(b.info for b in batches)
        self._append.append(RawBatches(records, infos))  # as received: a view, no copy
        before = self.voters()
        for info in infos:
            self.meta.append(info.base_offset, info.epoch, info.count)
            if info.controls:
                self.history.apply_batch(info.base_offset, info.controls)
                self.learn_record_endpoints(info.controls)
        if self.voters() != before:
            self.on_voters_changed(before)
        return True

    def handle_fetch_snapshot_response(self, resp: FetchSnapshotResponse, inf: InFlight) -> None:
        if inf.correlation_id != self.fetch_corr:
            return
        self.fetch_corr = None
        if resp.leader_epoch > self.epoch:
            self.observe_leader(resp.leader_epoch, resp.leader_id, resp.leader_endpoint)
            return
        role = self.role
        if not isinstance(role, Follower) or self.snap_fetch is None:
            return
        sid, position, _size = self.snap_fetch
        if resp.error_code is not ErrorCode.NONE or resp.snapshot_id != sid or resp.position != position:
            if resp.error_code in (ErrorCode.SNAPSHOT_NOT_FOUND, ErrorCode.POSITION_OUT_OF_RANGE):
                self.snap_fetch = None  # re-fetch: the leader will name its current snapshot
            self.fetch_retry_at = self.now + min(100, self.config.election_timeout_ms // 10)
            return
        self.last_leader_contact_ms = self.now
        role.fetch_deadline = self.now + self.config.fetch_timeout_ms
        data = resp.unaligned_records
        self._chunks.append(SnapshotChunk(sid, position, data, resp.size))
        position += len(data)
        if position >= resp.size:
            self.snap_fetch = None
            self.snap_installing = sid
            self._install = sid
            # Everything in the local log is replaced by the snapshot (KIP-630); batches not yet
            # handed to the driver are dropped (and forgotten, in case the install fails).
            if self._append:
                first = self._append[0].base_offset
                self._append = []
                self.meta.truncate(first)
                self.history.truncate(first)
        else:
            self.snap_fetch = (sid, position, resp.size)
