"""One simulated replica (:class:`Node`: its core, driver, storage and state machine) and the ports
the real driver runs on inside the simulation: the network (:class:`SimTransport`, sending
through the scheduler of :class:`tests.sim.harness.Sim`), the quorum-state store, the result
sink and the simulated clock.
"""

from __future__ import annotations

import random
import uuid as _uuid
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from quorum.core.messages import FetchRequest, Message
from quorum.core.raft import RaftCore
from quorum.core.ready import AdminResult, Outbound, ProposalResult, ReadResult, RoleChange
from quorum.driver import Driver, Pending
from quorum.driver.memory import DictStateMachine
from quorum.storage.memory import MemoryLog, MemoryQuorumStateStore, MemorySnapshotStore
from quorum.types import QuorumState, ReplicaKey
from tests.sim.checks import CLUSTER

if TYPE_CHECKING:
    from tests.sim.harness import Sim



def uuid_for(rng: random.Random) -> str:
    return str(_uuid.UUID(int=rng.getrandbits(128), version=4))


_COUNTING: dict[type[RaftCore], type[RaftCore]] = {}


def counting(core_cls: type[RaftCore]) -> type[RaftCore]:
    """``core_cls`` that records, each time it moves its high watermark as leader, the voter
    set it counted: ``counted`` holds (old hw, new hw, voters) so the checks can judge an
    acknowledgement against the set that committed its offset, not any set in force since."""
    if core_cls not in _COUNTING:

        class Counting(core_cls):  # type: ignore[misc,valid-type]
            def set_hw(self, new_hw: int) -> None:
                old = self.hw
                super().set_hw(new_hw)
                if self.hw > old and self.leader_state() is not None:
                    crossed = (old, self.hw, frozenset(self.voters().voters))
                    self.__dict__.setdefault("counted", []).append(crossed)

        Counting.__name__ = f"Counting{core_cls.__name__}"
        _COUNTING[core_cls] = Counting
    return _COUNTING[core_cls]


@dataclass
class Node:
    id: int
    uuid: str
    log: MemoryLog = field(default_factory=MemoryLog)
    qstore: MemoryQuorumStateStore = field(default_factory=lambda: MemoryQuorumStateStore(CLUSTER))
    snapshots: MemorySnapshotStore = field(default_factory=MemorySnapshotStore)
    sm: DictStateMachine = field(default_factory=DictStateMachine)
    core: RaftCore | None = None
    driver: Driver | None = None
    pending: Pending | None = None  # a Ready whose persist (fsync) is in flight
    applied: int = 0  # exclusive end of what the checks compared with the committed map
    inbound: dict[int, tuple[int, int]] = field(default_factory=dict)  # local corr -> (src, orig)
    next_in: int = 0
    incarnation: int = 0
    last_epoch_seen: int = 0
    last_hw_seen: int = 0
    initial: bool = True  # formatted for the new cluster (False: a replacement disk)
    persisted_epoch: int = 0

    @property
    def key(self) -> ReplicaKey:
        return ReplicaKey(self.id, self.uuid)

    @property
    def endpoint(self) -> str:
        return f"node{self.id}:9000"

    @property
    def qs(self) -> QuorumState:
        return self.qstore.load()

    @property
    def kv(self) -> dict[str, str]:
        return self.sm.data


class SimTransport:
    def __init__(self, sim: Sim, node: Node) -> None:
        self.sim, self.node = sim, node

    def send(self, out: Outbound) -> None:
        msg = out.message
        if isinstance(msg, FetchRequest) and msg.fetch_offset > self.node.log.flushed_end_offset:
            # The pipelining rule (quorum.core.replication): a claim beyond the fsynced
            # log names only committed records, against the simulation's own record of what
            # was committed (not the node's view of it).
            if msg.fetch_offset > self.sim.committed_end:
                self.sim.fail(
                    "fetch-claims-durable",
                    f"node {self.node.id} sends a Fetch at offset {msg.fetch_offset} but has fsynced "
                    f"only up to {self.node.log.flushed_end_offset} and only "
                    f"{self.sim.committed_end} records are committed",
                )
            self.sim.pipelined_fetches += 1
        self.sim.send(self.node, out.destination_id, msg)


class SimQuorumState:
    """The node's quorum-state store, remembering the persisted epoch for the checks."""

    def __init__(self, node: Node) -> None:
        self.node = node

    def save(self, state: QuorumState) -> None:
        self.node.qstore.save(state)
        self.node.persisted_epoch = state.leader_epoch


class SimSink:
    """The driver's completions, handed to the simulation's checks with the node."""

    def __init__(self, sim: Sim, node: Node) -> None:
        self.sim, self.node = sim, node

    def proposal_done(self, result: ProposalResult) -> None:
        self.sim.on_proposal(self.node, result)

    def read_done(self, result: ReadResult) -> None:
        self.sim.on_read(result)

    def admin_done(self, result: AdminResult) -> None:
        self.sim.admin_results[result.request_id] = result
        self.sim.note(f"admin {result.request_id} -> {result.error.value} {result.message}")

    def role_changed(self, view: RoleChange) -> None:
        self.sim.on_role(self.node, view)

    def applied(self, applied_end: int, applied_epoch: int) -> None:
        self.sim.on_applied(self.node, applied_end)

    def recovery_needed(self) -> None:
        self.sim.recovery_needed.add(self.node.id)

    def note(self, message: str) -> None:
        self.sim.errors.append(f"node {self.node.id}: {message}")


class SimClock:
    def __init__(self, sim: Sim) -> None:
        self.sim = sim

    def now_ms(self) -> int:
        return self.sim.now


@dataclass(order=True)
class Delivery:
    at: int
    seq: int
    dest: int = field(compare=False)
    src: int = field(compare=False)
    incarnation: int = field(compare=False)  # of the destination when sent (requests) or of the sender
    message: Message = field(compare=False)
