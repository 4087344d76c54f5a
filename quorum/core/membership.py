"""KIP-856 membership (AddVoter / RemoveVoter), KIP-856 bootstrapping, KIP-642 reassignment
and the KIP-704 style recovery hand-off, on the leader.

AddVoter, in order (spec 000 "AddVoter Handling" and its error list):

1. not the leader -> NOT_LEADER (with the leader hint);
2. no UUID given -> INVALID_REQUEST; the leader is RECOVERING -> LEADER_RECOVERING;
3. (id, UUID) already in the voter set -> VOTER_ALREADY_ADDED;
4. (id, UUID) was removed before -> INVALID_REQUEST (KAFKA-19850: removal sticks);
5. (id, UUID) never fetched from this leader (not an observer) -> INVALID_REQUEST;
6. id not allowed (not a bootstrap voter id, not a current voter id, not a target voter id)
   -> INVALID_REQUEST;
7. a reassignment is running and the id is not a target id -> REASSIGNMENT_IN_PROGRESS
   (a replacement for a target id may be added: it helps); another voter change is
   uncommitted in the log (between high watermark and log end, KAFKA-20740) or being handled
   -> VOTER_CHANGE_IN_PROGRESS;
8. wait until the replica is caught up (fetch offset within ``catch_up_max_lag`` of the log end
   and a fetch within ``catch_up_recent_ms``), else REPLICA_NOT_CAUGHT_UP after
   ``add_voter_timeout_ms``;
9. wait for the voter set to be bootstrapped and this epoch's LeaderChangeMessage to commit;
10. append AddVoterRecord (applied at once); answer once committed by the new majority
    (REQUEST_TIMED_OUT after the timeout: the record then stays pending in the log).

RemoveVoter likewise: VOTER_ALREADY_REMOVED if (id, UUID) was a voter and is no more,
INVALID_REQUEST if it never was one, INVALID_REQUEST if it would remove the last UUID of an id
(RemoveVoter removes UUIDs, not ids; only a KIP-642 reassignment removes ids) unless a
replacement of that id with a new UUID is already a caught-up observer (the RemoveThenAdd
recovery order, as Kafka's final KIP-853 procedure does it). A leader that
removes itself keeps serving Fetch, does not count itself in the high watermark, and resigns
once the removal is committed (KAFKA-17608).
"""

from __future__ import annotations

from quorum.core.progress import AdminOp, LeaderState
from quorum.core.ready import AdminResult
from quorum.core.replication import ReplicationMixin
from quorum.core.voters import VoterChange
from quorum.types import (
    AddVoter,
    ErrorCode,
    KraftError,
    LeaderRecovery,
    LeaderRecoveryState,
    RemoveVoter,
    ReplicaKey,
    TargetVoters,
)


