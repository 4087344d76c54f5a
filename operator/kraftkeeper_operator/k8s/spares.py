"""Spare node certificates: a replaced disk's pod starts once (docs/operator.md "Certificates
bound to the disk").

Beside each replica's current node certificate the operator keeps a *spare*: a certificate of the
same replica naming a fresh storage UUID that no disk has had. An empty volume formatted after
the bootstrap takes the spare's UUID (manifests.py ``format_command``, ``--storage-uuid-from-cert``)
and its node serves the spare (``kraftkeeper start --spare-cert``), so the first start of a
replaced disk already holds a certificate of its disk and joins as an observer. The operator then
*promotes* the spare (it becomes the current certificate, a new spare is issued) and only then
lets the recovery take the observer (recovery.py ``RecoveryBook.vouched``: an observer is taken
as a new disk only when the replica's current certificate names it).

What must hold, and how:

* **Only a replaced volume consumes a spare.** Whoever holds a pod's files can start a process as
  (id, spare UUID). The spare records the uid of the replica's claim when it was issued; an
  observer presenting the spare is promoted only when the claim now has another uid (the volume
  was replaced), never on the observer alone. Otherwise the spare is *refused*: a Warning Event,
  and a new spare (the refused UUID is then neither current nor spare, so never taken).
* **No running node holds the spare it could be replaced with.** A spare reaches a container only
  at its start (the tls volume is a sub-path mount: tlsspec.py). The spare records the replica's
  node container when it was issued; when another container of that replica runs and the
  replica's current voter fetches again after it was first seen (the node restarted on its own
  volume, which read the spare at start), the spare is *rotated* (a new UUID). So a node that
  is later compromised and its disk replaced cannot have kept the key of its successor.
* **A UUID formats one disk.** The spare leaves the spare slot (promotion) before its voter is
  added; in cert-manager mode its Secret is deleted at once (cert-manager issues the next one).
* **Old disks retire as before**: the old (id, UUID) is removed by the recovery (RemoveVoter) and
  stays retired in the core; a renewal keeps a spare's UUID.
* **No more key material in the operator**: Operator mode issues the spare from the CA it already
  holds; CertManager mode asks for a second Certificate per replica, ``NAME-node-<id>-spare``.

Spares are issued once the quorum has bootstrapped (before it, the pods format with their current
certificate's UUID); quorums of an older operator get theirs on the next pass. Without a spare (not
issued yet, or cert-manager still issuing it) a replaced disk takes the old path: a random UUID,
the node's refusal, ``CertificateForNewDisk`` and one pod restart (quorumtls.py ``bind_disks``).
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from quorum.types import new_storage_uuid

from ..core.view import QuorumView
from .podhealth import NODE_CONTAINER
from .tlsobjects import cert_due, cert_identity, cert_serial, not_after, tls_days, unb64

if TYPE_CHECKING:
    from .kube import KubeApi
    from .manifests import QuorumSpec
    from .quorumtls import QuorumTls
    from .tlsobjects import OperatorCa

log = logging.getLogger("kraftkeeper.operator")


ISSUE, PROMOTE, REFUSE, ROTATE = "issue", "promote", "refuse", "rotate"


@dataclass(frozen=True)
class Spare:
    """One replica's spare: its UUID, and what it was issued after (its claim's uid and the
    replica's node container id then; "" for none)."""

    uuid: str
    claim: str = ""
    container: str = ""

    def encode(self) -> str:
        return f"{self.uuid} {self.claim or '-'} {self.container or '-'}"

    @classmethod
    def decode(cls, text: str | bytes | None) -> Spare | None:
        raw = text.decode("utf-8", "replace") if isinstance(text, bytes) else (text or "")
        parts = raw.split()
        if len(parts) != 3:
            return None
        uuid, claim, container = (p if p != "-" else "" for p in parts)
        return cls(uuid, claim, container) if uuid else None


def node_container(pod: Mapping[str, Any] | None) -> str:
    """The running node container's id in ``pod`` ("" if none runs)."""
    for cs in ((pod or {}).get("status") or {}).get("containerStatuses") or []:
        if cs.get("name") == NODE_CONTAINER and (cs.get("state") or {}).get("running") is not None:
            return str(cs.get("containerID") or "")
    return ""


def voter_fetch(view: QuorumView, rid: int, uuid: str | None) -> int | None:
    """When voter (rid, uuid) last fetched (the leader's clock); None if it is no voter."""
    v = next((v for v in view.voters if uuid is not None and (v.id, v.uuid) == (rid, uuid)), None)
    return None if v is None else v.last_fetch_ms


