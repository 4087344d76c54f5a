"""Who a certificate names, and when it is due for renewal: the identity half of the per-cluster
PKI (:mod:`quorum.security.pki` issues; this module reads). The URI forms are described in
:mod:`quorum.security.pki`.

The one renewal rule (:func:`renewal_due`) is used by every issuer we run: local mode's files and
the operator's Secrets on Kubernetes.
"""

from __future__ import annotations

import datetime as dt
import re
from dataclasses import dataclass, replace
from typing import Any
from urllib.parse import parse_qs, urlsplit

from cryptography import x509
from cryptography.x509.oid import NameOID

from quorum.security.roles import ROLES
from quorum.types import ErrorCode, KraftError, canonical_uuid, is_cluster_id

__all__ = [
    "SCHEME",
    "Identity",
    "check_validity",
    "identity_from_cert",
    "identity_from_peercert",
    "load_cert",
    "parse_identity_uri",
    "peercert_dict",
    "peercert_validity",
    "renewal_due",
]

SCHEME = "kraftkeeper"
NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")  # a client name
MAX_ID = 2**31 - 1


@dataclass(frozen=True)
class Identity:
    """Who a certificate names: a replica of a cluster (``replica_id``) or a client
    (``name`` and ``role``)."""

    cluster_id: str
    replica_id: int | None = None
    name: str | None = None
    role: str | None = None
    storage_uuid: str | None = None  # a node credential bound to one disk (module docstring)

    @property
    def is_peer(self) -> bool:
        return self.replica_id is not None

    def uri(self) -> str:
        if self.replica_id is not None:
            base = f"{SCHEME}://{self.cluster_id}/replica/{self.replica_id}"
            return base if self.storage_uuid is None else f"{base}?storage={self.storage_uuid}"
        return f"{SCHEME}://{self.cluster_id}/client/{self.name}?role={self.role}"


def _bad(msg: str) -> KraftError:
    return KraftError(ErrorCode.UNAUTHENTICATED, msg)


def parse_identity_uri(uri: str) -> Identity:
    """The identity of a ``kraftkeeper://`` URI SAN; UNAUTHENTICATED naming what is wrong."""
    parts = urlsplit(uri)
    if parts.scheme != SCHEME or not is_cluster_id(parts.netloc or ""):
        raise _bad(f"certificate URI {uri!r:.120} is not a kraftkeeper identity")
    segs = parts.path.split("/")
    if len(segs) == 3 and segs[1] == "replica":
        if not segs[2].isdigit() or not segs[2].isascii() or int(segs[2]) > MAX_ID:
            raise _bad(f"certificate URI {uri!r:.120} has an invalid replica id")
        storage: str | None = None
        if parts.query:
            q = parse_qs(parts.query, strict_parsing=False)
            values = q.get("storage", [])
            if set(q) != {"storage"} or len(values) != 1:
                raise _bad(f"certificate URI {uri!r:.120} has an invalid storage binding")
            try:
                storage = canonical_uuid(values[0])
            except ValueError:
                raise _bad(f"certificate URI {uri!r:.120}: storage is not a UUID") from None
        return Identity(parts.netloc, replica_id=int(segs[2]), storage_uuid=storage)
    if len(segs) == 3 and segs[1] == "client" and NAME_RE.match(segs[2]):
        q = parse_qs(parts.query, strict_parsing=False)
        roles = q.get("role", [])
        if len(roles) != 1 or roles[0] not in ROLES or set(q) != {"role"}:
            raise _bad(f"certificate URI {uri!r:.120} has no valid role")
        return Identity(parts.netloc, name=segs[2], role=roles[0])
    raise _bad(f"certificate URI {uri!r:.120} names neither a replica nor a client")


def _identity_from_uris(uris: list[str]) -> Identity:
    mine = [u for u in uris if u.startswith(f"{SCHEME}://")]
    if len(mine) != 1:
        raise _bad(f"certificate carries {len(mine)} kraftkeeper identities (expected exactly one)")
    return parse_identity_uri(mine[0])


def identity_from_cert(cert: x509.Certificate) -> Identity:
    """The identity in a certificate's URI SAN (validity dates are checked by the caller)."""
    try:
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        raise _bad("certificate has no subject alternative name") from None
    return _identity_from_uris(san.get_values_for_type(x509.UniformResourceIdentifier))


