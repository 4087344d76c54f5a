"""``spec.tls`` and ``spec.clientSelector`` of a KRaftQuorum, and what TLS changes in its pods
(secure by default where we start the quorum). No API calls; manifests.py calls this.

``spec.tls.mode``:

* ``Operator`` (the default): the operator keeps a CA per KRaftQuorum in the Secret
  ``NAME-ca`` and issues every node certificate into the Secret ``NAME-tls`` (keys
  ``node-<id>.crt`` / ``node-<id>.key`` and ``ca.crt``), kubetls.py.
* ``CertManager``: ``spec.tls.certManager.issuerRef`` names a cert-manager Issuer or
  ClusterIssuer; the operator creates one ``Certificate`` per replica id (Secret
  ``NAME-node-<id>-tls``), one for itself and one for applications, and never sees a CA key.
* ``Disabled``: plaintext, unauthenticated (``kraftkeeper start --insecure``), for tests and
  for platforms that terminate TLS elsewhere; anyone who reaches the port owns the quorum.

A pod never mounts the other replicas' keys in its node container: the ``tls`` init container
mounts the node Secret(s), copies only its own ``node-<id>`` certificate and key and the CA
into an in-memory emptyDir, and only that emptyDir is mounted into the node container. Nothing
in ``spec.tls`` names a file or a path (the operator writes nowhere a resource can choose);
unknown keys are refused, naming them.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

MODES = ("Operator", "CertManager", "Disabled")
ISSUER_KINDS = ("Issuer", "ClusterIssuer")
TLS_MOUNT = "/etc/kraftkeeper/tls"  # the node container: its own cert, key and the CA only
SECRETS_MOUNT = "/etc/kraftkeeper/tls-secrets"  # the tls init container only
MAX_REPLICA_ID = 9  # spec.voters is at most 9: the projected Secrets cover ids 1..9
_DNS_NAME = re.compile(r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$")
_LABEL_KEYS = ("podSelector", "namespaceSelector")


class TlsSpecError(ValueError):
    """An invalid ``spec.tls`` / ``spec.clientSelector``; the message names the field."""


@dataclass(frozen=True)
class TlsSpec:
    mode: str = "Operator"
    issuer_name: str = ""
    issuer_kind: str = "Issuer"
    issuer_group: str = "cert-manager.io"
    validity_days: int = 90
    renew_before_days: int = 30

    @property
    def enabled(self) -> bool:
        return self.mode != "Disabled"

    @property
    def cert_manager(self) -> bool:
        return self.mode == "CertManager"


def _int(d: Mapping[str, Any], key: str, default: int, lo: int, hi: int) -> int:
    v = d.get(key, default)
    if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
        raise TlsSpecError(f"spec.tls.{key}: must be an integer from {lo} to {hi}, got {v!r:.60}")
    return v


def _only(d: Mapping[str, Any], where: str, allowed: tuple[str, ...]) -> None:
    unknown = sorted(str(k) for k in d if k not in allowed)
    if unknown:
        names = ", ".join(unknown)[:200]
        raise TlsSpecError(f"{where}: unknown field(s) {names} (allowed: {', '.join(allowed)})")


def parse_tls(raw: Any) -> TlsSpec:
    """Validate ``spec.tls`` (absent: the Operator mode with its defaults)."""
    if raw is None:
        return TlsSpec()
    if not isinstance(raw, Mapping):
        raise TlsSpecError("spec.tls: must be an object")
    _only(raw, "spec.tls", ("mode", "certManager", "validityDays", "renewBeforeDays"))
    cm = raw.get("certManager")
    mode = raw.get("mode", "CertManager" if cm is not None else "Operator")
    if mode not in MODES:
        raise TlsSpecError(f"spec.tls.mode: {mode!r:.60} is not one of {', '.join(MODES)}")
    validity = _int(raw, "validityDays", 90, 1, 3650)
    renew = _int(raw, "renewBeforeDays", min(30, max(1, validity // 3)), 1, 3650)
    if renew >= validity:
        raise TlsSpecError(
            f"spec.tls.renewBeforeDays: {renew} must be less than spec.tls.validityDays {validity}"
        )
    if mode != "CertManager":
        if cm is not None:
            raise TlsSpecError(f"spec.tls.certManager: only with mode CertManager (mode is {mode})")
        return TlsSpec(mode, validity_days=validity, renew_before_days=renew)
    if not isinstance(cm, Mapping):
        raise TlsSpecError("spec.tls.certManager: mode CertManager needs certManager.issuerRef")
    _only(cm, "spec.tls.certManager", ("issuerRef",))
    ref = cm.get("issuerRef")
    if not isinstance(ref, Mapping):
        raise TlsSpecError("spec.tls.certManager.issuerRef: missing or not an object")
    _only(ref, "spec.tls.certManager.issuerRef", ("name", "kind", "group"))
    name, kind, group = ref.get("name"), ref.get("kind", "Issuer"), ref.get("group", "cert-manager.io")
    if not isinstance(name, str) or not _DNS_NAME.match(name):
        raise TlsSpecError(f"spec.tls.certManager.issuerRef.name: must be an object name, got {name!r:.60}")
    if kind not in ISSUER_KINDS:
        raise TlsSpecError(
            f"spec.tls.certManager.issuerRef.kind: {kind!r:.60} is not Issuer or ClusterIssuer"
        )
    if not isinstance(group, str) or not _DNS_NAME.match(group):
        raise TlsSpecError(f"spec.tls.certManager.issuerRef.group: must be an API group, got {group!r:.60}")
    return TlsSpec(mode, name, kind, group, validity, renew)


def parse_client_selector(raw: Any, name: str) -> list[dict[str, Any]]:
    """``spec.clientSelector``: NetworkPolicy peers (``podSelector`` / ``namespaceSelector``
    label selectors) allowed to reach the client port. Absent: pods of the same namespace
    labelled ``kraftkeeper.io/client: NAME``."""
    if raw is None:
        return [{"podSelector": {"matchLabels": {"kraftkeeper.io/client": name}}}]
    if not isinstance(raw, list) or len(raw) > 32:
        raise TlsSpecError("spec.clientSelector: must be a list of at most 32 peers")
    out = []
    for i, peer in enumerate(raw):
        where = f"spec.clientSelector[{i}]"
        if not isinstance(peer, Mapping) or not peer:
            raise TlsSpecError(f"{where}: must be an object with podSelector and/or namespaceSelector")
        _only(peer, where, _LABEL_KEYS)
        for k, sel in peer.items():
            if not isinstance(sel, Mapping):
                raise TlsSpecError(f"{where}.{k}: must be a label selector object")
            _only(sel, f"{where}.{k}", ("matchLabels", "matchExpressions"))
            labels = sel.get("matchLabels") or {}
            if not isinstance(labels, Mapping) or not all(
                isinstance(a, str) and isinstance(b, str) for a, b in labels.items()
            ):
                raise TlsSpecError(f"{where}.{k}.matchLabels: must map strings to strings")
            if not isinstance(sel.get("matchExpressions") or [], list):
                raise TlsSpecError(f"{where}.{k}.matchExpressions: must be a list")
        out.append({str(k): dict(v) for k, v in peer.items()})
    return out


def start_args(tls: TlsSpec) -> str:
    """The TLS part of the node container's ``kraftkeeper start`` command."""
    if not tls.enabled:
        return "--insecure"
    return f"--cert {TLS_MOUNT}/node.crt --key {TLS_MOUNT}/node.key --ca {TLS_MOUNT}/ca.crt"


