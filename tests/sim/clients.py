"""What the simulation's clients and operators do (mixed into :class:`tests.sim.harness.Sim`):
find the leader, write and read through it, run an admin call (add, remove or reassign voters)
and wait for its result, run the simulation until a condition holds, and summarise a run.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from quorum.types import KraftError

if TYPE_CHECKING:
    from tests.sim.harness import Sim
    from tests.sim.nodes import Node


class ClientOps:
    """Client and admin operations over the simulation's state (``self`` is a :class:`Sim`)."""

    def leader(self) -> Node | None:
        best: Node | None = None
        for n in self.nodes.values():
            if n.core is not None and n.core.role_name == "leader":
                if best is None or n.core.epoch > best.core.epoch:  # type: ignore[union-attr]
                    best = n
        return best

    def write(self, count: int = 1) -> bool:
        ld = self.leader()
        if ld is None or ld.core is None:
            return False
        recs = []
        for _ in range(count):
            self.client_seq += 1
            recs.append(f'{{"k": "k{self.client_seq % 17}", "v": "v{self.client_seq}"}}')
        try:
            last = ld.core.propose([r.encode() for r in recs], self.now)
        except KraftError:
            return False
        self.proposals[(ld.id, ld.uuid, last, ld.core.epoch)] = recs
        self.pump(ld)
        return True

    def read(self) -> int | None:
        ld = self.leader()
        if ld is None or ld.core is None:
            return None
        self.read_seq += 1
        try:
            ld.core.read_index(self.read_seq, self.now)
        except KraftError:
            return None
        self.reads[self.read_seq] = self.max_acked
        self.pump(ld)
        return self.read_seq

    def admin(self, op: str, arg: Any) -> int | None:
        ld = self.leader()
        if ld is None or ld.core is None:
            return None
        self.admin_seq += 1
        rid = self.admin_seq
        self.note(f"admin {rid}: {op} {arg} at leader {ld.id}")
        if op == "add":
            ld.core.add_voter(rid, arg, self.now)
        elif op == "remove":
            ld.core.remove_voter(rid, arg, self.now)
        else:
            ld.core.reassign(rid, arg, self.now)
        self.pump(ld)
        return rid

    def wait_admin(self, rid: int | None, ms: int = 8000) -> Any:
        if rid is None:
            return None
        end = self.now + ms
        while self.now < end and rid not in self.admin_results:
            self.run(self.step_ms)
        return self.admin_results.get(rid)

    def until(self, cond: Callable[[], bool], ms: int, action: Callable[[Sim], None] | None = None) -> bool:
        end = self.now + ms
        while self.now < end:
            if cond():
                return True
            self.run(self.step_ms, action)
        return cond()

    def summary(self) -> dict[str, Any]:
        return {
            "seed": self.seed,
            "now": self.now,
            "committed": self.committed_end,
            "pipelined_fetches": self.pipelined_fetches,
            "deferred_fsyncs": self.deferred_fsyncs,
            "cuts_with_unsynced": self.cuts_with_unsynced,
            "kills_with_unsynced": self.kills_with_unsynced,
            "leaders": len(self.leaders),
            "errors": len(self.errors),
        }
