"""A KRaftQuorum with ``spec.kafka``: the operator, against a real kube-apiserver (tests/k8s
fixtures), repairs three real Kafka 4.x controllers (tests/kafka fixtures) and runs nothing itself.

* the schema refuses bad specs with a message naming the field (AddThenRemove with Kafka's reason,
  engine fields next to spec.kafka, a malformed bootstrap list, dropping spec.kafka later);
* what the schema cannot see is reported in ``status`` (a port out of range, a client properties
  file the client cannot honour, a missing Secret) with a Warning Event;
* a replaced controller disk is healed with no human step, over SASL_SSL with the client settings
  and the truststore taken from a Secret: status (voters with directory ids,
  leader, recoveries), Events and the event log show it, and no StatefulSet, Service, PDB or
  NetworkPolicy was ever created;
* one owner per Kafka quorum (kafka/ownership.py): a younger resource over the same controllers,
  named otherwise, reports OwnerConflict naming the owner, makes no voter change, and heals the
  next replacement once the owner is deleted;
* the leader's disk replaced and the operator killed right after RemoveRaftVoter committed
  (failpoints.py): a new operator finishes the same recovery with AddRaftVoter alone.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kraftkeeper_operator import failpoints
from kraftkeeper_operator.kafka.cluster import KafkaControllers, KafkaSecurity

import tests.k8s.conftest as k8s_env
from quorum.kafka.mapping import base64_to_uuid
from quorum.localports import free_ports
from tests.k8s.conftest import KubeEnv
from tests.k8s.operator_support import Operator  # the operator runner tests/k8s uses (duplicate D2)
from tests.kafka.k8s_kafka_support import (
    KQ,
    condition,
    describe_now,
    events_of,
    kq,
    secret,
    status_of,
    uuid_of,
)
from tests.kafka.test_kafka_security import make_pki

pytestmark = [pytest.mark.slow, pytest.mark.k8s]


# tests/k8s's etcd + kube-apiserver, but for this module only: stopped when it ends rather than at
# the end of the session (tests/k8s keeps its own for its directory).
@pytest.fixture(scope="module")
def kube() -> Iterator[KubeEnv]:
    yield from k8s_env.kube.__wrapped__()


@pytest.fixture(scope="module")
def kraftquorum_crd(kube: KubeEnv) -> dict[str, Any]:
    return k8s_env.kraftquorum_crd.__wrapped__(kube)  # type: ignore[no-any-return]


@pytest.fixture
def namespace(kube: KubeEnv) -> str:
    return k8s_env.namespace.__wrapped__(kube)  # type: ignore[no-any-return]


@pytest.fixture
def controllers(tmp_path: Path, kafka_jars: Path) -> Iterator[KafkaControllers]:
    """Three SASL_SSL controllers (PEM CA and keystore, one PLAIN user) on free loopback ports."""
    pki = tmp_path / "pki"
    pki.mkdir()
    ca, ks = make_pki(pki)
    k = KafkaControllers(
        tmp_path / "kafka", kafka_jars, security=KafkaSecurity(ca, ks, "admin", "admin-secret")
    )
    for c, port in zip(k.controllers.values(), free_ports(len(k.controllers)), strict=True):
        c.port = port
    with k.running():
        yield k


def test_schema_refuses_bad_kafka_specs(
    kube: KubeEnv,
    kraftquorum_crd: dict[str, Any],
    namespace: str,
) -> None:
    ns, boot = namespace, ["127.0.0.1:25001"]
    path = KQ.format(ns=ns)
    cases: list[tuple[dict[str, Any], str]] = [
        (kq("a", bootstrapControllers=boot, order="AddThenRemove"), "DUPLICATE_VOTER"),
        (kq("b", bootstrapControllers=[]), "spec.kafka.bootstrapControllers"),
        (kq("c", bootstrapControllers=["no-port"]), "spec.kafka.bootstrapControllers[0]"),
        (kq("d", bootstrapControllers=boot, stabilizationSeconds=60, timeoutSeconds=30), "timeoutSeconds"),
        (kq("e"), "spec.kafka.bootstrapControllers: Required value"),
    ]
    with_image = kq("f", bootstrapControllers=boot)
    with_image["spec"]["image"] = "kraftkeeper:test"
    cases.append((with_image, "runs no pods"))
    with_tls = kq("g", bootstrapControllers=boot)
    with_tls["spec"]["tls"] = {"mode": "Disabled"}
    cases.append((with_tls, "spec.kafka.clientSecretRef"))
    for obj, needle in cases:
        st, body = kube.request("POST", path, obj)
        assert st == 422, (obj, st, body)
        assert needle in body["message"], (needle, body["message"])
    # A valid one is stored with Kafka's default order; spec.kafka cannot be dropped afterwards.
    st, body = kube.request("POST", path, kq("ok", bootstrapControllers=boot))
    assert st == 201, body
    assert body["spec"]["kafka"]["order"] == "RemoveThenAdd"
    st, body = kube.request(
        "PATCH",
        path + "/ok",
        json.dumps({"spec": {"kafka": None, "voters": 3}}),
        content_type="application/merge-patch+json",
    )
    assert st == 422 and "cannot be added or removed" in body["message"], body


@pytest.fixture
def operator(
    kube: KubeEnv,
    kraftquorum_crd: dict[str, Any],
    namespace: str,
    tmp_path: Path,
) -> Iterator[Operator]:
    op = Operator(kube, namespace, tmp_path / "operator.log")
    yield op
    op.stop()
    print("operator log:\n" + op.tail())  # shown by pytest when the test failed


def test_operator_heals_kafka_controller_disk(
    kube: KubeEnv,
    namespace: str,
    operator: Operator,
    controllers: KafkaControllers,
    tmp_path: Path,
) -> None:
    ns, k = namespace, controllers
    assert k.security is not None
    boot = [c.endpoint for c in k.controllers.values()]
    # The truststore travels in the same Secret; the properties name it by its key.
    props = k.security.client_properties().replace(str(k.security.ca_pem), "ca.pem")
    assert "ssl.truststore.location=ca.pem" in props
    client = {"client.properties": props, "ca.pem": k.security.ca_pem.read_text()}
    for obj in (
        secret("kafka-client", client),
        secret("kafka-broken", {"client.properties": "security.protocol=BOGUS\n"}),
    ):
        st, body = kube.request("POST", f"/api/v1/namespaces/{ns}/secrets", obj)
        assert st == 201, body
    events = tmp_path / "events"
    good = kq(
        "kq", bootstrapControllers=boot, clientSecretRef={"name": "kafka-client"}, stabilizationSeconds=0
    )
    good["spec"]["eventLog"] = {"path": str(events)}
    st, body = kube.request("POST", KQ.format(ns=ns), good)
    assert st == 201, body

    def whole(name: str = "kq") -> dict[str, Any] | None:
        s = status_of(kube, ns, name)
        voters = {(v["id"], v.get("uuid")) for v in s.get("voters") or []}
        want = {(i, uuid_of(k, i)) for i in k.controllers}
        ok = (
            s.get("phase") == "Running"
            and voters == want
            and condition(s, "Available").get("status") == "True"
            # Kafka reports the high watermark as -1 until a new leader's first commit.
            and s.get("highWatermark", -1) > 0
        )
        return s if ok else None

    s = kube.wait_for("status Running with the three controllers", whole, timeout=120)
    assert s["leaderId"] in k.controllers and s["leaderEpoch"] >= 1
    # Kafka's cluster id comes from DescribeCluster, which a controller answers once it is ready.
    s = kube.wait_for(
        "status.kafka.clusterId",
        lambda: (x := status_of(kube, ns, "kq")).get("kafka", {}).get("clusterId") == k.cluster_id and x,
        timeout=60,
    )
    assert {c["id"] for c in s["kafka"]["controllers"]} == set(k.controllers)

    # What the schema cannot see is reported in status (and as a Warning Event), never a crash.
    # Created after kq (seconds later: creationTimestamp has whole seconds), so kq owns the quorum.
    bad: list[tuple[dict[str, Any], str, str, str]] = [
        (kq("bad-port", bootstrapControllers=["127.0.0.1:70000"]), "Failed", "InvalidSpec", "70000"),
        (
            kq("bad-config", bootstrapControllers=boot, clientSecretRef={"name": "kafka-broken"}),
            "Failed",
            "InvalidClientConfig",
            "security.protocol",
        ),
        (
            # The same controllers by another name: the ownership rule must still see one quorum.
            kq(
                "no-secret",
                bootstrapControllers=[e.replace("127.0.0.1", "localhost") for e in boot],
                clientSecretRef={"name": "absent"},
                stabilizationSeconds=0,
            ),
            "Pending",
            "ClientSecretMissing",
            "absent",
        ),
    ]
    late_events = tmp_path / "late-events"
    bad[2][0]["spec"]["eventLog"] = {"path": str(late_events)}
    for obj in [o for o, *_ in bad]:
        st, body = kube.request("POST", KQ.format(ns=ns), obj)
        assert st == 201, body
    created = {
        n: kube.request("GET", KQ.format(ns=ns) + "/" + n)[1]["metadata"]["creationTimestamp"]
        for n in ("kq", "no-secret")
    }
    assert created["kq"] < created["no-secret"], created

    for obj, phase, reason, needle in bad:
        name = obj["metadata"]["name"]

        def reported(name: str = name, phase: str = phase, reason: str = reason) -> dict[str, Any] | None:
            s = status_of(kube, ns, name)
            c = condition(s, "Available")
            return s if s.get("phase") == phase and c.get("reason") == reason else None

        s = kube.wait_for(f"{name}: phase {phase}, reason {reason}", reported, timeout=60)
        assert needle in condition(s, "Available")["message"], s
        kube.wait_for(
            f"a Warning Event {reason} on {name}",
            lambda name=name, reason=reason: [
                e for e in events_of(kube, ns, name) if e["type"] == "Warning" and e["reason"] == reason
            ],
            timeout=30,
        )

    # A missing Secret is retried: creating it is all it takes. no-secret then sees the quorum
    # (voters, cluster id) but kq, the older resource over the same controllers, owns it.
    st, body = kube.request("POST", f"/api/v1/namespaces/{ns}/secrets", secret("absent", client))
    assert st == 201, body

    seen: list[dict[str, Any]] = []

    def conflict() -> dict[str, Any] | None:
        s = status_of(kube, ns, "no-secret")
        seen[:] = [s]  # shown when the wait fails
        ok = len(s.get("voters") or []) == 3 and s.get("kafka", {}).get("clusterId") == k.cluster_id
        return s if ok and condition(s, "Degraded").get("reason") == "OwnerConflict" else None

    try:
        s = kube.wait_for("no-secret reports that kq owns the quorum", conflict, timeout=60)
    except AssertionError:
        print("no-secret's last status:", json.dumps(seen, indent=1))
        raise
    assert condition(s, "Available")["status"] == "True" and s["phase"] == "Degraded"
    assert f"KRaftQuorum {ns}/kq," in condition(s, "Degraded")["message"]
    assert condition(status_of(kube, ns, "kq"), "Degraded").get("status") == "False"
    warned = kube.wait_for(
        "a Warning Event OwnerConflict on no-secret",
        lambda: [e for e in events_of(kube, ns, "no-secret") if e["reason"] == "OwnerConflict"],
        timeout=30,
    )
    assert len(warned) == 1 and warned[0]["type"] == "Warning"

    # Replace a follower's disk: it comes back as an observer with a new directory id.
    leader = status_of(kube, ns, "kq")["leaderId"]
    victim = next(i for i in k.controllers if i != leader)
    old = uuid_of(k, victim)
    new = str(base64_to_uuid(k.replace_disk(victim)))
    assert new != old

    def healed(name: str = "kq", victim: int = victim, new: str = new) -> dict[str, Any] | None:
        s = whole(name)
        recs = (s or {}).get("recoveries") or []
        done = [r for r in recs if r.get("newUuid") == new and r.get("result") == "Succeeded"]
        return s if s and done and (victim, new) in {(v["id"], v.get("uuid")) for v in s["voters"]} else None

    s = kube.wait_for("the replaced controller healed", healed, timeout=120)
    rec = next(r for r in s["recoveries"] if r.get("newUuid") == new)
    assert rec["replicaId"] == victim and rec["oldUuid"] == old

    def reasons() -> set[str] | None:
        got = {str(e["reason"]) for e in events_of(kube, ns, "kq")}
        return got if {"RemoveVoterCommitted", "RecoveryCompleted"} <= got else None

    assert "Reconciled" in kube.wait_for("RecoveryCompleted Event on kq", reasons, timeout=30)

    def logged(where: Path) -> list[dict[str, Any]]:
        return [
            json.loads(line)
            for f in sorted(where.rglob("*.jsonl"))
            for line in f.read_text().splitlines()
            if line.strip()
        ]

    mine = [e for e in logged(events) if e.get("new_uuid") == new]
    assert [e["type"] for e in mine][-1] == "recovery_completed"
    assert {e["cluster"] for e in mine} == {f"{ns}/kq"} and {e["old_uuid"] for e in mine} == {old}
    types = [e["type"] for e in mine]
    assert types.index("remove_voter_committed") < types.index("add_voter_started"), types
    # The resource that does not own the quorum took no part: no event logged, no recovery, no
    # voter-change Event, and it still names kq.
    assert logged(late_events) == []
    s = status_of(kube, ns, "no-secret")
    assert not s.get("recoveries") and condition(s, "Degraded").get("reason") == "OwnerConflict", s
    assert not {"RemoveVoterStarted", "RemoveVoterCommitted"} & {
        str(e["reason"]) for e in events_of(kube, ns, "no-secret")
    }

    # The operator ran nothing: no StatefulSet, Service, PDB or NetworkPolicy in the namespace.
    for path in (
        f"/apis/apps/v1/namespaces/{ns}/statefulsets",
        f"/api/v1/namespaces/{ns}/services",
        f"/apis/policy/v1/namespaces/{ns}/poddisruptionbudgets",
        f"/apis/networking.k8s.io/v1/namespaces/{ns}/networkpolicies",
    ):
        st, body = kube.request("GET", path)
        assert st == 200 and body["items"] == [], (path, body)

    # The owner deleted: no-secret takes over (an Info Event says so) and heals the next one. It
    # never ran the first recovery, so nothing of its own retires the dead directory id that Kafka
    # keeps listing as an observer for minutes: that leftover must not pass for a new disk.
    st, body = kube.request("DELETE", KQ.format(ns=ns) + "/kq")
    assert st in (200, 202), body
    try:
        s = kube.wait_for("no-secret Running as the owner", lambda: whole("no-secret"), timeout=60)
    except AssertionError:
        print("no-secret's status:", json.dumps(status_of(kube, ns, "no-secret"), indent=1))
        print("the leader's view:", json.dumps(describe_now(k), indent=1))
        raise
    assert condition(s, "Degraded").get("reason") != "OwnerConflict"
    assert not [r for r in s.get("recoveries") or [] if r.get("newUuid") == old], s
    kube.wait_for(
        "an OwnershipTaken Event on no-secret",
        lambda: [e for e in events_of(kube, ns, "no-secret") if e["reason"] == "OwnershipTaken"],
        timeout=30,
    )
    leader = s["leaderId"]
    victim2 = next(i for i in k.controllers if i not in (leader, victim))
    new2 = str(base64_to_uuid(k.replace_disk(victim2)))
    s = kube.wait_for(
        "the second replacement healed by no-secret",
        lambda: healed("no-secret", victim2, new2),
        timeout=120,
    )
    assert {e["cluster"] for e in logged(late_events)} == {f"{ns}/no-secret"}
    assert "recovery_completed" in [e["type"] for e in logged(late_events) if e.get("new_uuid") == new2]


def test_operator_restarted_between_remove_and_add_resumes(
    kube: KubeEnv,
    kraftquorum_crd: dict[str, Any],
    namespace: str,
    controllers: KafkaControllers,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The leader's disk is replaced and the operator dies right after RemoveRaftVoter committed
    (its event logged, its progress not yet in status: the worst instant). A new operator finishes
    the same recovery with AddRaftVoter alone: the new controller's listeners come from
    status.kafka (Kafka no longer lists them), and nothing is removed twice."""
    ns, k = namespace, controllers
    assert k.security is not None
    props = k.security.client_properties().replace(str(k.security.ca_pem), "ca.pem")
    obj = secret("kafka-client", {"client.properties": props, "ca.pem": k.security.ca_pem.read_text()})
    st, body = kube.request("POST", f"/api/v1/namespaces/{ns}/secrets", obj)
    assert st == 201, body
    events = tmp_path / "events"
    good = kq(
        "kq",
        bootstrapControllers=[c.endpoint for c in k.controllers.values()],
        clientSecretRef={"name": "kafka-client"},
        stabilizationSeconds=0,
    )
    good["spec"]["eventLog"] = {"path": str(events)}
    st, body = kube.request("POST", KQ.format(ns=ns), good)
    assert st == 201, body

    def voters(s: dict[str, Any]) -> set[tuple[int, Any]]:
        return {(v["id"], v.get("uuid")) for v in s.get("voters") or []}

    def running() -> dict[str, Any] | None:
        s = status_of(kube, ns, "kq")
        ok = s.get("phase") == "Running" and voters(s) == {(i, uuid_of(k, i)) for i in k.controllers}
        return s if ok else None

    monkeypatch.setenv(failpoints.ENV, failpoints.AFTER_REMOVE_COMMITTED)
    crashing = Operator(kube, ns, tmp_path / "operator-1.log")
    monkeypatch.delenv(failpoints.ENV)  # the operator that resumes runs without the failpoint
    resumed: Operator | None = None
    try:
        s = kube.wait_for("status Running", running, timeout=120)
        victim = s["leaderId"]
        old = uuid_of(k, victim)
        new = str(base64_to_uuid(k.replace_disk(victim)))
        kube.wait_for("the operator's exit at the failpoint", lambda: crashing.proc.poll() is not None, 120)
        assert crashing.proc.returncode == failpoints.EXIT_CODE, crashing.tail()
        s = status_of(kube, ns, "kq")
        rec = next(r for r in s["recoveries"] if r.get("newUuid") == new)
        assert rec["result"] == "InProgress" and rec["replicaId"] == victim and rec["oldUuid"] == old
        assert "atRemoveCommitted" not in (rec.get("phaseSeconds") or {}), rec  # not persisted yet
        assert victim in {c["id"] for c in s["kafka"]["controllers"]}

        resumed = Operator(kube, ns, tmp_path / "operator-2.log")

        def healed() -> dict[str, Any] | None:
            s = running()
            recs = [r for r in (s or {}).get("recoveries") or [] if r.get("newUuid") == new]
            return s if s and recs and recs[-1]["result"] == "Succeeded" else None

        s = kube.wait_for("the recovery finished by the new operator", healed, timeout=120)
        assert (victim, new) in voters(s)
        recs = [r for r in s["recoveries"] if r.get("newUuid") == new]
        assert [r["recoveryId"] for r in recs] == [rec["recoveryId"]]
        logged = [
            json.loads(line)
            for f in sorted(events.rglob("*.jsonl"))
            for line in f.read_text().splitlines()
            if line.strip()
        ]
        types = [e["type"] for e in logged if e.get("recovery_id") == rec["recoveryId"]]
        assert types.count("remove_voter_started") == 1 and types.count("remove_voter_committed") == 1, types
        assert types[-3:] == ["add_voter_started", "add_voter_committed", "recovery_completed"], types
    finally:
        crashing.stop()
        if resumed is not None:
            resumed.stop()
            print("resumed operator log:\n" + resumed.tail())
        print("crashing operator log:\n" + crashing.tail())
