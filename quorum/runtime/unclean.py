"""KIP-704 style unclean recovery, offline half: ``kraftkeeper quorum recover-unclean``.

Used only when a majority of voters is permanently gone. Run against a surviving node's
directory while that node is stopped: it appends, at a new epoch, a control batch that makes
this replica the sole voter with leader recovery state RECOVERING, and records the new epoch
in the quorum-state file. When the node starts it elects itself, refuses client reads/writes
and AddVoter while RECOVERING, verifies its log and state machine (``verify_local_state``),
snapshots, and writes RECOVERED; then voters can be added again.

Never automatic inside the engine (the operator may call it only when the resource allows it),
and loudly logged: offsets committed elsewhere but never replicated here are lost.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable

from quorum.core.raft import RaftCore
from quorum.core.recovery import plan_unclean_recovery
from quorum.records import decode_batches
from quorum.runtime.snapshots import Snapshotter
from quorum.runtime.statemachine import Applier
from quorum.storage import open_storage
from quorum.storage.base import LogStorage
from quorum.types import ErrorCode, KraftError

log = logging.getLogger("kraftkeeper.unclean")


def verify_local_state(lg: LogStorage) -> int:
    """Read the whole log and check every batch's CRC; returns the number of batches.
    Raises CORRUPT_LOG naming the offset if anything does not verify."""
    offset = lg.log_start_offset
    n = 0
    while offset < lg.end_offset:
        data = lg.read(offset, 16 * 1024 * 1024)
        if not data:
            break
        try:
            batches, _ = decode_batches(data, verify_crc=True)
        except KraftError as e:
            raise KraftError(
                ErrorCode.CORRUPT_LOG, f"log does not verify near offset {offset}: {e.message}"
            ) from None
        n += len(batches)
        offset = batches[-1].info.next_offset
    return n


def recover_unclean(data_dir: str) -> str:
    """Apply the offline recovery plan to a stopped node's directory; returns a summary."""
    meta, qstore, lg, _snapshots, summary = open_storage(data_dir)
    try:
        qstate = qstore.load()
        plan = plan_unclean_recovery(summary, qstate, meta.replica_key, 0)
        batch, new_state = plan.batch, plan.quorum_state
        lg.append(batch.base_offset, batch.epoch, batch.items(), batch.append_time_ms)
        lg.flush()
        qstore.save(new_state)
    finally:
        lg.close()
    msg = (
        f"UNCLEAN RECOVERY: node {meta.node_id} ({meta.storage_uuid}) is now the sole voter at epoch "
        f"{new_state.leader_epoch}, state RECOVERING; records committed elsewhere after offset "
        f"{summary.end_offset} may be lost"
    )
    log.warning("%s", msg)
    return msg


async def verify_recovery(
    core: RaftCore, lg: LogStorage, applier: Applier, snapshotter: Snapshotter, now_ms: Callable[[], int]
) -> None:
    """The online half (KIP-704 style): the sole leader after an unclean recovery verifies that
    every committed batch decodes (CRCs) and that the state machine rebuilt from them, snapshots,
    then tells the core it is RECOVERED. On failure it stays RECOVERING (logged)."""
    try:
        # The sole voter commits its whole log on its own; apply it all before verifying.
        deadline = time.monotonic() + 30
        while applier.applied_end < lg.end_offset and time.monotonic() < deadline:
            applier.applied.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(applier.applied.wait(), max(0.0, deadline - time.monotonic()))
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(None, verify_local_state, lg)
        lost_after = lg.end_offset
        snapshotter.busy = True
        try:
            await snapshotter.take_or_raise()
        finally:
            snapshotter.busy = False
        core.recovery_verified(lost_after, now_ms())
        log.warning("unclean recovery verified: offsets at or after %d may have been lost", lost_after)
        snapshotter.wake()
    except Exception:
        log.exception("unclean recovery verification failed; staying RECOVERING")
