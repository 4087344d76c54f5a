"""The PKI (certificates verify against the CA, identities, key file modes), bearer tokens, and
the pure authenticate / authorize functions with every kind of bad credential."""

from __future__ import annotations

import datetime as dt
import ipaddress
import json
import stat
from pathlib import Path

import pytest
from cryptography import x509

from quorum.core import messages as m
from quorum.security.auth import (
    Principal,
    authenticate,
    authorize,
    check_peer_message,
    required_permission,
    rpc_sender,
)
from quorum.security.identity import parse_identity_uri
from quorum.security.pki import (
    Identity,
    identity_from_cert,
    identity_from_peercert,
    init_ca,
    issue_client,
    issue_node,
    load_ca,
    peer_hostname,
    peercert_dict,
)
from quorum.security.tokens import TOKENS_FILE, TokenStore
from quorum.types import ErrorCode, KraftError, OffsetAndEpoch
from tests.security.conftest import CLUSTER, Pki


def _cert(path: Path) -> x509.Certificate:
    return x509.load_pem_x509_certificate(path.read_bytes())


def _peer(path: Path) -> dict[str, object]:
    return peercert_dict(_cert(path))


def test_node_certificate_verifies_and_names_the_replica(pki: Pki) -> None:
    cert = _cert(pki.node(2)[0])
    cert.verify_directly_issued_by(pki.ca.cert)  # raises if the signature does not verify
    with pytest.raises(ValueError):
        cert.verify_directly_issued_by(pki.other_ca.cert)
    assert identity_from_cert(cert) == Identity(CLUSTER, replica_id=2)
    san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert san.get_values_for_type(x509.UniformResourceIdentifier) == ["kraftkeeper://c1/replica/2"]
    assert san.get_values_for_type(x509.DNSName) == ["localhost", peer_hostname(CLUSTER, 2)]
    assert san.get_values_for_type(x509.IPAddress) == [ipaddress.ip_address("127.0.0.1")]
    assert load_ca(pki.dir).cluster_id == CLUSTER


def test_client_certificate_carries_its_role(pki: Pki) -> None:
    for role in ("admin", "readwrite", "read"):
        cert = _cert(pki.client(role)[0])
        cert.verify_directly_issued_by(pki.ca.cert)
        assert identity_from_cert(cert) == Identity(CLUSTER, name=role, role=role)
        eku = cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
        assert [u.dotted_string for u in eku] == ["1.3.6.1.5.5.7.3.2"]  # clientAuth only


def test_private_files_are_0600_and_ca_is_not_replaced(pki: Pki) -> None:
    for p in (pki.dir / "ca.key", pki.node(1)[1], pki.client("admin")[1], pki.dir / TOKENS_FILE):
        assert stat.S_IMODE(p.stat().st_mode) == 0o600, p
    before = (pki.dir / "ca.crt").read_bytes()
    with pytest.raises(KraftError) as e:
        init_ca(pki.dir, CLUSTER)
    assert e.value.code is ErrorCode.ALREADY_FORMATTED
    assert (pki.dir / "ca.crt").read_bytes() == before


@pytest.mark.parametrize(
    "uri",
    [
        "kraftkeeper://c1/replica/x",
        "kraftkeeper://c1/replica/99999999999",
        "kraftkeeper://c1/client/app?role=root",
        "kraftkeeper://c1/client/app?role=read&role=admin",
        "kraftkeeper://c1/client/app",
        "kraftkeeper:///replica/1",
        "spiffe://c1/replica/1",
        "kraftkeeper://c1/ca",
    ],
)
def test_bad_identity_uris_are_refused(uri: str) -> None:
    with pytest.raises(KraftError) as e:
        parse_identity_uri(uri)
    assert e.value.code is ErrorCode.UNAUTHENTICATED


def test_issue_refuses_bad_input(pki: Pki, tmp_path: Path) -> None:
    for call, word in (
        (lambda: issue_client(pki.ca, "x", "root"), "role"),
        (lambda: issue_client(pki.ca, "../x", "read"), "name"),
        (lambda: issue_client(pki.ca, "node-1", "read"), "name"),
        (lambda: issue_node(pki.ca, -1), "node id"),
        (lambda: issue_node(pki.ca, 1, ["bad host!"]), "host"),
        (lambda: init_ca(tmp_path, "bad/id"), "cluster id"),
        (lambda: load_ca(tmp_path / "none"), "no CA"),
    ):
        with pytest.raises(KraftError) as e:
            call()
        assert word in e.value.message


def test_authenticate_node_and_client_certificates(pki: Pki) -> None:
    p = authenticate(_peer(pki.node(2)[0]), None, cluster_id=CLUSTER, tokens=pki.tokens)
    assert p == Principal("peer", CLUSTER, replica_id=2)
    p = authenticate(_peer(pki.client("read")[0]), None, cluster_id=CLUSTER, tokens=pki.tokens)
    assert (p.kind, p.name, p.role) == ("client", "read", "read")


