"""``describe`` (the ``quorum describe --json`` object of docs/reference.md, KIP-595
DescribeQuorum with KIP-856 observers) and the metric values (KIP-595 and KIP-856 metric set).
"""

from __future__ import annotations

from typing import Any

from quorum.core.membership import MembershipMixin
from quorum.core.progress import LeaderState, ReplicaProgress
from quorum.core.roles import Leader
from quorum.types import ReplicaKey


class DescribeMixin(MembershipMixin):
    def _replica_row(
        self, key: ReplicaKey, p: ReplicaProgress | None, ls: LeaderState | None
    ) -> dict[str, Any]:
        is_local = key.id == self.local.id and (key.uuid is None or key.uuid == self.local.uuid)
        if is_local and ls is not None:
            leo, fetched, caught = self.meta.durable_end, self.now, self.now
        elif p is not None:
            leo, fetched, caught = p.end_offset, p.last_fetch_ms, p.last_caught_up_ms
        else:
            leo, fetched, caught = -1, -1, -1
        uuid = key.uuid
        if uuid is None and p is not None:
            uuid = p.key.uuid
        endpoint = (
            self.key_endpoints.get(key) or (p.endpoint if p is not None else None) or self.endpoint_of(key.id)
        )
        lag = max(0, self.meta.end - leo) if leo >= 0 else -1
        return {
            "id": key.id,
            "uuid": uuid,
            "endpoint": endpoint,
            "log_end_offset": leo,
            "lag": lag,
            "last_fetch_timestamp": fetched,
            "last_caught_up_timestamp": caught,
        }

    def describe(self, now_ms: int) -> dict[str, Any]:
        """The ``quorum describe --json`` object. Progress numbers are only known on the
        leader; elsewhere they are -1 (the runtime forwards describe to the leader)."""
        self.now = max(self.now, now_ms)
        ls = self.leader_state()
        voters = self.voters()
        rows = []
        for v in voters.sorted_voters():
            rows.append(self._replica_row(v, ls.progress_of_voter(v) if ls is not None else None, ls))
        observers = []
        if ls is not None:
            for key, p in sorted(ls.progress.items(), key=lambda kv: (kv[0].id, kv[0].uuid or "")):
                if voters.find(key) is None or (
                    voters.find(key) != key and ReplicaKey(key.id, None) not in voters.voters
                ):
                    observers.append(self._replica_row(key, p, ls))
            if voters.find(self.local) is None:
                observers.append(self._replica_row(self.local, None, ls))
        change = self.pending_voter_change()
        return {
            "cluster_id": self.cluster_id,
            "leader_id": self.leader_id(),
            "leader_epoch": self.epoch,
            "high_watermark": self.hw,
            "voters": rows,
            "observers": observers,
            "pending_voter_change": None
            if change is None
            else {"op": change.op, "id": change.key.id, "uuid": change.key.uuid},
            "target_voters": None if voters.target_voters is None else list(voters.target_voters),
            "leader_recovery_state": voters.recovery.value,
        }

    def metrics(self) -> dict[str, Any]:
        """KIP-595 (current-leader, current-epoch, current-vote, high-watermark,
        log-end-offset, current-state) and KIP-856 (number-of-voters,
        number-of-possible-voters, pending-add-voter, pending-remove-voter) values, plus the
        leader recovery state. Election latencies come as ``RoleChange.election_latency_ms``."""
        voters = self.voters()
        change = self.pending_voter_change()
        ls = self.leader_state()
        possible = 0
        if ls is not None:
            possible = sum(1 for k in ls.progress if voters.find(k) is None and k.uuid is not None)
        return {
            "current_leader": self.leader_id(),
            "current_epoch": self.epoch,
            "current_vote": self.quorum.voted_id if self.quorum.leader_epoch == self.epoch else -1,
            "high_watermark": self.hw,
            "log_end_offset": self.meta.end,
            "log_start_offset": self.meta.log_start,
            "current_state": self.role.name
            if self.is_voter() or isinstance(self.role, Leader)
            else f"observer-{self.role.name}",
            "is_voter": self.is_voter(),
            "number_of_voters": len(voters.voters),
            "number_of_possible_voters": possible,
            "pending_add_voter": 1 if change is not None and change.op == "add" else 0,
            "pending_remove_voter": 1 if change is not None and change.op == "remove" else 0,
            "leader_recovery_state": voters.recovery.value,
        }
