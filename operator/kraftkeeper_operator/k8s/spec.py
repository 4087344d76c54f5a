"""The KRaftQuorum custom resource as typed documents: ``spec`` (with ``spec.kafka``, the Kafka
client settings) and ``status``, as strict pydantic models.

These models are the one statement of the resource's shape in code: ``quorumspec.parse_spec``
validates through :func:`validate_spec`, and a test walks the CRD's ``openAPIV3Schema``
(crds/kraftquorums.kraftkeeper.io.yaml) against :func:`json_schema` of the same models, so a
field, type, enum, default, bound or required-ness cannot differ between the two.

Strict means: no coercion (``"3"`` is not a number, ``"yes"`` not a boolean) and no unknown
fields; the API server prunes and checks the same, so these rules matter for objects stored
before the schema was tightened and for callers that do not go through the API server.
Defaults are the CRD's (the API server applies them before the operator reads an object).
Free-form sub-documents the API server checks itself (a Pod's affinity, label selectors) are
plain mappings here.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator
from pydantic.alias_generators import to_camel

from ..core.policy import RecoveryPolicy

# One default per policy setting: the models take the recovery policy's (which the local and watch
# commands' flags take too, core/options.py); a test checks the CRD's defaults against the models.
_POLICY = RecoveryPolicy()

Int64 = Annotated[int, Field(json_schema_extra={"format": "int64"})]
QUANTITY_PATTERN = r"^(\+)?([0-9]+(\.[0-9]*)?|\.[0-9]+)(([KMGTPE]i)|[numkMGTPE]|([eE](\+|-)?[0-9]+))?$"
Quantity = int | Annotated[str, Field(pattern=QUANTITY_PATTERN)]  # a Kubernetes int-or-string
Port = Annotated[int, Field(ge=1024, le=65535)]
UUID_PATTERN = r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$"
SIZE_PATTERN = r"^([1-9][0-9]*|[0-9]+\.[0-9]*[1-9][0-9]*)(Ki|Mi|Gi|Ti|Pi|Ei|k|M|G|T|P|E)?$"
HOST_PORT_PATTERN = r"^(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9]([A-Za-z0-9.-]{0,251}[A-Za-z0-9])?):[0-9]{1,5}$"


class _Doc(BaseModel):
    """A strict, closed, immutable document with the resource's camelCase names."""

    model_config = ConfigDict(
        strict=True, extra="forbid", frozen=True, alias_generator=to_camel, populate_by_name=True
    )


class Storage(_Doc):
    size: str = Field(default="1Gi", pattern=SIZE_PATTERN)
    storage_class_name: str | None = Field(default=None, max_length=253)


class Resources(_Doc):
    requests: dict[str, Quantity] | None = None
    limits: dict[str, Quantity] | None = None


class Ports(_Doc):
    client: Port = 9093
    metrics: Port | None = None  # None: the client port, where nodes serve /metrics


class Toleration(_Doc):
    key: str | None = None
    operator: Literal["Exists", "Equal"] | None = None
    value: str | None = None
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] | None = None
    toleration_seconds: Int64 | None = None


class SpreadConstraint(BaseModel):
    """A core/v1 TopologySpreadConstraint; fields beyond the three checked pass through."""

    model_config = ConfigDict(strict=True, extra="allow", frozen=True, alias_generator=to_camel)
    max_skew: int = Field(ge=1)
    topology_key: str = Field(min_length=1)
    when_unsatisfiable: Literal["DoNotSchedule", "ScheduleAnyway"]


class Scheduling(_Doc):
    node_selector: dict[str, str] | None = None
    tolerations: list[Toleration] | None = Field(default=None, max_length=32)
    affinity: dict[str, Any] | None = None
    topology_spread_constraints: list[SpreadConstraint] | None = Field(default=None, max_length=8)
    priority_class_name: str | None = Field(default=None, max_length=253)


class Recovery(_Doc):
    enabled: bool = _POLICY.enabled
    order: Literal["AddThenRemove", "RemoveThenAdd"] = "AddThenRemove"  # RecoveryPolicy.order
    stabilization_seconds: int = Field(default=int(_POLICY.stabilization_seconds), ge=0, le=3600)
    max_lag_records: Int64 = Field(default=_POLICY.max_lag, ge=0)
    timeout_seconds: int = Field(default=int(_POLICY.timeout_seconds), ge=10, le=86400)


class UncleanRecovery(_Doc):
    enabled: bool = _POLICY.unclean_allowed
    after_seconds: int = Field(default=int(_POLICY.unclean_after_seconds), ge=30, le=86400)


