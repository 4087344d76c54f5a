"""A KRaftQuorum's ``status``: its one writer, the progress store kept in it (core/progress.py's
port) and the condition helpers, for both membership backends (our engine and ``spec.kafka``).
A pass's own conditions come from core/status.py (``ControllerStatus.to_crd_status``); the
helpers here are for what no pass decided: a spec or client Secret that cannot be used
(:func:`unavailable_condition`, :func:`invalid_spec`) and a status a failed or hung pass left
behind (:func:`stale_conditions`, :meth:`StatusWriter.report_stale`).

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

import kopf

from quorum.timefmt import rfc3339

from ..core.progress import Known, Listeners, Progress
from ..core.records import Recovery
from ..core.status import ControllerStatus, progress_status, status_changed
from ..core.view import QuorumView
from .kube import KubeApi
from .unclean import STATUS_PREFIX

log = logging.getLogger("kraftkeeper.operator")

MAX_RECOVERIES = 20  # the CRD's maxItems of status.recoveries

# Bounds one status patch (the Kafka backend's watchdog, watchdog.py ``within``).
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

    async def send(self, status: dict[str, Any]) -> None:
        """Patch ``status`` whatever was written before (for a caller that compared itself)."""
        call = self.kube.patch_status(self.namespace, self.name, status)
        if self.bound is None:
            await call
        else:
            await self.bound(f"status of KRaftQuorum {self.namespace}/{self.name}", call)

    async def write(self, status: dict[str, Any]) -> None:
        """A pass's whole status, when it changed in anything but a condition's timestamp."""
        if status_changed(self.last, status):
            await self.send(status)
            self.last = status

    async def patch(self, patch: dict[str, Any]) -> None:
        """Some fields of the status, when one of them differs from the last written."""
        if any(v != self.last.get(k) for k, v in patch.items()):
            await self.send(patch)
            self.last = {**self.last, **patch}

    async def write_pass(
        self,
        st: ControllerStatus,
        generation: int,
        recoveries: list[dict[str, Any]],
        *,
        ever_available: bool,
        extra: Mapping[str, Any] | None = None,
    ) -> None:
        """A pass's status, for either backend: the controller's (conditions keep their
        transition time while unchanged), ``recoveries`` and ``extra`` fields; ``Bootstrapping``
        until the quorum was available once."""
        status = st.to_crd_status(self.last, generation)
        status["recoveries"] = recoveries
        status.update(extra or {})
        if not ever_available:
            status["phase"] = "Bootstrapping"
        await self.write(status)

    async def report_stale(self, why: str) -> None:
        """Say in ``Degraded`` that the status was not refreshed and why (a failed or hung pass):
        voters and phase as last written must not pass for current. Best effort: the log has
        the cause already."""
        last = self.last
        if not last.get("conditions"):
            return
        status = {"phase": last.get("phase"), "conditions": stale_conditions(last, why)}
        if status["phase"] == "Running":
            status["phase"] = "Degraded"
        if not status_changed(last, {**last, **status}):
            return
        try:
            await self.patch(status)
        except Exception as e:
            log.warning("%s/%s: could not write the Degraded condition: %s", self.namespace, self.name, e)


def unavailable_condition(reason: str, message: str) -> dict[str, Any]:
    """``Available`` False for ``reason`` (an invalid spec, an unusable client Secret)."""
    return {
        "type": "Available",
        "status": "False",
        "reason": reason,
        "message": message[:32000],
        "lastTransitionTime": rfc3339(),
    }


def invalid_spec(patch: kopf.Patch, generation: int, message: str, reason: str = "InvalidSpec") -> None:
    """A create / update handler's answer to a spec it cannot act on: ``Failed``, with
    ``Available`` False naming what is wrong."""
    patch.status["phase"] = "Failed"
    patch.status["observedGeneration"] = generation
    patch.status["conditions"] = [unavailable_condition(reason, message)]


async def refuse_spec(
    kube: KubeApi, body: kopf.Body, patch: kopf.Patch, message: str, *, event: str = "InvalidSpec"
) -> kopf.PermanentError:
    """Refuse a spec the operator cannot act on: :func:`invalid_spec` in the handler's status
    patch and a Warning Event (reason ``event``); returns the error the handler raises (retrying
    cannot help)."""
    invalid_spec(patch, int((body.get("metadata") or {}).get("generation") or 0), message)
    await kube.notify(body, warning=True, reason=event, message=message)
    return kopf.PermanentError(f"invalid spec: {message}")


def stale_conditions(status: Mapping[str, Any], why: str) -> list[dict[str, Any]]:
    """``status.conditions`` with ``Degraded`` set to True, reason ``StatusNotRefreshed``."""
    stamp = rfc3339()
    out: list[dict[str, Any]] = []
    for c in status.get("conditions") or []:
        if c.get("type") != "Degraded":
            out.append(dict(c))
            continue
        out.append(
            {
                **c,
                "status": "True",
                "reason": "StatusNotRefreshed",
                "message": f"voters and phase are as of the last good pass: {why}"[:32000],
                "lastTransitionTime": c.get("lastTransitionTime") if c.get("status") == "True" else stamp,
            }
        )
    return out


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
