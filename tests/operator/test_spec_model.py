"""The KRaftQuorum models (k8s/spec.py) against the CRD's openAPIV3Schema, field by field, and the
operator's own status documents against the status model.

Both schemas are brought to one normal form (references resolved, a union of a type with null
read as an optional field, an object default filled in with its properties' defaults as the API
server does) and walked together: a field in one but not the other, a different type, enum,
default, bound, pattern or required-ness fails with the path and both sides. Descriptions, CEL
rules and ``nullable`` (the model's optional fields take null anyway) are not compared."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from kraftkeeper_operator.k8s.spec import SpecModelError, json_schema, validate_spec, validate_status

REPO = Path(__file__).resolve().parents[2]
CRDS = [
    REPO / "crds" / "kraftquorums.kraftkeeper.io.yaml",
    REPO / "charts/kraftkeeper/crds/kraftquorums.kraftkeeper.io.yaml",
]
COMPARED = (
    "type",
    "enum",
    "default",
    "format",
    "pattern",
    "minimum",
    "maximum",
    "minLength",
    "maxLength",
    "minItems",
    "maxItems",
)


def _resolve(node: Any, defs: dict[str, Any]) -> Any:
    if isinstance(node, dict):
        if "$ref" in node:  # keys beside a reference (a default) apply to what it names
            siblings = {k: v for k, v in node.items() if k != "$ref"}
            return {**_resolve(defs[node["$ref"].rsplit("/", 1)[1]], defs), **siblings}
        return {k: _resolve(v, defs) for k, v in node.items() if k != "$defs"}
    if isinstance(node, list):
        return [_resolve(v, defs) for v in node]
    return node


def _drop_none(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _drop_none(v) for k, v in value.items() if v is not None}
    return value


def _normal(node: dict[str, Any]) -> dict[str, Any]:
    """One schema node in the compared form (both sides)."""
    node = dict(node)
    branches = [b for b in node.pop("anyOf", []) if b.get("type") != "null"]
    if len(branches) == 1:
        node = {**branches[0], **node}
    elif branches:
        types = sorted(b["type"] for b in branches)
        for b in branches:
            node.update({k: v for k, v in b.items() if k != "type"})
        node["type"] = types
    out = {k: node[k] for k in COMPARED if k in node}
    if out.get("default", 0) is None:  # an optional field: absent, not a default of null
        del out["default"]
    elif "default" in out:
        out["default"] = _drop_none(out["default"])
    if "properties" in node:
        out["properties"] = {k: _normal(v) for k, v in node["properties"].items()}
        out["required"] = sorted(node.get("required", []))
        if isinstance(out.get("default"), dict):
            out["default"] = _fill(out["default"], out["properties"])
    if "items" in node:
        out["items"] = _normal(node["items"])
    extra = node.get("additionalProperties")
    if isinstance(extra, dict):
        out["values"] = _normal(extra)
    elif (extra is True or node.get("x-kubernetes-preserve-unknown-fields")) and "properties" not in node:
        out["freeform"] = True
    return out


def _fill(default: dict[str, Any], props: dict[str, Any]) -> dict[str, Any]:
    """An object default as the API server stores it: its properties' own defaults applied."""
    out = dict(default)
    for name, sub in props.items():
        if name not in out and "default" in sub:
            out[name] = sub["default"]
    return out


def _diff(model: dict[str, Any], crd: dict[str, Any], path: str) -> list[str]:
    out = []
    for key in (*COMPARED, "required", "freeform"):
        if model.get(key) != crd.get(key):
            out.append(f"{path}: {key} is {model.get(key)!r} in the model, {crd.get(key)!r} in the CRD")
    mp, cp = model.get("properties", {}), crd.get("properties", {})
    for name in sorted(set(mp) | set(cp)):
        if name not in cp:
            out.append(f"{path}.{name}: in the model, not in the CRD")
        elif name not in mp:
            out.append(f"{path}.{name}: in the CRD, not in the model")
        else:
            out += _diff(mp[name], cp[name], f"{path}.{name}")
    for key, label in (("items", "[]"), ("values", "{}")):
        if (key in model) != (key in crd):
            out.append(f"{path}{label}: present in {'the model' if key in model else 'the CRD'} only")
        elif key in model:
            out += _diff(model[key], crd[key], f"{path}{label}")
    return out


def _crd_schema(path: Path) -> dict[str, Any]:
    crd = yaml.safe_load(path.read_text())
    (version,) = crd["spec"]["versions"]
    schema: dict[str, Any] = version["schema"]["openAPIV3Schema"]["properties"]
    return schema


