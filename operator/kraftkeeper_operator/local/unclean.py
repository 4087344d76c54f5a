"""Unclean recovery in local mode: the shared coordinator (unclean.py, the same state machine
as on Kubernetes) over local processes. The request is kept in ``control/unclean-recovery.json``;
"restarting" the survivor means the supervisor stops it, runs ``kraftkeeper quorum
recover-unclean`` on its directory and starts it again (the part the init container plays on
Kubernetes, with the same checks: the node's id and the storage UUID in its ``meta.properties``
must be the request's, and a marker ``unclean-recovery.<token>.done`` in the directory makes a
repeated restart never repeat the recovery). Which nodes are gone, for the survivor rule
(core/survivor.py): held stopped, or no process running (``Supervisor.gone``).
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import replace
from typing import TYPE_CHECKING

from quorum.client import QuorumClient
from quorum.timefmt import rfc3339

from ..core.survivor import Probe, probe_log_state
from ..telemetry import OperatorMetrics
from ..unclean import MARKER_PREFIX, RequestStore, UncleanCoordinator, UncleanRequest
from .cluster import ClusterLayout, meta_uuid, write_atomic
from .supervisor import Supervisor

if TYPE_CHECKING:
    from ..controller import RecoveryController

log = logging.getLogger("kraftkeeper.operator.local")

RETRY_AFTER_S = 30.0  # a failed recover-unclean is tried again after this (the kubelet's back-off)


class LocalRequestStore:
    """The request in a file of the cluster's control directory; restart = the offline recovery
    of the survivor's directory by the supervisor (module docstring)."""

    def __init__(self, layout: ClusterLayout, sup: Supervisor) -> None:
        self.layout, self.sup = layout, sup
        self.path = layout.control() / "unclean-recovery.json"
        self.where = str(self.path)
        self.failed_at = 0.0

    async def load(self) -> UncleanRequest | None:
        try:
            text = await asyncio.to_thread(self.path.read_text)
        except FileNotFoundError:
            return None
        return UncleanRequest.from_json(text)

    async def save(self, request: UncleanRequest) -> None:
        await asyncio.to_thread(write_atomic, self.path, request.to_json() + "\n")

    async def restart(self, ordinal: int) -> None:
        # The coordinator persists the request before it restarts anything: read it back.
        req = await self.load()
        i = ordinal + 1
        d = self.layout.data_dir(i)
        if req is None or req.replica_id != i:
            raise RuntimeError(f"no unclean-recovery request for node {i} in {self.path}")
        marker = d / f"{MARKER_PREFIX}{req.token}.done"
        if marker.exists():
            log.warning("unclean recovery %s was done on node %d's directory already", req.token, i)
            return
        mine = meta_uuid(d)
        if mine not in req.uuids:
            # Its disk was replaced meanwhile: that disk was never a voter; nothing to recover.
            log.error(
                "unclean recovery %s names node %d with storage UUID(s) %s, but its directory is %s: "
                "not recovering",
                req.token,
                i,
                ", ".join(req.uuids),
                mine,
            )
            return
        if time.monotonic() - self.failed_at < RETRY_AFTER_S:
            raise RuntimeError(f"recover-unclean on node {i} failed less than {RETRY_AFTER_S:.0f}s ago")
        out = await self.sup.run_offline(i, "quorum", "recover-unclean", "--dir", str(d))
        text = (out.stdout or out.stderr or "").strip()[-500:]
        if out.returncode != 0:
            self.failed_at = time.monotonic()
            raise RuntimeError(f"recover-unclean on node {i} exited with {out.returncode}: {text}")
        await asyncio.to_thread(write_atomic, marker, rfc3339() + "\n")
        log.warning("unclean recovery %s of node %d: %s", req.token, i, text)


class LocalUnclean:
    """One local cluster's unclean recovery: the shared coordinator, with its probes through the
    supervisor's current client (replaced when the admin credential is renewed)."""

    def __init__(
        self,
        layout: ClusterLayout,
        sup: Supervisor,
        ctl: RecoveryController,
        client: QuorumClient,
        *,
        metrics: OperatorMetrics | None = None,
        store: RequestStore | None = None,
    ) -> None:
        self.layout, self.sup, self.ctl, self.client = layout, sup, ctl, client
        self.coordinator = UncleanCoordinator(
            store if store is not None else LocalRequestStore(layout, sup),
            ctl.sink,
            cluster=layout.name,
            probe=self._probe,
            metrics=metrics,
        )
        self.note: str | None = None

    async def _probe(self, ordinal: int, endpoint: str) -> Probe:
        """Node ``ordinal + 1``'s log state, with the storage UUID of the disk it runs on (a
        replaced disk's node answers, but was no voter)."""
        p = await probe_log_state(self.client, ordinal, endpoint)
        return replace(p, storage_uuid=meta_uuid(self.layout.data_dir(ordinal + 1)) or "")

    async def maybe_run(self) -> str | None:
        """One pass of the coordinator; its note (logged once per distinct note)."""
        lay = self.layout
        lost = self.ctl.unreachable_since_ms is not None
        endpoints = [lay.endpoint(i) for i in range(1, lay.nodes + 1)]
        note = await self.coordinator.step(self.ctl, lost, endpoints, self.sup.gone())
        if note is not None and note != self.note:
            log.warning("unclean recovery: %s", note)
        self.note = note
        return note

    async def close(self) -> None:
        await self.client.close()
