"""The certificate rotation through an upgrade, against a real kube-apiserver (no controller
runs: a StatefulSet's status is written through ``statefulsets/status`` as its controller writes
it). ``pods_ready`` (quorumtls.py) holds the rotation while a StatefulSet roll is under way: the roll
replaces the highest outdated pod whatever the state of the others, so a renewal restart during it
could take down a second pod. And the node certificates an older operator issued (no storage
UUID) are bound one at a time, each only when the rotation renews it and restarts its pod: bound
in the Secret earlier, the rotation would no longer see it due and its running node would keep the
unbound one (seen on the kubelet: renewing replica 1 bound all three, and 2 and 3 never restarted)."""

from __future__ import annotations

import base64
from typing import Any

from cryptography import x509
from kraftkeeper_operator.core.view import QuorumView, Replica
from kraftkeeper_operator.k8s.manifests import owner_reference, parse_spec
from kraftkeeper_operator.k8s.quorumtls import QuorumTls, pods_ready
from kraftkeeper_operator.k8s.tlsobjects import secret

from quorum.security.pki import identity_from_cert
from tests.k8s.conftest import KubeEnv
from tests.k8s.operator_support import create, get, kq
from tests.k8s.test_kafka_daemon_steps import _kube_api

STS = "/apis/apps/v1/namespaces/{ns}/statefulsets"


def _statefulset() -> dict[str, Any]:
    labels = {"app": "db"}
    return {
        "apiVersion": "apps/v1", "kind": "StatefulSet", "metadata": {"name": "db"},
        "spec": {"replicas": 3, "serviceName": "db", "selector": {"matchLabels": labels},
                 "template": {"metadata": {"labels": labels},
                              "spec": {"containers": [{"name": "node", "image": "kraftkeeper:old"}]}}},
    }


async def test_rotation_waits_until_the_roll_is_done(kube: KubeEnv, namespace: str) -> None:
    ns = namespace
    base = STS.format(ns=ns)
    st, body = kube.request("POST", base, _statefulset())
    assert st == 201, body
    q = parse_spec({"metadata": {"name": "db", "namespace": ns}, "spec": {}})
    api = await _kube_api(kube)
    try:
        assert await pods_ready(api, q, 3), "no status (no controller): the quorum's view decides"

        def status(**fields: Any) -> None:
            rolled = {"observedGeneration": 1, "replicas": 3, "readyReplicas": 3, "updatedReplicas": 3,
                      "currentRevision": "db-1", "updateRevision": "db-1"}
            s, b = kube.request("PATCH", f"{base}/db/status", {"status": {**rolled, **fields}},
                                content_type="application/merge-patch+json")
            assert s == 200, b

        status()
        assert await pods_ready(api, q, 3)
        status(readyReplicas=2)
        assert not await pods_ready(api, q, 3), "a pod is unready"
        status(updatedReplicas=1, updateRevision="db-2")
        assert not await pods_ready(api, q, 3), "two replicas still on the old template"
        status(updatedReplicas=3, updateRevision="db-2")
        assert not await pods_ready(api, q, 3), "the last pod updated, but the roll not yet recorded done"
        status(currentRevision="db-2", updateRevision="db-2")
        assert await pods_ready(api, q, 3)
        # A new template (the operator applied it) that the controller has not seen yet.
        s, b = kube.request("PATCH", f"{base}/db", {"spec": {"template": {"spec": {"containers": [
            {"name": "node", "image": "kraftkeeper:new"}]}}}}, content_type="application/merge-patch+json")
        assert s == 200 and b["metadata"]["generation"] == 2, b
        assert not await pods_ready(api, q, 3), "the controller has not observed the new template"
    finally:
        await api.api.close()


DISKS = {1: "1d3f138d-5271-479b-9a67-18d76a7295f3", 2: "2a89a23c-7f1f-4e79-8250-03e2e523cfdd",
         3: "3112150b-f0d8-42ff-8f73-e352aca8cc2c"}


def _bindings(kube: KubeEnv, ns: str) -> dict[int, str | None]:
    data = (get(kube, f"/api/v1/namespaces/{ns}/secrets/db-tls") or {}).get("data") or {}
    return {i: identity_from_cert(x509.load_pem_x509_certificate(base64.b64decode(data[f"node-{i}.crt"])))
            .storage_uuid for i in (1, 2, 3)}


async def test_unbound_certificates_are_bound_one_renewal_at_a_time(
    kube: KubeEnv, kraftquorum_crd: dict[str, Any], namespace: str
) -> None:
    ns = namespace
    body = create(kube, ns, kq("db", 3))
    q, owner = parse_spec(body), owner_reference(body)
    api = await _kube_api(kube)
    tls = QuorumTls()
    try:
        # The Secret an older operator wrote: its CA, node certificates naming no disk.
        ca = await tls._ca(api, q, owner)
        data = {"ca.crt": ca.ca_pems()[0]}
        for i in (1, 2, 3):
            data[f"node-{i}.crt"], data[f"node-{i}.key"] = ca.node(i)
        await api.apply(secret(q, owner, "db-tls", data))
        # The new operator's first reconcile, before it knows the voters' disks, and after.
        await tls.ensure(api, q, owner, 3)
        tls.observe(QuorumView(1, 2, 100, tuple(Replica(i, u) for i, u in DISKS.items())))
        await tls.ensure(api, q, owner, 3)
        assert _bindings(kube, ns) == {1: None, 2: None, 3: None}, "bound without a restart"
        assert await tls.due(api, q, 3) == [1, 2, 3]
        for i in (1, 2, 3):  # what the rotator's renew does, one node at a time
            await tls._node_secret(api, q, owner, ca, 3, renew=(i,))
            assert _bindings(kube, ns) == {k: DISKS[k] if k <= i else None for k in (1, 2, 3)}
            assert await tls.due(api, q, 3) == list(range(i + 1, 4))
    finally:
        tls.close()
        await api.api.close()
