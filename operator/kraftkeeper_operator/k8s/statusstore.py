"""A KRaftQuorum's ``status``: its one writer and the progress store kept in it (core/progress.py's
port), for both membership backends (our engine and ``spec.kafka``).

:class:`StatusWriter` remembers the status as last written (at start: as kopf read it) and patches
the API server only when something changed: a whole pass's status when anything but a condition's
timestamp differs (core/status.py ``status_changed``: writing on every pass would wake every
watcher of the object for nothing), a partial patch when one of its fields differs.

:class:`StatusProgressStore` saves a recovery's progress into ``status.recoveries`` before each
voter change and right after its outcome, with the voter set a committed change made (core/status.py
``progress_status``: a Succeeded record never sits next to the voter it removed) and, for a Kafka
quorum, ``status.kafka.controllers`` (where a new controller listens: Kafka lists only the voters'
endpoints). It loads from the status a previous operator run wrote: the disk-replacement records
(an unreadable item is logged and skipped: the quorum, described on the next pass, corrects the
phase), the last voter set published (kept while no leader answers; unclean recovery picks from
it) and the controllers' listeners. An unclean recovery's item is written here too but read back
from its own ConfigMap (unclean.py).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

from ..core.progress import Known, Listeners, Progress
from ..core.records import Recovery
from ..core.status import progress_status, status_changed
from ..core.view import QuorumView
from .kube import KubeApi
from .unclean import STATUS_PREFIX

log = logging.getLogger("kraftkeeper.operator")

MAX_RECOVERIES = 20  # the CRD's maxItems of status.recoveries

# Bounds one status patch (the Kafka daemon's watchdog, kafka/watchdog.py ``within``).
Bound = Callable[[str, Awaitable[None]], Awaitable[None]]


class StatusWriter:
    """One KRaftQuorum's status writes."""

    def __init__(
        self,
        kube: KubeApi,
        namespace: str,
        name: str,
        shown: Mapping[str, Any] | None = None,
        bound: Bound | None = None,
    ) -> None:
        self.kube, self.namespace, self.name = kube, namespace, name
        self.last: dict[str, Any] = dict(shown or {})
        self.bound = bound

    async def _send(self, status: dict[str, Any]) -> None:
        call = self.kube.patch_status(self.namespace, self.name, status)
        if self.bound is None:
            await call
        else:
            await self.bound(f"status of KRaftQuorum {self.namespace}/{self.name}", call)

    async def write(self, status: dict[str, Any]) -> None:
        """A pass's whole status, when it changed in anything but a condition's timestamp."""
        if status_changed(self.last, status):
            await self._send(status)
            self.last = status

    async def patch(self, patch: dict[str, Any]) -> None:
        """Some fields of the status, when one of them differs from the last written."""
        if any(v != self.last.get(k) for k, v in patch.items()):
            await self._send(patch)
            self.last = {**self.last, **patch}


def recoveries_status(records: list[Recovery], request: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """``status.recoveries``: the disk replacements, then the unclean request (newest last,
    within the CRD's :data:`MAX_RECOVERIES` items)."""
    items = [r.to_crd_status() for r in records][-MAX_RECOVERIES:]
    if request is not None:
        items = [*items[-(MAX_RECOVERIES - 1) :], request]
    return items


def known_voters(status: Mapping[str, Any]) -> list[tuple[int, str]]:
    """The voter set a previous operator run published (kept while no leader answers)."""
    out = []
    for v in status.get("voters") or []:
        try:
            if v.get("uuid"):
                out.append((int(v["id"]), str(v["uuid"])))
        except (KeyError, TypeError, ValueError, AttributeError):
            continue
    return out


def records_from_status(key: str, status: Mapping[str, Any]) -> list[Recovery]:
    """The disk-replacement recoveries a previous operator run persisted in ``status.recoveries``
    (an unreadable item is logged and skipped)."""
    records = []
    for d in status.get("recoveries") or []:
        if str(d.get("recoveryId", "")).startswith(STATUS_PREFIX):
            continue  # an unclean recovery: its record lives in the ConfigMap
        try:
            records.append(Recovery.from_crd_status(d))
        except (KeyError, ValueError, TypeError) as e:
            log.warning("%s: ignoring unreadable status.recoveries item %r: %s", key, d, e)
    return records


def listeners_from_status(status: Mapping[str, Any]) -> Listeners:
    """``status.kafka.controllers``: where each Kafka controller listens."""
    out: Listeners = {}
    for c in ((status.get("kafka") or {}).get("controllers")) or []:
        try:
            out[int(c["id"])] = [(str(x["name"]), str(x["host"]), int(x["port"])) for x in c["listeners"]]
        except (KeyError, TypeError, ValueError):
            continue
    return out


def kafka_status(cluster_id: str | None, listeners: Listeners) -> dict[str, Any]:
    """``status.kafka``: the Kafka cluster id and the controllers' listeners."""
    return {
        "clusterId": cluster_id or "",
        "controllers": [
            {"id": i, "listeners": [{"name": n, "host": h, "port": p} for n, h, p in lst]}
            for i, lst in sorted(listeners.items())
        ],
    }


@dataclass
class Beside:
    """What a progress save writes beside the records (read at each save)."""

    committed: QuorumView | None = None  # the voter set a change of this pass made
    request: dict[str, Any] | None = None  # the unclean request's status.recoveries item
    kafka: dict[str, Any] | None = None  # status.kafka of a spec.kafka quorum


class StatusProgressStore:
    """The progress store in a KRaftQuorum's status (module docstring)."""

    def __init__(self, writer: StatusWriter, key: str, beside: Callable[[], Beside] = Beside) -> None:
        self.writer, self.key, self.beside = writer, key, beside

    async def load(self) -> Progress:
        shown = self.writer.last
        return Progress(
            records_from_status(self.key, shown),
            Known(known_voters(shown), listeners_from_status(shown), self.key),
        )

    async def save(self, records: list[dict[str, Any]]) -> None:
        b = self.beside()
        items = recoveries_status([Recovery.from_dict(d) for d in records], b.request)
        patch = progress_status(items, b.committed)
        if b.kafka is not None:
            patch["kafka"] = b.kafka
        await self.writer.patch(patch)
