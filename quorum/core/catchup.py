"""Catch-up of a replica far behind its leader: batched fsyncs and larger fetches.

Both rules apply only while a follower's log end is below the high watermark its leader last
told it (``Follower.leader_hw``): committed records are still to fetch. Pure functions; the
follower and leader sides of ``quorum.core.replication`` and ``RaftCore.ready`` call them.

Batched fsync. The Ready that hands over fetched batches asks for no fsync until
``catchup_flush_bytes`` were appended since the last one (:func:`defer_flush`). The Ready
whose batches reach that high watermark fsyncs everything, as do a Ready with a leader's
batch, a truncation, a snapshot or a quorum-state save, and the first Ready of any role other
than follower while the log is not durable (``RaftCore.ready``: before it votes or leads on
it). This changes no claim: every Fetch sent meanwhile names an offset at or below the high
watermark (the batches end below the leader's, and the local one is the leader's capped at
the local end), which the pipelining invariant of ``quorum.core.replication`` already allows;
the driver's backstop and the simulation's check (tests/sim, with power cuts) are the same.
What a power cut may lose grows from one response to ``catchup_flush_bytes`` plus one
response, all of it committed and durable on the majority that committed it; the replica
then fetches again from its real end. Pipelining itself stops where catch-up ends: the Fetch
after the batches that reach the leader's high watermark waits for their fsync
(``tick_fetch``), so a leader sees a replica caught up (lag 0, KIP-856 AddVoter's check) only
once everything it fetched is durable. The driver applies committed records only once they are
fsynced locally (``Driver.apply_to`` is capped at the fsynced end), as before.

Larger fetches. While far behind, the follower asks for ``catchup_fetch_max_bytes`` per Fetch
(KIP-595 Fetch carries MaxBytes) instead of ``fetch_max_bytes``, and the leader serves that
much only for an offset below its own high watermark (:func:`serve_max_bytes`); at the tail
both stay at ``fetch_max_bytes``. Memory bounds, with the defaults (32 MiB fetches, 64 MiB
fsync budget): the leader holds one response per Fetch being answered (32 MiB, or one batch
when a batch is larger); the follower one response in flight, one being written, and the
written, not yet fsynced batches its state machine has still to apply (the budget): at most
about 128 MiB, which the driver's ``RecentBatches`` is sized to hold (else it would read them
back from the log to apply them).
"""

from __future__ import annotations

from collections.abc import Sequence

from quorum.core.config import CoreConfig
from quorum.core.ready import LeaderBatch, RawBatches
from quorum.core.roles import Follower, Role

__all__ = ["defer_flush", "fetch_max_bytes", "serve_max_bytes"]


def far_behind(role: Role, end: int) -> bool:
    """A follower whose log ends below the high watermark its leader last told it."""
    return isinstance(role, Follower) and end < role.leader_hw


def defer_flush(role: Role, end: int, budget: int, append: Sequence[LeaderBatch | RawBatches]) -> bool:
    """May the Ready handing over ``append`` (the log then ending at ``end``) skip its fsync?
    Counts the appended bytes in ``role`` either way; the count starts over when the fsync is
    asked for."""
    if not isinstance(role, Follower) or not append:
        return False
    size = 0
    for b in append:
        if not isinstance(b, RawBatches):
            role.unflushed_bytes = 0
            return False
        size += len(b.data)
    role.unflushed_bytes += size
    if far_behind(role, end) and role.unflushed_bytes < budget:
        return True
    role.unflushed_bytes = 0
    return False


def fetch_max_bytes(role: Role, end: int, config: CoreConfig) -> int:
    """MaxBytes of the follower's next Fetch from ``end``."""
    if far_behind(role, end):
        return max(config.fetch_max_bytes, config.catchup_fetch_max_bytes)
    return config.fetch_max_bytes


def serve_max_bytes(fetch_offset: int, hw: int, config: CoreConfig) -> int:
    """The most a leader with high watermark ``hw`` serves for a Fetch at ``fetch_offset``
    (and never more than the request's MaxBytes, except to send one whole batch)."""
    if fetch_offset < hw:
        return max(config.fetch_max_bytes, config.catchup_fetch_max_bytes)
    return config.fetch_max_bytes
