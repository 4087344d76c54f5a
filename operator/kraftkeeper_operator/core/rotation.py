"""Certificate renewal of a running quorum, one node at a time, never breaking it.

The same rule in local mode (local/tls.py: restart = the supervisor restarts the process) and on
Kubernetes (k8s/quorumtls.py: restart = delete the pod; the StatefulSet re-creates it and its node
container reads the renewed certificate from its own directory of the projected ``tls`` volume):

* a node is renewed only when the quorum is fully healthy in the leader's view: every voter id
  the quorum should have is in the voter set, every follower is caught up (lag within
  ``max_lag``) and fetched within ``fresh_ms``, and no voter change or reassignment is in flight;
* the renewed node is restarted, and the next renewal waits until this node fetched from the
  leader again after its restart with a lag within ``max_lag`` (or leads again).

So at most one voter is ever down for a rotation, which a quorum of 3 or more survives (a
quorum of 1 has a short outage: it has no other voter). Certificates are renewed ``renew
before`` their expiry, which must leave time for every node's turn; an unhealthy quorum
postpones renewal (logged) rather than risk a second voter down.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable

from .view import QuorumView

log = logging.getLogger("kraftkeeper.operator.rotation")


def healthy(view: QuorumView | None, ids: list[int], max_lag: int, now_ms: int, fresh_ms: int) -> bool:
    """Every voter of ``ids`` is in the voter set, caught up and fetching; no change in flight."""
    if view is None or view.pending is not None or view.target_voters is not None:
        return False
    by_id = {v.id: v for v in view.voters}
    if sorted(by_id) != sorted(ids) or len(view.voters) != len(ids):
        return False
    for i, v in by_id.items():
        if i == view.leader_id:
            continue
        if not 0 <= v.lag <= max_lag or v.last_fetch_ms < now_ms - fresh_ms:
            return False
    return True


def healthy_majority_without(
    view: QuorumView | None, node: int, max_lag: int, now_ms: int, fresh_ms: int
) -> bool:
    """A leader other than ``node``, and a majority of the voter set healthy without ``node``
    (the leader, and voters caught up and fetching): the quorum commits without it, so its disk
    may be treated as lost (supervisor.py, a damaged log)."""
    if view is None or view.leader_id <= 0 or view.leader_id == node:
        return False
    ok = sum(
        1
        for v in view.voters
        if v.id != node
        and (v.id == view.leader_id or (0 <= v.lag <= max_lag and v.last_fetch_ms >= now_ms - fresh_ms))
    )
    return ok >= len(view.voters) // 2 + 1


class CertRotator:
    """Renews node certificates one node at a time (module docstring).

    ``due()`` lists the replica ids whose certificate needs renewal (soonest first),
    ``renew(id)`` issues the new one, ``restart(id)`` restarts that node; ``ids()`` are the
    voter ids the quorum should have. ``notify(reason, message, warning)``, when given, hears
    each step (CertificateRenewalWaiting, CertificateRenewalStarted, CertificateRenewed) and is
    awaited, so the step is told before it is taken (the operator posts them as Kubernetes Events
    on the KRaftQuorum, stored before the pod restart they announce); ``label`` prefixes the log lines
    (the quorum's name)."""

    def __init__(
        self,
        due: Callable[[], Awaitable[list[int]]],
        renew: Callable[[int], Awaitable[None]],
        restart: Callable[[int], Awaitable[None]],
        ids: Callable[[], list[int]],
        *,
        max_lag: int = 100,
        fresh_ms: int = 3000,
        notify: Callable[[str, str, bool], Awaitable[None]] | None = None,
        label: str = "",
    ) -> None:
        self.due, self.renew, self.restart, self.ids = due, renew, restart, ids
        self.notify = notify
        self.prefix = f"{label}: " if label else ""
        self.max_lag, self.fresh_ms = max_lag, fresh_ms
        self.in_flight: tuple[int, int] | None = None  # (node, restart time in ms)
        self.rotations: dict[int, int] = {}  # node -> renewals done (status, tests)
        self.waiting_note: str | None = None

    def _back(self, view: QuorumView | None, node: int, since_ms: int) -> bool:
        if view is None:
            return False
        if view.leader_id == node:
            return True  # elected again: it runs, with its new certificate
        return any(
            v.id == node and v.last_fetch_ms >= since_ms and 0 <= v.lag <= self.max_lag for v in view.voters
        )

    async def step(self, view: QuorumView | None) -> int | None:
        """One pass: finish the rotation in flight, else start the next due one. Returns the
        node restarted by this pass, if any."""
        now_ms = int(time.time() * 1000)
        if self.in_flight is not None:
            node, since = self.in_flight
            if not self._back(view, node, since):
                return None
            await self._tell(
                "CertificateRenewed", f"node {node} is back in the quorum with its renewed certificate"
            )
            self.in_flight = None
        due = await self.due()
        if not due:
            return None
        if not healthy(view, self.ids(), self.max_lag, now_ms, self.fresh_ms):
            note = f"certificate renewal of node(s) {due} waits for a fully healthy quorum"
            if note != self.waiting_note:  # once per situation, not every pass
                await self._tell("CertificateRenewalWaiting", note, warning=True)
                self.waiting_note = note
            return None
        self.waiting_note = None
        node = due[0]
        await self.renew(node)
        self.in_flight = (node, now_ms)
        self.rotations[node] = self.rotations.get(node, 0) + 1
        await self._tell("CertificateRenewalStarted", f"restarting node {node} with its renewed certificate")
        await self.restart(node)
        # Back means a fetch after the restart returned (the old process is gone by then).
        self.in_flight = (node, int(time.time() * 1000))
        return node

    async def _tell(self, reason: str, message: str, warning: bool = False) -> None:
        (log.warning if warning else log.info)("%s%s", self.prefix, message)
        if self.notify is not None:
            await self.notify(reason, message, warning)