_SSL_TIME = "%b %d %H:%M:%S %Y GMT"


def identity_from_peercert(peercert: dict[str, Any], now: dt.datetime | None = None) -> Identity:
    """The identity of a verified TLS peer from ``ssl.SSLSocket.getpeercert()``'s dictionary.

    Checks the validity period again (the TLS handshake did, but a long-lived connection can
    outlive a certificate) and requires exactly one ``kraftkeeper://`` URI SAN."""
    if not isinstance(peercert, dict) or not peercert:
        raise _bad("no verified client certificate")
    check_validity(*peercert_validity(peercert), now)
    sans = peercert.get("subjectAltName", ())
    uris = [str(v) for k, v in sans if k == "URI"] if isinstance(sans, tuple | list) else []
    return _identity_from_uris(uris)


def peercert_validity(peercert: dict[str, Any]) -> tuple[dt.datetime, dt.datetime]:
    """(notBefore, notAfter) of ``getpeercert()``'s dictionary, UTC."""
    try:
        not_before = dt.datetime.strptime(str(peercert["notBefore"]), _SSL_TIME).replace(tzinfo=dt.UTC)
        not_after = dt.datetime.strptime(str(peercert["notAfter"]), _SSL_TIME).replace(tzinfo=dt.UTC)
    except (KeyError, ValueError):
        raise _bad("certificate validity dates are unreadable") from None
    return not_before, not_after


def check_validity(not_before: dt.datetime, not_after: dt.datetime, now: dt.datetime | None = None) -> None:
    """UNAUTHENTICATED unless ``now`` lies inside the validity period."""
    now = now or dt.datetime.now(dt.UTC)
    if now < not_before:
        raise _bad(f"certificate is not valid before {not_before.isoformat()}")
    if now > not_after:
        raise _bad(f"certificate expired at {not_after.isoformat()}")


def peercert_dict(cert: x509.Certificate) -> dict[str, Any]:
    """``cert`` in the shape of ``ssl.SSLSocket.getpeercert()`` (the fields we read)."""
    sans: list[tuple[str, str]] = []
    try:
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        sans += [("URI", v) for v in san.get_values_for_type(x509.UniformResourceIdentifier)]
        sans += [("DNS", v) for v in san.get_values_for_type(x509.DNSName)]
        sans += [("IP Address", str(v)) for v in san.get_values_for_type(x509.IPAddress)]
    except x509.ExtensionNotFound:
        pass
    return {
        "subject": ((("commonName", _cn(cert)),),),
        "notBefore": cert.not_valid_before_utc.strftime(_SSL_TIME),
        "notAfter": cert.not_valid_after_utc.strftime(_SSL_TIME),
        "subjectAltName": tuple(sans),
    }


def _cn(cert: x509.Certificate) -> str:
    attrs = cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)
    return str(attrs[0].value) if attrs else ""


# ---- renewal ---------------------------------------------------------------------------------


def load_cert(pem: bytes | None) -> x509.Certificate | None:
    """A PEM certificate, or None if missing or unreadable."""
    try:
        return x509.load_pem_x509_certificate(pem) if pem else None
    except ValueError:
        return None


def renewal_due(
    cert: x509.Certificate | bytes | None,
    renew_before: dt.timedelta,
    expect: Identity | None = None,
    now: dt.datetime | None = None,
) -> bool:
    """The one renewal rule: a certificate is due when it is missing or unreadable, when it names
    another identity than ``expect`` (its disk binding compared only if ``expect`` names a disk:
    a caller that does not know the disk yet must not re-issue for it), or when it expires within
    ``renew_before`` of ``now``. Re-issuing early is always safe; serving an expired or foreign
    certificate is not, so every doubt answers "due"."""
    c = load_cert(cert) if not isinstance(cert, x509.Certificate) else cert
    if c is None:
        return True
    if expect is not None:
        try:
            named = identity_from_cert(c)
        except KraftError:  # not ours: simply re-issued
            return True
        if expect.storage_uuid is None:
            named = replace(named, storage_uuid=None)
        if named != expect:
            return True
    return c.not_valid_after_utc <= (now or dt.datetime.now(dt.UTC)) + renew_before
