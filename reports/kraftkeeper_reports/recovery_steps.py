"""One recovery's events as the generator draws them, step by step (see ``generate``).

A recovery is detection, catch-up, then two voter changes (KIP-856 "Disk failure recovery":
AddVoter then RemoveVoter; Kafka, KIP-853: RemoveVoter then AddVoter), each started by the
operator and committed one quorum round later, or a failure at the step it names. The random
draws happen in a fixed order, so a seed gives the same lines whatever the caller's structure.
"""

from __future__ import annotations

import math
import random
from typing import Final, NamedTuple

from kraftkeeper_reports import events as ev
from kraftkeeper_reports.intervals import ADD_THEN_REMOVE, AUTO_JOIN
from quorum.timefmt import rfc3339


class Who(NamedTuple):
    """What every line of one recovery repeats."""

    cluster: str
    rid: str
    replica: int
    old: str
    new: str


# One event of a recovery before it is written: (type, ms into the day, leader, epoch, detail).
# A plain tuple, not a NamedTuple: one is made per event and the generator's speed is per event.
Ev = tuple[str, int, int | None, int | None, str]
TYP: Final = 0  # the fields generate's anomalies change
AT: Final = 1


def line(day_start: int, who: Who, e: Ev) -> str:
    """``e`` as one event-log line (the schema of ``events``), ``day_start`` in epoch ms."""
    # Hand-built for speed (json.dumps per event halves the generator's throughput); the values
    # are JSON-safe by construction: cluster and ids have no quotes or backslashes.
    cluster, rid, replica, old, new = who
    typ, at, leader, epoch, detail = e
    lid = "null" if leader is None else str(leader)
    lep = "null" if epoch is None else str(epoch)
    return (
        f'{{"schema_version":1,"ts":"{rfc3339(day_start + at, millis=True)}","cluster":"{cluster}",'
        f'"recovery_id":"{rid}","type":"{typ}","replica_id":{replica},"old_uuid":"{old}",'
        f'"new_uuid":"{new}","leader_id":{lid},"leader_epoch":{lep},"detail":{detail}}}'
    )


# Why a recovery failed: (fewest, most ms after the step it failed in, message, leader still known).
FAILURES: Final = {
    ev.REASON_FELL_BEHIND: (2_000, 30_000, "REPLICA_NOT_CAUGHT_UP after 5 retries", True),
    ev.REASON_QUORUM_LOST: (500, 20_000, "no leader for 10 s", False),  # leader_id null on the failed event
}


class Steps:
    """One recovery's events as they are drawn, each ``wait`` ms after the one before."""

    def __init__(self, rng: random.Random, t: int, leader: int, epoch: int) -> None:
        self.rng, self.t, self.leader, self.epoch = rng, t, leader, epoch
        self.events: list[Ev] = []

    def add(self, typ: str, wait: int, detail: str = "{}", leader_known: bool = True) -> None:
        self.t += wait
        lead, ep = (self.leader, self.epoch) if leader_known else (None, None)
        self.events.append((typ, self.t, lead, ep, detail))

    def fail(self, reason: str) -> None:
        if reason == "timeout":  # the operator's catch-up deadline (10 min)
            self.add(ev.RECOVERY_FAILED, 600_000, '{"reason":"timeout","message":"catch-up exceeded 600 s"}')
            return
        lo, hi, message, leader_known = FAILURES[reason]
        self.add(ev.RECOVERY_FAILED, int(self.rng.uniform(lo, hi)),
                 f'{{"reason":"{reason}","message":"{message}"}}', leader_known)

    def change(self, started: str, committed: str, voters: int, gap_ms: tuple[int, int],
               commit_ms: float, fails: str | None) -> bool:
        """One voter change as the operator logs it: started ``gap_ms`` (mean, least) after the
        step before, then failed for ``fails`` or committed one quorum round later (median
        ``commit_ms``) with ``voters`` voters. False when it failed."""
        self.add(started, int(self.rng.expovariate(1 / gap_ms[0])) + gap_ms[1])
        if fails:
            self.fail(fails)
            return False
        commit = int(self.rng.lognormvariate(math.log(commit_ms), 0.5)) + 1
        self.add(committed, commit, f'{{"voters":{voters}}}')
        return True


def voter_changes(s: Steps, order: str, voters: int, failed: str | None) -> None:
    """The steps after catch-up in ``order``. AddThenRemove (KIP-856): AddVoter, where a replica
    behind again or a lost quorum fails the recovery, then RemoveVoter. RemoveThenAdd (KIP-853,
    ``operator watch``): RemoveVoter, failed by a lost quorum, then AddVoter, failed by a replica
    behind again, with the voter set left one short. Auto-join is recorded from outside
    (``kafka_probe.AutoJoinRecorder``): only committed steps, seen by a DescribeQuorum every 50 ms,
    and Kafka never gives up."""
    rng = s.rng
    if order == AUTO_JOIN:  # Kafka's controller notices and removes the old id within its own period
        for typ, median, n in ((ev.REMOVE_VOTER_COMMITTED, 900, voters - 1),
                               (ev.ADD_VOTER_COMMITTED, 400, voters)):
            s.add(typ, int(rng.lognormvariate(math.log(median), 0.4)) + 50, f'{{"voters":{n}}}')
        s.add(ev.RECOVERY_COMPLETED, int(rng.expovariate(1 / 60)) + 1)
        return
    if order == ADD_THEN_REMOVE:
        ok = s.change(ev.ADD_VOTER_STARTED, ev.ADD_VOTER_COMMITTED, voters + 1, (150, 5), 6, failed) and \
            s.change(ev.REMOVE_VOTER_STARTED, ev.REMOVE_VOTER_COMMITTED, voters, (40, 2), 5, None)
    else:
        lost = failed if failed == ev.REASON_QUORUM_LOST else None
        behind = failed if failed == ev.REASON_FELL_BEHIND else None
        ok = s.change(ev.REMOVE_VOTER_STARTED, ev.REMOVE_VOTER_COMMITTED, voters - 1, (150, 5), 8, lost) and \
            s.change(ev.ADD_VOTER_STARTED, ev.ADD_VOTER_COMMITTED, voters, (40, 2), 8, behind)
    if ok:
        s.add(ev.RECOVERY_COMPLETED, int(rng.expovariate(1 / 3)) + 1)
