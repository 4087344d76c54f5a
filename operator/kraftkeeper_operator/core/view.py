"""The leader's ``describe`` object (docs/reference.md, ``quorum describe --json``) parsed into a
:class:`QuorumView`, with the liveness and majority arithmetic the recovery decisions use."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

# ---------------------------------------------------------------------------------------------
# The leader's describe object, parsed


@dataclass(frozen=True)
class Replica:
    """One ``voters`` / ``observers`` entry of ``quorum describe --json`` (docs/reference.md)."""

    id: int
    uuid: str
    endpoint: str | None = None
    log_end_offset: int = -1
    lag: int = -1
    last_fetch_ms: int = -1
    last_caught_up_ms: int = -1


@dataclass(frozen=True)
class PendingChange:
    op: str  # "add" | "remove"
    id: int
    uuid: str


class DescribeError(ValueError):
    """A describe object that does not follow docs/reference.md (names the field)."""


@dataclass(frozen=True)
class QuorumView:
    """The leader's view of the quorum at one instant."""

    leader_id: int
    leader_epoch: int
    high_watermark: int
    voters: tuple[Replica, ...]
    observers: tuple[Replica, ...] = ()
    pending: PendingChange | None = None
    target_voters: tuple[int, ...] | None = None
    recovery_state: str = "RECOVERED"
    cluster_id: str = ""

    @classmethod
    def from_describe(cls, d: Mapping[str, Any]) -> QuorumView:
        try:
            voters = tuple(_replica(r) for r in d["voters"])
            observers = tuple(_replica(r) for r in d.get("observers") or ())
            p = d.get("pending_voter_change")
            pending = PendingChange(str(p["op"]), int(p["id"]), str(p["uuid"])) if p else None
            tv = d.get("target_voters")
            return cls(
                leader_id=int(d["leader_id"]),
                leader_epoch=int(d["leader_epoch"]),
                high_watermark=int(d.get("high_watermark", -1)),
                voters=voters,
                observers=observers,
                pending=pending,
                target_voters=tuple(int(i) for i in tv) if tv is not None else None,
                recovery_state=str(d.get("leader_recovery_state", "RECOVERED")),
                cluster_id=str(d.get("cluster_id", "")),
            )
        except (KeyError, TypeError, ValueError) as e:
            raise DescribeError(f"describe object malformed: {type(e).__name__}: {e}") from e

    def voter_uuids(self, replica_id: int) -> list[str]:
        return [v.uuid for v in self.voters if v.id == replica_id]

    def leader_uuid(self) -> str | None:
        """UUID of the leader's voter entry. With two voters of the leader's id (mid-recovery)
        the dead old one cannot be leading, so take the one that fetched / wrote most recently."""
        mine = [v for v in self.voters if v.id == self.leader_id]
        if not mine:
            return None
        return max(mine, key=lambda v: (v.last_fetch_ms, v.log_end_offset)).uuid

    def is_live(self, r: Replica, now_ms: int, window_ms: int) -> bool:
        if r.id == self.leader_id and r.uuid == self.leader_uuid():
            return True
        return r.last_fetch_ms >= 0 and now_ms - r.last_fetch_ms <= window_ms

    def live_voters(self, now_ms: int, window_ms: int) -> list[Replica]:
        return [v for v in self.voters if self.is_live(v, now_ms, window_ms)]

    def live_for_change(self, r: Replica, now_ms: int, window_ms: int) -> bool:
        """Whether ``r`` may be counted toward the majority that must commit a voter change:
        :func:`live_for_change` with this view's leader."""
        is_leader = r.id == self.leader_id and r.uuid == self.leader_uuid()
        return live_for_change(r, is_leader=is_leader, now_ms=now_ms, window_ms=window_ms)

    def change_live_voters(
        self, now_ms: int, window_ms: int, *, exclude: tuple[int, str] | None = None
    ) -> list[Replica]:
        """The voters (but ``exclude``, the one a change removes or supersedes) that count toward
        the majority after a voter change."""
        return [
            v
            for v in self.voters
            if (v.id, v.uuid) != exclude and self.live_for_change(v, now_ms, window_ms)
        ]

    def after_change(self, add: bool, replica_id: int, uuid: str) -> QuorumView:
        """This view with a committed voter change applied: AddVoter moves the (id, uuid) observer
        (or a bare entry) into the voters, RemoveVoter drops the (id, uuid) voter. What the status
        written right after the commit shows, before the next describe (the status that
        carried a Succeeded record still listed the removed voter)."""
        key = (replica_id, uuid)
        if not add:
            return replace(self, voters=tuple(v for v in self.voters if (v.id, v.uuid) != key))
        if any((v.id, v.uuid) == key for v in self.voters):
            return self
        joined = next((o for o in self.observers if (o.id, o.uuid) == key), Replica(replica_id, uuid))
        return replace(
            self,
            voters=(*self.voters, joined),
            observers=tuple(o for o in self.observers if (o.id, o.uuid) != key),
        )

    def has_live_majority(self, now_ms: int, window_ms: int) -> bool:
        return self.leader_id >= 0 and len(self.live_voters(now_ms, window_ms)) >= majority(len(self.voters))


def _replica(r: Mapping[str, Any]) -> Replica:
    return Replica(
        id=int(r["id"]),
        uuid=str(r["uuid"]) if r.get("uuid") else "",  # "" = not known yet (bootstrap voter)
        endpoint=r.get("endpoint"),
        log_end_offset=int(r.get("log_end_offset", -1)),
        lag=int(r.get("lag", -1)),
        last_fetch_ms=int(r.get("last_fetch_timestamp", -1)),
        last_caught_up_ms=int(r.get("last_caught_up_timestamp", -1)),
    )


def majority(n: int) -> int:
    return n // 2 + 1


# A follower long-polls Fetch for at most fetch_max_wait_ms (500 ms by default, in our engine and
# in Kafka's KRaft), so a running voter's last fetch is never much older than that; three times it
# allows for a loaded machine. A voter killed a moment ago is still "live" by the policy's window
# (5 s by default, what status and QuorumLost use) but no longer by this.
CHANGE_FETCH_SILENCE_MS = 1_500


def live_for_change(r: Replica, *, is_leader: bool, now_ms: int, window_ms: int) -> bool:
    """The sharper liveness a voter change relies on (found by a flaky test: a voter killed within
    the 5 s live window still counted live, so RemoveVoter started and could not commit).

    ``r`` counts only if it is the leader, or the leader reports both
    * its last fetch within ``min(window_ms, CHANGE_FETCH_SILENCE_MS)`` (it is still fetching), and
    * when the leader reports it (``last_caught_up_timestamp`` >= 0, KIP-853 DescribeQuorum v2's
      lastCaughtUpTimestamp), that it was caught up to the leader's end within ``window_ms`` (its
      lag is not growing without bound); -1 = not reported, so only the fetch rule applies.

    Invariant: ``live_for_change`` implies :meth:`QuorumView.is_live` (it is never more permissive
    than the status rule), so using it for the majority-after-change check can only refuse a
    change that the window rule would allow, never allow one it would refuse."""
    if is_leader:
        return True
    fetch_ms = min(window_ms, CHANGE_FETCH_SILENCE_MS)
    if r.last_fetch_ms < 0 or now_ms - r.last_fetch_ms > fetch_ms:
        return False
    return r.last_caught_up_ms < 0 or now_ms - r.last_caught_up_ms <= window_ms
