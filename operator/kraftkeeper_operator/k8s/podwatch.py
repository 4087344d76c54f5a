"""The quorum pods of one namespace, kept by one list and then a watch (steady-state
cost: a list per quorum per daemon pass was most of the operator's API requests).

:class:`PodWatch` lists the pods labelled ``app.kubernetes.io/name=kraftkeeper`` once, then
follows a watch from that list's resourceVersion (re-listing when the watch ends or the server
says 410 Gone), and calls ``on_change(instance)`` for a pod that was added, changed or deleted, so
the quorum's daemon wakes at once (handlers.py) instead of at its back-off. :meth:`PodWatch.pods`
answers None until the first list arrived and after a failure until the next one: the caller
then lists for itself (quorums.py), so a broken watch costs requests, never stale health.
Only the namespaces of managed quorums are watched (the operator's Role allows list and watch of
pods there; a namespace-scoped install has no right to watch all namespaces).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from typing import Any

from kubernetes_asyncio import watch
from kubernetes_asyncio.client.exceptions import ApiException

from .kube import KubeApi

log = logging.getLogger("kraftkeeper.operator")

NAME_LABEL = "app.kubernetes.io/name"
INSTANCE_LABEL = "app.kubernetes.io/instance"
SELECTOR = f"{NAME_LABEL}=kraftkeeper"
# Server-side end of one watch request (then the watch is re-established from a fresh list);
# the client's own limit is longer so the server ends it first.
WATCH_SECONDS = 240
LIST_TIMEOUT_S = 30
RETRY_S = 5.0


class PodWatch:
    """The kraftkeeper pods of one namespace, by name (the API's JSON, camelCase keys)."""

    def __init__(self, kube: KubeApi, namespace: str, on_change: Callable[[str], None]) -> None:
        self.kube = kube
        self.namespace = namespace
        self.on_change = on_change
        self._pods: dict[str, dict[str, Any]] = {}
        self._synced = False
        self._task: asyncio.Task[None] | None = None
        self._error = ""  # the last failure logged

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name=f"pod watch {self.namespace}")

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    def pods(self, instance: str) -> list[dict[str, Any]] | None:
        """The pods of quorum ``instance``; None while the watch is not in sync."""
        if not self._synced:
            return None
        return [p for p in self._pods.values() if _instance(p) == instance]

    async def _run(self) -> None:
        while True:
            try:
                rv = await self._list()
                await self._watch(rv)
            except asyncio.CancelledError:
                raise
            except Exception as e:  # unreachable API, 403, 410: list again after a pause
                self._synced = False
                if isinstance(e, ApiException) and e.status == 410:
                    continue  # our resourceVersion is too old: list again now
                if str(e) != self._error:  # logged once per distinct error, not every retry
                    log.warning("pod watch in %s: %s; retrying every %gs", self.namespace, e, RETRY_S)
                    self._error = str(e)
                await asyncio.sleep(RETRY_S)

    async def _list(self) -> str:
        # Bounded like every KubeApi call: a list that never answers must not leave the watcher
        # stuck (the retry loop above lists again after RETRY_S).
        got = await self.kube.core.list_namespaced_pod(
            self.namespace, label_selector=SELECTOR, _request_timeout=LIST_TIMEOUT_S
        )
        data: dict[str, Any] = self.kube.api.sanitize_for_serialization(got)
        before, self._pods = self._pods, {p["metadata"]["name"]: p for p in data.get("items") or []}
        was_synced, self._synced, self._error = self._synced, True, ""
        # Wake only the quorums whose pods changed since the last list (a re-list every few
        # minutes must not cost every quorum a pass).
        for name in {*before, *self._pods}:
            old, new = before.get(name), self._pods.get(name)
            if not was_synced or _version(old) != _version(new):
                inst = _instance(new or old or {})
                if inst:
                    self.on_change(inst)
        return str((data.get("metadata") or {}).get("resourceVersion") or "")

    async def _watch(self, rv: str) -> None:
        w = watch.Watch()
        async with w.stream(
            self.kube.core.list_namespaced_pod,
            self.namespace,
            label_selector=SELECTOR,
            resource_version=rv,
            timeout_seconds=WATCH_SECONDS,
            _request_timeout=WATCH_SECONDS + 30,
        ) as stream:
            async for ev in stream:
                pod = ev.get("raw_object") or {}
                name = (pod.get("metadata") or {}).get("name")
                if not name or ev.get("type") not in ("ADDED", "MODIFIED", "DELETED"):
                    continue  # BOOKMARK, or an object without a name
                if ev["type"] == "DELETED":
                    self._pods.pop(name, None)
                else:
                    self._pods[name] = pod
                inst = _instance(pod)
                if inst:
                    self.on_change(inst)


def _version(pod: dict[str, Any] | None) -> str | None:
    return None if pod is None else str((pod.get("metadata") or {}).get("resourceVersion"))


def _instance(pod: dict[str, Any]) -> str:
    return str(((pod.get("metadata") or {}).get("labels") or {}).get(INSTANCE_LABEL) or "")
