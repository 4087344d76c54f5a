"""The Kubernetes objects built for a KRaftQuorum (pure functions; the k8s tests apply them to
a real API server) and the endpoint-override test hook."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from kraftkeeper_operator.core.view import QuorumView, Replica
from kraftkeeper_operator.k8s.manifests import (
    BOOTSTRAP_KEY,
    BOOTSTRAP_MOUNT,
    SpecError,
    bootstrap_configmap,
    endpoints,
    owner_reference_of,
    parse_overrides,
    parse_spec,
    pod_disruption_budget,
    statefulset,
)
from kraftkeeper_operator.k8s.quorums import quorum_bootstrapped

from quorum.storage.meta import load_meta
from tests.operator.operator_nodes import run_format_container


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
    start = pod["containers"][0]["command"][-1]
    # The node container prepares its volume itself, then execs the node (no format init container).
    assert '--node-id "$ID" --ignore-formatted' in start
    assert "${POD_NAME##*-} + 1" in start  # id = ordinal + 1
    assert start.index("kraftkeeper format") < start.index("exec kraftkeeper start")
    assert [c["name"] for c in pod.get("initContainers") or []] in ([], ["tls"])
    assert "1@q-0.q-headless.ns.svc:9100,2@q-1.q-headless.ns.svc:9100,3@q-2.q-headless.ns.svc:9100" in start
    assert pod["containers"][0]["image"] == "kk:1"
    assert pod["automountServiceAccountToken"] is False  # a node never calls the Kubernetes API
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


def test_pods_are_hardened_for_the_restricted_pod_security_level() -> None:
    sts = statefulset(parse_spec(body(voters=3)), OWNER, replicas=3, bootstrap_voters=3)
    pod = sts["spec"]["template"]["spec"]
    assert pod["securityContext"] == {
        "runAsNonRoot": True,
        "runAsUser": 10001,
        "runAsGroup": 10001,
        "fsGroup": 10001,  # a fresh (root-owned) volume becomes writable by the image's user
        "fsGroupChangePolicy": "OnRootMismatch",
        "seccompProfile": {"type": "RuntimeDefault"},
    }
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["tmp"] == {"name": "tmp", "emptyDir": {}}
    for c in (pod.get("initContainers") or []) + pod["containers"]:
        assert c["securityContext"] == {
            "allowPrivilegeEscalation": False,
            "readOnlyRootFilesystem": True,
            "capabilities": {"drop": ["ALL"]},
        }, c["name"]
        assert {"name": "tmp", "mountPath": "/tmp"} in c["volumeMounts"]
        assert {"name": "HOME", "value": "/tmp"} in c["env"]


def test_bootstrap_configmap_is_owned_mounted_and_only_the_flag_form_carries_the_key() -> None:
    q = parse_spec(body(voters=3))
    owner = owner_reference_of(q)
    assert owner["uid"] == "u-1" and owner["kind"] == "KRaftQuorum" and owner["controller"] is True
    plain = bootstrap_configmap(q, owner, bootstrapped=False)
    assert plain["metadata"]["name"] == "q-bootstrap" and plain["metadata"]["ownerReferences"] == [owner]
    assert "data" not in plain  # the spec reconcile never owns (so never removes) the flag
    assert bootstrap_configmap(q, owner, bootstrapped=True)["data"] == {BOOTSTRAP_KEY: "true"}
    pod = statefulset(q, owner, replicas=3, bootstrap_voters=3)["spec"]["template"]["spec"]
    vol = next(v for v in pod["volumes"] if v["name"] == "bootstrap")
    assert vol["configMap"] == {"name": "q-bootstrap"}  # not optional: no flag, no pod
    node = next(c for c in pod["containers"] if c["name"] == "node")
    assert {"name": "bootstrap", "mountPath": BOOTSTRAP_MOUNT, "readOnly": True} in node["volumeMounts"]


def test_quorum_counts_as_bootstrapped_only_when_every_voter_has_a_uuid() -> None:
    def view(*uuids: str) -> QuorumView:
        return QuorumView(1, 3, 10, tuple(Replica(i + 1, u) for i, u in enumerate(uuids)))

    assert quorum_bootstrapped(view("a", "b", "c"))
    assert not quorum_bootstrapped(view("a", "", "c"))  # voter 2 is still a uuid-less bootstrap voter
    assert not quorum_bootstrapped(view())
    assert not quorum_bootstrapped(None)


@pytest.mark.slow  # starts processes
def test_format_container_formats_a_fresh_volume_as_a_replacement_once_bootstrapped(tmp_path: Path) -> None:
    q = parse_spec(body(voters=3))
    sts = statefulset(q, OWNER, replicas=3, bootstrap_voters=3)
    flags = tmp_path / "flags"
    flags.mkdir()  # a ConfigMap volume without the key: an empty directory
    out = run_format_container(sts, 2, tmp_path / "before", flags)
    assert out.returncode == 0, out.stderr
    first = load_meta(tmp_path / "before")
    assert first.node_id == 3 and first.cluster_id == q.cluster_id and first.initial_bootstrap is True
    # The operator flipped the flag (the kubelet projects data keys as files).
    (flags / BOOTSTRAP_KEY).write_text("true")
    out = run_format_container(sts, 0, tmp_path / "after", flags)
    assert out.returncode == 0, out.stderr
    meta = load_meta(tmp_path / "after")
    assert meta.node_id == 1 and meta.initial_bootstrap is False
    # A formatted volume keeps its identity whatever the flag says (--ignore-formatted).
    again = run_format_container(sts, 2, tmp_path / "before", flags)
    assert again.returncode == 0, again.stderr
    kept = load_meta(tmp_path / "before")
    assert kept.storage_uuid == first.storage_uuid and kept.initial_bootstrap is True
    assert again.stdout.strip().splitlines()[-1] == first.storage_uuid
