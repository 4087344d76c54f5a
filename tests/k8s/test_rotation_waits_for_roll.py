"""The certificate rotation waits for a StatefulSet roll, against a real kube-apiserver (no
controller runs: the StatefulSet's status is written through ``statefulsets/status`` as its
controller writes it). A roll (an image change, an operator upgrade) replaces the highest outdated
pod whatever the state of the others, so a renewal restart during it could take down a second pod:
``pods_ready`` (quorumtls.py) says no while the controller has not seen the newest template, while
any replica is on the old revision, and while any pod is unready."""

from __future__ import annotations

from typing import Any

from kraftkeeper_operator.k8s.manifests import parse_spec
from kraftkeeper_operator.k8s.quorumtls import pods_ready

from tests.k8s.conftest import KubeEnv
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
