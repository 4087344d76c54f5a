"""The per-KRaftQuorum TLS work of the operator (objects in kubetls.py, API calls in kube.py).

:meth:`QuorumTls.ensure` runs on every spec reconcile, before the StatefulSet is applied (the
pods need their Secret): Operator mode loads or creates the CA Secret, issues node certificates
that are missing or name another identity (never the ones merely due: those are renewed one pod
at a time by :meth:`QuorumTls.rotator`), the applications' client Secret, and returns the
operator's admin client config; CertManager mode applies the Certificates and returns the
operator's admin config from cert-manager's Secret (a TemporaryError while it is not issued yet);
Disabled returns None (plaintext).
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
from quorum.types import KraftError

from ..core.rotation import CertRotator
from .kube import KubeApi, post_quorum_event
from .manifests import QuorumSpec
from .tlsobjects import (
    OperatorCa,
    cert_due,
    certificates,
    client_config_from_secret,
    client_json,
    not_before,
    secret,
    tls_days,
    unb64,
)

RESTART_GONE_S = 120.0  # longest wait for a deleted pod to go (its grace period is 30 s)

log = logging.getLogger("kraftkeeper.operator")


async def pods_ready(kube: KubeApi, q: QuorumSpec, replicas: int) -> bool:
    """Every pod of the StatefulSet Ready, when its controller reports it: the rotator's "back in
    the quorum" (the node fetched again) comes before the kubelet's readiness probe passes, and
    restarting the next pod then would leave two pods unready at once (as a StatefulSet roll
    never does). No status reported (no controller: stand-in nodes in tests) -> the quorum's view
    alone decides."""
    sts = await kube.read_statefulset(q.namespace, q.name)
    st = (sts or {}).get("status") or {}
    if "observedGeneration" not in st:
        return True
    return int(st.get("readyReplicas") or 0) >= replicas

WAIT_S = 5


class QuorumTls:
    """TLS state the operator keeps for one KRaftQuorum (a cache: the Secrets are the truth)."""

    def __init__(self) -> None:
        self.ca: OperatorCa | None = None
        self.cm_dir: Path | None = None
        self.config: ClientConfig | None = None
        self.cm_data: dict[str, str] | None = None  # cert-manager's Secret as last loaded

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
            for obj in certificates(q, owner, replicas):
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
        await self._node_secret(kube, q, owner, ca, replicas, renew=())
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

    async def _node_secret(
        self,
        kube: KubeApi,
        q: QuorumSpec,
        owner: Mapping[str, Any],
        ca: OperatorCa,
        replicas: int,
        renew: tuple[int, ...],
    ) -> None:
        """``NAME-tls``: issue what is missing or foreign, and the ids in ``renew``."""
        name = f"{q.name}-tls"
        old = await kube.secret_data(q.namespace, name) or {}
        data = {k: v for k in old if (v := unb64(old, k)) is not None}
        changed = data.get("ca.crt") != ca.ca_pems()[0]
        data["ca.crt"] = ca.ca_pems()[0]
        for i in range(1, replicas + 1):
            ident = Identity(q.cluster_id, replica_id=i)
            if i in renew or cert_due(data.get(f"node-{i}.crt"), dt.timedelta(0), ident):
                data[f"node-{i}.crt"], data[f"node-{i}.key"] = await asyncio.to_thread(ca.node, i)
                changed = True
                log.info("%s: issued the certificate of replica %d", q.cluster, i)
        if changed:
            await kube.apply(secret(q, owner, name, data))

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
                    out.append(i)
            return out
        if self.ca is None:
            return []
        data = await kube.secret_data(q.namespace, f"{q.name}-tls") or {}
        renew = tls_days(q.tls.renew_before_days)
        return [i for i in range(1, replicas + 1) if cert_due(unb64(data, f"node-{i}.crt"), renew)]

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
                await self._node_secret(kube, q, owner, self.ca, replicas, renew=(i,))

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

        def notify(reason: str, message: str, warning: bool) -> None:
            q, _ = get()
            post_quorum_event(q, warning=warning, reason=reason, message=message)

        q0, _ = get()
        return CertRotator(due, renew, restart, ids, notify=notify, label=q0.cluster)
