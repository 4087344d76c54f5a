"""The progress store port: where a run mode keeps a multi-step recovery's progress between passes
and across restarts, and the one document format of the stores that keep it in a file.

A recovery takes several voter changes, each an admin call whose outcome a crash can hide. The
controller hands the store the recorded progress before each change and right after its outcome
(``RecoveryController.persist`` is a store's :meth:`ProgressStore.save`), so a restarted operator
knows which storage UUID was the old one and which step was reached; the quorum stays the judge of
what was done. Beside the records a store keeps what the run mode knows only from earlier passes
(:class:`Known`): the last voter set a leader reported (unclean recovery picks its survivor among
those voters while no leader answers) and, for a Kafka quorum, where each controller listens
(Kafka's describe lists the voters' endpoints only) and the cluster name.

Implementations: a file (``..progressfile``: local mode's ``operator-state.json``, the Kafka
watcher's ``_watch-state.json``), a KRaftQuorum's ``status`` (``..k8s.crdstatus``, for both
membership backends) and memory (``..testing.memory``, for tests).

Invariants: a store never guesses past damage: :meth:`ProgressStore.load` of an unreadable store
raises :class:`ProgressDamaged` naming it (the records name the storage UUIDs a completed recovery
retired, which must never be re-added), and a save replaces the whole progress at once, so a load
after a crash sees the old progress or the new one, never a mix.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from .records import Recovery

# controller id -> its listeners as (name, host, port), as Kafka's describe reports them
Listeners = dict[int, list[tuple[str, str, int]]]


@dataclass
class Known:
    """What a run mode keeps beside the records (read by a store at each save)."""

    voters: list[tuple[int, str]] = field(default_factory=list)  # (id, storage UUID)
    listeners: Listeners = field(default_factory=dict)
    cluster: str | None = None  # the event log's cluster name, when the store is not per cluster


@dataclass
class Progress:
    """What :meth:`ProgressStore.load` returns: nothing at all for a store never saved."""

    records: list[Recovery] = field(default_factory=list)
    known: Known = field(default_factory=Known)


class ProgressDamaged(ValueError):
    """A store holds progress that does not parse: fixed or moved by hand, never guessed past."""


class ProgressStore(Protocol):
    """The port. ``save`` takes the records as the controller's book gives them
    (``Recovery.to_dict`` items) and returns once they are durable."""

    async def load(self) -> Progress: ...

    async def save(self, records: list[dict[str, Any]]) -> None: ...


def progress_document(records: list[dict[str, Any]], known: Known) -> dict[str, Any]:
    """The JSON document of a file-like store."""
    return {
        "cluster": known.cluster,
        "recoveries": records,
        "voters": [[i, u] for i, u in known.voters],
        "listeners": {str(k): [list(x) for x in v] for k, v in sorted(known.listeners.items())},
    }


def encode_progress(records: list[dict[str, Any]], known: Known) -> str:
    return json.dumps(progress_document(records, known), indent=1) + "\n"


def decode_progress(text: str, where: str) -> Progress:
    """Inverse of :func:`encode_progress`, also reading the two layouts written before it (local
    mode's bare list of records, the watcher's ``records`` key). Raises :class:`ProgressDamaged`
    naming ``where`` and what is wrong."""
    try:
        data: Any = json.loads(text)
        if isinstance(data, list):
            data = {"recoveries": data}
        if not isinstance(data, Mapping):
            raise TypeError(f"a JSON object was expected, not {type(data).__name__}")
        raw = data.get("recoveries", data.get("records")) or []
        cluster = data.get("cluster")
        return Progress(
            [Recovery.from_dict(d) for d in raw],
            Known(
                [(int(i), str(u)) for i, u in data.get("voters") or []],
                {
                    int(k): [(str(n), str(h), int(p)) for n, h, p in v]
                    for k, v in (data.get("listeners") or {}).items()
                },
                None if cluster is None else str(cluster),
            ),
        )
    except (ValueError, KeyError, TypeError, AttributeError) as e:
        why = f"{type(e).__name__}: {e}"
        raise ProgressDamaged(f"{where} is damaged ({why}); fix or move it by hand") from None
