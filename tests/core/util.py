"""Helpers for the focused core tests: one real ``RaftCore`` carried out by the real driver
(``quorum.driver``) over the in-memory storage of ``quorum.storage.memory``, fed hand-made
messages, so each RPC handler and error path is exercised directly."""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import TypeVar

from quorum.core.config import CoreConfig
from quorum.core.messages import (
    FetchRequest,
    FetchResponse,
    Message,
    VoteRequest,
    VoteResponse,
)
from quorum.core.raft import RaftCore
from quorum.core.ready import AdminResult, Outbound, ReadResult, Ready
from quorum.driver import Driver, Ports, StorageReader
from quorum.driver.memory import DictStateMachine, ManualClock, QueueTransport, RecordingSink, read_records
from quorum.storage import recover_log
from quorum.storage.memory import MemoryLog, MemoryQuorumStateStore, MemorySnapshotStore
from quorum.types import ControlRecord, ErrorCode, LogSummary, QuorumState, ReplicaKey

CLUSTER = "test-cluster"
M = TypeVar("M")
UUIDS = {i: f"00000000-0000-4000-8000-00000000000{i}" for i in range(1, 10)}


def key(i: int, u: str | None = None) -> ReplicaKey:
    return ReplicaKey(i, u if u is not None else UUIDS[i])


@dataclass
class Storage:
    log: MemoryLog = field(default_factory=MemoryLog)
    qstore: MemoryQuorumStateStore = field(default_factory=lambda: MemoryQuorumStateStore(CLUSTER))
    snapshots: MemorySnapshotStore = field(default_factory=MemorySnapshotStore)

    def summary(self) -> LogSummary:
        return recover_log(self.log, self.snapshots)

    def reader(self) -> StorageReader:
        return StorageReader(self.log, self.snapshots)


@dataclass
class Harness:
    core: RaftCore
    store: Storage
    clock: ManualClock = field(default_factory=ManualClock)
    transport: QueueTransport = field(default_factory=QueueTransport)
    sink: RecordingSink = field(default_factory=RecordingSink)
    sm: DictStateMachine = field(default_factory=DictStateMachine)
    readies: list[Ready] = field(default_factory=list)
    corr: int = 1000
    driver: Driver = field(init=False)

    def __post_init__(self) -> None:
        ports = Ports(
            self.store.log,
            self.store.qstore,
            self.store.snapshots,
            self.transport,
            self.clock,
            self.sm,
            self.sink,
        )
        self.driver = Driver(self.core, ports, self.store.log.log_start_offset)

    @property
    def now(self) -> int:
        return self.clock.now

    @now.setter
    def now(self, value: int) -> None:
        self.clock.now = value

    @property
    def log(self) -> MemoryLog:
        return self.store.log

    @property
    def qs(self) -> QuorumState:
        return self.store.qstore.load()

    @property
    def durable_end(self) -> int:
        return self.store.log.flushed_end_offset

    @property
    def sent(self) -> list[Outbound]:
        return self.transport.sent

    @property
    def reads(self) -> list[ReadResult]:
        return self.sink.reads

    @property
    def admin(self) -> list[AdminResult]:
        return self.sink.admin

    def records(self, start: int = 0, end: int | None = None) -> list[bytes | ControlRecord]:
        stop = self.log.end_offset if end is None else end
        return [r for _o, _e, r, _b in read_records(self.log, start, stop)]

    def last_epoch_below(self, offset: int) -> int:
        le = 0
        for _o, e, _r, _b in read_records(self.log, self.log.log_start_offset, offset):
            le = e
        return le

    def drain(self) -> list[Outbound]:
        """Carry out every Ready (through the driver) and return the messages sent."""
        first = len(self.transport.sent)
        for _ in range(1000):
            r = self.core.ready()
            if r.is_empty():
                return self.transport.sent[first:]
            self.readies.append(r)
            self.driver.carry_out(r)
        raise AssertionError("the core never went idle")

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
        off = self.durable_end if offset is None else offset
        le = self.last_epoch_below(off) if last_epoch is None else last_epoch
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
    core_cls: type[RaftCore] = RaftCore,
    **cfg: int,
) -> Harness:
    store = Storage()
    config = CoreConfig(
        bootstrap_voters={i: f"n{i}:1" for i in voters},
        local_endpoint=f"n{local}:1",
        pre_vote=pre_vote,
        **cfg,  # type: ignore[arg-type]
    )
    core = core_cls(
        config,
        key(local, uuid),
        CLUSTER,
        store.qstore.load(),
        store.summary(),
        store.reader(),
        random.Random(7),
        0,
    )
    h = Harness(core, store)
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


def leader(
    voters: tuple[int, ...] = (1, 2, 3), bootstrap: bool = True, pre_vote: bool = True, **cfg: int
) -> Harness:
    """A leader whose followers have fetched everything (voter set bootstrapped, committed)."""
    h = make(1, voters, pre_vote, None, **cfg)
    elect(h)
    if bootstrap:
        for _ in range(4):
            for v in voters[1:]:
                h.fetch(v)
            h.tick(10)
        assert h.core.voters().from_log, h.core.voters()
        assert h.core.hw == h.durable_end
    return h


def fetch_responses(out: list[Outbound]) -> list[FetchResponse]:
    return [o.message for o in out if isinstance(o.message, FetchResponse)]
