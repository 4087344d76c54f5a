"""KIP-704 style unclean recovery (plan + RECOVERING leader), snapshot transfer between two
real cores (FetchSnapshot chunks, install handshake), and bad input to the core."""

from __future__ import annotations

import dataclasses
import json
import random

import pytest

from quorum.core.config import CoreConfig
from quorum.core.messages import FetchSnapshotRequest, is_request
from quorum.core.raft import RaftCore
from quorum.core.recovery import plan_unclean_recovery
from quorum.driver.memory import ManualClock
from quorum.types import (
    ErrorCode,
    KraftError,
    LeaderRecovery,
    LeaderRecoveryState,
    OffsetAndEpoch,
    QuorumState,
)
from tests.core.util import CLUSTER, Harness, key, leader, make


def test_unclean_recovery_plan_and_recovering_leader() -> None:
    h = leader()
    h.core.propose([b"a", b"b"], h.now)
    h.drain()
    h.fetch(2)
    committed = h.core.hw
    plan = plan_unclean_recovery(
        h.store.summary(), h.qs, key(1), 5000, h.core.config.bootstrap_voters, "n1:1"
    )
    assert plan.epoch == h.core.epoch + 1
    assert {k.id for k in plan.removed} == {2, 3}
    b = plan.batch
    h.log.append(b.base_offset, b.epoch, b.items(), b.append_time_ms)
    h.log.flush()
    h.store.qstore.save(plan.quorum_state)
    core = RaftCore(
        h.core.config, key(1), CLUSTER, h.qs, h.store.summary(), h.store.reader(), random.Random(3), 5000
    )
    r = Harness(core, h.store, clock=ManualClock(5000))
    r.drain()
    assert core.voters().recovery is LeaderRecoveryState.RECOVERING
    assert [v.id for v in core.voters().voters] == [1]
    r.tick(3000)
    assert core.role_name == "leader" and core.epoch > plan.epoch
    assert any(rd.recovery_needed for rd in r.readies)
    for call in (lambda: core.propose([b"x"], r.now), lambda: core.read_index(1, r.now)):
        with pytest.raises(KraftError) as e:
            call()
        assert e.value.code is ErrorCode.LEADER_RECOVERING
    core.add_voter(9, key(2), r.now)
    r.drain()
    assert [a.error for a in r.admin if a.request_id == 9] == [ErrorCode.LEADER_RECOVERING]
    assert core.hw >= committed  # nothing committed was dropped
    core.recovery_verified(plan.batch.base_offset, r.now)
    r.tick(50)
    assert core.voters().recovery is LeaderRecoveryState.RECOVERED
    assert core.voters().lost_after == plan.batch.base_offset
    last = core.propose([b"after"], r.now)
    r.drain()
    assert core.hw > last
    with pytest.raises(KraftError):
        core.recovery_verified(0, r.now)  # not recovering any more


def test_recovery_plan_requires_uuid() -> None:
    h = leader()
    from quorum.types import ReplicaKey

    with pytest.raises(KraftError) as e:
        plan_unclean_recovery(h.log.summary(), h.qs, ReplicaKey(1, None), 0)
    assert e.value.code is ErrorCode.INVALID_REQUEST


def _wire(a: Harness, b: Harness, rounds: int = 200) -> None:
    """Deliver messages between two harnesses (ids 1 and 2) until quiet."""
    by_id = {a.core.local.id: a, b.core.local.id: b}
    pending: dict[tuple[int, int], tuple[int, int]] = {}
    seq = [10_000]
    inbox = [(a.core.local.id, o) for o in a.drain()] + [(b.core.local.id, o) for o in b.drain()]
    for _ in range(rounds):
        if not inbox:
            for h in (a, b):
                h.now += 10
                h.core.tick(h.now)
                inbox += [(h.core.local.id, o) for o in h.drain()]
            if not inbox:
                continue
        src, o = inbox.pop(0)
        dest = by_id.get(o.destination_id)
        if dest is None:
            continue
        msg = o.message
        if is_request(msg):
            seq[0] += 1
            pending[(dest.core.local.id, seq[0])] = (src, msg.correlation_id)
            msg = dataclasses.replace(msg, correlation_id=seq[0])
            out = dest.step(msg)
        else:
            back = pending.pop((src, msg.correlation_id), None)
            if back is None:
                continue
            out = dest.step(dataclasses.replace(msg, correlation_id=back[1]))
        inbox += [(dest.core.local.id, x) for x in out]


def test_snapshot_transfer_between_cores() -> None:
    h = leader(snapshot_chunk_bytes=64)
    for i in range(20):
        h.core.propose([f"rec{i}".encode()], h.now)
        h.drain()
        h.fetch(3)
    hw = h.core.hw
    sid = OffsetAndEpoch(hw, h.core.epoch_at(hw - 1))
    controls = h.core.controls_at(hw)
    h.store.snapshots.write(sid, controls, [json.dumps({"pad": "z" * 300}).encode()])
    h.log.delete_before(hw)
    h.core.snapshot_taken(sid, min(h.log.log_start_offset, hw))
    data = h.store.snapshots.read_chunk(sid, 0, 1 << 20)[0]
    f = make(local=2, snapshot_chunk_bytes=64)
    f.now = h.now
    _wire(h, f)
    # The follower's driver verified and installed it, and loaded it into its state machine.
    assert f.store.snapshots.latest() == sid and f.sm.data == {"pad": "z" * 300}
    assert f.core.hw >= sid.offset and f.core.log_end_offset >= sid.offset
    assert f.core.voters().from_log and f.core.voters() == h.core.voters()
    chunks = [m for m in h.sent if isinstance(m.message, FetchSnapshotRequest)]
    assert not chunks  # requests go from the follower, not the leader
    fetch_snaps = [o for o in f.sent if isinstance(o.message, FetchSnapshotRequest)]
    assert len(fetch_snaps) >= len(data) // 64


def test_snapshot_taken_rejects_bad_positions() -> None:
    h = leader()
    with pytest.raises(KraftError) as e:
        h.core.snapshot_taken(OffsetAndEpoch(h.core.hw + 5, 1), 0)
    assert e.value.code is ErrorCode.INVALID_REQUEST and "high watermark" in e.value.message
    with pytest.raises(KraftError):
        h.core.snapshot_taken(OffsetAndEpoch(h.core.hw, 1), h.core.hw + 1)


def test_bad_config_and_input_get_clear_errors() -> None:
    with pytest.raises(ValueError, match="election_timeout_ms"):
        CoreConfig(election_timeout_ms=0)
    with pytest.raises(ValueError, match="catch_up_max_lag"):
        CoreConfig(catch_up_max_lag=-1)
    h = leader()
    with pytest.raises(KraftError) as e:
        h.core.propose([], h.now)
    assert e.value.code is ErrorCode.INVALID_REQUEST
    with pytest.raises(KraftError) as e:
        RaftCore(
            h.core.config,
            key(1),
            "another-cluster",
            QuorumState(CLUSTER),
            h.store.summary(),
            h.store.reader(),
            random.Random(1),
            0,
        )
    assert e.value.code is ErrorCode.INCONSISTENT_CLUSTER_ID
    # Nothing committed was lost by the refused calls.
    assert h.core.hw == h.durable_end


def test_recovery_record_round_trips_in_snapshot_controls() -> None:
    h = leader()
    h.core.history.apply_batch(h.core.meta.end, (LeaderRecovery(LeaderRecoveryState.RECOVERING, 7),))
    controls = h.core.history.latest.to_controls({})
    assert LeaderRecovery(LeaderRecoveryState.RECOVERING, 7) in controls