def leads(view: QuorumView, rid: int, uuid: str | None) -> bool:
    return uuid is not None and view.leader_id == rid and view.leader_uuid() == uuid


def decide(
    spare: Spare | None,
    *,
    presented: bool,
    claim: str | None,
    container: str,
    fetched_since_seen: bool,
    voter: bool = True,
) -> str:
    """What to do with one replica's spare (module docstring): ISSUE (none yet), PROMOTE (an
    observer presents it from a replaced claim), REFUSE (an observer presents it, the claim is the
    one it was issued with), ROTATE (another node container runs, on the replica's own disk), or
    "" (nothing). ``claim`` None: unknown (not read, or no claim): never promotes. A replica that
    is no voter (a scale-up's new id: nothing to replace) whose spare was issued while none of
    its node containers ran may take it on the claim it was issued with (the StatefulSet made
    the claim before the operator's pass)."""
    if spare is None:
        return ISSUE
    if presented:
        if claim is None:
            return ""
        fresh = not voter and not spare.container
        return PROMOTE if claim != spare.claim or fresh else REFUSE
    if container and container != spare.container and fetched_since_seen:
        return ROTATE
    return ""


class SpareBook:
    """The spares of one quorum as the operator knows them (the Secret or the Certificates are
    the truth: quorumtls.py loads them), and the containers it saw start."""

    def __init__(self) -> None:
        self.spares: dict[int, Spare] = {}
        self.loaded = False  # CertManager mode: read from the Certificates' annotations once
        # replica id -> (a node container other than its spare's, its voter's last fetch then)
        self.seen: dict[int, tuple[str, int]] = {}
        self.refused: dict[int, str] = {}  # replica id -> the UUID last refused (one Event each)

    def facts(
        self, rid: int, view: QuorumView, current: str | None, pod: Mapping[str, Any] | None
    ) -> tuple[bool, str, bool]:
        """For replica ``rid``: an observer presents its spare; the running node container; that
        container is not the spare's and the current voter fetched after it was first seen."""
        spare = self.spares.get(rid)
        container = node_container(pod)
        if spare is None:
            return False, container, False
        presented = any((o.id, o.uuid) == (rid, spare.uuid) for o in view.observers)
        since = False
        if container and container != spare.container:
            # The old container is gone (one pod per ordinal, one node container per pod): a
            # fetch of the current voter after this container was first seen is this one's.
            fetched = voter_fetch(view, rid, current)
            first = self.seen.get(rid)
            if first is None or first[0] != container:
                self.seen[rid] = (container, fetched if fetched is not None else -1)
            else:
                since = fetched is not None and fetched > first[1]
            since = since or leads(view, rid, current)
        return presented, container, since


async def claim_uid(kube: KubeApi, q: QuorumSpec, rid: int) -> str | None:
    """The uid of replica ``rid``'s claim (``data-NAME-<ordinal>``), None if there is none."""
    meta = await kube.read_meta("PersistentVolumeClaim", q.namespace, f"data-{q.name}-{rid - 1}")
    uid = (meta or {}).get("uid")
    return str(uid) if uid else None


async def spare_pass(
    t: QuorumTls,
    kube: KubeApi,
    q: QuorumSpec,
    owner: Mapping[str, Any],
    pods: list[dict[str, Any]],
    view: QuorumView | None,
    replicas: int,
) -> bool:
    """One pass over the spares of a bootstrapped quorum; True if a spare was promoted (the
    caller observes again: the recovery may take that observer now)."""
    if not q.tls.enabled or view is None or not t.spares_ready(q):
        return False
    book = t.spare_book
    by_name = {str((p.get("metadata") or {}).get("name")): p for p in pods}
    todo: dict[int, tuple[Spare, bool]] = {}  # replica id -> its next spare, promote the old one
    for rid in range(1, replicas + 1):
        spare = book.spares.get(rid)
        presented, container, since = book.facts(
            rid, view, t.current.get(rid), by_name.get(f"{q.name}-{rid - 1}")
        )
        if spare is not None and not presented and not since:
            continue  # the common case: no API call
        claim = await claim_uid(kube, q, rid)
        voter = any(v.id == rid for v in view.voters)
        what = decide(
            spare,
            presented=presented,
            claim=claim,
            container=container,
            fetched_since_seen=since,
            voter=voter,
        )
        if not what:
            continue
        if what == PROMOTE:
            log.info(
                "%s: replica %d's new disk took its spare certificate (storage %s)",
                q.cluster,
                rid,
                spare.uuid if spare else "?",
            )
        if what == REFUSE and spare is not None and book.refused.get(rid) != spare.uuid:
            book.refused[rid] = spare.uuid
            await kube.notify(
                q,
                warning=True,
                reason="SpareCertificateRefused",
                message=f"replica {rid}: a node presents the spare certificate (storage {spare.uuid}) but "
                f"claim data-{q.name}-{rid - 1} was not replaced: not taken as a new disk; spare renewed",
            )
        todo[rid] = (Spare(new_storage_uuid(), claim or "", container), what == PROMOTE)
    if todo:
        await t.write_spares(kube, q, owner, todo, replicas)
        for rid in todo:
            book.seen.pop(rid, None)
    return any(promote for _, promote in todo.values())