class IssuerRef(_Doc):
    name: str = Field(max_length=253)
    kind: Literal["Issuer", "ClusterIssuer"] | None = None
    group: str | None = Field(default=None, max_length=253)


class CertManager(_Doc):
    issuer_ref: IssuerRef


class Tls(_Doc):
    mode: Literal["Operator", "CertManager", "Disabled"] | None = None
    validity_days: int | None = Field(default=None, ge=1, le=3650)
    renew_before_days: int | None = Field(default=None, ge=1, le=3650)
    cert_manager: CertManager | None = None


class ClientPeer(_Doc):
    pod_selector: dict[str, Any] | None = None
    namespace_selector: dict[str, Any] | None = None


class EventLog(_Doc):
    path: str = Field(default="stdout", max_length=1024, pattern=r"^(stdout|/[^\x00]*)$")


class SecretRef(_Doc):
    name: str = Field(min_length=1, max_length=253)
    key: str | None = Field(default=None, min_length=1, max_length=253, pattern=r"^[-._a-zA-Z0-9]+$")


class KafkaSettings(_Doc):
    """``spec.kafka``: the Kafka client settings of a quorum the operator repairs but does not run."""

    bootstrap_controllers: list[Annotated[str, Field(max_length=261, pattern=HOST_PORT_PATTERN)]] = Field(
        min_length=1, max_length=16
    )
    client_secret_ref: SecretRef | None = None
    order: Literal["RemoveThenAdd", "AddThenRemove"] = "RemoveThenAdd"  # Kafka's only order (options.py)
    stabilization_seconds: int = Field(default=int(_POLICY.stabilization_seconds), ge=0, le=3600)
    max_lag_records: Int64 = Field(default=_POLICY.max_lag, ge=0)
    timeout_seconds: int = Field(default=int(_POLICY.timeout_seconds), ge=10, le=86400)


class QuorumSpecDoc(_Doc):
    """``spec`` of a KRaftQuorum."""

    voters: int = Field(default=3, ge=1, le=9)
    image: str | None = Field(default=None, min_length=1, max_length=512, pattern=r"^[^\s]+$")
    image_pull_policy: Literal["Always", "IfNotPresent", "Never"] = "IfNotPresent"
    storage: Storage = Storage()
    resources: Resources | None = None
    ports: Ports = Ports()
    scheduling: Scheduling | None = None
    recovery: Recovery = Recovery()
    unclean_recovery: UncleanRecovery = UncleanRecovery()
    tls: Tls = Tls()
    client_selector: list[ClientPeer] | None = Field(default=None, max_length=32)
    event_log: EventLog = EventLog()
    kafka: KafkaSettings | None = None

    @field_validator("voters")
    @classmethod
    def _odd_voters(cls, value: int) -> int:
        # An even count adds no fault tolerance and makes every majority larger (the CRD's rule).
        if value % 2 == 0:
            raise ValueError("must be odd")
        return value


class ReplicaStatus(_Doc):
    id: int = Field(ge=0)
    uuid: str | None = Field(default=None, pattern=UUID_PATTERN)
    lag: Int64 | None = None
    log_end_offset: Int64 | None = None
    endpoint: str | None = None


class Condition(_Doc):
    type: Literal["Available", "Degraded", "Recovering", "QuorumLost"]
    status: Literal["True", "False", "Unknown"]
    reason: str | None = Field(default=None, max_length=1024)
    message: str | None = Field(default=None, max_length=32768)
    last_transition_time: str | None = Field(default=None, json_schema_extra={"format": "date-time"})
    observed_generation: Int64 | None = None


class Listener(_Doc):
    name: str | None = Field(default=None, max_length=256)
    host: str | None = Field(default=None, max_length=256)
    port: int | None = None


class ControllerStatus(_Doc):
    id: int
    listeners: list[Listener] | None = Field(default=None, max_length=16)


class KafkaStatus(_Doc):
    cluster_id: str | None = Field(default=None, max_length=64)
    controllers: list[ControllerStatus] | None = Field(default=None, max_length=64)


class RecoveryStatus(_Doc):
    recovery_id: str
    replica_id: int
    old_uuid: str | None = None
    new_uuid: str | None = None
    started_at: str | None = Field(default=None, json_schema_extra={"format": "date-time"})
    completed_at: str | None = Field(default=None, json_schema_extra={"format": "date-time"})
    phase_seconds: dict[str, float] | None = None
    result: Literal["InProgress", "Succeeded", "Failed"] | None = None
    reason: str | None = None


Phase = Literal["Pending", "Bootstrapping", "Running", "Degraded", "Recovering", "QuorumLost", "Failed"]