@pytest.mark.parametrize(
    ("which", "words"),
    [
        ("none", "no credential"),
        ("foreign", "cluster 'other'"),
        ("other-ca", "cluster 'other'"),
        ("expired", "expired"),
    ],
)
def test_authenticate_refuses_bad_certificates(pki: Pki, which: str, words: str) -> None:
    cert = {
        "none": None,
        "foreign": _peer(pki.dir / "foreign" / "node-2.crt"),
        "other-ca": _peer(pki.dir / "other-ca" / "node-2.crt"),
        "expired": _peer(pki.dir / "expired" / "node-2.crt"),
    }[which]
    with pytest.raises(KraftError) as e:
        authenticate(cert, None, cluster_id=CLUSTER, tokens=pki.tokens)
    assert e.value.code is ErrorCode.UNAUTHENTICATED and words in e.value.message


def test_not_yet_valid_and_identity_less_certificates(pki: Pki) -> None:
    d = _peer(pki.node(1)[0])
    with pytest.raises(KraftError, match="not valid before"):
        identity_from_peercert(d, dt.datetime.now(dt.UTC) - dt.timedelta(days=1))
    d2 = dict(d, subjectAltName=(("DNS", "localhost"),))
    with pytest.raises(KraftError, match="0 kraftkeeper identities"):
        identity_from_peercert(d2)
    d3 = dict(
        d, subjectAltName=(("URI", "kraftkeeper://c1/replica/1"), ("URI", "kraftkeeper://c1/replica/2"))
    )
    with pytest.raises(KraftError, match="2 kraftkeeper identities"):
        identity_from_peercert(d3)


def test_tokens_are_stored_hashed_and_compared(pki: Pki) -> None:
    text = (pki.dir / TOKENS_FILE).read_text()
    for token in pki.token.values():
        assert token not in text
    assert json.loads(text)["version"] == 1
    p = authenticate(None, f"Bearer {pki.token['readwrite']}", cluster_id=CLUSTER, tokens=pki.tokens)
    assert (p.kind, p.name, p.role, p.via) == ("client", "tok-readwrite", "readwrite", "token")
    # a token wins over the connection's certificate
    p = authenticate(
        _peer(pki.node(1)[0]), f"Bearer {pki.token['read']}", cluster_id=CLUSTER, tokens=pki.tokens
    )
    assert p.role == "read"
    for header, words in (
        (f"Bearer {pki.token['read']}x", "not valid"),
        ("Bearer ", "Bearer TOKEN"),
        (f"Basic {pki.token['read']}", "Bearer TOKEN"),
        ("Bearer " + "a" * 300, "too long"),
        ("Bearer short", "not valid"),
    ):
        with pytest.raises(KraftError) as e:
            authenticate(_peer(pki.node(1)[0]), header, cluster_id=CLUSTER, tokens=pki.tokens)
        assert e.value.code is ErrorCode.UNAUTHENTICATED and words in e.value.message
    with pytest.raises(KraftError):
        authenticate(None, f"Bearer {pki.token['read']}", cluster_id=CLUSTER, tokens=None)


def test_token_file_errors_name_the_entry(tmp_path: Path) -> None:
    f = tmp_path / TOKENS_FILE
    f.write_text('{"version": 1, "tokens": [{"name": "a", "role": "root", "sha256": "' + "0" * 64 + '"}]}')
    with pytest.raises(KraftError, match=r"tokens\[0\].*role"):
        TokenStore.load(f)
    f.write_text('{"version": 1, "tokens": [], "x": 1}')
    with pytest.raises(KraftError, match="version"):
        TokenStore.load(f)
    assert TokenStore.load(tmp_path / "missing.json").entries == []


PEER2 = Principal("peer", CLUSTER, replica_id=2)


def _client(role: str) -> Principal:
    return Principal("client", CLUSTER, name=role, role=role)


@pytest.mark.parametrize(
    ("principal", "method", "path", "claimed", "outcome"),
    [
        (None, "GET", "/healthz", None, "ok"),
        (None, "GET", "/metrics", None, "ok"),
        (None, "GET", "/readyz", None, "ok"),
        (None, "POST", "/raft/v1/fetch", 2, ErrorCode.UNAUTHENTICATED),
        (None, "GET", "/v1/kv/a", None, ErrorCode.UNAUTHENTICATED),
        (PEER2, "POST", "/raft/v1/fetch", 2, "ok"),
        (PEER2, "POST", "/raft/v1/fetch", 3, ErrorCode.PERMISSION_DENIED),
        (PEER2, "POST", "/raft/v1/vote", None, ErrorCode.PERMISSION_DENIED),
        (PEER2, "GET", "/v1/kv/a", None, ErrorCode.PERMISSION_DENIED),
        (PEER2, "GET", "/v1/quorum/describe", None, ErrorCode.PERMISSION_DENIED),
        (_client("admin"), "POST", "/raft/v1/fetch", 2, ErrorCode.PERMISSION_DENIED),
        (_client("read"), "GET", "/v1/kv/a", None, "ok"),
        (_client("read"), "PUT", "/v1/kv/a", None, ErrorCode.PERMISSION_DENIED),
        (_client("read"), "DELETE", "/v1/kv/a", None, ErrorCode.PERMISSION_DENIED),
        (_client("readwrite"), "PUT", "/v1/kv/a", None, "ok"),
        (_client("readwrite"), "GET", "/v1/quorum/describe", None, ErrorCode.PERMISSION_DENIED),
        (_client("readwrite"), "POST", "/v1/quorum/reassign", None, ErrorCode.PERMISSION_DENIED),
        (_client("admin"), "POST", "/v1/quorum/voters", None, "ok"),
        (_client("admin"), "DELETE", "/v1/kv/a", None, "ok"),
        (_client("readwrite"), "GET", "/v2/unknown", None, ErrorCode.PERMISSION_DENIED),
        (_client("read"), "POST", "/metrics", None, ErrorCode.PERMISSION_DENIED),
    ],
)
def test_authorize_matrix(
    principal: Principal | None, method: str, path: str, claimed: int | None, outcome: object
) -> None:
    if outcome == "ok":
        authorize(principal, method, path, claimed)
        return
    with pytest.raises(KraftError) as e:
        authorize(principal, method, path, claimed)
    assert e.value.code is outcome


