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

A pod never mounts the other replicas' keys in its node container, and needs no container of
its own to keep them out: the pod's ``tls`` volume is a projected volume with one directory per
pod (``NAME-<ordinal>``: that replica's ``node.crt``, ``node.key`` and ``ca.crt``, from the
node Secret(s)), and the node container mounts only its own directory (``subPathExpr:
$(POD_NAME)``): the kubelet bind-mounts that one directory, so the other replicas' keys are not
in the container's filesystem at all. (An init container that copied the pod's own files out
did the same at the price of a second container start on every pod start, which a replaced
disk's recovery waits for.) The kubelet resolves a sub-path when the container starts, so a
restarted container reads the Secret as it is then; a running node keeps what it read at start
(it reads its certificate, key and CA once). Every pod's directory exists from the first mount
(a downward-API file in each): a sub-path missing at the first mount would be created by the
kubelet as a plain directory and shadow the Secret's files for the pod's whole life. Nothing in
``spec.tls`` names a file or a path (the operator writes nowhere a resource can choose);
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
SPARE_CRT, SPARE_KEY = "spare.crt", "spare.key"  # its spare (spares.py), beside node.crt/.key
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
    # $SPARE: spare_args_command's (unquoted: two options and two paths without spaces, or none).
    t = TLS_MOUNT
    return f"--cert {t}/node.crt --key {t}/node.key --ca {t}/ca.crt $SPARE"


def spare_args_command() -> str:
    """The shell step that puts the pod's spare certificate, when it has one, in ``$SPARE``: the
    node's ``kraftkeeper start --spare-cert/--spare-key`` (served only if it names the disk)."""
    t = TLS_MOUNT
    return (
        f'SPARE=""; if [ -s {t}/{SPARE_CRT} ] && [ -s {t}/{SPARE_KEY} ]; then '
        f'SPARE="--spare-cert {t}/{SPARE_CRT} --spare-key {t}/{SPARE_KEY}"; fi'
    )


def check_command() -> str:
    """The node container's first step with TLS on: its own files are there, or it exits (and
    the kubelet retries) saying that the certificate is not issued yet."""
    t = TLS_MOUNT
    return (
        f'if [ ! -s {t}/node.crt ] || [ ! -s {t}/node.key ] || [ ! -s {t}/ca.crt ]; then '
        'echo "no certificate for replica $(( ${POD_NAME##*-} + 1 )) in the node Secret yet (the operator '
        'or cert-manager issues it)"; exit 1; fi'
    )


def tls_volume(name: str, tls: TlsSpec) -> dict[str, Any]:
    """The pod's ``tls`` volume: directory ``NAME-<k>`` holds replica ``k + 1``'s ``node.crt``,
    ``node.key`` and ``ca.crt``, from ``NAME-tls`` (keys ``node-<id>.crt``/``.key``, ``ca.crt``) in
    Operator mode or from the cert-manager Secret ``NAME-node-<id>-tls`` (``tls.crt``, ``tls.key``,
    ``ca.crt``) of each replica id 1..9, and its spare ``spare.crt`` / ``spare.key`` (keys
    ``spare-<id>.crt``/``.key`` of ``NAME-tls``, or cert-manager's ``NAME-node-<id>-spare-tls``).
    Every Secret is optional, so a replica whose key is not issued yet gets an empty directory
    (its node container then exits: check_command); the downward-API file in each directory
    makes it exist from the first mount."""
    ids = range(1, MAX_REPLICA_ID + 1)
    if tls.cert_manager:
        sources: list[dict[str, Any]] = [
            {
                "secret": {
                    "name": f"{name}-node-{i}-tls",
                    "optional": True,
                    "items": [
                        {"key": "tls.crt", "path": f"{name}-{i - 1}/node.crt"},
                        {"key": "tls.key", "path": f"{name}-{i - 1}/node.key"},
                        {"key": "ca.crt", "path": f"{name}-{i - 1}/ca.crt"},
                    ],
                }
            }
            for i in ids
        ]
        sources += [
            {
                "secret": {
                    "name": f"{name}-node-{i}-spare-tls",
                    "optional": True,
                    "items": [
                        {"key": "tls.crt", "path": f"{name}-{i - 1}/{SPARE_CRT}"},
                        {"key": "tls.key", "path": f"{name}-{i - 1}/{SPARE_KEY}"},
                    ],
                }
            }
            for i in ids
        ]
    else:
        items = [
            item
            for i in ids
            for item in (
                {"key": f"node-{i}.crt", "path": f"{name}-{i - 1}/node.crt"},
                {"key": f"node-{i}.key", "path": f"{name}-{i - 1}/node.key"},
                {"key": "ca.crt", "path": f"{name}-{i - 1}/ca.crt"},
                {"key": f"spare-{i}.crt", "path": f"{name}-{i - 1}/{SPARE_CRT}"},
                {"key": f"spare-{i}.key", "path": f"{name}-{i - 1}/{SPARE_KEY}"},
            )
        ]
        # Optional: keys of replica ids the quorum does not have are skipped, not an error.
        sources = [{"secret": {"name": f"{name}-tls", "optional": True, "items": items}}]
    pods = [{"path": f"{name}-{i - 1}/pod", "fieldRef": {"fieldPath": "metadata.name"}} for i in ids]
    sources.append({"downwardAPI": {"items": pods}})
    return {"name": "tls", "projected": {"sources": sources, "defaultMode": 0o440}}


def apply_to_pod(pod_spec: dict[str, Any], name: str, tls: TlsSpec) -> None:
    """Add the ``tls`` volume and the node container's mount of its own directory (in place),
    and switch the probes to HTTPS (the kubelet does not verify a probe's certificate)."""
    if not tls.enabled:
        return
    node = pod_spec["containers"][0]
    pod_spec["volumes"] = [*pod_spec["volumes"], tls_volume(name, tls)]
    # $(POD_NAME) is the container's env var (the downward API's metadata.name).
    mount = {"name": "tls", "mountPath": TLS_MOUNT, "subPathExpr": "$(POD_NAME)", "readOnly": True}
    node["volumeMounts"] = [*node["volumeMounts"], mount]
    for probe in ("readinessProbe", "livenessProbe"):
        node[probe]["httpGet"]["scheme"] = "HTTPS"
