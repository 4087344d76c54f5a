"""What the KRaftQuorum-with-``spec.kafka`` tests (tests/kafka/test_k8s_kafka.py) read and write
through the kube-apiserver and the controllers: the KRaftQuorum and Secret objects they create,
the status, Events and conditions they check, a controller's directory id as a UUID, and the
leader's DescribeQuorum as the operator reads it (for a failure message).
"""

from __future__ import annotations

import asyncio
import base64
from typing import Any

from kraftkeeper_operator.kafka.backend import KafkaQuorum
from kraftkeeper_operator.kafka.clientconf import ClientSettings, parse_client_properties
from kraftkeeper_operator.kafka.cluster import KafkaControllers

from quorum.kafka.mapping import base64_to_uuid
from quorum.timefmt import now_ms
from tests.k8s.conftest import KubeEnv

KQ = "/apis/kraftkeeper.io/v1alpha1/namespaces/{ns}/kraftquorums"


def kq(name: str, **kafka: Any) -> dict[str, Any]:
    return {
        "apiVersion": "kraftkeeper.io/v1alpha1",
        "kind": "KRaftQuorum",
        "metadata": {"name": name},
        "spec": {"kafka": kafka},
    }


def secret(name: str, data: dict[str, str]) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": name},
        "data": {k: base64.b64encode(v.encode()).decode() for k, v in data.items()},
    }


def status_of(kube: KubeEnv, ns: str, name: str) -> dict[str, Any]:
    st, body = kube.request("GET", KQ.format(ns=ns) + "/" + name)
    assert st == 200, body
    return dict(body.get("status") or {})


def events_of(kube: KubeEnv, ns: str, name: str) -> list[dict[str, Any]]:
    st, body = kube.request("GET", f"/api/v1/namespaces/{ns}/events")
    assert st == 200, body
    return [e for e in body["items"] if e["involvedObject"]["name"] == name]


def condition(status: dict[str, Any], type_: str) -> dict[str, Any]:
    return next((c for c in status.get("conditions") or [] if c.get("type") == type_), {})


def uuid_of(k: KafkaControllers, i: int) -> str:
    d = k.controllers[i].directory_id()
    assert d is not None
    return str(base64_to_uuid(d))


def describe_now(k: KafkaControllers) -> dict[str, Any]:
    """The leader's DescribeQuorum as the operator reads it (for a failure message)."""
    assert k.security is not None
    settings = ClientSettings.from_dict(parse_client_properties(k.security.client_properties(), "client"))

    async def run() -> dict[str, Any]:
        api = KafkaQuorum(k.bootstrap, settings)
        try:
            return {"now_ms": now_ms(), **await api.describe()}
        finally:
            await api.close()

    return asyncio.run(run())
