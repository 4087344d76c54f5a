"""The one-owner rule for KRaftQuorums over the same Kafka controller quorum (kafka/ownership.py):
the pure decision, from resource bodies as the API server returns them."""

from __future__ import annotations

import asyncio
import itertools
from dataclasses import dataclass
from typing import Any

import pytest
from kraftkeeper_operator.core.policy import RecoveryPolicy
from kraftkeeper_operator.core.status import Condition, ControllerStatus
from kraftkeeper_operator.k8s.context import OperatorContext
from kraftkeeper_operator.k8s.kafkaownership import (
    LIST_SHARE_S,
    REASON,
    Claim,
    Ownership,
    claim_of,
    conflict_message,
    owner_of,
    policy_for,
    same_quorum,
    shared_lists,
)
from kraftkeeper_operator.kafka.backend import KafkaQuorum
from kubernetes_asyncio.client.exceptions import ApiException

from tests.operator.helpers import Notices


def body(
    name: str,
    created: str,
    boot: list[str],
    *,
    ns: str = "ns",
    cluster_id: str = "",
    listeners: list[tuple[str, int]] = (),  # type: ignore[assignment]
    deleting: bool = False,
    processed: bool = True,  # an operator reached Kafka for it (status.kafka written)
) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "namespace": ns, "creationTimestamp": created}
    if deleting:
        meta["deletionTimestamp"] = "2026-11-23T20:00:00Z"
    status: dict[str, Any] = {"phase": "Running"}
    if processed:
        status["kafka"] = {
            "clusterId": cluster_id,
            "controllers": [
                {"id": i, "listeners": [{"name": "CONTROLLER", "host": h, "port": p}]}
                for i, (h, p) in enumerate(listeners)
            ],
        }
    return {"metadata": meta, "spec": {"kafka": {"bootstrapControllers": boot}}, "status": status}


def claim(b: dict[str, Any], resolved: dict[str, frozenset[str]] | None = None) -> Claim:
    c = claim_of(b, resolved or {})
    assert c is not None
    return c


T1, T2, T3 = "2026-11-23T10:00:00Z", "2026-11-23T11:00:00Z", "2026-11-23T12:00:00Z"


def test_the_oldest_resource_owns_whatever_order_the_list_comes_in() -> None:
    a = claim(body("a", T2, ["k0:9093", "k1:9093"]))
    b = claim(body("b", T1, ["k1:9093", "k2:9093"]))  # oldest, overlapping on k1
    c = claim(body("c", T3, ["k2:9093"]))
    for peers in itertools.permutations([a, b, c]):
        for me in (a, b, c):
            assert owner_of(me, peers).key == "ns/b"


def test_ties_on_creation_time_go_by_namespace_then_name() -> None:
    x = claim(body("x", T1, ["k0:9093"], ns="beta"))
    y = claim(body("a", T1, ["k0:9093"], ns="gamma"))
    z = claim(body("z", T1, ["k0:9093"], ns="alpha"))
    assert owner_of(x, [y, z]).key == "alpha/z"
    w = claim(body("b", T1, ["k0:9093"], ns="alpha"))
    assert owner_of(x, [y, z, w]).key == "alpha/b"


def test_disjoint_quorums_each_have_their_own_owner() -> None:
    a = claim(body("a", T1, ["k0:9093"]))
    b = claim(body("b", T2, ["other:9093"]))
    assert not same_quorum(a, b)
    assert owner_of(b, [a]).key == "ns/b" and owner_of(a, [b]).key == "ns/a"


def test_same_host_other_port_is_another_quorum() -> None:
    a = claim(body("a", T1, ["k0:9093"]))
    b = claim(body("b", T2, ["k0:9094"]))
    assert owner_of(b, [a]).key == "ns/b"


def test_the_cluster_id_decides_when_both_know_it() -> None:
    # Disjoint bootstrap names, one cluster: one owner.
    a = claim(body("a", T1, ["k0.svc:9093"], cluster_id="Cid-1"))
    b = claim(body("b", T2, ["10.0.0.7:9093"], cluster_id="Cid-1"))
    assert owner_of(b, [a]).key == "ns/a"
    # The same address, two cluster ids (a quorum rebuilt in place, an old status): two quorums.
    c = claim(body("c", T2, ["k0.svc:9093"], cluster_id="Cid-2"))
    assert owner_of(c, [a]).key == "ns/c"
    # One side does not know the cluster id yet: the endpoints decide.
    d = claim(body("d", T3, ["k0.svc:9093"]))
    assert owner_of(d, [a]).key == "ns/a"