class MembershipMixin(ReplicationMixin):
    # ------------------------------------------------------------------ queries

    def pending_voter_change(self) -> VoterChange | None:
        """The uncommitted voter change in the log, if any (derived from the log only)."""
        changes = [c for c in self.history.voter_changes_from(self.hw) if c.op != "bootstrap"]
        return changes[0] if changes else None

    def leader_change_committed(self, ls: LeaderState) -> bool:
        return self.hw > ls.epoch_start_offset

    def recovering(self) -> bool:
        return self.voters().recovery is LeaderRecoveryState.RECOVERING

    def caught_up(self, ls: LeaderState, key: ReplicaKey) -> bool:
        p = ls.progress.get(key)
        if p is None or p.last_fetch_ms < 0:
            return False
        return (
            p.end_offset >= self.meta.end - self.config.catch_up_max_lag
            and self.now - p.last_fetch_ms <= self.config.catch_up_recent_ms
        )

    def writes_allowed(self, ls: LeaderState) -> bool:
        """KIP-856 bootstrapping: no state-machine writes until the voter set is in the log,
        committed, and (if this leader wrote it) replicated to every voter."""
        if self.local.uuid is None:
            return True  # UUID-less test mode: nothing to bootstrap
        committed = self.history.at(self.hw - 1)
        if not committed.from_log:
            return False
        if ls.bootstrap_offset >= 0 and not ls.bootstrap_done:
            for v in self.other_voters():
                p = ls.progress_of_voter(v)
                if p is None or p.end_offset <= ls.bootstrap_offset:
                    return False
            ls.bootstrap_done = True
        return True

    def _reject(self, request_id: int, code: ErrorCode, message: str) -> None:
        self._admin_results.append(
            AdminResult(request_id, code, message, self.leader_id(), self.epoch, self.leader_endpoint())
        )

    def _busy(self, ls: LeaderState) -> str | None:
        change = self.pending_voter_change()
        if change is not None:
            return f"uncommitted voter change in the log: {change.op} {change.key} at offset {change.offset}"
        for op in ls.admin:
            if op.op in ("add", "remove"):
                return f"request {op.request_id} ({op.op} {op.key}) is in progress"
        return None

    # ------------------------------------------------------------------ admin entry points

    def add_voter(self, request_id: int, key: ReplicaKey, now_ms: int) -> None:
        self.now = max(self.now, now_ms)
        ls = self.leader_state()
        if ls is None:
            self._reject(request_id, ErrorCode.NOT_LEADER, "not the leader")
            return
        if key.uuid is None:
            self._reject(request_id, ErrorCode.INVALID_REQUEST, "AddVoter needs the replica's storage UUID")
            return
        if self.recovering():
            self._reject(request_id, ErrorCode.LEADER_RECOVERING, "the leader is recovering (KIP-704)")
            return
        voters = self.voters()
        if key in voters.voters:
            self._reject(request_id, ErrorCode.VOTER_ALREADY_ADDED, f"{key} is already a voter")
            return
        if key in voters.removed:
            self._reject(
                request_id,
                ErrorCode.INVALID_REQUEST,
                f"{key} was removed and cannot come back; format a new storage UUID",
            )
            return
        if key not in ls.progress:
            self._reject(
                request_id,
                ErrorCode.INVALID_REQUEST,
                f"{key} is not an observer: it has not fetched from this leader",
            )
            return
        allowed = set(self.config.bootstrap_voters) | voters.ids() | set(voters.target_voters or ())
        if key.id not in allowed:
            self._reject(
                request_id,
                ErrorCode.INVALID_REQUEST,
                f"replica id {key.id} is not a configured, current or target voter id",
            )
            return
        if voters.target_voters is not None and key.id not in voters.target_voters:
            # Adding a replica of a target id (e.g. a replaced disk) helps the reassignment.
            self._reject(
                request_id,
                ErrorCode.REASSIGNMENT_IN_PROGRESS,
                f"a reassignment to {list(voters.target_voters)} is in progress",
            )
            return
        busy = self._busy(ls)
        if busy is not None:
            self._reject(request_id, ErrorCode.VOTER_CHANGE_IN_PROGRESS, busy)
            return
        ls.admin.append(AdminOp(request_id, "add", key, now_ms, now_ms + self.config.add_voter_timeout_ms))
        self.process_admin(ls)

    def remove_voter(self, request_id: int, key: ReplicaKey, now_ms: int) -> None:
        self.now = max(self.now, now_ms)
        ls = self.leader_state()
        if ls is None:
            self._reject(request_id, ErrorCode.NOT_LEADER, "not the leader")
            return
        if key.uuid is None:
            self._reject(
                request_id, ErrorCode.INVALID_REQUEST, "RemoveVoter needs the replica's storage UUID"
            )
            return
        if self.recovering():
            self._reject(request_id, ErrorCode.LEADER_RECOVERING, "the leader is recovering (KIP-704)")
            return
        voters = self.voters()
        if key not in voters.voters:
            if key in voters.removed:
                self._reject(request_id, ErrorCode.VOTER_ALREADY_REMOVED, f"{key} is already removed")
            else:
                self._reject(request_id, ErrorCode.INVALID_REQUEST, f"{key} is not a voter")
            return
        # KIP-856 removes UUIDs, not ids. One exception, for the RemoveThenAdd recovery order
        # (Kafka's final KIP-853 procedure): the id's last UUID may go when a replacement of the
        # same id (a new storage UUID) is already a caught-up observer, ready to be added back.
        replacement_ready = any(
            k.id == key.id
            and k != key
            and k not in voters.voters
            and k not in voters.removed
            and self.caught_up(ls, k)
            for k in ls.progress
        )
        if not replacement_ready and not any(v.id == key.id and v != key for v in voters.voters):
            self._reject(
                request_id,
                ErrorCode.INVALID_REQUEST,
                f"removing {key} would remove replica id {key.id} from the voters; RemoveVoter removes "
                "storage UUIDs, use reassign to change replica ids",
            )
            return
        busy = self._busy(ls)
        if busy is not None:
            self._reject(request_id, ErrorCode.VOTER_CHANGE_IN_PROGRESS, busy)
            return
        ls.admin.append(AdminOp(request_id, "remove", key, now_ms, now_ms + self.config.add_voter_timeout_ms))
        self.process_admin(ls)

    def reassign(self, request_id: int, ids: list[int] | tuple[int, ...] | None, now_ms: int) -> None:
        """KIP-642: record the target voter ids (or cancel with None / the current ids); the
        leader then executes single-member changes. Completes once the TargetVoters record is
        committed."""
        self.now = max(self.now, now_ms)
        ls = self.leader_state()
        if ls is None:
            self._reject(request_id, ErrorCode.NOT_LEADER, "not the leader")
            return
        if self.recovering():
            self._reject(request_id, ErrorCode.LEADER_RECOVERING, "the leader is recovering (KIP-704)")
            return
        voters = self.voters()
        target: tuple[int, ...] | None = None
        if ids is not None:
            if not ids:
                self._reject(request_id, ErrorCode.INVALID_REQUEST, "the target voter set is empty")
                return
            if len(set(ids)) != len(ids) or any(not 0 <= i < 1 << 31 for i in ids):
                self._reject(request_id, ErrorCode.INVALID_REQUEST, f"bad target voter ids {list(ids)}")
                return
            target = tuple(sorted(ids))
            if set(target) == voters.ids():
                target = None
        if target is None and voters.target_voters is None:
            self._admin_results.append(
                AdminResult(
                    request_id,
                    ErrorCode.NONE,
                    "no reassignment to cancel",
                    self.local.id,
                    self.epoch,
                    self.leader_endpoint(),
                )
            )
            return
        ls.admin.append(
            AdminOp(
                request_id,
                "reassign",
                ReplicaKey(-1, None),
                now_ms,
                now_ms + self.config.add_voter_timeout_ms,
                target=target,
            )
        )
        self.process_admin(ls)

    def recovery_verified(self, lost_after: int, now_ms: int) -> int:
        """KIP-704: the driver verified the RECOVERING leader's state; append
        LeaderRecovery(RECOVERED). Returns the record's offset."""
        self.now = max(self.now, now_ms)
        ls = self.leader_state()
        if ls is None:
            raise KraftError(ErrorCode.NOT_LEADER, "only the leader can finish recovery")
        if not self.recovering():
            raise KraftError(ErrorCode.INVALID_REQUEST, "the leader is not recovering")
        return self.append_control((LeaderRecovery(LeaderRecoveryState.RECOVERED, lost_after),))

    # ------------------------------------------------------------------ execution

    def process_admin(self, ls: LeaderState) -> None:
        for op in list(ls.admin):
            if op.appended_offset >= 0:
                if self.hw > op.appended_offset:
                    ls.admin.remove(op)
                    self._admin_results.append(
                        AdminResult(
                            op.request_id,
                            ErrorCode.NONE,
                            "committed",
                            self.local.id,
                            self.epoch,
                            self.leader_endpoint(),
                        )
                    )
                elif self.now >= op.deadline_ms:
                    ls.admin.remove(op)
                    self._reject(
                        op.request_id,
                        ErrorCode.REQUEST_TIMED_OUT,
                        f"record at offset {op.appended_offset} not committed in time; it stays pending",
                    )
                continue
            ready = self.leader_change_committed(ls) and not self.recovering()
            if op.op == "add":
                ready = ready and self.voters().from_log and self.pending_voter_change() is None
                caught = self.caught_up(ls, op.key)
                if self.now >= op.deadline_ms:
                    ls.admin.remove(op)
                    if not caught:
                        self._reject(
                            op.request_id,
                            ErrorCode.REPLICA_NOT_CAUGHT_UP,
                            f"{op.key} did not catch up within {self.config.add_voter_timeout_ms} ms",
                        )
                    else:
                        self._reject(op.request_id, ErrorCode.REQUEST_TIMED_OUT, "could not append in time")
                    continue
                if ready and caught:
                    endpoint = ls.progress[op.key].endpoint or self.endpoint_of(op.key.id)
                    op.appended_offset = self.append_control((AddVoter(op.key, endpoint),))
            elif op.op == "remove":
                ready = ready and self.pending_voter_change() is None
                if self.now >= op.deadline_ms:
                    ls.admin.remove(op)
                    self._reject(op.request_id, ErrorCode.REQUEST_TIMED_OUT, "could not append in time")
                    continue
                if ready:
                    if op.key not in self.voters().voters:
                        ls.admin.remove(op)
                        self._reject(
                            op.request_id, ErrorCode.VOTER_ALREADY_REMOVED, f"{op.key} is already removed"
                        )
                        continue
                    op.appended_offset = self.append_control((RemoveVoter(op.key),))
            else:
                if self.now >= op.deadline_ms:
                    ls.admin.remove(op)
                    self._reject(op.request_id, ErrorCode.REQUEST_TIMED_OUT, "could not append in time")
                    continue
                if ready:
                    op.appended_offset = self.append_control((TargetVoters(op.target),))

    def maybe_bootstrap(self, ls: LeaderState) -> None:
        """KIP-856 bootstrapping: once every configured voter's UUID is known, write one
        AddVoterRecord per voter in ONE batch (atomic: replicated and committed together)."""
        if self.voters().from_log or ls.bootstrap_offset >= 0 or self.local.uuid is None:
            return
        if not self.config.bootstrap_voters or not self.leader_change_committed(ls):
            return
        uuids: dict[int, str] = {}
        for vid in sorted(self.config.bootstrap_voters):
            u = self.local.uuid if vid == self.local.id else self.learned_uuids.get(vid)
            if u is None:
                return
            uuids[vid] = u
        controls = tuple(
            AddVoter(ReplicaKey(vid, u), self.config.bootstrap_voters.get(vid)) for vid, u in uuids.items()
        )
        ls.bootstrap_offset = self.append_control(controls)

    def run_reassignment(self, ls: LeaderState) -> None:
        """KIP-642: one single-member change at a time towards ``target_voters``: add missing
        ids first (once a replica of that id is a caught-up observer), then remove others,
        the leader itself last (it resigns once that removal commits)."""
        voters = self.voters()
        target = voters.target_voters
        if target is None or self.recovering() or not voters.from_log:
            return
        if not self.leader_change_committed(ls) or self.pending_voter_change() is not None:
            return
        if any(op.op in ("add", "remove") or op.appended_offset < 0 for op in ls.admin):
            return
        missing = [i for i in target if i not in voters.ids()]
        for vid in missing:
            cands = [
                p
                for k, p in ls.progress.items()
                if k.id == vid and k.uuid is not None and k not in voters.removed and self.caught_up(ls, k)
            ]
            if cands:
                best = max(cands, key=lambda p: p.last_fetch_ms)
                self.append_control((AddVoter(best.key, best.endpoint or self.endpoint_of(vid)),))
                return
        if missing:
            return
        extra = [v for v in voters.sorted_voters() if v.id not in target]
        me = voters.find(self.local)
        others = [v for v in extra if v != me]
        if others:
            self.append_control((RemoveVoter(others[0]),))
            return
        if extra:
            if len(voters.voters) > 1:
                self.append_control((RemoveVoter(extra[0]),))
            return
        self.append_control((TargetVoters(None),))

    def tick_membership(self) -> None:
        ls = self.leader_state()
        if ls is None:
            return
        self.maybe_bootstrap(ls)
        self.process_admin(ls)
        self.run_reassignment(ls)
        if self.recovering() and not ls.recovery_reported:
            ls.recovery_reported = True  # once per leadership: Ready.recovery_needed
            self.recovery_requested = True
        # KAFKA-17608 / KIP-856 step 7: a leader outside the voter set resigns once no voter
        # change is pending any more (its own removal is committed).
        if not self.is_voter() and self.pending_voter_change() is None and self.leader_state() is ls:
            self.resign_leadership()
