"""In-memory doubles of the operator's ports, never used by a running operator: a quorum
implementing :class:`~..api.QuorumApi` (a deterministic model for the domain tests and the bench)
and a progress store (core/progress.py's port, through the same document as the file store).

The model follows the KIP-856 rules that matter to the operator: AddVoter only for a caught-up
observer (handling step 1), one uncommitted change at a time (VOTER_CHANGE_IN_PROGRESS), a change
commits only with a live majority of the *new* voter set (step 6), and the leader is whoever a live
majority of voters elects (no leader -> UNAVAILABLE).
"""

from __future__ import annotations

import uuid as _uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from quorum.types import ErrorCode, KraftError

from ..core.progress import Known, Progress, decode_progress, encode_progress


@dataclass
class SimReplica:
    id: int
    uuid: str
    alive: bool = True
    lag: int = 0  # records behind the leader's log end
    last_fetch_ms: int = -1
    endpoint: str | None = None


class InMemoryQuorum:
    """A quorum model driven by an explicit clock (``now_ms()``); call :meth:`tick` to let time act
    (live replicas fetch, elections happen). Fault hooks: ``kill``, ``revive``, ``replace_disk``,
    ``set_lag``, ``fail_next`` (make the next call of an op raise a code, optionally after having
    applied the change: the "outcome unknown" case)."""

    CATCH_UP_LAG = 100  # the leader's own AddVoter catch-up check (KIP-856 step 1)

    def __init__(self, n: int, now_ms: Callable[[], int], *, cluster_id: str = "sim") -> None:
        self.now_ms = now_ms
        self.cluster_id = cluster_id
        self.replicas: dict[tuple[int, str], SimReplica] = {}
        self.voters: list[tuple[int, str]] = []
        for i in range(1, n + 1):
            r = SimReplica(i, str(_uuid.uuid4()), endpoint=f"node-{i}:9000")
            self.replicas[(i, r.uuid)] = r
            self.voters.append((i, r.uuid))
        self.leader: tuple[int, str] | None = None
        self.epoch = 0
        self.log_end = 10
        self.pending: dict[str, Any] | None = None
        self.target: list[int] | None = None
        self.calls: list[tuple[str, Any]] = []  # every admin call, for assertions
        self._fail: dict[str, tuple[ErrorCode, bool]] = {}
        # The real leader keeps listing a replica it has heard from (e.g. a removed old disk)
        # among the observers, with its last fetch time; the model can do the same.
        self.list_dead_observers = False
        # Our engine refuses a RemoveVoter that would leave an id without any voter UUID (it wants
        # a reassignment for that); the model can do the same.
        self.refuse_removing_last_uuid = False
        self.closed = False
        self.tick()

    # -- faults ---------------------------------------------------------------------------------

    def current(self, replica_id: int) -> SimReplica:
        """The live process of replica ``replica_id`` (the latest disk)."""
        cands = [r for r in self.replicas.values() if r.id == replica_id and r.alive]
        if not cands:
            raise KeyError(replica_id)
        return cands[-1]

    def kill(self, replica_id: int) -> None:
        for r in self.replicas.values():
            if r.id == replica_id:
                r.alive = False
        self.tick()

    def revive(self, replica_id: int) -> None:
        latest = [r for r in self.replicas.values() if r.id == replica_id][-1]
        latest.alive = True
        self.tick()

    def replace_disk(self, replica_id: int, *, lag: int = 5000) -> str:
        """Stop ``replica_id``, give it an empty disk with a new storage UUID; returns the UUID."""
        for r in self.replicas.values():
            if r.id == replica_id:
                r.alive = False
        self.tick()  # the old process is gone (a new leader is elected if it led)
        r = SimReplica(replica_id, str(_uuid.uuid4()), lag=lag, endpoint=f"node-{replica_id}:9000")
        self.replicas[(replica_id, r.uuid)] = r
        self.tick()
        return r.uuid

    def set_lag(self, replica_id: int, lag: int) -> None:
        self.current(replica_id).lag = lag

    def fail_next(self, op: str, code: ErrorCode, *, apply: bool = False) -> None:
        self._fail[op] = (code, apply)

    # -- time -----------------------------------------------------------------------------------

    def _live_voters(self) -> list[tuple[int, str]]:
        return [k for k in self.voters if self.replicas[k].alive]

    def tick(self) -> None:
        now = self.now_ms()
        for r in self.replicas.values():
            if r.alive:
                r.last_fetch_ms = now
        if self.leader is not None and (
            not self.replicas[self.leader].alive or self.leader not in self.voters
        ):
            self.leader = None
        if len(self._live_voters()) < len(self.voters) // 2 + 1:
            self.leader = None  # a leader without a majority resigns (fetch timeout)
        elif self.leader is None:
            self.leader = min(self._live_voters())
            self.epoch += 1

    def append(self, n: int = 1) -> None:
        self.log_end += n

    # -- QuorumApi ------------------------------------------------------------------------------

    def _entry(self, key: tuple[int, str]) -> dict[str, Any]:
        r = self.replicas[key]
        leo = self.log_end - r.lag if r.alive or r.last_fetch_ms >= 0 else -1
        return {
            "id": r.id,
            "uuid": r.uuid,
            "endpoint": r.endpoint,
            "log_end_offset": leo,
            "lag": self.log_end - leo,
            "last_fetch_timestamp": r.last_fetch_ms,
            "last_caught_up_timestamp": r.last_fetch_ms if r.lag == 0 else -1,
        }

    def _require_leader(self) -> None:
        if self.leader is None:
            raise KraftError(ErrorCode.UNAVAILABLE, "no leader: fewer than a majority of voters are live")

    def _maybe_fail(self, op: str) -> tuple[ErrorCode, bool] | None:
        return self._fail.pop(op, None)

    async def describe(self) -> dict[str, Any]:
        self.calls.append(("describe", None))
        self._require_leader()
        assert self.leader is not None
        observers = [
            k
            for k, r in self.replicas.items()
            if k not in self.voters and (r.alive or (self.list_dead_observers and r.last_fetch_ms >= 0))
        ]
        return {
            "cluster_id": self.cluster_id,
            "leader_id": self.leader[0],
            "leader_epoch": self.epoch,
            "high_watermark": self.log_end,
            "voters": [self._entry(k) for k in self.voters],
            "observers": [self._entry(k) for k in observers],
            "pending_voter_change": self.pending,
            "target_voters": self.target,
            "leader_recovery_state": "RECOVERED",
        }

    def _commit_possible(self, voters: list[tuple[int, str]]) -> bool:
        live = [k for k in voters if self.replicas[k].alive]
        return len(live) >= len(voters) // 2 + 1

    async def add_voter(self, id: int, uuid: str) -> dict[str, Any]:
        self.calls.append(("add_voter", (id, uuid)))
        key = (id, uuid)
        failure = self._maybe_fail("add_voter")
        if failure and not failure[1]:
            raise KraftError(failure[0], "injected failure")
        self._require_leader()
        if self.pending is not None:
            raise KraftError(ErrorCode.VOTER_CHANGE_IN_PROGRESS, f"pending {self.pending}")
        if key in self.voters:
            raise KraftError(ErrorCode.VOTER_ALREADY_ADDED, f"{id}:{uuid} is a voter")
        r = self.replicas.get(key)
        if r is None or not r.alive:
            raise KraftError(ErrorCode.INVALID_REQUEST, f"{id}:{uuid} is not an observer")
        if r.lag > self.CATCH_UP_LAG:
            raise KraftError(ErrorCode.REPLICA_NOT_CAUGHT_UP, f"{id}:{uuid} lags {r.lag}")
        new = [*self.voters, key]
        if not self._commit_possible(new):
            self.pending = {"op": "add", "id": id, "uuid": uuid}
            raise KraftError(ErrorCode.REQUEST_TIMED_OUT, "AddVoter record not committed")
        self.voters = new
        self.tick()
        if failure:
            raise KraftError(failure[0], "injected failure after the change committed")
        return {"id": id, "uuid": uuid}

    async def remove_voter(self, id: int, uuid: str) -> dict[str, Any]:
        self.calls.append(("remove_voter", (id, uuid)))
        key = (id, uuid)
        failure = self._maybe_fail("remove_voter")
        if failure and not failure[1]:
            raise KraftError(failure[0], "injected failure")
        self._require_leader()
        if self.pending is not None:
            raise KraftError(ErrorCode.VOTER_CHANGE_IN_PROGRESS, f"pending {self.pending}")
        if key not in self.voters:
            raise KraftError(ErrorCode.VOTER_ALREADY_REMOVED, f"{id}:{uuid} is not a voter")
        if self.refuse_removing_last_uuid and not any(k[0] == id and k != key for k in self.voters):
            raise KraftError(ErrorCode.INVALID_REQUEST, f"removing {id}:{uuid} would remove replica id {id}")
        new = [k for k in self.voters if k != key]
        if not new or not self._commit_possible(new):
            self.pending = {"op": "remove", "id": id, "uuid": uuid}
            raise KraftError(ErrorCode.REQUEST_TIMED_OUT, "RemoveVoter record not committed")
        self.voters = new
        self.tick()
        if failure:
            raise KraftError(failure[0], "injected failure after the change committed")
        return {"id": id, "uuid": uuid}

    async def close(self) -> None:
        """Nothing to release; recorded so tests can check the operator closed it."""
        self.calls.append(("close", None))
        self.closed = True

    async def reassign(self, voters: list[int] | None) -> dict[str, Any]:
        """Completes at once (the engine does it as single changes, KIP-642)."""
        self.calls.append(("reassign", voters))
        self._require_leader()
        if voters is None:
            self.target = None
            return {}
        keys: list[tuple[int, str]] = []
        for i in voters:
            try:
                keys.append((i, self.current(i).uuid))
            except KeyError:
                raise KraftError(ErrorCode.INVALID_REQUEST, f"replica {i} is not live") from None
        self.voters = keys
        self.tick()
        return {"voters": voters}


class MemoryProgressStore:
    """A progress store in memory: each save keeps the encoded document (the file store's, so a
    round trip here exercises the same encoding), ``saves`` counts them."""

    def __init__(self, known: Callable[[], Known] = Known, text: str | None = None) -> None:
        self.known = known
        self.text = text
        self.saves = 0

    async def load(self) -> Progress:
        return Progress() if self.text is None else decode_progress(self.text, "the in-memory store")

    async def save(self, records: list[dict[str, Any]]) -> None:
        self.text = encode_progress(records, self.known())
        self.saves += 1