def test_listeners_kafka_reported_and_resolved_addresses_count() -> None:
    # b names the controllers by address; a's status lists the listeners Kafka reported.
    a = claim(body("a", T1, ["kafka-0.kafka:9093"], listeners=[("k-0.internal", 9093)]))
    b = claim(body("b", T2, ["K-0.Internal.:9093"]))  # case and a trailing dot do not matter
    assert owner_of(b, [a]).key == "ns/a"
    # Written differently, resolved to one address.
    resolved = {"localhost": frozenset({"127.0.0.1", "::1"}), "127.0.0.1": frozenset({"127.0.0.1"})}
    c = claim(body("c", T1, ["localhost:25001"]), resolved)
    d = claim(body("d", T2, ["127.0.0.1:25001"]), resolved)
    assert owner_of(d, [c]).key == "ns/c"
    # Unresolved, they are compared as written only.
    assert owner_of(
        claim(body("d", T2, ["127.0.0.1:25001"])), [claim(body("c", T1, ["localhost:25001"]))]
    ).key == ("ns/d")


def test_the_next_oldest_takes_over_when_the_owner_is_deleted() -> None:
    a = body("a", T1, ["k0:9093"])
    b, c = claim(body("b", T2, ["k0:9093"])), claim(body("c", T3, ["k0:9093"]))
    assert owner_of(c, [claim(a), b]).key == "ns/a"
    gone = claim(body("a", T1, ["k0:9093"], deleting=True))
    assert owner_of(c, [gone, b]).key == "ns/b" and owner_of(b, [gone, c]).key == "ns/b"
    assert owner_of(c, [b]).key == "ns/b"  # and once it is gone from the list


def test_a_resource_without_a_working_client_owns_nothing() -> None:
    old = body("a", T1, ["k0:9093"])
    b = claim(body("b", T2, ["k0:9093"]))
    for phase in ("Pending", "Failed"):
        old["status"] = {"phase": phase, "kafka": {"clusterId": "Cid-1"}}  # it had one before
        assert owner_of(b, [claim(old)]).key == "ns/b"
    old["status"] = {"phase": "Degraded", "kafka": {"clusterId": ""}}
    assert owner_of(b, [claim(old)]).key == "ns/a"


def test_a_resource_no_operator_ever_reached_kafka_for_owns_nothing() -> None:
    # E.g. one in a namespace no operator watches, or created a moment ago: no status.kafka.
    old = claim(body("a", T1, ["k0:9093"], processed=False))
    b = claim(body("b", T2, ["k0:9093"]))
    assert old.idle and owner_of(b, [old]).key == "ns/b"
    fresh = claim_of({**body("c", T1, ["k0:9093"]), "status": {}}, {})
    assert fresh is not None and owner_of(b, [fresh]).key == "ns/b"


def test_a_resource_finds_itself_in_the_list_without_counting_twice() -> None:
    a, b = claim(body("a", T2, ["k0:9093"])), claim(body("b", T3, ["k0:9093"]))
    assert owner_of(a, [a, b]).key == "ns/a"


def test_overlap_is_transitive() -> None:
    a = claim(body("a", T1, ["k0:9093"]))
    b = claim(body("b", T2, ["k0:9093", "k1:9093"]))
    c = claim(body("c", T3, ["k1:9093"]))
    assert not same_quorum(a, c)
    assert owner_of(c, [a, b]).key == "ns/a"


def test_bodies_without_a_usable_spec_kafka_make_no_claim() -> None:
    assert claim_of(body("a", T1, ["no-port"]), {}) is None
    assert claim_of({"metadata": {"name": "x"}, "spec": {"kafka": {}}}, {}) is None
    assert claim_of({"metadata": {"name": "x"}, "spec": {"kafka": {"bootstrapControllers": [7]}}}, {}) is None


def test_the_conflict_message_names_the_owner_and_the_cluster() -> None:
    owner = claim(body("first", T1, ["k0:9093"], ns="kafka", cluster_id="Cid-1"))
    msg = conflict_message(owner)
    assert "KRaftQuorum kafka/first," in msg and "Cid-1" in msg and "no voter change" in msg
    assert REASON == "OwnerConflict"


def test_a_resource_that_does_not_own_the_quorum_runs_with_recovery_off() -> None:
    mine = RecoveryPolicy(enabled=True)
    owner = claim(body("first", T1, ["k0:9093"]))
    assert policy_for(mine, None) is mine
    off = policy_for(mine, owner)
    assert not off.enabled and off == RecoveryPolicy(enabled=False)


