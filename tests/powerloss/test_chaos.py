"""Real power loss on real processes: a 3-node TLS cluster, each node's data directory on its own
powerfs disk, under a concurrent client workload, through seeded rounds of faults. Each round
picks one node, two, or all three; each victim crashes (SIGKILL: what it had not fsynced stays
in its disk's page cache and the restarted node finds it) or loses power (SIGKILL and
``clear-cache``: what it had not fsynced is gone), in half the rounds inside an fsync (powerfs
holds the victims' syncs until they are killed: written, never synced). A quarter of the rounds
cut the power of the nodes that the round before crashed, once they restarted and rejoined: the
shape of a restart that trusted its page cache. The victims restart at once; the next round
waits until the quorum acknowledged a few more writes.

At the end every acknowledged write must be there: each fresh key reads back with its value, no
read returned a value older than a write acknowledged before it started, no two acknowledged
writes share an offset, and each register key's history is linearizable.

``KK_POWERLOSS_SEED`` replays a seed (printed at the start); ``KK_POWERLOSS_ROUNDS`` changes
the number of rounds (50)."""

from __future__ import annotations

import asyncio
import os
import random
import time
from collections.abc import Callable
from typing import Any

import pytest

from testkit.polling import wait_until
from tests.powerloss.cluster import PowerCluster
from tests.powerloss.history import Op, check_registers, duplicate_offsets, stale_reads
from tests.powerloss.workload import OP_TIMEOUT, Workload

pytestmark = pytest.mark.slow

ROUNDS = int(os.environ.get("KK_POWERLOSS_ROUNDS", "50"))
PROGRESS = 4  # writes acknowledged after a round's restarts before the next round

# Small segments and snapshots: segment rolls (new files, directory syncs), snapshots (atomic
# replacement) and deletion of snapshotted segments all happen between the faults.
CONFIG = {
    "log": {"segment_bytes": 16384},
    "snapshot": {"max_bytes": 65536},
    "client": {"write_timeout_ms": int(OP_TIMEOUT * 1000)},
}


def _round(c: PowerCluster, rng: random.Random, crashed_before: list[int]) -> tuple[str, list[int]]:
    """Apply one round's faults and restart the victims; returns (what, the nodes that only crashed)."""
    nodes = list(c.ports)
    if crashed_before and rng.random() < 0.25:
        # They restarted on what their page cache held; once they rejoined, that is lost.
        wait_until(
            f"nodes {crashed_before} ready again",
            lambda: all(c.ready(i) for i in crashed_before),
            60,
            errors=(Exception,),
        )
        crash: list[int] = []
        power = crashed_before
        kind = "restarted last round: "
    else:
        kind = ""
        victims = rng.sample(nodes, rng.choices([1, 2, 3], weights=[6, 2, 2])[0])
        how = rng.choice(["crash", "power", "mixed"])
        if how == "mixed":
            power = rng.sample(victims, rng.randint(1, len(victims)))
        else:
            power = victims if how == "power" else []
        crash = [i for i in victims if i not in power]
    # Half the time the victims die inside an fsync: written, not yet synced.
    in_fsync = c.hold_syncs(crash + power, 2) if rng.random() < 0.5 else []
    c.fault(crash, power)
    for i in crash + power:
        c.start(i)
    inside = f", killed inside fsync {sorted(in_fsync)}" if in_fsync else ""
    return f"{kind}crash {sorted(crash)} power loss {sorted(power)}{inside}", crash


async def _final_reads(
    c: PowerCluster, registers: list[str], fresh: dict[str, str]
) -> tuple[list[Op], list[str]]:
    async with c.client(timeout=60) as q:
        final = []
        for key in registers:
            start = time.monotonic()
            got = await q.get(key)
            final.append(Op("get", key, got.decode() if got is not None else None, start, time.monotonic()))
        sem = asyncio.Semaphore(16)

        async def one(key: str) -> str | None:
            async with sem:
                got = await q.get(key)
                return key if got is None or got.decode() != fresh[key] else None

        lost = [k for k in await asyncio.gather(*(one(k) for k in fresh)) if k is not None]
    return final, lost


@pytest.mark.timeout(900)  # 5 minutes on a 2-core machine shared with other test runs
def test_acknowledged_writes_survive_crashes_and_power_losses(
    power_cluster: Callable[[dict[str, Any]], PowerCluster],
) -> None:
    seed = int(os.environ.get("KK_POWERLOSS_SEED", random.randrange(1 << 31)))
    print(f"power-loss chaos: seed {seed} (KK_POWERLOSS_SEED={seed} replays it), {ROUNDS} rounds")
    rng = random.Random(seed)
    c = power_cluster(CONFIG)
    for i in c.ports:
        c.start(i)
    c.state()
    rounds: list[str] = []
    with Workload(c.client, seed) as load:
        wait_until("the first 20 acknowledged writes", lambda: load.acks >= 20, 60, errors=(Exception,))
        crashed: list[int] = []
        for r in range(ROUNDS):
            began = time.monotonic()
            what, crashed = _round(c, rng, crashed)
            target = load.acks + PROGRESS
            wait_until(
                f"{PROGRESS} writes acknowledged after round {r} ({what}; seed {seed})",
                lambda t=target: load.acks >= t,
                90,
                errors=(Exception,),
            )
            rounds.append(f"{what} {time.monotonic() - began:.1f}s")
        target = load.acks + 20
        wait_until(
            f"20 more writes acknowledged at the end (seed {seed})",
            lambda t=target: load.acks >= t,
            90,
            errors=(Exception,),
        )
    c.state()
    fresh = load.acknowledged_fresh_keys()
    final, lost = asyncio.run(_final_reads(c, load.registers, fresh))
    history = load.ops + final
    puts = [o for o in history if o.kind == "put"]
    print(f"{len(rounds)} rounds, {load.acks} acknowledged puts, {load.failures} indeterminate, "
          f"{len(history) - len(puts)} reads; rounds: {'; '.join(rounds)}")
    assert not lost, f"seed {seed}: {len(lost)} acknowledged writes lost, e.g. {sorted(lost)[:5]}"
    problems = stale_reads(history) + duplicate_offsets(history)
    assert not problems, f"seed {seed}: " + "\n".join(problems[:10])
    problems = check_registers(history)
    assert not problems, f"seed {seed}: " + "\n".join(problems)
    assert load.acks >= ROUNDS * PROGRESS and len(fresh) > 0
