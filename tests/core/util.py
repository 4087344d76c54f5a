"""Helpers for the focused core tests: one real ``RaftCore`` on a ``MemoryLog``, driven by
hand-made messages, so each RPC handler and error path is exercised directly."""

from __future__ import annotations

import random
from dataclasses import dataclass, field, replace
from typing import TypeVar

from quorum.core.config import CoreConfig
from quorum.core.memlog import MemoryLog
from quorum.core.messages import (
    FetchRequest,
    FetchResponse,
    Message,
    VoteRequest,
    VoteResponse,
)
from quorum.core.raft import RaftCore
from quorum.core.ready import AdminResult, Outbound, ReadResult, Ready
from quorum.types import ErrorCode, QuorumState, ReplicaKey

CLUSTER = "test-cluster"
M = TypeVar("M")
UUIDS = {i: f"00000000-0000-4000-8000-00000000000{i}" for i in range(1, 10)}


def key(i: int, u: str | None = None) -> ReplicaKey:
    return ReplicaKey(i, u if u is not None else UUIDS[i])


@dataclass
class Harness:
    core: RaftCore
    log: MemoryLog
    qs: QuorumState
    now: int = 0
    sent: list[Outbound] = field(default_factory=list)
    reads: list[ReadResult] = field(default_factory=list)
    admin: list[AdminResult] = field(default_factory=list)
    readies: list[Ready] = field(default_factory=list)
    corr: int = 1000

    def drain(self) -> list[Outbound]:
        """Handle every Ready (in the documented order) and return the messages sent."""
        out: list[Outbound] = []
        while True:
            r = self.core.ready()
            if r.is_empty():
                break
            self.readies.append(r)
            if r.truncate_to is not None:
                self.log.truncate(r.truncate_to)
            for b in r.append:
                self.log.append(b)
            if r.quorum_state is not None:
                self.qs = replace(r.quorum_state)
            if r.flush:
                self.log.flush()
            self.core.advance(r, self.log.durable_end)
            out.extend(r.messages)
            self.reads.extend(r.reads)
            self.admin.extend(r.admin_results)
        self.sent.extend(out)
        return out

    def step(self, msg: Message) -> list[Outbound]:
        self.core.step(msg, self.now)
        return self.drain()

    def tick(self, ms: int) -> list[Outbound]:
        out: list[Outbound] = []
        end = self.now + ms
        while self.now < end:
            self.now = min(end, self.now + 10)
            self.core.tick(self.now)
            out.extend(self.drain())
        return out

    def next_corr(self) -> int:
        self.corr += 1
        return self.corr

    def fetch(
        self,
        rid: int,
        offset: int | None = None,
        epoch: int | None = None,
        uuid: str | None = None,
        last_epoch: int | None = None,
        max_wait: int = 0,
        cluster: str = CLUSTER,
    ) -> list[Outbound]:
        """A Fetch from replica ``rid`` at ``offset`` (default: the leader's durable end)."""
        off = self.log.durable_end if offset is None else offset
        le = last_epoch
        if le is None:
            le = 0
            for info in self.log.infos:
                if info.base_offset < off:
                    le = info.epoch
        return self.step(
            FetchRequest(
                correlation_id=self.next_corr(),
                cluster_id=cluster,
                replica_id=rid,
                replica_uuid=UUIDS[rid] if uuid is None else uuid,
                current_leader_epoch=self.core.epoch if epoch is None else epoch,
                fetch_offset=off,
                last_fetched_epoch=le,
                max_wait_ms=max_wait,
                max_bytes=1 << 20,
                replica_endpoint=f"n{rid}:1",
            )
        )


def make(
    local: int = 1,
    voters: tuple[int, ...] = (1, 2, 3),
    pre_vote: bool = True,
    uuid: str | None = None,
    **cfg: int,
) -> Harness:
    log = MemoryLog()
    qs = QuorumState(CLUSTER)
    config = CoreConfig(
        bootstrap_voters={i: f"n{i}:1" for i in voters},
        local_endpoint=f"n{local}:1",
        pre_vote=pre_vote,
        **cfg,  # type: ignore[arg-type]
    )
    core = RaftCore(config, key(local, uuid), CLUSTER, qs, log.summary(), log, random.Random(7), 0)
    h = Harness(core, log, qs)
    h.drain()
    return h


def responses(out: list[Outbound], typ: type[M]) -> list[M]:
    return [o.message for o in out if isinstance(o.message, typ)]


def elect(h: Harness) -> None:
    """Make ``h`` the leader: answer every pre-vote and vote it sends with a grant."""
    answered: set[int] = set()
    for _ in range(300):
        for o in list(h.sent):
            m = o.message
            if isinstance(m, VoteRequest) and m.correlation_id not in answered:
                answered.add(m.correlation_id)
                h.step(
                    VoteResponse(
                        m.correlation_id,
                        ErrorCode.NONE,
                        -1,
                        m.candidate_epoch if not m.pre_vote else h.core.epoch,
                        True,
                        pre_vote=m.pre_vote,
                        voter_id=m.voter_id,
                        voter_uuid=UUIDS[m.voter_id],
                    )
                )
        if h.core.role_name == "leader":
            return
        h.tick(10)
    raise AssertionError(f"not elected: {h.core.role}")


def leader(voters: tuple[int, ...] = (1, 2, 3), bootstrap: bool = True, **cfg: int) -> Harness:
    """A leader whose followers have fetched everything (voter set bootstrapped, committed)."""
    h = make(1, voters, True, None, **cfg)
    elect(h)
    if bootstrap:
        for _ in range(4):
            for v in voters[1:]:
                h.fetch(v)
            h.tick(10)
        assert h.core.voters().from_log, h.core.voters()
        assert h.core.hw == h.log.durable_end
    return h


def fetch_responses(out: list[Outbound]) -> list[FetchResponse]:
    return [o.message for o in out if isinstance(o.message, FetchResponse)]
