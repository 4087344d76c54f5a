"""Seeded simulation runs. Every run interleaves arriving messages with in-flight fsyncs and
checks the invariants of tests/sim/checks.py after every event; ``SIM_SEED=N`` reruns one
seed, ``SIM_SEEDS=K`` changes how many run (1,060 seeds by default; the fast lane,
``KK_FAST_LANE=1``, runs the first quarter of each family and every regression seed, the whole
suite all of them)."""

from __future__ import annotations

import os

import pytest

from quorum.core.raft import RaftCore
from quorum.types import ErrorCode
from tests.core.old_core import OldRaftCore
from tests.sim.chaos import Operator, chaos_action, kill_action, settle
from tests.sim.harness import InvariantError, Sim

# Seeds that once failed, kept in the default run as regressions: 736 (chaos, no pre-vote) found
# the livelock of a candidate with a stale log resetting the others' election timers.
REGRESSIONS: dict[int, list[int]] = {0: [736]}
# Seeds on which the pre-fix core (tests/core/old_core.py) breaks a durability invariant under
# power-loss chaos: a leader stepping down while its fsync was in flight sent a Fetch
# claiming proposals it had not even written yet.
OLD_CORE_FAILS = [4173, 15]


def seeds(default: int, offset: int) -> list[int]:
    one = os.environ.get("SIM_SEED")
    if one is not None:
        return [int(one)]
    # The fast lane is for quick feedback: a quarter of each family (the simulations were 60 % of
    # its time); the whole suite, where nothing sets KK_FAST_LANE, runs every seed.
    fast = os.environ.get("KK_FAST_LANE") == "1"
    k = int(os.environ.get("SIM_SEEDS", max(1, default // 4) if fast else default))
    picked = list(range(offset, offset + k))
    return picked + [s for s in REGRESSIONS.get(offset, []) if s not in picked]


@pytest.mark.parametrize("seed", seeds(300, 0))
def test_chaos(seed: int) -> None:
    """Crashes (also between append and fsync), partitions, drops, duplicates, snapshots;
    every fourth seed without pre-vote."""
    sim = Sim(
        seed,
        voters=3 if seed % 5 else 5,
        drop=0.02,
        duplicate=0.01,
        pre_vote=seed % 4 != 0,
        snapshot_every=40 if seed % 3 == 0 else 0,
    )
    sim.crash_points = True
    sim.run(6000, chaos_action)
    settle(sim)
    assert sim.committed_end > 4, sim.summary()


def retry(sim: Sim, attempt: int) -> None:
    """The operator retries; faults continue for a while, then the cluster is healed (with
    one replica down for good a 3-voter quorum has no slack, so liveness needs healing)."""
    if attempt < 8:
        sim.run(300, chaos_action)
    else:
        sim.heal()
        sim.scheduled.clear()
        sim.run(300)


@pytest.mark.parametrize("seed", seeds(100, 1000))
def test_disk_replacement(seed: int) -> None:
    """KIP-856 recovery: a voter loses its disk, returns as an observer with a new UUID, is
    added (AddVoter(new)) and its old identity removed (RemoveVoter(old))."""
    sim = Sim(seed, voters=3, drop=0.01, snapshot_every=30 if seed % 2 else 0)
    sim.check_durable = False  # the replaced disk may have held an acknowledged write
    sim.run(1500, chaos_action)
    settle(sim)
    victim = sim.nodes[sim.rng.choice(sorted(sim.nodes))]
    old = victim.key
    new_uuid = sim.replace_disk(victim)
    new = victim.key
    assert new.uuid == new_uuid
    # Operator loop: wait until the new replica is an observer of the leader, then add it.
    result = None
    for attempt in range(30):
        rid = sim.admin("add", new)
        result = sim.wait_admin(rid)
        if result is not None and result.error in (ErrorCode.NONE, ErrorCode.VOTER_ALREADY_ADDED):
            break
        retry(sim, attempt)
    assert result is not None and result.error in (ErrorCode.NONE, ErrorCode.VOTER_ALREADY_ADDED), result
    for attempt in range(30):
        rid = sim.admin("remove", old)
        result = sim.wait_admin(rid)
        if result is not None and result.error in (ErrorCode.NONE, ErrorCode.VOTER_ALREADY_REMOVED):
            break
        retry(sim, attempt)
    assert result is not None and result.error in (ErrorCode.NONE, ErrorCode.VOTER_ALREADY_REMOVED), result
    sim.run(1500, chaos_action)
    settle(sim)
    ld = sim.leader()
    assert ld is not None and ld.core is not None
    voters = ld.core.voters()
    assert new in voters.voters and old not in voters.voters
    assert old in voters.removed


@pytest.mark.parametrize("seed", seeds(80, 2000))
def test_reassignment(seed: int) -> None:
    """KIP-642: reassign {1,2,3} to a set with a spare replica and without one old id
    (sometimes the leader's, which then removes itself last and resigns)."""
    sim = Sim(seed, voters=3, spares=2, drop=0.01)
    sim.run(1500, chaos_action)
    settle(sim)
    ld = sim.leader()
    assert ld is not None
    drop_id = ld.id if seed % 2 == 0 else next(i for i in (1, 2, 3) if i != ld.id)
    target = sorted([i for i in (1, 2, 3) if i != drop_id] + [4 + seed % 2])
    result = None
    for _ in range(10):
        result = sim.wait_admin(sim.admin("reassign", target))
        if result is not None and result.error is ErrorCode.NONE:
            break
        sim.run(300)
    assert result is not None and result.error is ErrorCode.NONE, result

    def done() -> bool:
        ld2 = sim.leader()
        return (
            ld2 is not None
            and ld2.core is not None
            and ld2.core.voters().target_voters is None
            and sorted(ld2.core.voters().ids()) == target
            and ld2.core.pending_voter_change() is None
        )

    assert sim.until(done, 20000, chaos_action), sim.summary()
    settle(sim)
    ld = sim.leader()
    assert ld is not None and ld.core is not None and ld.id in target


@pytest.mark.parametrize("seed", seeds(100, 3000))
def test_mixed_membership_chaos(seed: int) -> None:
    """Crashes, partitions, drops, disk replacements handled by an operator, and reassignments
    among five ids, all interleaved; invariants after every step, convergence at the end."""
    sim = Sim(seed, voters=3, spares=2, drop=0.01, snapshot_every=50 if seed % 2 else 0)
    op = Operator(sim, [1, 2, 3, 4, 5])
    sim.run(8000, op)
    op.faults = False
    sim.heal()
    sim.scheduled.clear()
    assert sim.until(lambda: op.idle, 30000, op), f"operator stuck on {op.todo}"
    settle(sim)
    ld = sim.leader()
    assert ld is not None and ld.core is not None
    core = ld.core
    assert core.pending_voter_change() is None or sim.until(lambda: core.pending_voter_change() is None, 5000)


def power_loss_sim(seed: int, core_cls: type[RaftCore] = RaftCore) -> Sim:
    """Power loss (one node, or several at once) at any moment, also while fsyncs are in
    flight, with partitions, drops, duplicates and snapshots; every fourth seed without
    pre-vote, every fifth with five voters."""
    sim = Sim(
        seed,
        voters=3 if seed % 5 else 5,
        drop=0.02,
        duplicate=0.01,
        pre_vote=seed % 4 != 0,
        snapshot_every=40 if seed % 3 == 0 else 0,
        core_cls=core_cls,
    )
    sim.crash_points = True
    sim.run(3000, lambda s: chaos_action(s, crash_rate=0.01, partition_rate=0.005))
    settle(sim)
    return sim


@pytest.mark.parametrize("seed", seeds(450, 4000) + [s for s in OLD_CORE_FAILS if not (4000 <= s < 4450)])
def test_power_loss(seed: int) -> None:
    sim = power_loss_sim(seed)
    assert sim.committed_end > 4, sim.summary()


def test_power_loss_runs_check_acknowledged_writes() -> None:
    """The durability invariant is not vacuous: power-loss runs acknowledge writes and check
    each against the fsynced logs (a few seeds, which the parametrized test runs as well)."""
    sims = [power_loss_sim(seed) for seed in (4000, 4001, 4002)]
    assert all(s.acked_checks > 0 and s.acked_top is not None for s in sims), [s.summary() for s in sims]


@pytest.mark.parametrize("seed", OLD_CORE_FAILS)
def test_power_loss_finds_the_old_fetch_offset_hole(seed: int) -> None:
    """The same runs on the pre-fix core break an invariant (the fixed core passes them in
    test_power_loss): the simulation can see the Fetch-offset durability hole."""
    with pytest.raises((InvariantError, RuntimeError), match=r"claim|acked-write-durable"):
        power_loss_sim(seed, OldRaftCore)


def admin_until(sim: Sim, op: str, arg: object, done: tuple[ErrorCode, ...]) -> None:
    result = None
    for attempt in range(30):
        result = sim.wait_admin(sim.admin(op, arg))
        if result is not None and result.error in done:
            return
        retry(sim, attempt)
    raise AssertionError(f"{op} {arg}: {result}")


@pytest.mark.parametrize("seed", seeds(30, 5000))
def test_old_disk_comes_back_and_cannot_disturb(seed: int) -> None:
    """After a KIP-856 disk recovery the OLD disk is re-attached under its removed
    (id, UUID), with its stale voter set, cut off from the leader (so it never reads its
    removal) and, every other seed, without pre-vote. It campaigns; the voters refuse without
    adopting its epochs, so the leader keeps its epoch; afterwards the old key stays removed."""
    sim = Sim(seed, voters=3, drop=0.01, pre_vote=seed % 2 == 0)
    sim.check_durable = False  # a replaced disk may have held an acknowledged write
    sim.run(1500, chaos_action)
    settle(sim)
    ld = sim.leader()
    assert ld is not None
    victim = sim.nodes[sim.rng.choice(sorted(i for i in sim.nodes if i != ld.id))]
    old = victim.key
    sim.replace_disk(victim)
    admin_until(sim, "add", victim.key, (ErrorCode.NONE, ErrorCode.VOTER_ALREADY_ADDED))
    admin_until(sim, "remove", old, (ErrorCode.NONE, ErrorCode.VOTER_ALREADY_REMOVED))
    settle(sim)
    ld = sim.leader()
    assert ld is not None and ld.core is not None
    if ld.id == victim.id:  # the new disk leads: hand over, so that it can be cut from the leader
        ld.core.resign(sim.now)
        sim.pump(ld)
        assert sim.until(lambda: (n := sim.leader()) is not None and n.id != victim.id, 8000)
        ld = sim.leader()
        assert ld is not None and ld.core is not None
    epoch = ld.core.epoch
    sim.blocked.add(frozenset((victim.id, ld.id)))
    sim.reattach_old_disk(victim)
    assert victim.key == old
    sim.run(3000, lambda s: s.write(1) if s.rng.random() < 0.2 else None)
    now = sim.leader()
    assert now is ld and ld.core is not None and ld.core.epoch == epoch, sim.summary()
    if seed % 2:  # without pre-vote it really campaigned, at epochs the voters never adopted
        assert victim.core is not None and victim.core.epoch > epoch
    sim.heal()
    settle(sim)
    ld = sim.leader()
    assert ld is not None and ld.core is not None
    assert old in ld.core.voters().removed and old not in ld.core.voters().voters


def catchup_power_loss_sim(seed: int) -> Sim:
    """Pipelined catch-up under power loss: one node is cut off while the others
    commit a backlog, then catches up in small fetches (1 KiB while far behind; each pipelined
    Fetch claims committed, not yet fsynced records) while power cuts hit any node, one or
    several at once, also while fsyncs are in flight. The acknowledged-write check (durable on
    a majority) runs after every step, and the transport checks every non-durable claim
    against what was really committed. The catch-up fsync is batched until the
    tail (the default budget), every 2 KiB of fetched batches, or not at all (budget 0), by
    seed."""
    budget = (64 * 1024 * 1024, 2048, 0)[seed % 3]
    sim = Sim(seed, voters=3 if seed % 2 else 5, drop=0.01, pre_vote=seed % 4 != 0,
              config={"fetch_max_bytes": 512, "catchup_fetch_max_bytes": 1024, "catchup_flush_bytes": budget})
    sim.crash_points = True
    lag = sim.nodes[1 + seed % len(sim.nodes)]
    pairs = [frozenset((lag.id, b)) for b in sim.nodes if b != lag.id]
    sim.blocked.update(pairs)  # from the start: it cannot be the leader
    sim.run(1500, lambda s: None if s.rng.random() < 0.5 else s.write(s.rng.randint(1, 3)))
    sim.blocked.difference_update(pairs)
    sim.run(2500, lambda s: chaos_action(s, crash_rate=0.01, partition_rate=0.0))
    settle(sim)
    return sim


@pytest.mark.parametrize("seed", seeds(60, 7000))
def test_pipelined_catchup_power_loss(seed: int) -> None:
    sim = catchup_power_loss_sim(seed)
    assert sim.committed_end > 4, sim.summary()


def test_pipelined_catchup_is_exercised() -> None:
    """The pipelining rule is not vacuous in the simulation: catch-up runs send Fetches that
    claim committed records before their fsync, and acknowledge writes checked against the
    fsynced logs."""
    sims = [catchup_power_loss_sim(seed) for seed in (7002, 7003, 7004)]
    assert all(s.pipelined_fetches > 0 and s.acked_checks > 0 for s in sims), [s.summary() for s in sims]
    # Batched fsyncs happen with a budget (seed 7002: the default, 7003: 2 KiB), never without
    # one (7004: budget 0).
    assert [s.deferred_fsyncs > 0 for s in sims] == [True, True, False], [s.summary() for s in sims]


def test_power_cuts_hit_batched_catchup_fsyncs() -> None:
    """The power-cut runs really cut nodes holding written, not yet fsynced records (what
    batched catch-up fsyncs leave), and every check still held in those runs."""
    sims = [catchup_power_loss_sim(seed) for seed in seeds(12, 7000)]
    assert sum(s.cuts_with_unsynced for s in sims) > 0, [s.summary() for s in sims]


def kill_sim(seed: int, sync_on_open: bool = True) -> Sim:
    """Process crashes (also in the middle of an fsync) that keep unsynced writes in the page
    cache, and power loss on any subset later, with partitions, drops and snapshots; every
    fourth seed without pre-vote, every fifth with five voters. ``sync_on_open=False``: the
    restarted process trusts the page cache (the hole ``open_storage`` closes)."""
    sim = Sim(
        seed,
        voters=3 if seed % 5 else 5,
        drop=0.01,
        pre_vote=seed % 4 != 0,
        snapshot_every=40 if seed % 3 == 0 else 0,
        sync_on_open=sync_on_open,
    )
    sim.kill_points = 0.03
    sim.run(4000, lambda s: kill_action(s, kill_rate=0.004, power_rate=0.003))
    settle(sim)
    return sim


# Seeds on which restarting without the fsync on open (sync_on_open=False) breaks durability:
# a killed node's unsynced batches, read back from the page cache, are claimed and counted.
NO_SYNC_ON_OPEN_FAILS = [8024]
REGRESSIONS[8000] = NO_SYNC_ON_OPEN_FAILS  # and the fixed code passes them, in every run


@pytest.mark.parametrize("seed", seeds(120, 8000))
def test_process_crash_then_power_loss(seed: int) -> None:
    sim = kill_sim(seed)
    assert sim.committed_end > 4, sim.summary()


def test_process_crashes_leave_unsynced_writes() -> None:
    """Not vacuous: the runs kill processes holding unsynced writes, and acknowledge writes
    that the strict check judges against the voter set each leader counted."""
    sims = [kill_sim(seed) for seed in (8001, 8005, 8009)]
    assert all(s.kills_with_unsynced > 0 and s.acked_checks > 0 for s in sims), [s.summary() for s in sims]


@pytest.mark.parametrize("seed", NO_SYNC_ON_OPEN_FAILS)
def test_process_crash_finds_the_trusted_page_cache(seed: int) -> None:
    """The same seeds with the fsync on open switched off break the acknowledged-write check
    (they pass in test_process_crash_then_power_loss): the simulation sees that hole."""
    with pytest.raises(InvariantError, match="acked-write-durable"):
        kill_sim(seed, sync_on_open=False)