class QuorumStatusDoc(_Doc):
    """``status`` of a KRaftQuorum, written by the operator only."""

    phase: Phase | None = None
    leader_id: int | None = None
    leader_epoch: Int64 | None = None
    high_watermark: Int64 | None = None
    observed_generation: Int64 | None = None
    voters: list[ReplicaStatus] | None = Field(default=None, max_length=32)
    observers: list[ReplicaStatus] | None = Field(default=None, max_length=32)
    conditions: list[Condition] | None = Field(default=None, max_length=16)
    kafka: KafkaStatus | None = None
    recoveries: list[RecoveryStatus] | None = Field(default=None, max_length=20)
    kopf: dict[str, Any] | None = None  # the kopf framework's bookkeeping


# Field-specific wording for the messages users know (the CRD's descriptions say the same).
_RULES = {
    "spec.voters": "must be an odd integer from 1 to 9",
    "spec.image": "must be an image reference without spaces",
    "spec.imagePullPolicy": "must be Always, IfNotPresent or Never",
    "spec.ports.client": "must be a port from 1024 to 65535",
    "spec.ports.metrics": "must be a port from 1024 to 65535",
    "spec.storage.size": "must be a positive quantity such as 1Gi",
    "spec.eventLog.path": "must be 'stdout' or an absolute path",
    "spec.recovery.order": "must be AddThenRemove or RemoveThenAdd",
    "spec.recovery.enabled": "must be true or false",
    "spec.uncleanRecovery.enabled": "must be true or false",
}


# Pydantic's wording for the common type errors, in the resource's (JSON) terms.
_PLAIN = {
    "model_type": "must be an object",
    "model_attributes_type": "must be an object",
    "dict_type": "must be an object",
    "list_type": "must be a list",
    "int_type": "must be an integer",
    "bool_type": "must be true or false",
    "string_type": "must be a string",
    "float_type": "must be a number",
}


class SpecModelError(ValueError):
    """A document that does not fit its model; the message names the field path and the problem."""


def _where(prefix: str, loc: tuple[int | str, ...]) -> str:
    out = prefix
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else f".{part}"
    return out


_TAGS = ("int", "str", "constrained-str")


def _fields(loc: tuple[int | str, ...]) -> tuple[int | str, ...]:
    """``loc`` without pydantic's union-branch tags (``int``, ``str``, ``function-after[...]``)."""
    return tuple(p for p in loc if not (isinstance(p, str) and (p in _TAGS or "[" in p)))


def describe(prefix: str, err: ValidationError) -> str:
    """The first problem of ``err`` as ``PATH: what is wrong, got VALUE``."""
    errors = err.errors(include_url=False)
    e = errors[0]
    where = _where(prefix, _fields(e["loc"]))
    branches = [x for x in errors if _fields(x["loc"]) == _fields(e["loc"])]
    if len(branches) > 1 and where not in _RULES:  # a union: every branch said no
        said = " or ".join(x["msg"][:1].lower() + x["msg"][1:] for x in branches)
        return f"{where}: {said}, got {e['input']!r:.80}"
    if e["type"] == "extra_forbidden":
        return f"{where}: unknown field"
    if e["type"] == "missing":
        return f"{where}: required"
    rule = _RULES.get(where) or _PLAIN.get(e["type"])
    if rule is None and e["type"] == "literal_error":
        rule = f"must be one of {e.get('ctx', {}).get('expected', '')}"
    rule = rule or (e["msg"][:1].lower() + e["msg"][1:])
    return f"{where}: {rule}, got {e['input']!r:.80}"


def _plain(value: Any) -> Any:
    """Mappings and sequences as dicts and lists (kopf hands out read-only views; strict models
    take plain JSON)."""
    if isinstance(value, Mapping):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return value


def validate_spec(raw: Any) -> QuorumSpecDoc:
    """``spec`` of a KRaftQuorum as its model; raises :class:`SpecModelError` naming the field."""
    if not isinstance(raw, Mapping):
        raise SpecModelError("spec: missing or not an object")
    try:
        return QuorumSpecDoc.model_validate(_plain(raw))
    except ValidationError as e:
        raise SpecModelError(describe("spec", e)) from None


def validate_status(raw: Any) -> QuorumStatusDoc:
    """``status`` of a KRaftQuorum as its model; raises :class:`SpecModelError` naming the field."""
    try:
        return QuorumStatusDoc.model_validate(_plain(raw))
    except ValidationError as e:
        raise SpecModelError(describe("status", e)) from None


def json_schema() -> dict[str, Any]:
    """The models as one JSON schema (``spec`` and ``status`` properties), names as in the CRD."""
    return {
        "spec": QuorumSpecDoc.model_json_schema(by_alias=True),
        "status": QuorumStatusDoc.model_json_schema(by_alias=True),
    }
