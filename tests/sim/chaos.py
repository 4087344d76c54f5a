"""Random fault schedules for the simulation (power loss, process crashes, partitions, drops,
disk replacements, membership changes), all drawn from the simulation's seeded RNG."""

from __future__ import annotations

from functools import partial

from tests.sim.harness import Sim
from tests.sim.nodes import Node


def chaos_action(sim: Sim, crash_rate: float = 0.0015, partition_rate: float = 0.0015) -> None:
    rng = sim.rng
    r = rng.random()
    if r < 0.25:
        sim.write(rng.randint(1, 3))
    elif r < 0.28:
        sim.read()
    r = rng.random()
    live = [n for n in sim.nodes.values() if n.core is not None]
    if r < crash_rate and live:
        # Power loss on one node, or now and then on several at once (leaders and followers).
        k = 1 if rng.random() < 0.7 else rng.randint(1, len(live))
        victims = rng.sample(live, k)
        sim.crash_many(victims)
        for n in victims:
            sim.at(rng.randint(100, 2000), partial(restart, sim, n))
    elif r < crash_rate + partition_rate:
        a = rng.choice(list(sim.nodes))
        pairs = [frozenset((a, b)) for b in sim.nodes if b != a]
        sim.note(f"partition node {a}")
        sim.blocked.update(pairs)
        sim.at(rng.randint(200, 3000), partial(unblock, sim, pairs))


def kill_action(sim: Sim, kill_rate: float = 0.01, power_rate: float = 0.004) -> None:
    """Writes, reads and partitions as ``chaos_action`` (no power loss of its own), plus:
    process crashes of one node or several (unsynced writes stay in the page cache; each
    restarts later), and power loss on any subset of the nodes, running or already dead (a
    dead node's page cache is lost with the power, so a power loss after a process crash drops
    what the crashed process had not synced)."""
    chaos_action(sim, crash_rate=0.0, partition_rate=0.004)
    rng = sim.rng
    r = rng.random()
    nodes = list(sim.nodes.values())
    live = [n for n in nodes if n.core is not None]
    if r < kill_rate and live:
        victims = rng.sample(live, 1 if rng.random() < 0.7 else rng.randint(1, len(live)))
        sim.kill_many(victims)
        for n in victims:
            sim.at(rng.randint(100, 2000), partial(restart, sim, n))
    elif r < kill_rate + power_rate:
        victims = rng.sample(nodes, rng.randint(1, len(nodes)))
        running = [n for n in victims if n.core is not None]
        sim.crash_many(victims)
        for n in running:
            sim.at(rng.randint(100, 2000), partial(restart, sim, n))


def restart(sim: Sim, n: Node) -> None:
    if n.core is None:
        sim.note(f"restart node {n.id}")
        sim.start(n)


def unblock(sim: Sim, pairs: list[frozenset[int]]) -> None:
    sim.blocked.difference_update(pairs)
    sim.note("heal partition")


def settle(sim: Sim, ms: int = 6000) -> None:
    """Heal everything and check that the quorum converges and still commits."""
    sim.crash_points = False
    sim.scheduled.clear()
    sim.heal()
    ok = sim.until(lambda: sim.leader() is not None and sim.write(1), ms)
    if not ok:
        sim.fail("liveness", "no leader accepting writes after healing")
    target = sim.committed_end
    ld = sim.leader()
    assert ld is not None and ld.core is not None

    def converged() -> bool:
        ld2 = sim.leader()
        if ld2 is None or ld2.core is None:
            return False
        vs = ld2.core.voters()
        return (
            all(
                n.core is not None and n.core.hw >= max(target, 1) and n.core.hw == ld2.core.hw
                for n in sim.nodes.values()
                if vs.contains(n.key) and n.core is not None
            )
            and sim.committed_end > target
        )

    if not sim.until(converged, ms):
        sim.fail(
            "liveness",
            f"voters did not converge: {[(n.id, n.core and n.core.hw) for n in sim.nodes.values()]}",
        )
    # State machines that applied the same prefix hold the same data.
    by_applied: dict[int, dict[str, str]] = {}
    for n in sim.nodes.values():
        if n.driver is None:
            continue
        seen = by_applied.setdefault(n.driver.applied_end, n.kv)
        if seen != n.kv:
            sim.fail("state-machine-agreement", f"node {n.id} applied {n.applied} but its data differs")