async def spare_in_secret(
    t: QuorumTls,
    q: QuorumSpec,
    data: dict[str, bytes],
    ca: OperatorCa,
    i: int,
    todo: tuple[Spare, bool] | None,
) -> bool:
    """Replica ``i``'s spare in ``NAME-tls``'s ``data`` (in place): promoted and replaced
    (``todo``), or renewed with its UUID when due; remembered in the spare book. True if
    ``data`` changed."""
    crt, key, state = f"spare-{i}.crt", f"spare-{i}.key", f"spare-{i}.state"
    spare = Spare.decode(data.get(state))
    ident = cert_identity(data.get(crt))
    if spare is None or ident is None or ident.storage_uuid != spare.uuid:
        spare = None  # none, or half written: a new one when the daemon asks
    if todo is None:
        if spare is None:
            t.spare_book.spares.pop(i, None)
            return False
        t.spare_book.spares[i] = spare
        if not cert_due(data.get(crt), tls_days(q.tls.renew_before_days)):
            return False
        data[crt], data[key] = await asyncio.to_thread(ca.node, i, spare.uuid)
        return True
    nxt, promote = todo
    if promote and spare is not None:
        data[f"node-{i}.crt"], data[f"node-{i}.key"] = data[crt], data[key]
        t.reported[i] = t.current[i] = spare.uuid
    data[crt], data[key] = await asyncio.to_thread(ca.node, i, nxt.uuid)
    data[state] = nxt.encode().encode()
    t.spare_book.spares[i] = nxt
    return True


async def runs_spare(t: QuorumTls, kube: KubeApi, q: QuorumSpec, i: int, pem: bytes | None) -> bool:
    """cert-manager: replica ``i``'s pod started with the spare that became its certificate, and
    ``pem`` (its node Secret's) is only cert-manager's first issue for that disk after the
    promotion: no restart for it while the spare the node serves is not due. A later issue (a
    renewal) restarts the pod as usual."""
    entry = t.on_spare.get(i)
    if entry is None:
        return False
    uid, expires, uuid, serial = entry
    ident, now_serial = cert_identity(pem), cert_serial(pem)
    if serial is None and ident is not None and ident.storage_uuid == uuid:
        serial = now_serial
        t.on_spare[i] = (uid, expires, uuid, serial)
    ok = (
        serial is not None
        and serial == now_serial
        and dt.datetime.now(dt.UTC) + tls_days(q.tls.renew_before_days) < expires
        and await kube.pod_uid(q.namespace, f"{q.name}-{i - 1}") == uid
    )
    if not ok:
        t.on_spare.pop(i, None)
    return ok


async def write_cm_spares(
    t: QuorumTls,
    kube: KubeApi,
    q: QuorumSpec,
    owner: Mapping[str, Any],
    todo: Mapping[int, tuple[Spare, bool]],
    replicas: int,
) -> None:
    """CertManager mode: the spare Certificates of ``todo``; a promoted spare's UUID becomes the
    node Certificate's, and a replaced spare's Secret is deleted at once (cert-manager issues the
    next), so no new pod can format a volume with it."""
    book = t.spare_book
    replaced = []
    for i, (nxt, promote) in todo.items():
        old = book.spares.get(i)
        secret_name = f"{q.name}-node-{i}-spare-tls"
        if promote and old is not None:
            t.reported[i] = t.current[i] = old.uuid
            expires = not_after(unb64(await kube.secret_data(q.namespace, secret_name), "tls.crt"))
            uid = await kube.pod_uid(q.namespace, f"{q.name}-{i - 1}")
            if expires is not None and uid is not None:
                t.on_spare[i] = (uid, expires, old.uuid, None)
        book.spares[i] = nxt
        if old is not None:
            replaced.append(secret_name)
    await t.ensure(kube, q, owner, replicas)  # the Certificates name the next spares first,
    for name in replaced:  # then the old spare leaves the pods' volume; cert-manager issues the next
        await kube.delete_secret(q.namespace, name)
