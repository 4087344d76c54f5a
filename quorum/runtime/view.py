"""The node's published view of the quorum (role, epoch, leader) and its clock.

The view is what the node tells the outside world: ``/readyz``, the leader hint in every 421
answer, ``/v1/node/log-state``, who may serve describe. It changes only when the core publishes
a ``RoleChange``; at start it is the role the core restored from its quorum state (a
follower restarted on its own directory must report its leader at once, not ``unattached``).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any

from quorum.core.raft import RaftCore
from quorum.core.ready import RoleChange
from quorum.types import ErrorCode, KraftError

__all__ = ["Clock", "NodeView"]

log = logging.getLogger("kraftkeeper.node")


class Clock:
    """Wall-clock milliseconds that never go backwards (timestamps in describe are epoch ms,
    KIP-836 style; the monotonic clock keeps them from jumping back with NTP)."""

    def __init__(self) -> None:
        self._wall0 = time.time()
        self._mono0 = time.monotonic()

    def now_ms(self) -> int:
        return int((self._wall0 + (time.monotonic() - self._mono0)) * 1000)


@dataclass
class NodeView:
    node_id: int
    role: str
    epoch: int
    leader_id: int
    leader_endpoint: str | None

    @classmethod
    def restored(cls, node_id: int, core: RaftCore) -> NodeView:
        """The role the core restored at start (KIP-595: a follower of epoch E keeps following
        its leader after a restart); the driver publishes the same in its first Ready."""
        rc = core.role_view()
        return cls(node_id, rc.role, rc.epoch, rc.leader_id, rc.leader_endpoint)

    def publish(self, rc: RoleChange) -> None:
        if rc.role != self.role or rc.epoch != self.epoch or rc.leader_id != self.leader_id:
            log.info("role %s epoch %d leader %d", rc.role, rc.epoch, rc.leader_id)
        self.role, self.epoch, self.leader_id, self.leader_endpoint = (
            rc.role,
            rc.epoch,
            rc.leader_id,
            rc.leader_endpoint,
        )

    def error(self, code: ErrorCode, message: str = "") -> KraftError:
        """A refusal; NOT_LEADER carries the leader hint (docs/reference.md: 421 with
        ``leader_id``, ``leader_epoch``, ``leader_endpoint``)."""
        if code is ErrorCode.NOT_LEADER:
            return KraftError(
                code,
                message or f"node {self.node_id} is not the leader",
                leader_id=self.leader_id,
                leader_epoch=self.epoch,
                leader_endpoint=self.leader_endpoint,
            )
        return KraftError(code, message or code.value)

    def readiness(self) -> tuple[bool, dict[str, Any]]:
        """Ready means the node knows a leader or is it (Strimzi #12760: readiness that reflects
        the quorum, not just a live process)."""
        ok = self.leader_id >= 0 and self.role in ("leader", "follower")
        return ok, {"ready": ok, "role": self.role, "leader_id": self.leader_id, "epoch": self.epoch}
