"""The Kubernetes objects built for a KRaftQuorum (pure functions; the k8s tests apply them to
a real API server) and the endpoint-override test hook."""

from __future__ import annotations

from typing import Any

import pytest
from kraftkeeper_operator.manifests import (
    SpecError,
    endpoints,
    parse_overrides,
    parse_spec,
    pod_disruption_budget,
    statefulset,
)


def body(**spec: Any) -> dict[str, Any]:
    return {"metadata": {"name": "q", "namespace": "ns", "uid": "u-1", "generation": 2}, "spec": spec}


OWNER = {"apiVersion": "kraftkeeper.io/v1alpha1", "kind": "KRaftQuorum", "name": "q", "uid": "u-1"}


@pytest.mark.parametrize(("voters", "allowed"), [(1, 0), (3, 1), (5, 2), (7, 3), (9, 4)])
def test_pdb_never_allows_a_majority_down(voters: int, allowed: int) -> None:
    pdb = pod_disruption_budget(parse_spec(body(voters=voters)), OWNER)
    assert pdb["spec"]["maxUnavailable"] == allowed
    assert voters - allowed >= voters // 2 + 1  # what remains is still a majority


def test_statefulset_identity_and_probes() -> None:
    q = parse_spec(body(voters=3, image="kk:1", ports={"client": 9100}))
    sts = statefulset(q, OWNER, replicas=3, bootstrap_voters=3)
    pod = sts["spec"]["template"]["spec"]
    assert '--node-id "$ID" --ignore-formatted' in pod["initContainers"][0]["command"][-1]
    assert "${POD_NAME##*-} + 1" in pod["initContainers"][0]["command"][-1]  # id = ordinal + 1
    start = pod["containers"][0]["command"][-1]
    assert "1@q-0.q-headless.ns.svc:9100,2@q-1.q-headless.ns.svc:9100,3@q-2.q-headless.ns.svc:9100" in start
    assert pod["containers"][0]["image"] == "kk:1"
    assert sts["metadata"]["ownerReferences"] == [OWNER]
    assert sts["spec"]["persistentVolumeClaimRetentionPolicy"]["whenScaled"] == "Delete"
    # The cluster id depends on namespace/name only: a re-created resource finds its volumes' id.
    assert (
        q.cluster_id
        == parse_spec({**body(voters=3), "metadata": {"name": "q", "namespace": "ns"}}).cluster_id
    )


@pytest.mark.parametrize(
    ("spec", "field"),
    [
        ({"voters": 4}, "spec.voters"),
        ({"voters": "3"}, "spec.voters"),
        ({"voters": 11}, "spec.voters"),
        ({"image": "a b"}, "spec.image"),
        ({"ports": {"client": 80}}, "spec.ports.client"),
        ({"storage": {"size": "-1Gi"}}, "spec.storage.size"),
        ({"eventLog": {"path": "relative.jsonl"}}, "spec.eventLog.path"),
        ({"recovery": {"order": "Sideways"}}, "spec.recovery.order"),
        ({"uncleanRecovery": {"enabled": "yes"}}, "spec.uncleanRecovery.enabled"),
    ],
)
def test_invalid_spec_names_the_field(spec: dict[str, Any], field: str) -> None:
    with pytest.raises(SpecError, match=field.replace(".", r"\.")):
        parse_spec(body(**spec))


def test_endpoint_overrides() -> None:
    q = parse_spec(body(voters=3))
    ov = parse_overrides("ns/q/0=127.0.0.1:1,ns/q/2=127.0.0.1:3, other/q/1=127.0.0.1:9")
    assert endpoints(q, 3, ov) == ["127.0.0.1:1", "q-1.q-headless.ns.svc:9093", "127.0.0.1:3"]
    assert parse_overrides('{"ns/q/1": "127.0.0.1:2"}') == {"ns/q/1": "127.0.0.1:2"}
    assert parse_overrides("") == {}
    with pytest.raises(ValueError, match="ns/name/ordinal=HOST:PORT"):
        parse_overrides("ns/q=127.0.0.1:1")


def test_event_log_path_must_stay_inside_the_operator_volume(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KRAFTKEEPER_EVENT_LOG_DIR", "/data/events")
    assert parse_spec(body(eventLog={"path": "/data/events/q.jsonl"})).event_log == "/data/events/q.jsonl"
    assert parse_spec(body(eventLog={"path": "stdout"})).event_log == "stdout"
    for bad in ("/etc/passwd", "/data/events/../../etc/x.jsonl", "/data/eventsX/q.jsonl"):
        with pytest.raises(SpecError, match=r"spec\.eventLog\.path: .* outside"):
            parse_spec(body(eventLog={"path": bad}))