def test_rpc_sender_per_request_type() -> None:
    assert rpc_sender(m.VoteRequest(1, "c", 3, None, 1, 1, None, 0, 0)) == 3
    assert rpc_sender(m.BeginQuorumEpochRequest(1, "c", 4, 1, 1, None)) == 4
    assert rpc_sender(m.EndQuorumEpochRequest(1, "c", 5, 1, 1, None)) == 5
    assert rpc_sender(m.FetchRequest(1, "c", 6, None, 1, 0, 0, 0, 0)) == 6
    assert rpc_sender(m.FetchSnapshotRequest(1, "c", 7, None, 1, OffsetAndEpoch(1, 1), 0, 1)) == 7
    assert required_permission("HEAD", "/healthz") is None


def test_a_node_certificate_bound_to_its_disk(tmp_path: Path) -> None:
    """``storage=UUID`` binds a node credential to one disk: a request must claim that (id,
    UUID); a certificate without it keeps the replica-id check alone; bad bindings are refused."""
    ca = init_ca(tmp_path, CLUSTER)
    disk = "6f1d3c2a-0b5e-4e8f-9a7d-1c2b3a4d5e6f"
    crt, _ = issue_node(ca, 3, storage_uuid=disk.upper())
    ident = identity_from_cert(_cert(crt))
    assert ident == Identity(CLUSTER, replica_id=3, storage_uuid=disk)
    assert ident.uri() == f"kraftkeeper://{CLUSTER}/replica/3?storage={disk}"
    bound = authenticate(_peer(crt), None, cluster_id=CLUSTER, tokens=None)
    assert bound.storage_uuid == disk
    other = "0a1b2c3d-4e5f-4a6b-8c7d-9e0f1a2b3c4d"
    check_peer_message(bound, m.FetchRequest(1, CLUSTER, 3, disk, 1, 0, 0, 0, 1))
    check_peer_message(bound, m.VoteRequest(1, CLUSTER, 3, disk, 2, 1, None, 0, 0))
    for msg in (
        m.FetchRequest(1, CLUSTER, 3, other, 1, 0, 0, 0, 1),  # the new disk's UUID: refused
        m.FetchRequest(1, CLUSTER, 3, None, 1, 0, 0, 0, 1),  # no UUID ("any disk of 3"): refused
        m.FetchSnapshotRequest(1, CLUSTER, 3, other, 1, OffsetAndEpoch(1, 1), 0, 1),
        m.BeginQuorumEpochRequest(1, CLUSTER, 3, 2, 1, None, leader_uuid=other),
        m.EndQuorumEpochRequest(1, CLUSTER, 3, 2, 1, None, leader_uuid="not-a-uuid"),
        m.FetchRequest(1, CLUSTER, 2, disk, 1, 0, 0, 0, 1),  # another replica
    ):
        with pytest.raises(KraftError) as e:
            check_peer_message(bound, msg)
        assert e.value.code is ErrorCode.PERMISSION_DENIED
    legacy = authenticate(_peer(issue_node(ca, 2)[0]), None, cluster_id=CLUSTER, tokens=None)
    check_peer_message(legacy, m.FetchRequest(1, CLUSTER, 2, other, 1, 0, 0, 0, 1))
    with pytest.raises(KraftError):
        check_peer_message(None, m.FetchRequest(1, CLUSTER, 2, other, 1, 0, 0, 0, 1))
    for bad in ("?storage=nope", "?storage=a&storage=b", "?disk=" + disk, "?storage=" + disk + "&role=admin"):
        with pytest.raises(KraftError, match="storage"):
            parse_identity_uri(f"kraftkeeper://{CLUSTER}/replica/3{bad}")
    with pytest.raises(KraftError, match="invalid storage UUID"):
        issue_node(ca, 4, storage_uuid="nope")