def _status() -> ControllerStatus:
    conds = [
        Condition("Available", True, "LeaderElected"),
        Condition("Degraded", False, "Healthy"),
        Condition("Recovering", False, "Idle"),
        Condition("QuorumLost", False, "LeaderElected"),
    ]
    return ControllerStatus(view=None, conditions=conds, recoveries=[])


def test_one_warning_per_episode_and_an_info_event_on_takeover() -> None:
    kube = Notices()
    seen = kube.seen
    me = body("late", T2, ["k0:9093"])
    owner = claim(body("first", T1, ["k0:9093"]))
    o = Ownership()

    async def main() -> None:
        for _ in range(3):
            st = _status()
            await o.report(kube, me, st, owner)  # type: ignore[arg-type]
            d = st.condition("Degraded")
            assert (d.status, d.reason) == (True, REASON) and "KRaftQuorum ns/first," in d.message
            assert st.phase == "Degraded"
        assert seen == [("Warning", REASON)]
        st = _status()
        await o.report(kube, me, st, None)  # type: ignore[arg-type]
        assert seen[-1] == ("Normal", "OwnershipTaken") and st.condition("Degraded").status is False
        await o.report(kube, me, _status(), None)  # type: ignore[arg-type]
        assert len(seen) == 2
        # A restarted operator (no memory) whose status already names the owner posts nothing again.
        me["status"] = {
            "conditions": [{"type": "Degraded", "reason": REASON, "message": conflict_message(owner)}]
        }
        await Ownership().report(kube, me, _status(), owner)  # type: ignore[arg-type]
        assert len(seen) == 2

    asyncio.run(main())


class CountingCustom:
    """The KRaftQuorum list calls of the API client, counted; ``forbid`` answers the cluster-wide
    list with 403 (namespace-scoped RBAC), ``fail`` makes the next list call fail once."""

    def __init__(self, items: list[dict[str, Any]], *, forbid: bool = False) -> None:
        self.items, self.forbid, self.fail = items, forbid, False
        self.calls: list[str] = []

    async def list_cluster_custom_object(self, *_: Any) -> dict[str, Any]:
        self.calls.append("*")
        await asyncio.sleep(0)  # lets the other passes arrive while this one is in flight
        if self.forbid:
            raise ApiException(status=403)
        if self.fail:
            self.fail = False
            raise ApiException(status=500)
        return {"items": self.items}

    async def list_namespaced_custom_object(self, _g: str, _v: str, ns: str, _p: str) -> dict[str, Any]:
        self.calls.append(ns)
        await asyncio.sleep(0)
        return {"items": [i for i in self.items if i["metadata"]["namespace"] == ns]}


@dataclass(eq=False)  # hashable by identity, as the real API client
class FakeKube:
    custom: CountingCustom


@pytest.mark.parametrize("forbid", [False, True])
async def test_one_kraftquorum_list_serves_every_resources_pass(forbid: bool) -> None:
    bodies = [body(f"q{i}", f"2026-11-23T1{i}:00:00Z", ["127.0.0.1:9093"], cluster_id="c") for i in range(5)]
    custom = CountingCustom(bodies, forbid=forbid)
    ctx = OperatorContext(kube=FakeKube(custom))  # type: ignore[arg-type]
    shared = shared_lists(ctx.kube)
    clock = [100.0]
    shared.clock = lambda: clock[0]
    owners = [Ownership() for _ in bodies]
    api = KafkaQuorum("127.0.0.1:9093")
    api.cluster_id = "c"  # known: no describe before the decision
    # Forbidden: the cluster-wide call (shared too) answers 403, then each lists its namespace.
    first = ["*"] if not forbid else ["*", "ns"]

    async def one_pass() -> list[Claim | None]:
        return list(
            await asyncio.gather(*(o.decide(ctx, b, api) for o, b in zip(owners, bodies, strict=True)))
        )

    got = await one_pass()  # five resources wake together: one list call
    assert [g.key if g else None for g in got] == [None] + ["ns/q0"] * 4
    assert custom.calls == first and shared.calls == len(first)
    await one_pass()  # within LIST_SHARE_S: served again, no call
    assert custom.calls == first
    clock[0] += LIST_SHARE_S  # older than that: one new list for all
    await one_pass()
    assert custom.calls == (["*", "*"] if not forbid else ["*", "ns", "ns"])
    if not forbid:
        # A failed list is not kept: every pass that awaited it fails, the next one lists again.
        clock[0] += LIST_SHARE_S
        custom.fail = True
        with pytest.raises(ApiException):
            await owners[0].decide(ctx, bodies[0], api)
        assert await owners[1].decide(ctx, bodies[1], api) is not None
        assert custom.calls == ["*", "*", "*", "*"]
    await api.close()