def copy_command() -> str:
    """The ``tls`` init container: its own replica's files only, into the in-memory volume.
    Fails (and so retries) until the Secret holds this replica's certificate."""
    s, t = SECRETS_MOUNT, TLS_MOUNT
    return (
        "ID=$(( ${POD_NAME##*-} + 1 )) && umask 077 && "
        f'if [ ! -s {s}/node-$ID.crt ] || [ ! -s {s}/node-$ID.key ]; then '
        'echo "no certificate for replica $ID in the node Secret yet (the operator or cert-manager '
        'issues it)"; exit 1; fi && '
        f"cp {s}/node-$ID.crt {t}/node.crt && cp {s}/node-$ID.key {t}/node.key && "
        f"if [ -s {s}/ca.crt ]; then cp {s}/ca.crt {t}/ca.crt; else cp {s}/ca-$ID.crt {t}/ca.crt; fi"
    )


def secrets_volume(name: str, tls: TlsSpec) -> dict[str, Any]:
    """The node Secret(s), for the ``tls`` init container: ``NAME-tls`` in Operator mode, the
    cert-manager Secrets of replica ids 1..9 (optional: only existing ones appear) otherwise."""
    if not tls.cert_manager:
        return {"name": "tls-secrets", "secret": {"secretName": f"{name}-tls", "defaultMode": 0o440}}
    sources = [
        {
            "secret": {
                "name": f"{name}-node-{i}-tls",
                "optional": True,
                "items": [
                    {"key": "tls.crt", "path": f"node-{i}.crt"},
                    {"key": "tls.key", "path": f"node-{i}.key"},
                    {"key": "ca.crt", "path": f"ca-{i}.crt"},
                ],
            }
        }
        for i in range(1, MAX_REPLICA_ID + 1)
    ]
    return {"name": "tls-secrets", "projected": {"sources": sources, "defaultMode": 0o440}}


def apply_to_pod(
    pod_spec: dict[str, Any], name: str, tls: TlsSpec, env: list[dict[str, Any]], security: dict[str, Any]
) -> None:
    """Add the ``tls`` init container, its volumes and the node container's mount (in place),
    and switch the probes to HTTPS (the kubelet does not verify a probe's certificate)."""
    if not tls.enabled:
        return
    node = pod_spec["containers"][0]
    pod_spec.setdefault("initContainers", []).append(
        {
            "name": "tls",
            "image": node["image"],
            "imagePullPolicy": node["imagePullPolicy"],
            "command": ["sh", "-c", copy_command()],
            "env": env,
            "volumeMounts": [
                {"name": "tls-secrets", "mountPath": SECRETS_MOUNT, "readOnly": True},
                {"name": "tls", "mountPath": TLS_MOUNT},
                {"name": "tmp", "mountPath": "/tmp"},  # HOME (the root filesystem is read-only)
            ],
            "securityContext": security,
        }
    )
    pod_spec["volumes"] += [secrets_volume(name, tls), {"name": "tls", "emptyDir": {"medium": "Memory"}}]
    node["volumeMounts"] = [*node["volumeMounts"], {"name": "tls", "mountPath": TLS_MOUNT, "readOnly": True}]
    for probe in ("readinessProbe", "livenessProbe"):
        node[probe]["httpGet"]["scheme"] = "HTTPS"
