"""What the operator tests under tests/k8s share: ``kraftkeeper operator run`` in a subprocess
(`Operator`) and the ``operator`` fixture that runs it, the endpoint overrides that point it at
stand-in node processes, the KRaftQuorum collection path, and small API helpers to build, create
and read a resource and its status."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from testkit.launchers import start_operator_run, stop_process, tail_of
from tests.k8s.conftest import KubeEnv, free_port
from tests.operator.operator_nodes import LocalCluster

KQ = "/apis/kraftkeeper.io/v1alpha1/namespaces/{ns}/kraftquorums"


class Operator:
    """``kraftkeeper operator run`` in a subprocess, watching one namespace."""

    def __init__(self, kube: KubeEnv, ns: str, log: Path, overrides: str = "", interval: float = 0.5) -> None:
        self.metrics_port = free_port()
        env = kube.env()
        env.update(
            KRAFTKEEPER_METRICS_PORT=str(self.metrics_port),
            KRAFTKEEPER_METRICS_HOST="127.0.0.1",
            KRAFTKEEPER_RECONCILE_INTERVAL=str(interval),
            KRAFTKEEPER_QUORUM_TIMEOUT="2",
            KRAFTKEEPER_ENDPOINT_OVERRIDES=overrides,
            KRAFTKEEPER_DEFAULT_IMAGE="kraftkeeper:test",
        )
        self.log = log
        self.proc = start_operator_run(env, ns, log, verbose=True)

    def stop(self) -> None:
        stop_process(self.proc)

    def tail(self) -> str:
        return tail_of(self.log)


# The stand-in node processes (operator_nodes.LocalCluster) serve plaintext on loopback.
PLAINTEXT = {"mode": "Disabled"}


def overrides_for(nodes: LocalCluster, ns: str, name: str) -> str:
    """KRAFTKEEPER_ENDPOINT_OVERRIDES pointing pod k of KRaftQuorum ``name`` at stand-in node k+1."""
    return ",".join(f"{ns}/{name}/{k}={nodes.endpoint(k + 1)}" for k in range(nodes.nodes))


def kq(name: str, voters: int = 3, **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "kraftkeeper.io/v1alpha1",
        "kind": "KRaftQuorum",
        "metadata": {"name": name},
        "spec": {"voters": voters, **spec},
    }


def create(kube: KubeEnv, ns: str, obj: dict[str, Any]) -> dict[str, Any]:
    st, body = kube.request("POST", KQ.format(ns=ns), obj)
    assert st == 201, body
    return body  # type: ignore[no-any-return]


def create_quorum_pod(
    kube: KubeEnv, ns: str, quorum: str, ordinal: int, containers: list[str], init: tuple[str, ...] = ()
) -> dict[str, Any]:
    """A pod standing for the StatefulSet's pod ``quorum-ordinal`` (its template's labels; no
    kubelet runs it: tests write its status through ``pods/status``). Returns the created pod."""
    sts = kube.wait_for(
        f"StatefulSet {quorum}",
        lambda: get(kube, f"/apis/apps/v1/namespaces/{ns}/statefulsets/{quorum}"),
        timeout=60,
    )
    labels = sts["spec"]["template"]["metadata"]["labels"]
    spec: dict[str, Any] = {
        "automountServiceAccountToken": False,
        "containers": [{"name": c, "image": "kraftkeeper:test"} for c in containers],
    }
    if init:
        spec["initContainers"] = [{"name": c, "image": "kraftkeeper:test"} for c in init]
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": f"{quorum}-{ordinal}", "namespace": ns, "labels": labels},
        "spec": spec,
    }
    st, body = kube.request("POST", f"/api/v1/namespaces/{ns}/pods", pod)
    assert st == 201, body
    return dict(body)


def create_quorum_claim(kube: KubeEnv, ns: str, quorum: str, ordinal: int, labels: dict[str, str]) -> None:
    """The StatefulSet's claim ``data-quorum-ordinal`` of that pod (no controller-manager here to
    make it), with the quorum's labels."""
    claim = {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {"name": f"data-{quorum}-{ordinal}", "namespace": ns, "labels": labels},
        "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}},
    }
    st, body = kube.request("POST", f"/api/v1/namespaces/{ns}/persistentvolumeclaims", claim)
    assert st == 201, body


def events_of(kube: KubeEnv, ns: str, uid: str, reason: str) -> list[dict[str, Any]]:
    """The Events of reason ``reason`` about the object with ``uid``."""
    items = (get(kube, f"/api/v1/namespaces/{ns}/events") or {}).get("items", [])
    return [e for e in items if e["involvedObject"].get("uid") == uid and e.get("reason") == reason]


def get(kube: KubeEnv, path: str) -> dict[str, Any] | None:
    st, body = kube.request("GET", path)
    return body if st == 200 else None  # type: ignore[no-any-return]


def kq_status(kube: KubeEnv, ns: str, name: str) -> dict[str, Any]:
    """The KRaftQuorum's status: {} until the operator writes one (or once the object is gone)."""
    return (get(kube, KQ.format(ns=ns) + f"/{name}") or {}).get("status") or {}


def wait_known_voters(kube: KubeEnv, ns: str, name: str, voters: int) -> dict[str, Any]:
    """The status, once the quorum is Running with ``voters`` voters, each with its storage UUID."""

    def known() -> dict[str, Any] | None:
        s = kq_status(kube, ns, name)
        vs = s.get("voters") or []
        ok = s.get("phase") == "Running" and len(vs) == voters and all(v.get("uuid") for v in vs)
        return s if ok else None

    return kube.wait_for(  # type: ignore[no-any-return]
        f"{name} Running with {voters} voters, each with its UUID", known, timeout=120
    )


@pytest.fixture
def operator(
    kube: KubeEnv, kraftquorum_crd: dict[str, Any], namespace: str, tmp_path: Path
) -> Iterator[Operator]:
    """The operator running against the test apiserver, watching ``namespace``; its log is
    printed when the test ends (pytest shows it for a failed test). Test modules import it."""
    op = Operator(kube, namespace, tmp_path / "operator.log")
    yield op
    op.stop()
    print("operator log:\n" + op.tail())
