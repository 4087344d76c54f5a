"""Which replica survives an unclean recovery: one rule for both modes (local and Kubernetes).

When a majority of voters is gone for good, KIP-704 style unclean recovery makes one surviving
replica the sole voter. The survivor must be the replica a Raft election would have preferred:
the one whose log is *most up to date* by Raft's comparison (Raft §5.4.1, KIP-595 "Vote"
handling): the higher epoch of the last log entry wins, and only with equal last epochs does the
longer log win. Comparing log end offsets alone (or bytes on disk) is wrong: a former leader can
hold a long tail of records it appended in an old epoch and never committed, while a shorter log
with a newer last epoch holds records a later leader *did* commit; the long stale log would win and
the committed records would be the ones thrown away.

Each replica says where its log stands through ``GET /v1/node/log-state`` (served by every node,
leader or not, with no storage UUID in it): ``{"node_id", "last_epoch", "end_offset",
"high_watermark", ...}``. :func:`parse_log_state` checks that object, :func:`probe_log_state`
fetches it, and :func:`choose_survivor` is the pure rule.

:func:`decide_survivor` decides *whether* a probe set may be chosen from at all. A former voter
that did not answer cannot be left out just because its probe failed: a slow or still-starting
replica may hold the newest epoch, and choosing without it throws away what it committed (seen:
a probe that timed out under load made a longer stale log the survivor). So every former voter
must be *accounted for*: it answered, or the platform says it is gone (local mode: held stopped
or no process running; Kubernetes: no pod, a pod being deleted or unschedulable, or its node
container not running nor starting). While one is neither, no choice is made and the caller
asks again on its next pass. KIP-966's unclean recovery likewise asks the replicas for their
last leader epoch and log end offset and waits for the answers of the replicas that may hold
the latest data before electing the highest epoch, then the longest log. Which replicas are
*eligible* (their id, and where it can be read their storage UUID, were voters in the last voter
set a leader reported) is decided here too: the operator cannot read a disk in Kubernetes mode
(the init container checks the UUID), and local mode reads ``meta.properties``.
"""

from __future__ import annotations

import json
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import aiohttp

LOG_STATE_PATH = "/v1/node/log-state"


class LogStateError(ValueError):
    """A log-state answer that does not follow the endpoint's shape (names the field)."""


@dataclass(frozen=True)
class LogState:
    """Where one replica's local log stands (``GET /v1/node/log-state``)."""

    node_id: int
    last_epoch: int  # epoch of the last batch in the local log
    end_offset: int  # exclusive end offset of the local log
    high_watermark: int = -1

    @property
    def election_key(self) -> tuple[int, int]:
        """What Raft's vote compares (§5.4.1): last epoch first, then log length."""
        return (self.last_epoch, self.end_offset)


def parse_log_state(d: Mapping[str, Any]) -> LogState:
    """The endpoint's JSON object as a :class:`LogState`; :class:`LogStateError` names the field
    that is missing or of the wrong type."""
    if not isinstance(d, Mapping):
        raise LogStateError(f"log-state: expected a JSON object, got {type(d).__name__}")
    values: dict[str, int] = {}
    for name in ("node_id", "last_epoch", "end_offset", "high_watermark"):
        if name not in d:
            if name == "high_watermark":
                continue
            raise LogStateError(f"log-state: field {name!r} is missing")
        v = d[name]
        if isinstance(v, bool) or not isinstance(v, int):
            raise LogStateError(f"log-state: field {name!r} must be an integer, got {json.dumps(v)[:40]}")
        values[name] = v
    if values["node_id"] < 0 or values["end_offset"] < 0 or values["last_epoch"] < 0:
        raise LogStateError(f"log-state: negative node_id, last_epoch or end_offset in {dict(d)}")
    return LogState(
        values["node_id"], values["last_epoch"], values["end_offset"], values.get("high_watermark", -1)
    )


def choose_survivor(candidates: Sequence[LogState]) -> LogState | None:
    """The candidate with the most up-to-date log by Raft's election order (last epoch, then end
    offset); on a full tie the lower node id, so the choice is deterministic. None if there are
    no candidates."""
    if not candidates:
        return None
    return max(candidates, key=lambda s: (s.last_epoch, s.end_offset, -s.node_id))