class Operator:
    """A tiny recovery operator inside the simulation: replaces a disk now and then and walks
    each replaced replica through AddVoter(new) then RemoveVoter(old), retrying on transient
    answers; also starts KIP-642 reassignments among the configured ids."""

    def __init__(
        self, sim: Sim, ids: list[int], replace_rate: float = 0.0012, reassign_rate: float = 0.0008
    ) -> None:
        self.sim = sim
        sim.check_durable = False  # a replaced disk may have held an acknowledged write
        self.ids = ids
        self.replace_rate = replace_rate
        self.reassign_rate = reassign_rate
        self.todo: list[tuple[str, object]] = []  # ("add"|"remove", key)
        self.waiting: int | None = None
        self.next_try = 0
        self.replacements = 0
        self.reassignments = 0
        self.completed = 0
        self.faults = True  # False: only finish pending work, inject nothing new
        self.reassign_started = -1
        self.blocked_by_reassign = 0

    @property
    def idle(self) -> bool:
        return not self.todo and self.waiting is None

    def __call__(self, sim: Sim) -> None:
        if self.faults:
            chaos_action(sim)
        rng = sim.rng
        if self.faults and self.idle:
            r = rng.random()
            ld = sim.leader()
            if r < self.replace_rate and ld is not None and ld.core is not None:
                voters = [
                    n for n in sim.nodes.values() if ld.core.voters().contains(n.key) and n.core is not None
                ]
                if len(voters) >= 3:
                    n = rng.choice(voters)
                    old = n.key
                    sim.replace_disk(n)
                    self.todo = [("add", n.key), ("remove", old)]
                    self.replacements += 1
            elif r < self.replace_rate + self.reassign_rate and ld is not None and ld.core is not None:
                if ld.core.voters().target_voters is None:
                    target = sorted(rng.sample(self.ids, 3))
                    self.todo = [("reassign", target)]
                    self.reassignments += 1
                    self.reassign_started = sim.now
        if self.idle and self.reassign_started >= 0 and sim.now - self.reassign_started > 15000:
            # A target can be unreachable (its ids' only replicas were removed and stay
            # removed, KAFKA-19850): the operator cancels it.
            ld = sim.leader()
            if ld is not None and ld.core is not None and ld.core.voters().target_voters is not None:
                self.todo = [("reassign", None)]
            self.reassign_started = -1
        if self.waiting is not None:
            res = sim.admin_results.get(self.waiting)
            if res is None:
                if sim.now > self.next_try + 8000:
                    self.waiting = None  # lost with its leader: retry
                return
            self.waiting = None
            op, arg = self.todo[0]
            done = {
                "add": ("NONE", "VOTER_ALREADY_ADDED"),
                "remove": ("NONE", "VOTER_ALREADY_REMOVED"),
                "reassign": ("NONE",),
            }[op]
            if res.error.value in done:
                self.todo.pop(0)
                self.completed += 1
            elif res.error.value == "INVALID_REQUEST" and (
                (op == "add" and "removed" in res.message)
                or (op == "remove" and "not a voter" in res.message)
            ):
                self.todo.pop(0)  # final answers: nothing left to do for this key
            elif res.error.value == "REASSIGNMENT_IN_PROGRESS":
                self.blocked_by_reassign += 1
                if self.blocked_by_reassign >= 10:
                    # Disk recovery comes first: cancel the reassignment in the way.
                    self.todo.insert(0, ("reassign", None))
                    self.blocked_by_reassign = 0
            self.next_try = sim.now + 200
            return
        if self.todo and sim.now >= self.next_try:
            op, arg = self.todo[0]
            rid = sim.admin(op, arg)
            if rid is None:
                self.next_try = sim.now + 200
            else:
                self.waiting = rid
                self.next_try = sim.now
