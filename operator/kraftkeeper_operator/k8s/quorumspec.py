"""A KRaftQuorum as the operator works with it: :class:`QuorumSpec`, read from the object by
:func:`parse_spec` through the typed document (spec.py), with what one field cannot say alone
(the default image from the operator's environment, the event-log directory it may write,
the recovery policy, TLS and client peers resolved with their cross-field rules)."""

from __future__ import annotations

import hashlib
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel

from ..core.recovery import PolicyError, RecoveryPolicy
from .spec import SpecModelError, validate_spec
from .tlsspec import TlsSpec, TlsSpecError, parse_client_selector, parse_tls

DEFAULT_IMAGE = "kraftkeeper:latest"


class SpecError(ValueError):
    """An invalid KRaftQuorum spec; the message names the field."""


@dataclass(frozen=True)
class QuorumSpec:
    namespace: str
    name: str
    uid: str
    voters: int
    image: str
    image_pull_policy: str
    port: int
    metrics_port: int
    storage_size: str
    storage_class: str | None
    resources: Mapping[str, Any]
    scheduling: Mapping[str, Any]
    policy: RecoveryPolicy
    event_log: str  # "stdout" or an absolute path
    generation: int
    tls: TlsSpec = field(default_factory=TlsSpec)  # tlsspec.py; kubetls.py makes its Secrets
    client_selector: tuple[dict[str, Any], ...] = ()  # NetworkPolicy peers allowed as clients

    @property
    def headless(self) -> str:
        return f"{self.name}-headless"

    @property
    def bootstrap_configmap(self) -> str:
        return f"{self.name}-bootstrap"

    @property
    def cluster(self) -> str:
        return f"{self.namespace}/{self.name}"

    @property
    def cluster_id(self) -> str:
        return hashlib.sha256(self.cluster.encode()).hexdigest()[:22]

    def labels(self) -> dict[str, str]:
        return {
            "app.kubernetes.io/name": "kraftkeeper",
            "app.kubernetes.io/instance": self.name,
            "app.kubernetes.io/component": "quorum",
            "app.kubernetes.io/managed-by": "kraftkeeper-operator",
        }

    def selector(self) -> dict[str, str]:
        return {"app.kubernetes.io/name": "kraftkeeper", "app.kubernetes.io/instance": self.name}

    def pod_endpoint(self, ordinal: int) -> str:
        return f"{self.name}-{ordinal}.{self.headless}.{self.namespace}.svc:{self.port}"

    def voters_arg(self, n: int) -> str:
        return ",".join(f"{k + 1}@{self.pod_endpoint(k)}" for k in range(n))


def parse_spec(body: Mapping[str, Any]) -> QuorumSpec:
    """Validate a KRaftQuorum object; raises :class:`SpecError` naming the field.

    The shape (types, bounds, enums, defaults) is the model's (spec.py, checked against the CRD);
    what needs more than one field or the operator's environment is checked here."""
    meta = body.get("metadata") or {}
    try:
        m = validate_spec(body.get("spec"))
    except SpecModelError as e:
        raise SpecError(str(e)) from None
    image = m.image or os.environ.get("KRAFTKEEPER_DEFAULT_IMAGE") or DEFAULT_IMAGE
    log_path = m.event_log.path
    # The operator writes where a resource tells it to: keep that inside its event-log volume
    # (KRAFTKEEPER_EVENT_LOG_DIR, set by the Helm chart) so a spec cannot overwrite other files.
    root = os.environ.get("KRAFTKEEPER_EVENT_LOG_DIR")
    if root and log_path != "stdout":
        norm, base = os.path.normpath(log_path), os.path.normpath(root)
        if norm != base and not norm.startswith(base + os.sep):
            raise SpecError(
                f"spec.eventLog.path: {log_path!r} is outside the operator's event-log directory {root}"
            )
    try:
        policy = RecoveryPolicy.from_spec(_dump(m.recovery), _dump(m.unclean_recovery))
        tls = parse_tls(_dump(m.tls, unset=False))
        clients = parse_client_selector(
            None if m.client_selector is None else [_dump(p, unset=False) for p in m.client_selector],
            str(meta["name"]),
        )
    except (PolicyError, TlsSpecError) as e:
        raise SpecError(str(e)) from None
    return QuorumSpec(
        namespace=str(meta.get("namespace") or "default"),
        name=str(meta["name"]),
        uid=str(meta.get("uid", "")),
        voters=m.voters,
        image=image,
        image_pull_policy=m.image_pull_policy,
        port=m.ports.client,
        metrics_port=m.ports.client if m.ports.metrics is None else m.ports.metrics,
        storage_size=m.storage.size,
        storage_class=m.storage.storage_class_name,
        resources=_dump(m.resources, unset=False) if m.resources else {},
        scheduling=_dump(m.scheduling, unset=False) if m.scheduling else {},
        policy=policy,
        event_log=log_path,
        generation=int(meta.get("generation") or 0),
        tls=tls,
        client_selector=tuple(clients),
    )


def _dump(doc: BaseModel, *, unset: bool = True) -> dict[str, Any]:
    """A sub-document back as the resource's JSON: with its defaults (``unset``), else only what
    the object says (for parsers whose defaults depend on other fields)."""
    return doc.model_dump(by_alias=True, exclude_unset=not unset, exclude_none=True)
