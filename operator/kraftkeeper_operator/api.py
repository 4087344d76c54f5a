"""The narrow quorum interface the operator needs: the membership backend port.

``QuorumApi`` is the subset of :class:`quorum.client.QuorumClient` the recovery controller calls
(describe, AddVoter, RemoveVoter, reassignment), so the controller runs unchanged against real
node processes (``QuorumClient``), a Kafka controller quorum (``kafka.backend``) and the in-memory
model of the tests (``testing.memory``).
"""

from __future__ import annotations

from typing import Any, Protocol


class QuorumApi(Protocol):
    """What the operator asks of a quorum: the whole contract an engine adapter implements (our
    engine's ``QuorumClient``, the in-memory model of ``testing.memory``, a Kafka controller quorum).

    Errors are :class:`quorum.types.KraftError` with the engine's code (docs/reference.md error
    codes); ``TimeoutError`` / ``OSError`` mean the quorum was not reached (outcome unknown).

    * ``describe()``: the leader's view, the ``quorum describe --json`` object of docs/reference.md
      (leader_id, leader_epoch, high_watermark, voters / observers with id, uuid, endpoint,
      log_end_offset, lag, last_fetch_timestamp, pending_voter_change, target_voters, ...);
    * ``add_voter(id, uuid)`` / ``remove_voter(id, uuid)``: one KIP-856 voter change; returns only
      once the change is *committed* (the controller starts the next step right away);
    * ``reassign(voters)``: KIP-642 reassignment of the voter ids (None cancels);
    * ``close()``: release connections; the object is not used afterwards.
    """

    async def describe(self) -> dict[str, Any]: ...

    async def add_voter(self, id: int, uuid: str) -> dict[str, Any]: ...

    async def remove_voter(self, id: int, uuid: str) -> dict[str, Any]: ...

    async def reassign(self, voters: list[int] | None) -> dict[str, Any]: ...

    async def close(self) -> None: ...