def model_against_crd(crd: dict[str, Any]) -> list[str]:
    problems = []
    for part, model in json_schema().items():
        problems += _diff(_normal(_resolve(model, model.get("$defs", {}))), _normal(crd[part]), part)
    return problems


@pytest.mark.parametrize("path", CRDS, ids=lambda p: str(p.relative_to(REPO)))
def test_the_crd_schema_is_the_model(path: Path) -> None:
    problems = model_against_crd(_crd_schema(path))
    assert not problems, "the CRD and the models in k8s/spec.py differ:\n" + "\n".join(problems)


@pytest.mark.parametrize(
    ("edit", "expected"),
    [
        (lambda s: s["spec"]["properties"].pop("voters"), "spec.voters: in the model, not in the CRD"),
        (
            lambda s: s["spec"]["properties"]["ports"]["properties"]["client"].update(default=9094),
            "spec.ports.client: default is 9093 in the model, 9094 in the CRD",
        ),
        (lambda s: s["spec"]["properties"]["imagePullPolicy"]["enum"].pop(), "spec.imagePullPolicy: enum"),
        (lambda s: s["spec"]["properties"]["kafka"].update(required=[]), "spec.kafka: required"),
        (lambda s: s["status"]["properties"]["leaderId"].update(type="string"), "status.leaderId: type"),
        (
            lambda s: s["spec"]["properties"]["storage"]["properties"].update(extra={"type": "string"}),
            "spec.storage.extra: in the CRD, not in the model",
        ),
    ],
)
def test_a_drift_is_named(edit: Any, expected: str) -> None:
    crd = _crd_schema(CRDS[0])
    edit(crd)
    assert any(expected in p for p in model_against_crd(crd)), model_against_crd(crd)


def test_defaults_are_the_crds() -> None:
    m = validate_spec({})
    assert (m.voters, m.image_pull_policy, m.ports.client, m.storage.size, m.event_log.path) == (
        3,
        "IfNotPresent",
        9093,
        "1Gi",
        "stdout",
    )
    assert (m.recovery.order, m.recovery.stabilization_seconds, m.unclean_recovery.after_seconds) == (
        "AddThenRemove",
        10,
        300,
    )


def test_one_default_per_policy_setting() -> None:
    """The spec's recovery defaults (and so the CRD's, checked against the models above) are the
    recovery policy's, which the flags of ``operator local`` and ``operator watch`` take too."""
    import argparse

    from kraftkeeper_operator.core.options import add_policy_arguments, policy_from_args
    from kraftkeeper_operator.core.policy import Order, RecoveryPolicy
    from kraftkeeper_operator.k8s.quorumspec import parse_spec

    policy = RecoveryPolicy()
    q = parse_spec({"metadata": {"name": "q", "namespace": "ns"}, "spec": {}})
    assert q.policy == policy
    m = validate_spec({"kafka": {"bootstrapControllers": ["c-0:9093"]}})
    assert m.kafka is not None
    assert (m.kafka.stabilization_seconds, m.kafka.max_lag_records, m.kafka.timeout_seconds) == (
        policy.stabilization_seconds,
        policy.max_lag,
        policy.timeout_seconds,
    )
    for order in (Order.ADD_THEN_REMOVE, Order.REMOVE_THEN_ADD):
        p = argparse.ArgumentParser()
        add_policy_arguments(p, order=order)
        from_flags = policy_from_args(p.parse_args([]))
        assert from_flags == RecoveryPolicy(order=order)


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ({"voters": 4}, "spec.voters: must be an odd integer from 1 to 9, got 4"),
        ({"voters": "3"}, "spec.voters: must be an odd integer from 1 to 9, got '3'"),
        ({"replicas": 3}, "spec.replicas: unknown field"),
        (
            {"recovery": {"maxLagRecords": -1}},
            "spec.recovery.maxLagRecords: input should be greater than or equal to 0",
        ),
        (
            {"kafka": {"bootstrapControllers": []}},
            "spec.kafka.bootstrapControllers: list should have at least 1 item",
        ),
        (
            {"kafka": {"bootstrapControllers": ["c-0:9093"], "clientSecretRef": {}}},
            "spec.kafka.clientSecretRef.name: required",
        ),
        (
            {"scheduling": {"tolerations": [{"effect": "Sometimes"}]}},
            "spec.scheduling.tolerations[0].effect: must be one of 'NoSchedule', 'PreferNoSchedule'",
        ),
        ({"resources": {"limits": {"memory": "lots"}}}, "spec.resources.limits.memory:"),
    ],
)
def test_errors_name_the_path_and_the_problem(spec: dict[str, Any], message: str) -> None:
    with pytest.raises(SpecModelError) as e:
        validate_spec(spec)
    assert str(e.value).startswith(message), str(e.value)


