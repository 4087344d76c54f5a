"""Random fault schedules for the simulation (crashes, partitions, drops, disk replacements,
membership changes), all drawn from the simulation's seeded RNG."""

from __future__ import annotations

from tests.sim.harness import Node, Sim


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
        n = rng.choice(live)
        sim.crash(n)
        sim.at(rng.randint(100, 2000), lambda n=n: restart(sim, n))
    elif r < crash_rate + partition_rate:
        a = rng.choice(list(sim.nodes))
        pairs = [frozenset((a, b)) for b in sim.nodes if b != a]
        sim.note(f"partition node {a}")
        sim.blocked.update(pairs)
        sim.at(rng.randint(200, 3000), lambda pairs=pairs: unblock(sim, pairs))


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
