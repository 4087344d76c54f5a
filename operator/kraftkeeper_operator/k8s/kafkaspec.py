"""``spec.kafka``: a KRaftQuorum that points at an existing Apache Kafka controller quorum, its
spec validated (:func:`parse_kafka_spec`, a :class:`SpecError` naming the field) and the create /
update handler's answer (:func:`reconcile_kafka`: validation only, no object is created). The
per-quorum daemon that repairs membership is :mod:`.kafkaquorums`."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import kopf

from quorum.kafka.schemas import SchemaJarMissing, find_clients_jar

from ..controller import ControllerStatus
from ..core.policy import Order, PolicyError, RecoveryPolicy
from ..kafka.backend import parse_bootstrap
from .context import OperatorContext
from .crdstatus import refuse_spec
from .manifests import QuorumSpec, SpecError, parse_spec

DEFAULT_SECRET_KEY = "client.properties"
# Fields that only make sense when the operator runs the engine. Those with a schema default
# (voters, storage, ports, imagePullPolicy, tls: {}) cannot be told apart from "not given" and are
# ignored instead.
ENGINE_FIELDS = ("image", "resources", "scheduling", "clientSelector")
ADD_THEN_REMOVE_REASON = (
    "spec.kafka.order: AddThenRemove cannot work on Kafka: it keeps one directory id per voter id "
    "and refuses AddRaftVoter for a second one (DUPLICATE_VOTER, KIP-853); use RemoveThenAdd"
)


def is_kafka(body: Mapping[str, Any]) -> bool:
    """The resource points at an existing Kafka quorum (``spec.kafka`` is set)."""
    spec = body.get("spec")
    return isinstance(spec, Mapping) and spec.get("kafka") is not None


@dataclass(frozen=True)
class KafkaSpec:
    """A validated KRaftQuorum with ``spec.kafka``; ``base`` carries name, uid, event log and
    generation (its engine fields are unused)."""

    base: QuorumSpec
    bootstrap: tuple[tuple[str, int], ...]
    secret_name: str | None
    secret_key: str

    @property
    def cluster(self) -> str:
        return self.base.cluster

    @property
    def policy(self) -> RecoveryPolicy:
        return self.base.policy


def parse_kafka_spec(body: Mapping[str, Any]) -> KafkaSpec:
    """Validate a KRaftQuorum with ``spec.kafka``; raises :class:`SpecError` naming the field.
    The schema checks the same; checking again covers objects stored before it was tightened."""
    spec = body.get("spec") or {}
    k = spec.get("kafka")
    if not isinstance(k, Mapping):
        raise SpecError("spec.kafka: must be an object")
    for name in ENGINE_FIELDS:
        if spec.get(name):
            raise SpecError(f"spec.{name}: not allowed with spec.kafka (the operator runs no pods then)")
    tls = spec.get("tls") or {}
    if isinstance(tls, Mapping) and (tls.get("mode") or tls.get("certManager")):
        raise SpecError(
            "spec.tls: not allowed with spec.kafka; client TLS comes from spec.kafka.clientSecretRef"
        )
    if (spec.get("uncleanRecovery") or {}).get("enabled"):
        raise SpecError("spec.uncleanRecovery.enabled: not supported with spec.kafka")
    boot = k.get("bootstrapControllers")
    if not isinstance(boot, list) or not boot or not all(isinstance(b, str) for b in boot):
        raise SpecError("spec.kafka.bootstrapControllers: must be a non-empty list of HOST:PORT")
    try:
        bootstrap = parse_bootstrap(",".join(boot), "spec.kafka.bootstrapControllers")
    except ValueError as e:
        raise SpecError(str(e)) from None
    if k.get("order", Order.REMOVE_THEN_ADD.value) == Order.ADD_THEN_REMOVE.value:
        raise SpecError(ADD_THEN_REMOVE_REASON)
    ref = k.get("clientSecretRef")
    if ref is not None and (not isinstance(ref, Mapping) or not isinstance(ref.get("name"), str)):
        raise SpecError("spec.kafka.clientSecretRef: must be {name, key?}")
    recovery = {
        name: k[name]
        for name in ("order", "stabilizationSeconds", "maxLagRecords", "timeoutSeconds")
        if name in k
    }
    recovery.setdefault("order", Order.REMOVE_THEN_ADD.value)
    recovery["enabled"] = (spec.get("recovery") or {}).get("enabled", True)
    try:
        policy = RecoveryPolicy.from_spec(recovery)
    except PolicyError as e:
        msg = str(e).replace("spec.recovery.", "spec.kafka.")
        raise SpecError(msg.replace("spec.kafka.enabled", "spec.recovery.enabled")) from None
    # parse_spec checks name, eventLog and the rest; its policy is replaced by spec.kafka's.
    base = dataclasses.replace(parse_spec(body), policy=policy)
    return KafkaSpec(
        base=base,
        bootstrap=tuple(bootstrap),
        secret_name=str(ref["name"]) if ref else None,
        secret_key=str(ref.get("key") or DEFAULT_SECRET_KEY) if ref else DEFAULT_SECRET_KEY,
    )


def schemas_problem() -> str:
    """Why AddRaftVoter / RemoveRaftVoter cannot be sent ("" when they can): their classes come from
    the message schemas in Kafka's kafka-clients jar (quorum/kafka/schemas.py), which the operator
    image does not carry; DescribeQuorum needs no jar, so status works either way."""
    try:
        find_clients_jar()
    except SchemaJarMissing as e:
        return str(e)
    return ""


def note_schemas_missing(st: ControllerStatus, problem: str) -> None:
    """Say in ``Degraded`` (unless it already says something) that no recovery can change voters:
    a quorum that looks healthy but cannot be healed must not look fine."""
    c = st.condition("Degraded")
    if not c.status:
        c.status, c.reason = True, "KafkaSchemasMissing"
        c.message = f"voter changes are impossible, a replaced controller would not be healed: {problem}"


async def reconcile_kafka(ctx: OperatorContext, body: kopf.Body, patch: kopf.Patch) -> None:
    """handlers.py's create / update / resume for a resource with ``spec.kafka``: validate only
    (the daemon does the work); no object is created."""
    meta = body.get("metadata") or {}
    generation = int(meta.get("generation") or 0)
    try:
        q = parse_kafka_spec(body)
    except SpecError as e:
        raise await refuse_spec(ctx.kube, body, patch, str(e)) from e
    # The phase is the daemon's alone: a phase written here from this (older) body could land
    # after the daemon's and would then stay, as the daemon writes only what changed.
    patch.status["observedGeneration"] = generation
    where = ",".join(f"{h}:{p}" for h, p in q.bootstrap)
    msg = f"existing Kafka controllers {where}; no pods are run"
    await ctx.kube.notify(body, warning=False, reason="Reconciled", message=msg)