@dataclass(frozen=True)
class SurvivorDecision:
    """What :func:`decide_survivor` made of one probe set."""

    survivor: Probe | None  # None: no choice on this probe set
    uuids: tuple[str, ...] = ()  # the survivor's voter UUID(s) in the last voter set
    candidates: tuple[LogState, ...] = ()  # the eligible answers compared
    waiting_for: tuple[int, ...] = ()  # former voters neither answering nor known to be gone
    errors: tuple[str, ...] = ()  # "ENDPOINT: why" of the probes that failed

    def note(self) -> str:
        """Why no survivor was chosen (for the log and the QuorumLost condition)."""
        if self.waiting_for:
            ids = ", ".join(str(i) for i in self.waiting_for)
            return (
                f"waiting for the log state of former voter(s) {ids}: not known to be gone, so they "
                "may hold the newest epoch (no survivor is chosen without them)"
            )
        return "no former voter answers with its log state"


def decide_survivor(
    known_voters: Sequence[tuple[int, str]],
    probes: Sequence[Probe],
    gone: Collection[int] | None,
) -> SurvivorDecision:
    """The survivor among the former voters (``known_voters``: the last voter set a leader
    reported), or no decision (module docstring). ``gone``: the replica ids the platform knows
    cannot answer (None: not known, so every former voter must answer). A probe counts for
    replica ``ordinal + 1``; an answer naming another node id is a misconfiguration, never a
    candidate; an answer from a disk whose UUID was not a voter (a replaced disk) is accounted for
    but no candidate. Invariant: a survivor is returned only when no former voter is unaccounted
    for."""
    uuids: dict[int, list[str]] = {}
    for rid, u in known_voters:
        if u:
            uuids.setdefault(rid, []).append(u)
    by_id = {p.ordinal + 1: p for p in probes}
    eligible: dict[int, Probe] = {}
    waiting: list[int] = []
    for rid in sorted(uuids):
        p = by_id.get(rid)
        if p is None or p.state is None:
            if gone is None or rid not in gone:
                waiting.append(rid)
            continue
        if p.state.node_id != rid:
            continue
        if p.storage_uuid is not None and p.storage_uuid not in uuids[rid]:
            continue
        eligible[rid] = p
    errors = tuple(f"{p.endpoint}: {p.error}" for p in probes if p.error)
    cands = tuple(p.state for p in eligible.values() if p.state is not None)
    if waiting:
        return SurvivorDecision(None, candidates=cands, waiting_for=tuple(waiting), errors=errors)
    best = choose_survivor(cands)
    if best is None:
        return SurvivorDecision(None, errors=errors)
    return SurvivorDecision(eligible[best.node_id], tuple(uuids[best.node_id]), cands, errors=errors)


# ---------------------------------------------------------------------------------------------
# Asking a replica


class NodeGetter(Protocol):
    """The one call the probe needs (``quorum.client.QuorumClient.node_get``): GET a path from one
    node, answering (HTTP status, body). Whatever transport security the client has applies."""

    async def node_get(self, endpoint: str, path: str) -> tuple[int, bytes]: ...


@dataclass(frozen=True)
class Probe:
    """What asking replica ``ordinal`` (0-based: pod NAME-ordinal, or local node ordinal + 1) at
    ``endpoint`` gave: its log state, or why there is none."""

    ordinal: int
    endpoint: str
    state: LogState | None = None
    error: str | None = None
    # the storage UUID of the disk behind the answer, where the caller can read it (local mode's
    # meta.properties); None: not known (Kubernetes), the id alone is checked
    storage_uuid: str | None = None

    @property
    def node_id(self) -> int | None:
        return self.state.node_id if self.state is not None else None


async def probe_log_state(client: NodeGetter, ordinal: int, endpoint: str) -> Probe:
    """Ask one node for its log state; never raises (``error`` says what failed)."""
    try:
        status, body = await client.node_get(endpoint, LOG_STATE_PATH)
        if status != 200:
            text = body[:200].decode("utf-8", "replace").strip()
            return Probe(ordinal, endpoint, error=f"HTTP {status} from {LOG_STATE_PATH}: {text}")
        return Probe(ordinal, endpoint, state=parse_log_state(json.loads(body)))
    # LogStateError and bad JSON are ValueErrors; aiohttp's client errors are not all OSErrors.
    except (TimeoutError, OSError, ValueError, aiohttp.ClientError) as e:
        return Probe(ordinal, endpoint, error=f"{type(e).__name__}: {e}".rstrip(": "))
