"""The quorum-state file: KIP-856 ``QuorumStateData`` as JSON, replaced atomically.

KIP-595 requires the epoch and vote to be durable before any message depending on them is
sent (a replica must never vote twice in one epoch); the driver calls :meth:`save` before
sending, and :func:`~quorum.storage.atomic.atomic_write` makes the replacement all-or-nothing.

File content (``quorum-state`` in the metadata directory)::

    {"cluster_id": "...", "leader_id": -1, "leader_epoch": 0, "voted_id": -1,
     "voted_uuid": null, "applied_offset": 0, "data_version": 1}

``data_version`` is the QuorumStateData schema version: 1 is KIP-856's (``VotedUuid`` added,
``CurrentVoters`` removed: the voter set lives in the log and snapshots).
"""

from __future__ import annotations

import json
import os
from typing import Any

from quorum.storage.atomic import atomic_write, ensure_dir
from quorum.strictjson import loads_strict
from quorum.types import ErrorCode, KraftError, QuorumState, canonical_uuid

__all__ = [
    "DATA_VERSION",
    "QUORUM_STATE_FILE",
    "QuorumStateStore",
    "decode_quorum_state",
    "encode_quorum_state",
]

QUORUM_STATE_FILE = "quorum-state"
DATA_VERSION = 1
_INT32 = (-(2**31), 2**31 - 1)
_INT64 = (-(2**63), 2**63 - 1)
MAX_FILE_BYTES = 64 * 1024
_FIELDS = frozenset(
    {"cluster_id", "leader_id", "leader_epoch", "voted_id", "voted_uuid", "applied_offset", "data_version"}
)


def encode_quorum_state(state: QuorumState) -> bytes:
    """The file bytes for ``state`` (validated: a bad state is refused before it can be written)."""
    _validate(state, "quorum state")
    d = {
        "cluster_id": state.cluster_id,
        "leader_id": state.leader_id,
        "leader_epoch": state.leader_epoch,
        "voted_id": state.voted_id,
        "voted_uuid": state.voted_uuid,
        "applied_offset": state.applied_offset,
        "data_version": DATA_VERSION,
    }
    return (json.dumps(d, separators=(",", ":")) + "\n").encode()


def _validate(state: QuorumState, where: str) -> None:
    def check_int(name: str, value: object, bounds: tuple[int, int], minimum: int) -> None:
        if isinstance(value, bool) or not isinstance(value, int) or not bounds[0] <= value <= bounds[1]:
            raise KraftError(
                ErrorCode.INVALID_REQUEST, f"{where}: field {name!r}={value!r} is not an integer"
            )
        if value < minimum:
            raise KraftError(
                ErrorCode.INVALID_REQUEST, f"{where}: field {name!r}={value!r} is below {minimum}"
            )

    if not isinstance(state.cluster_id, str):
        raise KraftError(ErrorCode.INVALID_REQUEST, f"{where}: field 'cluster_id' is not a string")
    check_int("leader_id", state.leader_id, _INT32, -1)
    check_int("leader_epoch", state.leader_epoch, _INT32, -1)
    check_int("voted_id", state.voted_id, _INT32, -1)
    check_int("applied_offset", state.applied_offset, _INT64, 0)
    if state.voted_uuid is not None:
        try:
            canonical_uuid(state.voted_uuid)
        except (ValueError, TypeError, AttributeError):
            raise KraftError(
                ErrorCode.INVALID_REQUEST, f"{where}: field 'voted_uuid'={state.voted_uuid!r} is not a UUID"
            ) from None


def decode_quorum_state(raw: bytes, where: str = QUORUM_STATE_FILE) -> QuorumState:
    """Parse file bytes; anything malformed raises CORRUPT_LOG naming ``where`` and the field."""
    if len(raw) > MAX_FILE_BYTES:
        raise KraftError(ErrorCode.CORRUPT_LOG, f"{where}: larger than {MAX_FILE_BYTES} bytes", file=where)
    try:
        d: Any = loads_strict(raw, where, code=ErrorCode.CORRUPT_LOG)
    except KraftError as e:
        raise KraftError(ErrorCode.CORRUPT_LOG, e.message, file=where) from None
    if not isinstance(d, dict):
        raise KraftError(ErrorCode.CORRUPT_LOG, f"{where}: expected a JSON object", file=where)
    unknown = sorted(set(d) - _FIELDS)
    if unknown:
        raise KraftError(
            ErrorCode.CORRUPT_LOG, f"{where}: unknown field(s) {', '.join(unknown)[:200]}", file=where
        )
    version = d.get("data_version", 0)
    if isinstance(version, bool) or version not in (0, DATA_VERSION):
        raise KraftError(
            ErrorCode.CORRUPT_LOG, f"{where}: unsupported data_version {version!r:.60}", file=where
        )
    if not isinstance(d.get("cluster_id"), str):
        raise KraftError(
            ErrorCode.CORRUPT_LOG, f"{where}: field 'cluster_id' missing or not a string", file=where
        )
    if "applied_offset" not in d:
        raise KraftError(ErrorCode.CORRUPT_LOG, f"{where}: field 'applied_offset' missing", file=where)
    state = QuorumState(
        cluster_id=d["cluster_id"],
        leader_id=d.get("leader_id", -1),
        leader_epoch=d.get("leader_epoch", 0),
        voted_id=d.get("voted_id", -1),
        voted_uuid=d.get("voted_uuid"),
        applied_offset=d["applied_offset"],
    )
    try:
        _validate(state, where)
    except KraftError as e:
        raise KraftError(ErrorCode.CORRUPT_LOG, e.message, file=where) from None
    if state.voted_uuid is not None:
        state.voted_uuid = canonical_uuid(state.voted_uuid)
    return state


class QuorumStateStore:
    """The quorum-state file in ``directory``. ``load`` of a fresh directory returns the default
    state for ``cluster_id``; a file written for another cluster is INCONSISTENT_CLUSTER_ID."""

    def __init__(self, directory: str | os.PathLike[str], cluster_id: str, *, fsync: bool = True) -> None:
        self.directory = os.fspath(directory)
        self.path = os.path.join(self.directory, QUORUM_STATE_FILE)
        self.cluster_id = cluster_id
        self.fsync = fsync

    def load(self, cluster_id: str | None = None) -> QuorumState:
        """The stored state (default for a fresh directory). ``cluster_id``, if given, must be
        the store's (INCONSISTENT_CLUSTER_ID otherwise)."""
        if cluster_id is not None:
            _check_cluster(QuorumState(cluster_id), self.cluster_id, self.path)
        try:
            with open(self.path, "rb") as f:
                raw = f.read()
        except FileNotFoundError:
            return QuorumState(cluster_id=self.cluster_id)
        state = decode_quorum_state(raw, self.path)
        _check_cluster(state, self.cluster_id, self.path)
        return state

    def save(self, state: QuorumState) -> None:
        _check_cluster(state, self.cluster_id, self.path)
        data = encode_quorum_state(state)
        ensure_dir(self.directory, fsync=self.fsync)
        atomic_write(self.path, data, fsync=self.fsync)


def _check_cluster(state: QuorumState, cluster_id: str, where: str) -> None:
    if state.cluster_id != cluster_id:
        raise KraftError(
            ErrorCode.INCONSISTENT_CLUSTER_ID,
            f"{where}: quorum state is for cluster {state.cluster_id!r}, this node is in {cluster_id!r}",
        )
