"""The per-KRaftQuorum TLS work of the operator (objects in kubetls.py, API calls in kube.py).

:meth:`QuorumTls.ensure` runs on every spec reconcile, before the StatefulSet is applied (the
pods need their Secret): Operator mode loads or creates the CA Secret, issues node certificates
that are missing or name another identity (never the ones merely due: those are renewed one pod
at a time by :meth:`QuorumTls.rotator`), the applications' client Secret, and returns the
operator's admin client config; CertManager mode applies the Certificates and returns the
operator's admin config from cert-manager's Secret (a TemporaryError while it is not issued yet);
Disabled returns None (plaintext).

Disk binding (tlsobjects.py module docstring): a replaced disk normally starts on its replica's
spare certificate (spares.py, whose pass the daemon runs; the spares live in the same Secret or
as a second Certificate per replica). Without one, the old path: :meth:`QuorumTls.bind_disks` runs
on every daemon pass. A pod whose node refused its certificate because it names another disk reported its
volume's storage UUID (podhealth.py ``disk_of_pod``): the operator issues (or has cert-manager
issue) the certificate of that disk and then deletes the pod once, so that its node container
mounts the new one (tlsspec.py); it does not wait for a healthy quorum as a renewal does (the node
is down anyway, and a certificate adds no voter: the recovery's AddVoter does). The quorum's view
names the disk of each voter; a certificate without a disk binding (issued by an older operator)
is bound to it by the rotation, one pod at a time.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
import shutil
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import kopf

from quorum.security.clientconfig import ClientConfig
from quorum.security.pki import Identity
from quorum.types import KraftError, new_storage_uuid

from ..core.rotation import CertRotator
from .kube import KubeApi
from .manifests import QuorumSpec
from .podhealth import disk_of_pod
from .spares import Spare, SpareBook, runs_spare, spare_in_secret, write_cm_spares
from .tlsobjects import (
    DISK_ANNOTATION,
    SPARE_ANNOTATION,
    OperatorCa,
    cert_due,
    cert_identity,
    certificates,
    client_config_from_secret,
    client_json,
    not_before,
    secret,
    tls_days,
    unb64,
)

RESTART_GONE_S = 120.0  # longest wait for a deleted pod to go (its grace period is 30 s)
WAIT_S = 5

log = logging.getLogger("kraftkeeper.operator")


async def pods_ready(kube: KubeApi, q: QuorumSpec, replicas: int) -> bool:
    """Every pod of the StatefulSet Ready and no roll of it pending, when its controller reports
    it: the rotator's "back in the quorum" (the node fetched again) comes before the kubelet's
    readiness probe passes, and restarting the next pod then would leave two pods unready at once
    (as a StatefulSet roll never does). A roll (a new pod template: an image change, an operator
    upgrade) is the StatefulSet controller's own one-pod-at-a-time restart, which does not wait
    for pods the operator deletes (with podManagementPolicy Parallel it replaces the highest
    outdated ordinal whatever the others' state): the rotation waits until that roll is done,
    so the two never take down a pod each. No status reported (no controller: stand-in nodes in
    tests) -> the quorum's view alone decides."""
    sts = await kube.read_statefulset(q.namespace, q.name) or {}
    st = sts.get("status") or {}
    if "observedGeneration" not in st:
        return True
    rolled = (
        int(st["observedGeneration"]) >= int((sts.get("metadata") or {}).get("generation") or 0)
        and st.get("currentRevision") == st.get("updateRevision")
        and int(st.get("updatedReplicas") or 0) >= replicas
    )
    return rolled and int(st.get("readyReplicas") or 0) >= replicas


class QuorumTls:
    """TLS state the operator keeps for one KRaftQuorum (a cache: the Secrets are the truth)."""

    def __init__(self) -> None:
        self.ca: OperatorCa | None = None
        self.cm_dir: Path | None = None
        self.config: ClientConfig | None = None
        self.cm_data: dict[str, str] | None = None  # cert-manager's Secret as last loaded
        self.reported: dict[int, str] = {}  # replica id -> storage UUID its pod's volume reported
        self.voter_disks: dict[int, str] = {}  # replica id -> its one voter's UUID (quorum view)
        self.chosen: dict[int, str] = {}  # cert-manager: UUIDs chosen for not yet issued Secrets
        self.restarted: set[str] = set()  # uids of pods deleted to take their disk's certificate
        self.cm_unbound: set[int] = set()  # cert-manager: replica ids whose Certificate names no disk
        self.current: dict[int, str | None] = {}  # replica id -> the UUID its certificate names
        self.spare_book = SpareBook()
        self.bootstrapped = False  # set by the daemon: spares are issued from then on
        # cert-manager: replica id -> its pod's uid, when the spare it started with expires, that
        # spare's UUID, the serial of cert-manager's first issue for it (spares.py ``runs_spare``)
        self.on_spare: dict[int, tuple[str, dt.datetime, str, int | None]] = {}
        # One read-modify-write of NAME-tls at a time: a promoted spare is never written back.
        self.secret_lock = asyncio.Lock()

    def close(self) -> None:
        if self.ca is not None:
            self.ca.close()
            self.ca = None
        if self.cm_dir is not None:
            shutil.rmtree(self.cm_dir, ignore_errors=True)
            self.cm_dir = None

    async def ensure(
        self, kube: KubeApi, q: QuorumSpec, owner: Mapping[str, Any], replicas: int
    ) -> ClientConfig | None:
        """Make the quorum's TLS objects; the operator's admin client config (module docstring)."""
        if not q.tls.enabled:
            self.close()
            self.config = None
            return None
        if q.tls.cert_manager:
            if self.ca is not None:  # switched from Operator mode: forget that CA
                self.ca.close()
                self.ca = None
            disks = {i: await self._cm_disk(kube, q, i) for i in range(1, replicas + 1)}
            self.cm_unbound = {i for i, d in disks.items() if d is None}
            self.current = dict(disks)
            book = self.spare_book
            if not book.loaded:
                for i in range(1, replicas + 1):
                    meta = await kube.read_meta("Certificate", q.namespace, f"{q.name}-node-{i}-spare")
                    found = Spare.decode(((meta or {}).get("annotations") or {}).get(SPARE_ANNOTATION))
                    if found is not None:
                        book.spares[i] = found
                book.loaded = True
            for obj in certificates(q, owner, replicas, disks, book.spares):
                await kube.apply(obj)
            data = await kube.secret_data(q.namespace, f"{q.name}-operator-tls")
            if not data:
                raise kopf.TemporaryError(
                    f"waiting for cert-manager to issue Secret {q.name}-operator-tls", delay=WAIT_S
                )
            if self.cm_dir is None:
                self.cm_dir = Path(tempfile.mkdtemp(prefix="kraftkeeper-cm-"))
            try:
                self.config = await asyncio.to_thread(client_config_from_secret, q, data, self.cm_dir)
            except ValueError as e:
                raise kopf.TemporaryError(str(e), delay=WAIT_S) from e
            self.cm_data = data
            return self.config
        ca = await self._ca(kube, q, owner)
        await self._locked_secret(kube, q, owner, ca, replicas, renew=())
        await self._client_secret(kube, q, owner, ca)
        self.config = await asyncio.to_thread(ca.admin_config)
        return self.config

    async def _ca(self, kube: KubeApi, q: QuorumSpec, owner: Mapping[str, Any]) -> OperatorCa:
        if self.ca is not None and self.ca.q.cluster_id == q.cluster_id:
            self.ca.q = q
            return self.ca
        name = f"{q.name}-ca"
        data = await kube.secret_data(q.namespace, name)
        if data is None:
            ca = await asyncio.to_thread(OperatorCa, q)
            crt, key = ca.ca_pems()
            if await kube.create_secret(secret(q, owner, name, {"ca.crt": crt, "ca.key": key})):
                log.info("%s: created the quorum's CA in Secret %s", q.cluster, name)
                self.ca = ca
                return ca
            ca.close()  # another writer won the race: use its CA
            data = await kube.secret_data(q.namespace, name)
        ca_crt, ca_key = unb64(data, "ca.crt"), unb64(data, "ca.key")
        try:
            if ca_crt is None or ca_key is None:
                raise ValueError("it needs ca.crt and ca.key")
            self.ca = await asyncio.to_thread(OperatorCa, q, ca_crt, ca_key)
        except (ValueError, KraftError) as e:
            msg = e.message if isinstance(e, KraftError) else str(e)
            raise kopf.PermanentError(f"Secret {q.namespace}/{name} is not this quorum's CA: {msg}") from e
        return self.ca

    async def _locked_secret(self, *args: Any, **kw: Any) -> None:
        async with self.secret_lock:
            await self._node_secret(*args, **kw)

    async def _node_secret(
        self,
        kube: KubeApi,
        q: QuorumSpec,
        owner: Mapping[str, Any],
        ca: OperatorCa,
        replicas: int,
        renew: tuple[int, ...],
        spares: Mapping[int, tuple[Spare, bool]] | None = None,
    ) -> None:
        """``NAME-tls``: issue what is missing or foreign, and the ids in ``renew``; the spares in
        ``spares`` (replica id -> the next spare, and whether the current one is promoted first)."""
        name = f"{q.name}-tls"
        old = await kube.secret_data(q.namespace, name) or {}
        data = {k: v for k in old if (v := unb64(old, k)) is not None}
        spares = dict(spares or {})
        changed = data.get("ca.crt") != ca.ca_pems()[0]
        data["ca.crt"] = ca.ca_pems()[0]
        for i in range(1, replicas + 1):
            pem = data.get(f"node-{i}.crt")
            ident = Identity(q.cluster_id, replica_id=i)
            current = cert_identity(pem)
            ours = current is not None and (current.cluster_id, current.replica_id) == (q.cluster_id, i)
            # An expired certificate keeps its disk: only a missing or foreign one gets a new UUID.
            disk = self.disk_for(i, current.storage_uuid if current is not None and ours else None, not ours)
            missing = cert_due(pem, dt.timedelta(0), ident)
            # A certificate naming another disk than its pod's is re-issued at once (its pod is
            # then restarted by bind_disks); an unbound one (an older operator's) only when the
            # rotation renews it: bound here, the rotation would no longer see it due, and its
            # running node would keep the unbound one.
            unbound = current is not None and current.storage_uuid is None and i not in self.reported
            moved = current is not None and disk != current.storage_uuid and not unbound
            if i in renew or missing or moved:
                data[f"node-{i}.crt"], data[f"node-{i}.key"] = await asyncio.to_thread(ca.node, i, disk)
                changed = True
                log.info("%s: issued the certificate of replica %d (storage %s)", q.cluster, i, disk)
            got = cert_identity(data.get(f"node-{i}.crt"))
            self.current[i] = None if got is None else got.storage_uuid
            changed |= await spare_in_secret(self, q, data, ca, i, spares.get(i))
        if changed:
            await kube.apply(secret(q, owner, name, data))

    def spares_ready(self, q: QuorumSpec) -> bool:
        """Spares are kept: the quorum bootstrapped and its certificates are known."""
        return self.bootstrapped and (self.spare_book.loaded if q.tls.cert_manager else self.ca is not None)

    def vouched(self, replicas: int) -> dict[int, str | None]:
        """Per replica id, the UUID its current certificate names (recovery.py ``vouched``)."""
        return {i: self.current[i] for i in range(1, replicas + 1) if i in self.current}

    async def write_spares(
        self,
        kube: KubeApi,
        q: QuorumSpec,
        owner: Mapping[str, Any],
        todo: Mapping[int, tuple[Spare, bool]],
        replicas: int,
    ) -> None:
        """Issue the spares in ``todo`` (spares.py), promoting the current one first where asked."""
        if not q.tls.cert_manager:
            if self.ca is not None:
                await self._locked_secret(kube, q, owner, self.ca, replicas, renew=(), spares=todo)
            return
        await write_cm_spares(self, kube, q, owner, todo, replicas)

    def disk_for(self, i: int, current: str | None, new: bool) -> str | None:
        """The storage UUID replica ``i``'s certificate should name: the one its pod's volume
        reported, else the one it names, else its voter's (binding an old, unbound certificate),
        else for a certificate issued anew a fresh one (the pod formats an empty volume with it
        before the quorum bootstrapped), else none (an unbound certificate stays as it is)."""
        if i in self.reported:
            return self.reported[i]
        if current is not None:
            return current
        if i in self.voter_disks:
            return self.voter_disks[i]
        return new_storage_uuid() if new else None

    async def _cm_disk(self, kube: KubeApi, q: QuorumSpec, i: int) -> str | None:
        """CertManager mode: :meth:`disk_for` from the disk the node Certificate was applied for
        (not issued yet, e.g. a promoted spare's), else from cert-manager's Secret (a fresh UUID
        remembered until the Secret exists)."""
        meta = await kube.read_meta("Certificate", q.namespace, f"{q.name}-node-{i}")
        intent = ((meta or {}).get("annotations") or {}).get(DISK_ANNOTATION)
        if intent:
            self.chosen.pop(i, None)
            return self.disk_for(i, str(intent), False)
        data = await kube.secret_data(q.namespace, f"{q.name}-node-{i}-tls")
        current = cert_identity(unb64(data, "tls.crt"))
        if current is None:
            return self.chosen.setdefault(i, self.disk_for(i, None, True) or new_storage_uuid())
        self.chosen.pop(i, None)
        return self.disk_for(i, current.storage_uuid, False)

    def observe(self, view: Any) -> None:
        """Remember each voter's storage UUID from the quorum's view (a ``QuorumView``; an id
        with two UUIDs, a disk replacement under way, names none)."""
        if view is None:
            return
        seen: dict[int, set[str]] = {}
        for v in view.voters:
            if v.uuid:
                seen.setdefault(v.id, set()).add(v.uuid)
        self.voter_disks = {i: next(iter(u)) for i, u in seen.items() if len(u) == 1}

    async def bind_disks(
        self,
        kube: KubeApi,
        q: QuorumSpec,
        owner: Mapping[str, Any],
        pods: list[dict[str, Any]],
        replicas: int,
    ) -> list[int]:
        """Give each pod that reported a new disk the certificate of that disk, and delete the pod
        once that certificate is in its Secret (module docstring). Returns the replica ids whose
        pod was deleted."""
        if not q.tls.enabled:
            return []
        if q.tls.cert_manager and self.cm_unbound & set(self.voter_disks):
            await self.ensure(kube, q, owner, replicas)  # bind them; the rotation restarts the pods
        reports: dict[int, tuple[str, dict[str, Any]]] = {}
        for pod in pods:
            found = disk_of_pod(pod, q.name)
            if found is not None and str((pod.get("metadata") or {}).get("uid")) not in self.restarted:
                reports[found[0]] = (found[1], pod)
        out = []
        for i, (disk, pod) in sorted(reports.items()):
            if self.reported.get(i) != disk:
                self.reported[i] = disk
                await kube.notify(
                    q,
                    warning=False,
                    reason="CertificateForNewDisk",
                    message=f"replica {i} runs on a new disk (storage {disk}): issuing its certificate",
                )
            if q.tls.cert_manager:
                issued = cert_identity(
                    unb64(await kube.secret_data(q.namespace, f"{q.name}-node-{i}-tls"), "tls.crt")
                )
                if issued is None or issued.storage_uuid != disk:
                    await self.ensure(kube, q, owner, replicas)  # applies the Certificate naming it
                    continue
            elif self.ca is not None:
                await self._locked_secret(kube, q, owner, self.ca, replicas, renew=())
            else:
                continue
            meta = pod.get("metadata") or {}
            self.restarted.add(str(meta.get("uid")))
            await kube.delete_pod(q.namespace, str(meta.get("name")))
            log.info(
                "%s: restarted pod %s with the certificate of its disk %s", q.cluster, meta.get("name"), disk
            )
            out.append(i)
        return out

    async def _client_secret(
        self, kube: KubeApi, q: QuorumSpec, owner: Mapping[str, Any], ca: OperatorCa
    ) -> None:
        name = f"{q.name}-client"
        old = await kube.secret_data(q.namespace, name) or {}
        renew = tls_days(q.tls.renew_before_days)
        if not cert_due(unb64(old, "tls.crt"), renew) and unb64(old, "ca.crt") == ca.ca_pems()[0]:
            return
        crt, key = await asyncio.to_thread(ca.client)
        data = {"ca.crt": ca.ca_pems()[0], "tls.crt": crt, "tls.key": key, "client.json": client_json()}
        await kube.apply(secret(q, owner, name, data))
        log.info("%s: issued the applications' client credential (Secret %s)", q.cluster, name)

    async def refresh(self, kube: KubeApi, q: QuorumSpec) -> bool:
        """Keep the operator's own credential fresh (every daemon pass): Operator mode re-issues
        it when due, CertManager mode reloads cert-manager's renewed Secret. True if it changed
        (the caller rebuilds its client: a TLS context holds the old certificate)."""
        if not q.tls.enabled or self.config is None:
            return False
        if q.tls.cert_manager:
            data = await kube.secret_data(q.namespace, f"{q.name}-operator-tls")
            if not data or data == self.cm_data or self.cm_dir is None:
                return False
            try:
                self.config = await asyncio.to_thread(client_config_from_secret, q, data, self.cm_dir)
            except ValueError:
                return False
            self.cm_data = data
            return True
        if self.ca is None:
            return False
        before = self.ca.admin
        self.config = await asyncio.to_thread(self.ca.admin_config)
        return self.config is not before

    async def due(self, kube: KubeApi, q: QuorumSpec, replicas: int) -> list[int]:
        """Replica ids to restart: Operator mode, those whose node certificate expires within
        ``renewBeforeDays``; CertManager mode, those whose pod started before cert-manager
        issued the certificate now in its Secret (cert-manager renewed it)."""
        if not q.tls.enabled:
            return []
        if q.tls.cert_manager:
            out = []
            for i in range(1, replicas + 1):
                data = await kube.secret_data(q.namespace, f"{q.name}-node-{i}-tls")
                issued = not_before(unb64(data, "tls.crt"))
                started = await kube.pod_start_time(q.namespace, f"{q.name}-{i - 1}")
                if issued is not None and started is not None and issued > started:
                    if not await runs_spare(self, kube, q, i, unb64(data, "tls.crt")):
                        out.append(i)
            return out
        if self.ca is None:
            return []
        data = await kube.secret_data(q.namespace, f"{q.name}-tls") or {}
        renew = tls_days(q.tls.renew_before_days)
        out = []
        for i in range(1, replicas + 1):
            pem = unb64(data, f"node-{i}.crt")
            current = cert_identity(pem)
            # An unbound certificate (an older operator's) is replaced by one naming the disk.
            unbound = current is not None and current.storage_uuid is None and i in self.voter_disks
            if unbound or cert_due(pem, renew):
                out.append(i)
        return out

    def rotator(self, kube: KubeApi, get: Any, owner: Mapping[str, Any]) -> CertRotator:
        """The one-pod-at-a-time renewal of this quorum; ``get()`` gives the current
        (QuorumSpec, replicas)."""

        async def due() -> list[int]:
            q, replicas = get()
            due = await self.due(kube, q, replicas)
            # The StatefulSet is read only when something is due (no extra request per pass).
            return due if due and await pods_ready(kube, q, replicas) else []

        async def renew(i: int) -> None:
            q, replicas = get()
            if self.ca is not None:
                await self._locked_secret(kube, q, owner, self.ca, replicas, renew=(i,))

        async def restart(i: int) -> None:
            q, _ = get()
            name = f"{q.name}-{i - 1}"
            old = await kube.pod_uid(q.namespace, name)
            await kube.delete_pod(q.namespace, name)
            # Return only once the old pod is gone: until then its process may still fetch
            # (graceful termination), and a fetch seen after this restart must come from the new
            # process, or the next node would be restarted while this one is still down.
            deadline = asyncio.get_running_loop().time() + RESTART_GONE_S
            while old is not None and await kube.pod_uid(q.namespace, name) == old:
                if asyncio.get_running_loop().time() > deadline:
                    raise kopf.TemporaryError(f"Pod {q.namespace}/{name} still there after deletion")
                await asyncio.sleep(0.5)

        def ids() -> list[int]:
            q, _ = get()
            return list(range(1, q.voters + 1))

        async def notify(reason: str, message: str, warning: bool) -> None:
            q, _ = get()
            await kube.notify(q, warning=warning, reason=reason, message=message)

        q0, _ = get()
        return CertRotator(due, renew, restart, ids, notify=notify, label=q0.cluster)