def test_what_the_operator_writes_fits_the_status_model() -> None:
    from kraftkeeper_operator.core.records import Phase, Recovery
    from kraftkeeper_operator.core.status import Condition, ControllerStatus
    from kraftkeeper_operator.core.view import QuorumView, Replica

    uuid = "0b7a4f5e-5b9c-4f7e-9a51-3f2c1d0e8a77"
    view = QuorumView(1, 3, 42, (Replica(1, uuid, "q-0:9093", 42, 0), Replica(2, uuid, None, 40, 2)))
    conditions = [
        Condition(t, t == "Available", "Test") for t in ("Available", "Degraded", "Recovering", "QuorumLost")
    ]
    done = Recovery("r-1", 2, uuid, uuid, Phase.COMPLETED, 1_000, caught_up_ms=2_000, finished_ms=4_000)
    running = Recovery("r-2", 3, uuid, uuid, Phase.STABILIZING, 5_000)
    for st in (
        ControllerStatus(view, conditions, [], records=[done, running]),
        ControllerStatus(None, conditions, [], known_voters=[(1, uuid)]),
    ):
        status = st.to_crd_status(generation=2)
        doc = validate_status(status)
        assert doc.phase == "Running" and doc.voters is not None and doc.voters[0].uuid == uuid
        want = ["Succeeded", "InProgress"] if st.records else []
        assert [r.result for r in doc.recoveries or []] == want
    with pytest.raises(SpecModelError, match=r"status\.phase: must be one of"):
        validate_status({**status, "phase": "Sleeping"})


def test_every_other_status_writer_fits_the_status_model() -> None:
    """Besides a pass's status (above): a refused spec, the Kafka backend's ``status.kafka``, the
    conditions of a pass that could not refresh, and an unclean request's recoveries item."""
    from kraftkeeper_operator.k8s.crdstatus import kafka_status, stale_conditions, unavailable_condition
    from kraftkeeper_operator.unclean import UncleanRequest

    uuid = "0b7a4f5e-5b9c-4f7e-9a51-3f2c1d0e8a77"
    refused_by = [unavailable_condition("InvalidSpec", "x")]
    refused = {"phase": "Failed", "observedGeneration": 3, "conditions": refused_by}
    kafka = kafka_status("MkU3OEVBNTcwNTJENDM2Qk", {1: [("CONTROLLER", "c-0.c", 9093)]})
    degraded = [{"type": "Degraded", "status": "False", "reason": "Healthy", "lastTransitionTime": None}]
    request = UncleanRequest("tok", 2, 1, (uuid,), 40, 1_000, 2_000).to_crd_status()
    doc = validate_status(
        {**refused, "kafka": kafka, "recoveries": [request]}
        | {"conditions": [*refused_by, *stale_conditions({"conditions": degraded}, "timed out")]}
    )
    assert doc.kafka is not None and doc.kafka.controllers is not None
    listeners = doc.kafka.controllers[0].listeners
    assert listeners is not None and listeners[0].port == 9093
    assert doc.recoveries is not None and doc.recoveries[0].replica_id == 2
    assert doc.conditions is not None and doc.conditions[-1].reason == "StatusNotRefreshed"


def test_free_form_parts_reach_the_pods_unchanged() -> None:
    from kraftkeeper_operator.k8s.quorumspec import parse_spec

    scheduling = {
        "nodeSelector": {"disk": "ssd"},
        "tolerations": [{"key": "k", "operator": "Equal", "value": "v", "effect": "NoSchedule"}],
        "affinity": {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": []}},
        "topologySpreadConstraints": [
            {"maxSkew": 1, "topologyKey": "zone", "whenUnsatisfiable": "DoNotSchedule", "minDomains": 2}
        ],
        "priorityClassName": "high",
    }
    resources = {"requests": {"cpu": "250m", "memory": 268435456}, "limits": {"memory": "1Gi"}}
    peers = [{"namespaceSelector": {"matchLabels": {"team": "a"}}}]
    q = parse_spec(
        {
            "metadata": {"name": "q", "namespace": "ns"},
            "spec": {"scheduling": scheduling, "resources": resources, "clientSelector": peers},
        }
    )
    assert (q.scheduling, q.resources, list(q.client_selector)) == (scheduling, resources, peers)
    assert (q.port, q.metrics_port, q.storage_class) == (9093, 9093, None)
    assert q.policy.unclean_after_seconds == 300  # the CRD's default, as the API server stores it
