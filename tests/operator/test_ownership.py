"""The operator's ownership rules (ownership.py), as pure functions: which KRaftQuorum names
collide in one namespace, which of two colliding quorums is refused, and which existing objects
may be patched or deleted."""

from __future__ import annotations

import kopf
import pytest
from kraftkeeper_operator.k8s.ownership import check_owned, name_conflict, older_quorums, owned_by


def test_a_name_that_makes_another_quorums_object_is_refused() -> None:
    msg = name_conflict("x-headless", ["x"])
    assert msg is not None and "Service 'x-headless'" in msg and "'x'" in msg
    assert name_conflict("x", ["x-headless"]) is not None  # either way round
    assert name_conflict("x-node-1", ["x"]) is not None  # Secret x-node-1-tls
    assert name_conflict("x-bootstrap", ["x"]) is None  # ConfigMap x-bootstrap-bootstrap: no clash
    assert name_conflict("orders-eu", ["orders"]) is None
    assert name_conflict("x", ["x"]) is None  # itself


def test_only_the_newer_of_two_colliding_quorums_is_refused() -> None:
    def q(name: str, ts: str, kafka: bool = False) -> dict[str, object]:
        spec: dict[str, object] = {"kafka": {"bootstrap": "b:1"}} if kafka else {}
        return {"metadata": {"name": name, "uid": name, "creationTimestamp": ts}, "spec": spec}

    items = [q("x", "2026-01-01T00:00:00Z"), q("x-headless", "2026-01-02T00:00:00Z")]
    assert older_quorums(items[1], items) == ["x"]
    assert older_quorums(items[0], items) == []  # the running one keeps running
    assert older_quorums(items[1], [items[1], q("x", "2026-01-01T00:00:00Z", kafka=True)]) == []


def test_objects_owned_by_another_resource_are_never_changed() -> None:
    mine = {"ownerReferences": [{"kind": "KRaftQuorum", "name": "x", "uid": "u1"}]}
    theirs = {"ownerReferences": [{"kind": "KRaftQuorum", "name": "x-headless", "uid": "u2"}]}
    check_owned("Service ns/x-headless", None, mine)  # absent: created
    check_owned("Service ns/x-headless", mine, mine)  # ours: patched
    with pytest.raises(kopf.PermanentError, match="owned by KRaftQuorum x-headless"):
        check_owned("Service ns/x-headless", theirs, mine)
    with pytest.raises(kopf.PermanentError, match="not made by the operator"):
        check_owned("Secret ns/x-tls", {"name": "x-tls"}, mine)
    assert owned_by(mine, "u1") and not owned_by(theirs, "u1") and not owned_by(None, "u1")
