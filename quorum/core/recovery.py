"""KIP-704 style unclean recovery, planned offline (``kraftkeeper quorum recover-unclean``).

When a majority of voters lost their disks, no leader can be elected cleanly. The operator
picks the survivor a Raft election would have preferred (the highest last epoch, then the longest
log: ``kraftkeeper_operator.core.survivor``; the longest log alone could be a stale leader's uncommitted
tail) and runs this plan on it while it is stopped:
one control batch at a new epoch that makes the local replica the sole voter and marks the log
RECOVERING, plus the quorum state to write. On restart the replica elects itself (it is the
only voter), refuses reads, writes and AddVoter while RECOVERING (``LEADER_RECOVERING``), asks
its driver (``Ready.recovery_needed``) to verify and snapshot, and only ``recovery_verified``
flips it to RECOVERED. Nothing here runs automatically.

The batch deliberately changes several voters at once: it is an unclean, offline operation
outside the one-change-at-a-time rule, recorded as such by LeaderRecovery(RECOVERING).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from quorum.core.ready import LeaderBatch
from quorum.core.voters import ControlState
from quorum.types import (
    AddVoter,
    ControlRecord,
    ErrorCode,
    KraftError,
    LeaderChange,
    LeaderRecovery,
    LeaderRecoveryState,
    LogSummary,
    QuorumState,
    RemoveVoter,
    ReplicaKey,
    TargetVoters,
)


@dataclass(frozen=True)
class RecoveryPlan:
    batch: LeaderBatch  # append at ``batch.base_offset`` (= the log end), then fsync
    quorum_state: QuorumState  # then write this quorum state
    removed: tuple[ReplicaKey, ...]  # voters the plan drops
    epoch: int


def voter_state(summary: LogSummary, bootstrap_ids: Mapping[int, str] | None = None) -> ControlState:
    """The latest control state of a log described by ``summary``."""
    st = ControlState.bootstrap(bootstrap_ids or {})
    for c in summary.snapshot_controls:
        st = st.apply(c)
    for b in summary.control_batches:
        for c in b.controls:
            st = st.apply(c)
    return st


def plan_unclean_recovery(
    summary: LogSummary,
    quorum_state: QuorumState,
    local: ReplicaKey,
    now_ms: int,
    bootstrap_voters: Mapping[int, str] | None = None,
    endpoint: str | None = None,
) -> RecoveryPlan:
    """Plan the recovery of ``local`` as the sole voter (see the module docstring)."""
    if local.uuid is None:
        raise KraftError(ErrorCode.INVALID_REQUEST, "unclean recovery needs the local storage UUID")
    current = voter_state(summary, bootstrap_voters)
    epoch = max(quorum_state.leader_epoch, summary.last_epoch) + 1
    controls: list[ControlRecord] = []
    if not current.from_log or local not in current.voters:
        controls.append(AddVoter(local, endpoint))
    removed = tuple(v for v in current.sorted_voters() if v != local and v.uuid is not None)
    controls.extend(RemoveVoter(v) for v in removed)
    if current.target_voters is not None:
        controls.append(TargetVoters(None))
    controls.append(LeaderRecovery(LeaderRecoveryState.RECOVERING, summary.end_offset))
    all_controls: tuple[ControlRecord, ...] = (LeaderChange(local.id, (local,), (local,)), *controls)
    batch = LeaderBatch(summary.end_offset, epoch, (), all_controls, now_ms)
    qs = QuorumState(
        cluster_id=quorum_state.cluster_id,
        leader_id=local.id,
        leader_epoch=epoch,
        voted_id=local.id,
        voted_uuid=local.uuid,
        applied_offset=quorum_state.applied_offset,
    )
    return RecoveryPlan(batch, qs, removed, epoch)
